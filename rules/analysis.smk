# Geometry analyses of trained checkpoints (paper A's geometry findings, paper B's findings 6-7).
# Every output lives under {results_dir}/analysis/{model}/ (helpers and settings: rules/inputs.smk and
# esgrpo.analysis.settings; defaults in schemas/config.schema.yaml; stages in esgrpo.workflow.stages.analysis).


rule analysis_all:
    input:
        ALL_ANALYSIS_TARGETS,
    localrule: True


rule analysis_drift:
    input:
        base=base_model_files,
        model=run_model,
        init=init_model_files,
    output:
        csv=f"{ANALYSIS_DIR}/{{model}}/drift/{{task}}/{{run}}.csv",
    log:
        f"{RESULTS}/logs/analysis/{{model}}/drift/{{task}}/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/drift/{{task}}/{{run}}.tsv"
    conda:
        SOFTWARE_ENV
    threads: planned("analysis_drift", "threads", 1)
    resources:
        mem_mb=planned("analysis_drift", "mem_mb", 4000),
        runtime=planned("analysis_drift", "runtime", 30),
        gpu=planned("analysis_drift", "gpu", 0),
        cpus_per_gpu=planned("analysis_drift", "cpus_per_gpu", 0),
        gpu_model=planned("analysis_drift", "gpu_model", ""),
    params:
        base_model=base_model_ref,
        model=run_model,
        init_model=init_model_ref,
        method=run_method,
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
    localrule: True
    conda:
        SOFTWARE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    script:
        "../workflow_scripts/analysis_theory.py"


rule analysis_cosine:
    input:
        base=base_model_files,
        models=analysis_cosine_models,
    output:
        csv=f"{ANALYSIS_DIR}/{{model}}/cosine/{{task}}/{{pair}}.csv",
    log:
        f"{RESULTS}/logs/analysis/{{model}}/cosine/{{task}}/{{pair}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/cosine/{{task}}/{{pair}}.tsv"
    wildcard_constraints:
        pair=PAIR_PATTERN,
    conda:
        SOFTWARE_ENV
    threads: planned("analysis_cosine", "threads", 1)
    resources:
        mem_mb=planned("analysis_cosine", "mem_mb", 4000),
        runtime=planned("analysis_cosine", "runtime", 30),
        gpu=planned("analysis_cosine", "gpu", 0),
        cpus_per_gpu=planned("analysis_cosine", "cpus_per_gpu", 0),
        gpu_model=planned("analysis_cosine", "gpu_model", ""),
    params:
        base_model=base_model_ref,
        pairs=analysis_cosine_pairs,
    script:
        "../workflow_scripts/analysis_cosine.py"


rule analysis_sparsity:
    input:
        unpack(judged_data),
        base=base_model_files,
        model=run_model,
    output:
        csv=f"{ANALYSIS_DIR}/{{model}}/sparsity/{{task}}/{{run}}.csv",
    log:
        f"{RESULTS}/logs/analysis/{{model}}/sparsity/{{task}}/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/sparsity/{{task}}/{{run}}.tsv"
    conda:
        SOFTWARE_ENV
    threads: planned("analysis_sparsity", "threads", 1)
    resources:
        mem_mb=planned("analysis_sparsity", "mem_mb", 4000),
        runtime=planned("analysis_sparsity", "runtime", 60),
        gpu=planned("analysis_sparsity", "gpu", 0),
        cpus_per_gpu=planned("analysis_sparsity", "cpus_per_gpu", 0),
        gpu_model=planned("analysis_sparsity", "gpu_model", ""),
    params:
        base_model=base_model_ref,
        model=run_model,
        start_dtype=start_dtype,
        method=run_method,
        fractions=ANALYSIS["sparsity_fractions"],
        eval_tasks=judged_tasks,
        eval=analysis_eval,
    script:
        "../workflow_scripts/analysis_sparsity.py"


