# Evaluation of a checkpoint on every task of its model: n samples per prompt plus a greedy pass.


rule eval_base:
    input:
        unpack(eval_data),
        model=base_model_files,
    output:
        summary=f"{RESULTS}/{{model}}/base/eval.json",
        prompts=f"{RESULTS}/{{model}}/base/eval_prompts.jsonl",
    log:
        f"{RESULTS}/logs/{{model}}/base/eval.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/base/eval.tsv"
    conda:
        SOFTWARE_ENV
    threads: planned("eval_base", "threads", 1)
    resources:
        mem_mb=planned("eval_base", "mem_mb", 2000),
        runtime=planned("eval_base", "runtime", 60),
        gpu=planned("eval_base", "gpu", 0),
        cpus_per_gpu=planned("eval_base", "cpus_per_gpu", 0),
        gpu_model=planned("eval_base", "gpu_model", ""),
    params:
        model=base_model_ref,
        eval=eval_base_settings,
        eval_tasks=eval_tasks,
        run="base",
        train_task="none",
    script:
        "../workflow_scripts/evaluate.py"


rule eval_run:
    input:
        unpack(eval_data),
        model=f"{RESULTS}/{{model}}/{{task}}/{{run}}/model",
    output:
        summary=f"{RESULTS}/{{model}}/{{task}}/{{run}}/eval.json",
        prompts=f"{RESULTS}/{{model}}/{{task}}/{{run}}/eval_prompts.jsonl",
    log:
        f"{RESULTS}/logs/{{model}}/{{task}}/{{run}}/eval.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/{{task}}/{{run}}/eval.tsv"
    conda:
        SOFTWARE_ENV
    threads: planned("eval_run", "threads", 1)
    resources:
        mem_mb=planned("eval_run", "mem_mb", 2000),
        runtime=planned("eval_run", "runtime", 60),
        gpu=planned("eval_run", "gpu", 0),
        cpus_per_gpu=planned("eval_run", "cpus_per_gpu", 0),
        gpu_model=planned("eval_run", "gpu_model", ""),
    params:
        model=run_model,
        eval=eval_run_settings,
        eval_tasks=eval_tasks,
        run="{run}",
        train_task="{task}",
    script:
        "../workflow_scripts/evaluate.py"
