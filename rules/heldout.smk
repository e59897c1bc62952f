# Held-out benchmarks through lm-evaluation-harness (esgrpo.evaluation.heldout): one job per checkpoint and
# benchmark of the config's `heldout_benchmarks` block: the base model and the final stage of each
# continual sequence (paper A's before -> after; docs/references.md). The tables read the per-prompt
# rows (esgrpo.report.planning); README.md, "Held-out benchmarks", says how to run them on real data.
# Resources from the plan (esgrpo.plan.grid.heldout_jobs): the memory and GPUs of the same checkpoint's
# evaluation job (the plan has no lm-eval job kind), the block's runtime as the time limit.


# Each rule's own constraint, not a global one: global constraints declared after a rule (the train and eval
# rules) rewrite its outputs under a default storage provider without their constraints (Snakemake 9.27,
# Rule.update_wildcard_constraints), and train_run and es_snapshot then both match a snapshot run.
BENCH_PATTERN = _alternatives(HELDOUT_BENCHMARKS) if HELDOUT_BENCHMARKS else "(?!)"


rule heldout_base:
    input:
        model=base_model_files,
    output:
        summary=f"{RESULTS}/{{model}}/base/heldout/{{bench}}.json",
        prompts=f"{RESULTS}/{{model}}/base/heldout/{{bench}}_prompts.jsonl",
    log:
        f"{RESULTS}/logs/{{model}}/base/heldout_{{bench}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/base/heldout_{{bench}}.tsv"
    wildcard_constraints:
        bench=BENCH_PATTERN,
    conda:
        SOFTWARE_ENV
    threads: planned("heldout_base", "threads", 1)
    resources:
        mem_mb=planned("heldout_base", "mem_mb", 4000),
        runtime=planned("heldout_base", "runtime", HELDOUT_RUNTIME),
        gpu=planned("heldout_base", "gpu", 0),
        cpus_per_gpu=planned("heldout_base", "cpus_per_gpu", 0),
        gpu_model=planned("heldout_base", "gpu_model", ""),
    params:
        model=base_model_ref,
        settings=heldout_settings,
        run="base",
        train_task="none",
    script:
        "../workflow_scripts/heldout_benchmark.py"


rule heldout_run:
    input:
        model=f"{RESULTS}/{{model}}/{{task}}/{{run}}/model",
    output:
        summary=f"{RESULTS}/{{model}}/{{task}}/{{run}}/heldout/{{bench}}.json",
        prompts=f"{RESULTS}/{{model}}/{{task}}/{{run}}/heldout/{{bench}}_prompts.jsonl",
    log:
        f"{RESULTS}/logs/{{model}}/{{task}}/{{run}}/heldout_{{bench}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/{{task}}/{{run}}/heldout_{{bench}}.tsv"
    wildcard_constraints:
        bench=BENCH_PATTERN,
    conda:
        SOFTWARE_ENV
    threads: planned("heldout_run", "threads", 1)
    resources:
        mem_mb=planned("heldout_run", "mem_mb", 4000),
        runtime=planned("heldout_run", "runtime", HELDOUT_RUNTIME),
        gpu=planned("heldout_run", "gpu", 0),
        cpus_per_gpu=planned("heldout_run", "cpus_per_gpu", 0),
        gpu_model=planned("heldout_run", "gpu_model", ""),
    params:
        model=run_model,
        settings=heldout_settings,
        run="{run}",
        train_task="{task}",
    script:
        "../workflow_scripts/heldout_benchmark.py"
