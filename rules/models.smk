# Models: the offline default is built here (tokenizer, tiny Llama, warm-up); other models are
# read by Hub id or path at evaluation and training time.


def default_model_tasks(wildcards):
    return model_tasks(wildcards.model)


rule build_default_model:
    input:
        train=lambda wc: expand(f"{RESULTS}/data/{{t}}/train.jsonl", t=model_tasks(wc.model)),
        info=lambda wc: expand(f"{RESULTS}/data/{{t}}/info.json", t=model_tasks(wc.model)),
    output:
        model=directory(f"{RESULTS}/{{model}}/base/model"),
        info=f"{RESULTS}/{{model}}/base/build.json",
    params:
        tasks=lambda wc: model_tasks(wc.model),
        seed=config["seed"],
        vocab_size=config["default_model"]["vocab_size"],
        architecture=config["default_model"]["architecture"],
        warmup=config["default_model"]["warmup"],
    log:
        f"{RESULTS}/logs/{{model}}/build_default_model.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/build_default_model.tsv"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    script:
        "../workflow_scripts/build_default_model.py"
