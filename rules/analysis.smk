# Geometry analyses of trained checkpoints (paper A's geometry findings, paper B's findings 6-7).
# Every output lives under results/analysis/{model}/ and is a tidy CSV (columns: the ANALYSIS
# table in esgrpo/pipeline/analysis.py). theta0 is always the model's base checkpoint.
# Settings: the config's `analysis:` block (defaults in esgrpo.pipeline.analysis.DEFAULTS and
# schemas/config.schema.yaml). Analyses pairing ES with GRPO (cosine, interpolation) are only
# requested when the config has both an `es` and a `grpo` block.
from esgrpo.pipeline.analysis import analysis_config, analysis_eval_settings
from esgrpo.runs import main_es_name, main_grpo_name

ANALYSIS = analysis_config(config)
ANALYSIS_DIR = f"{RESULTS}/analysis"


def _analysis_seeds(method):
    block = config.get(method)
    return list(block.get("seeds", [0])) if block else []


def analysis_pair_seeds():
    """Seeds with both a main ES and a main GRPO run (ES seed order)."""
    grpo = set(_analysis_seeds("grpo"))
    return [s for s in _analysis_seeds("es") if s in grpo]


def analysis_main_runs(model):
    """(task, run) of the main ES and main GRPO runs of every seed, on every task of `model`."""
    planned = set(planned_runs(config, model))
    runs = []
    for task in model_tasks(model):
        runs += [(task, main_es_name(config, s)) for s in _analysis_seeds("es")]
        runs += [(task, main_grpo_name(config, s)) for s in _analysis_seeds("grpo")]
    return [r for r in runs if r in planned]


def analysis_targets(model):
    """Every analysis output for `model` that the config asks for (for `rule all`)."""
    wanted, out = set(ANALYSIS["analyses"]), []
    a = f"{ANALYSIS_DIR}/{model}"
    runs = planned_runs(config, model)
    if "drift" in wanted:
        out += [f"{a}/drift/{t}/{r}.csv" for t, r in runs]
    if "theory" in wanted:
        for t, r in runs:
            if run_spec(config, t, r).method == "es":
                out += [f"{a}/theory/{t}/{r}.csv", f"{a}/theory/{t}/{r}.json"]
    main = analysis_main_runs(model)
    if "sparsity" in wanted:
        out += [f"{a}/sparsity/{t}/{r}.csv" for t, r in main]
    if "kl" in wanted:
        out += [f"{a}/kl/{t}/{r}.csv" for t, r in main]
    for t in model_tasks(model):
        for s in analysis_pair_seeds():
            if "cosine" in wanted:
                out.append(f"{a}/cosine/{t}/s{s}.csv")
            if "interpolation" in wanted:
                out += [f"{a}/interpolation/{t}/s{s}.csv", f"{a}/interpolation/{t}/s{s}.json"]
    return out


rule analysis_all:
    input:
        [path for m in MODELS for path in analysis_targets(m)],
    localrule: True


def analysis_run_model(wildcards):
    return f"{run_dir(wildcards.model, wildcards.task, wildcards.run)}/model"


def analysis_method(wildcards):
    return run_spec(config, wildcards.task, wildcards.run).method


def analysis_init_ref(wildcards):
    """The checkpoint the run started from: the base, or (sequential runs) another run's model."""
    spec = run_spec(config, wildcards.task, wildcards.run)
    if spec.init is None:
        return base_model_ref(wildcards)
    return f"{run_dir(wildcards.model, *spec.init)}/model"


def analysis_init_files(wildcards):
    spec = run_spec(config, wildcards.task, wildcards.run)
    return base_model_files(wildcards) if spec.init is None else analysis_init_ref(wildcards)


def analysis_eval(wildcards):
    return analysis_eval_settings(eval_params(wildcards.model), ANALYSIS["eval"])


