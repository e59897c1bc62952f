# Evaluation of a checkpoint on every task of its model: n samples per prompt plus a greedy pass.


rule eval_base:
    input:
        unpack(eval_data),
        model=base_model_files,
    output:
        summary=f"{RESULTS}/{{model}}/base/eval.json",
        prompts=f"{RESULTS}/{{model}}/base/eval_prompts.jsonl",
    params:
        model=base_model_ref,
        eval=lambda wc: eval_params(wc.model),
        eval_tasks=lambda wc: eval_tasks(wc.model),
        run="base",
        train_task="none",
    log:
        f"{RESULTS}/logs/{{model}}/base/eval.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/base/eval.tsv"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=60,
    conda:
        SOFTWARE_ENV
    script:
        "../workflow_scripts/evaluate.py"


rule eval_run:
    input:
        unpack(eval_data),
        model=f"{RESULTS}/{{model}}/{{task}}/{{run}}/model",
    output:
        summary=f"{RESULTS}/{{model}}/{{task}}/{{run}}/eval.json",
        prompts=f"{RESULTS}/{{model}}/{{task}}/{{run}}/eval_prompts.jsonl",
    params:
        model=run_model,
        eval=lambda wc: eval_params(wc.model),
        eval_tasks=lambda wc: eval_tasks(wc.model),
        run=lambda wc: wc.run,
        train_task=lambda wc: wc.task,
    log:
        f"{RESULTS}/logs/{{model}}/{{task}}/{{run}}/eval.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/{{task}}/{{run}}/eval.tsv"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=60,
    conda:
        SOFTWARE_ENV
    script:
        "../workflow_scripts/evaluate.py"