rule analysis_base_samples:
    input:
        base=base_model_files,
        test=f"{RESULTS}/data/{{evaltask}}/test.jsonl",
    output:
        samples=f"{ANALYSIS_DIR}/{{model}}/base_samples/{{evaltask}}.jsonl",
    log:
        f"{RESULTS}/logs/analysis/{{model}}/base_samples/{{evaltask}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/base_samples/{{evaltask}}.tsv"
    conda:
        SOFTWARE_ENV
    threads: planned("analysis_base_samples", "threads", 1)
    resources:
        mem_mb=planned("analysis_base_samples", "mem_mb", 2000),
        runtime=planned("analysis_base_samples", "runtime", 30),
        gpu=planned("analysis_base_samples", "gpu", 0),
        cpus_per_gpu=planned("analysis_base_samples", "cpus_per_gpu", 0),
        gpu_model=planned("analysis_base_samples", "gpu_model", ""),
    params:
        base_model=base_model_ref,
        kl=analysis_kl_settings,
        dtype=engine_dtype,
        device=engine_device,
        batch_size=base_samples_batch_size,
    script:
        "../workflow_scripts/analysis_base_samples.py"


rule analysis_kl:
    input:
        base=base_model_files,
        model=run_model,
        samples=kl_base_samples,
    output:
        csv=f"{ANALYSIS_DIR}/{{model}}/kl/{{task}}/{{run}}.csv",
    log:
        f"{RESULTS}/logs/analysis/{{model}}/kl/{{task}}/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/kl/{{task}}/{{run}}.tsv"
    conda:
        SOFTWARE_ENV
    threads: planned("analysis_kl", "threads", 1)
    resources:
        mem_mb=planned("analysis_kl", "mem_mb", 4000),
        runtime=planned("analysis_kl", "runtime", 30),
        gpu=planned("analysis_kl", "gpu", 0),
        cpus_per_gpu=planned("analysis_kl", "cpus_per_gpu", 0),
        gpu_model=planned("analysis_kl", "gpu_model", ""),
    params:
        base_model=base_model_ref,
        model=run_model,
        method=run_method,
        eval_tasks=eval_tasks,
        kl=analysis_kl_settings,
        dtype=engine_dtype,
        device=engine_device,
    script:
        "../workflow_scripts/analysis_kl.py"


rule analysis_interpolation:
    input:
        unpack(eval_data),
        base=base_model_files,
        es=pair_es_model,
        grpo=pair_grpo_model,
    output:
        csv=f"{ANALYSIS_DIR}/{{model}}/interpolation/{{task}}/{{pair}}.csv",
        json=f"{ANALYSIS_DIR}/{{model}}/interpolation/{{task}}/{{pair}}.json",
    log:
        f"{RESULTS}/logs/analysis/{{model}}/interpolation/{{task}}/{{pair}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analysis/{{model}}/interpolation/{{task}}/{{pair}}.tsv"
    wildcard_constraints:
        pair=PAIR_PATTERN,
    conda:
        SOFTWARE_ENV
    threads: planned("analysis_interpolation", "threads", 1)
    resources:
        mem_mb=planned("analysis_interpolation", "mem_mb", 4000),
        runtime=planned("analysis_interpolation", "runtime", 120),
        gpu=planned("analysis_interpolation", "gpu", 0),
        cpus_per_gpu=planned("analysis_interpolation", "cpus_per_gpu", 0),
        gpu_model=planned("analysis_interpolation", "gpu_model", ""),
    params:
        base_model=base_model_ref,
        es_model=pair_es_model,
        es_start_dtype=pair_es_start_dtype,
        grpo_model=pair_grpo_model,
        eval_tasks=eval_tasks,
        eval=analysis_interpolation_eval,
        steps=ANALYSIS["interpolation_steps"],
        multiples=ANALYSIS["scan_multiples"],
        random_seed=ANALYSIS["random_direction_seed"],
    script:
        "../workflow_scripts/analysis_interpolation.py"