def analysis_interpolation_eval(wildcards):
    overrides = {**ANALYSIS["eval"], **ANALYSIS["interpolation_eval"]}
    return analysis_eval_settings(eval_params(wildcards.model), overrides)


def analysis_engine(wildcards):
    ev = eval_params(wildcards.model)
    return {k: ev[k] for k in ("dtype", "device", "batch_size") if k in ev}


def analysis_kl_settings(wildcards):
    kl = dict(ANALYSIS["kl"])
    if kl.get("max_new_tokens") is None:
        kl["max_new_tokens"] = eval_params(wildcards.model).get("max_new_tokens", 24)
    return kl


def analysis_pair_models(wildcards):
    seed = int(wildcards.seed)
    es = f"{run_dir(wildcards.model, wildcards.task, main_es_name(config, seed))}/model"
    grpo = f"{run_dir(wildcards.model, wildcards.task, main_grpo_name(config, seed))}/model"
    return es, grpo


def analysis_cosine_pairs(wildcards):
    """es-grpo of this seed; es-es and grpo-grpo of this seed with the next configured seed."""
    seed = int(wildcards.seed)
    es, grpo = analysis_pair_models(wildcards)
    pairs = [{"pair": "es-grpo", "a": es, "b": grpo, "seed_b": seed}]
    for method, name in (("es", main_es_name), ("grpo", main_grpo_name)):
        seeds = _analysis_seeds(method)
        if seed in seeds and seeds.index(seed) + 1 < len(seeds):
            other = seeds[seeds.index(seed) + 1]
            pairs.append({"pair": f"{method}-{method}",
                          "a": f"{run_dir(wildcards.model, wildcards.task, name(config, seed))}/model",
                          "b": f"{run_dir(wildcards.model, wildcards.task, name(config, other))}/model",
                          "seed_b": other})
    return pairs


def analysis_task_data(wildcards):
    tasks = model_tasks(wildcards.model)
    return {
        "test": expand(f"{RESULTS}/data/{{t}}/test.jsonl", t=tasks),
        "info": expand(f"{RESULTS}/data/{{t}}/info.json", t=tasks),
    }


rule analysis_drift:
    input:
        base=base_model_files,
        model=analysis_run_model,
        init=analysis_init_files,
    output:
        csv=f"{ANALYSIS_DIR}/{{model}}/drift/{{task}}/{{run}}.csv",
    params:
        base_model=base_model_ref,
        model=analysis_run_model,
        init_model=analysis_init_ref,
        method=analysis_method,
    log:
        f"{RESULTS}/logs/analysis/{{model}}/drift/{{task}}/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/drift/{{task}}/{{run}}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    script:
        "../workflow_scripts/analysis_drift.py"


rule analysis_theory:
    input:
        metrics=f"{RESULTS}/{{model}}/{{task}}/{{run}}/metrics.jsonl",
        summary=f"{RESULTS}/{{model}}/{{task}}/{{run}}/summary.json",
    output:
        csv=f"{ANALYSIS_DIR}/{{model}}/theory/{{task}}/{{run}}.csv",
        json=f"{ANALYSIS_DIR}/{{model}}/theory/{{task}}/{{run}}.json",
    log:
        f"{RESULTS}/logs/analysis/{{model}}/theory/{{task}}/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/theory/{{task}}/{{run}}.tsv"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    localrule: True
    script:
        "../workflow_scripts/analysis_theory.py"


rule analysis_cosine:
    input:
        base=base_model_files,
        models=lambda wc: sorted({ref for p in analysis_cosine_pairs(wc) for ref in (p["a"], p["b"])}),
    output:
        csv=f"{ANALYSIS_DIR}/{{model}}/cosine/{{task}}/s{{seed}}.csv",
    params:
        base_model=base_model_ref,
        pairs=analysis_cosine_pairs,
    wildcard_constraints:
        seed=r"\d+",
    log:
        f"{RESULTS}/logs/analysis/{{model}}/cosine/{{task}}/s{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/cosine/{{task}}/s{{seed}}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    script:
        "../workflow_scripts/analysis_cosine.py"


