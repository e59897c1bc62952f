# Evaluation of a checkpoint on every task of its model: n samples per prompt plus a greedy pass.


def eval_inputs(wildcards):
    tasks = model_tasks(wildcards.model)
    return {
        "test": expand(f"{RESULTS}/data/{{t}}/test.jsonl", t=tasks),
        "info": expand(f"{RESULTS}/data/{{t}}/info.json", t=tasks),
    }


rule eval_base:
    input:
        unpack(eval_inputs),
        model=base_model_files,
    output:
        summary=f"{RESULTS}/{{model}}/base/eval.json",
        prompts=f"{RESULTS}/{{model}}/base/eval_prompts.jsonl",
    params:
        model=base_model_ref,
        eval=lambda wc: eval_params(wc.model),
        eval_tasks=lambda wc: model_tasks(wc.model),
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
    script:
        "../workflow_scripts/evaluate.py"
