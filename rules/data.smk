# Data preparation: every task's train and test rows, materialised once. A split no model uses
# (the train split of an evaluation-only task) is written empty and never downloaded.


rule prepare_task:
    output:
        train=f"{RESULTS}/data/{{task}}/train.jsonl",
        test=f"{RESULTS}/data/{{task}}/test.jsonl",
        info=f"{RESULTS}/data/{{task}}/info.json",
    log:
        f"{RESULTS}/logs/data/{{task}}.log",
    conda:
        SOFTWARE_ENV
    threads: 1
    resources:
        mem_mb=sized("mem_mb", 16000),  # DeepScaleR (40k rows) and SciKnowEval load whole splits
        runtime=sized("runtime", 60),
    params:
        options=task_options,
        splits=used_splits,
        seed=config["seed"],
    script:
        "../workflow_scripts/prepare_task.py"