rule analysis_sparsity:
    input:
        base=base_model_files,
        model=analysis_run_model,
        test=f"{RESULTS}/data/{{task}}/test.jsonl",
        info=f"{RESULTS}/data/{{task}}/info.json",
    output:
        csv=f"{ANALYSIS_DIR}/{{model}}/sparsity/{{task}}/{{run}}.csv",
    params:
        base_model=base_model_ref,
        model=analysis_run_model,
        method=analysis_method,
        fractions=ANALYSIS["sparsity_fractions"],
        eval=analysis_eval,
    log:
        f"{RESULTS}/logs/analysis/{{model}}/sparsity/{{task}}/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/sparsity/{{task}}/{{run}}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    script:
        "../workflow_scripts/analysis_sparsity.py"


rule analysis_base_samples:
    input:
        base=base_model_files,
        test=f"{RESULTS}/data/{{evaltask}}/test.jsonl",
    output:
        samples=f"{ANALYSIS_DIR}/{{model}}/base_samples/{{evaltask}}.jsonl",
    params:
        base_model=base_model_ref,
        kl=analysis_kl_settings,
        dtype=lambda wc: analysis_engine(wc).get("dtype", "float32"),
        device=lambda wc: analysis_engine(wc).get("device", "cpu"),
        batch_size=lambda wc: analysis_engine(wc).get("batch_size", 256),
    log:
        f"{RESULTS}/logs/analysis/{{model}}/base_samples/{{evaltask}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/base_samples/{{evaltask}}.tsv"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    script:
        "../workflow_scripts/analysis_base_samples.py"


rule analysis_kl:
    input:
        base=base_model_files,
        model=analysis_run_model,
        samples=lambda wc: expand(f"{ANALYSIS_DIR}/{wc.model}/base_samples/{{t}}.jsonl", t=model_tasks(wc.model)),
    output:
        csv=f"{ANALYSIS_DIR}/{{model}}/kl/{{task}}/{{run}}.csv",
    params:
        base_model=base_model_ref,
        model=analysis_run_model,
        method=analysis_method,
        eval_tasks=lambda wc: model_tasks(wc.model),
        kl=analysis_kl_settings,
        dtype=lambda wc: analysis_engine(wc).get("dtype", "float32"),
        device=lambda wc: analysis_engine(wc).get("device", "cpu"),
    log:
        f"{RESULTS}/logs/analysis/{{model}}/kl/{{task}}/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/kl/{{task}}/{{run}}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    script:
        "../workflow_scripts/analysis_kl.py"


rule analysis_interpolation:
    input:
        unpack(analysis_task_data),
        base=base_model_files,
        es=lambda wc: analysis_pair_models(wc)[0],
        grpo=lambda wc: analysis_pair_models(wc)[1],
    output:
        csv=f"{ANALYSIS_DIR}/{{model}}/interpolation/{{task}}/s{{seed}}.csv",
        json=f"{ANALYSIS_DIR}/{{model}}/interpolation/{{task}}/s{{seed}}.json",
    params:
        base_model=base_model_ref,
        es_model=lambda wc: analysis_pair_models(wc)[0],
        grpo_model=lambda wc: analysis_pair_models(wc)[1],
        eval_tasks=lambda wc: model_tasks(wc.model),
        eval=analysis_interpolation_eval,
        steps=ANALYSIS["interpolation_steps"],
        multiples=ANALYSIS["scan_multiples"],
        random_seed=ANALYSIS["random_direction_seed"],
    wildcard_constraints:
        seed=r"\d+",
    log:
        f"{RESULTS}/logs/analysis/{{model}}/interpolation/{{task}}/s{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/interpolation/{{task}}/s{{seed}}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
    script:
        "../workflow_scripts/analysis_interpolation.py"
