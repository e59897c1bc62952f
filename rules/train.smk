# Training: one job per (model, task, run); the run name says the method, settings and start.
# Progress (checkpoints to resume from) lives under {results_dir}/progress/, which is NOT a declared
# output: Snakemake deletes a failed job's outputs, and a killed run must keep its progress.


rule train_run:
    input:
        model=init_model_files,
        train=f"{RESULTS}/data/{{task}}/train.jsonl",
        info=f"{RESULTS}/data/{{task}}/info.json",
    output:
        model=directory(f"{RESULTS}/{{model}}/{{task}}/{{run}}/model"),
        metrics=f"{RESULTS}/{{model}}/{{task}}/{{run}}/metrics.jsonl",
        summary=f"{RESULTS}/{{model}}/{{task}}/{{run}}/summary.json",
    log:
        f"{RESULTS}/logs/{{model}}/{{task}}/{{run}}/train.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/{{task}}/{{run}}/train.tsv"
    wildcard_constraints:
        run=TRAINED_RUN_PATTERN,
    conda:
        SOFTWARE_ENV
    threads: planned("train_run", "threads", 1)
    resources:
        mem_mb=planned("train_run", "mem_mb", 4000),
        runtime=planned("train_run", "runtime", 120),
        gpu=planned("train_run", "gpu", 0),
        cpus_per_gpu=planned("train_run", "cpus_per_gpu", 0),
        gpu_model=planned("train_run", "gpu_model", ""),
    params:
        method=run_method,
        settings=train_settings,
        labels=run_labels,
        init_model=init_model_ref,
        progress_dir=f"{RESULTS}/progress/{{model}}/{{task}}/{{run}}",
        es_backend=config.get("es", {}).get("backend", "hf"),
        es_engine=es_engine,
    script:
        "../workflow_scripts/train_run.py"


# A main ES run's model after K of its iterations (es.snapshots) becomes run es-n{N}-it{K}-s{seed}:
# the training job exported it under its own folder (snapshots/it{K}/); this links it into place.
rule es_snapshot:
    input:
        unpack(snapshot_parent_files),
    output:
        model=directory(f"{RESULTS}/{{model}}/{{task}}/{{run}}/model"),
        metrics=f"{RESULTS}/{{model}}/{{task}}/{{run}}/metrics.jsonl",
        summary=f"{RESULTS}/{{model}}/{{task}}/{{run}}/summary.json",
    log:
        f"{RESULTS}/logs/{{model}}/{{task}}/{{run}}/snapshot.log",
    wildcard_constraints:
        run=SNAPSHOT_RUN_PATTERN,
    localrule: True
    conda:
        SOFTWARE_ENV
    threads: 1
    params:
        iteration=snapshot_iteration,
        parent=snapshot_parent_run,
        settings=run_settings,
        labels=run_labels,
    script:
        "../workflow_scripts/es_snapshot.py"
