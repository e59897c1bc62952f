# The rules' input functions and parameters, from the config: each model's files and tasks, each run's
# folder, settings and start, the evaluation settings and the analyses' jobs and inputs. Plain constants
# and functions; the plan's choices reach them through with_plan (rules/resources.smk).
from pathlib import Path

from esgrpo.analysis.jobs import analysis_jobs
from esgrpo.analysis.settings import analysis_config, analysis_eval_settings, next_seed
from esgrpo.config import judged_on, model_eval_tasks, model_warmup_tasks, task_splits
from esgrpo.pins import model_snapshot_folder
from esgrpo.runs import (
    IN_PLACE_DTYPE,
    arithmetic_run_name,
    eval_settings,
    main_es_name,
    main_grpo_name,
    pair_arithmetic,
    pair_seed,
    parse_run_name,
    reward_rules_setting,
    run_spec,
)

# --- models ------------------------------------------------------------------------------------

# Models shipped as a GGUF file (`models.<name>.gguf_file`) are converted once to HF layout.
GGUF_MODELS = [m for m, spec in config["models"].items() if spec.get("gguf_file")]


def model_tasks(model):
    """The tasks `model` is trained on."""
    return config["models"][model]["tasks"]


def train_tasks(wildcards):
    """The tasks the job's model is trained on."""
    return model_tasks(wildcards.model)


def eval_tasks(wildcards):
    """The tasks every checkpoint of the job's model is evaluated on (`eval_tasks`, default: its training tasks)."""
    return model_eval_tasks(config, wildcards.model)


def model_source(wildcards):
    """The model's `source`: a Hub id, a folder, "default", or a package holding its GGUF file."""
    return config["models"][wildcards.model]["source"]


def model_gguf_file(wildcards):
    return config["models"][wildcards.model]["gguf_file"]


def base_model_is_built(model):
    """Built here: the offline default, or a GGUF model converted once to HF layout."""
    spec = config["models"][model]
    return spec["source"] == "default" or bool(spec.get("gguf_file"))


def base_model_is_pinned(model):
    """A Hub id or folder with a pinned revision or file checksums (esgrpo.pins; rule pin_model checks them)."""
    spec = config["models"][model]
    return not base_model_is_built(model) and bool(spec.get("revision") or spec.get("sha256"))


PINNED_MODELS = [m for m in MODELS if base_model_is_pinned(m)]


def base_model_files(wildcards):
    """The built base checkpoint, when the model is built here (not a Hub id or a folder); for a pinned
    model, the record of its checked files (so that no job reads it before the check)."""
    if base_model_is_built(wildcards.model):
        return f"{RESULTS}/{wildcards.model}/base/model"
    if base_model_is_pinned(wildcards.model):
        return f"{RESULTS}/{wildcards.model}/base/pin.json"
    return []


def base_model_ref(wildcards):
    if base_model_is_built(wildcards.model):
        return f"{RESULTS}/{wildcards.model}/base/model"
    spec = config["models"][wildcards.model]
    if spec.get("revision") and not Path(spec["source"]).expanduser().is_dir():
        return str(model_snapshot_folder(spec["source"], spec["revision"]))  # the pinned revision's files
    return spec["source"]


def model_revision(wildcards):
    return config["models"][wildcards.model].get("revision")


def model_sha256(wildcards):
    return dict(config["models"][wildcards.model].get("sha256") or {})


def task_files(tasks, split="test"):
    return {
        split: expand(f"{RESULTS}/data/{{t}}/{split}.jsonl", t=tasks),
        "info": expand(f"{RESULTS}/data/{{t}}/info.json", t=tasks),
    }


def task_options(wildcards):
    """The task's block of the config (source, sizes, loader options)."""
    return config["tasks"][wildcards.task]


def used_splits(wildcards):
    """The splits of the task some model trains or evaluates on (esgrpo.config.task_splits)."""
    return task_splits(config, wildcards.task)


def train_data(wildcards):
    """Train rows and info of every training task of the model."""
    return task_files(train_tasks(wildcards), split="train")


def warmup_tasks(wildcards):
    """The tasks the default model is warmed up on: its training tasks and its held-out eval tasks."""
    return model_warmup_tasks(config, wildcards.model)


def warmup_data(wildcards):
    return task_files(warmup_tasks(wildcards), split="train")


def eval_data(wildcards):
    """Test rows and info of every evaluation task of the model."""
    return task_files(eval_tasks(wildcards))


def judged_tasks(wildcards):
    """The evaluation tasks that measure training on {task} (itself, or e.g. MATH-500 for DeepScaleR)."""
    return judged_on(config, wildcards.model, wildcards.task)


def judged_data(wildcards):
    return task_files(judged_tasks(wildcards))


# --- runs --------------------------------------------------------------------------------------


def run_dir(model, task, run):
    return f"{RESULTS}/{model}/{task}/{run}"


def run_model(wildcards):
    return f"{run_dir(wildcards.model, wildcards.task, wildcards.run)}/model"


def run_spec_of(wildcards):
    """What the run's name says (esgrpo.runs.RunSpec): method, settings, labels, start."""
    return run_spec(config, wildcards.model, wildcards.task, wildcards.run)


def run_method(wildcards):
    return run_spec_of(wildcards).method


def run_settings(wildcards):
    return run_spec_of(wildcards).settings


def run_labels(wildcards):
    return run_spec_of(wildcards).labels


def init_model_ref(wildcards):
    """The checkpoint a run starts from: the base, or (sequential runs) the previous stage's model."""
    spec = run_spec_of(wildcards)
    if spec.init is None:
        return base_model_ref(wildcards)
    return f"{run_dir(wildcards.model, *spec.init)}/model"


def snapshot_parent_dir(wildcards):
    """The folder of the ES run a snapshot run was exported by."""
    return run_dir(wildcards.model, *run_spec_of(wildcards).init)


def snapshot_parent_files(wildcards):
    """The model, metrics and summary of the ES run a snapshot run was exported by."""
    parent = snapshot_parent_dir(wildcards)
    return {
        "model": f"{parent}/model",
        "metrics": f"{parent}/metrics.jsonl",
        "summary": f"{parent}/summary.json",
    }


def snapshot_iteration(wildcards):
    """The parent ES run's iterations when it exported this snapshot."""
    return run_labels(wildcards)["iterations"]


def snapshot_parent_run(wildcards):
    return run_labels(wildcards)["snapshot_of"]


def init_model_files(wildcards):
    spec = run_spec_of(wildcards)
    return base_model_files(wildcards) if spec.init is None else init_model_ref(wildcards)


def eval_params(model):
    """Evaluation settings: the global block, overridden per model (esgrpo.runs.eval_settings), graded under
    rewards.rules."""
    return {**eval_settings(config, model), **reward_rules_setting(config)}


def eval_base_settings(wildcards):
    """The evaluation settings of the job's model, with the plan's engine choices (GPU configs)."""
    return with_plan("eval_base", wildcards, eval_params(wildcards.model))


def eval_run_settings(wildcards):
    return with_plan("eval_run", wildcards, eval_params(wildcards.model))


def engine_setting(wildcards, key, default):
    """One of the model's engine settings (dtype, device, batch_size) for analysis jobs."""
    return eval_params(wildcards.model).get(key, default)


def engine_dtype(wildcards):
    return engine_setting(wildcards, "dtype", "float32")


def engine_device(wildcards):
    return engine_setting(wildcards, "device", "cpu")


def base_samples_batch_size(wildcards):
    default = {"batch_size": engine_setting(wildcards, "batch_size", 256)}
    return with_plan("analysis_base_samples", wildcards, default)["batch_size"]


# --- analyses ----------------------------------------------------------------------------------
# Every analysis output lives under {RESULTS}/analysis/{model}/ and is a tidy CSV (columns: the
# ANALYSIS table in esgrpo/workflow/stages/analysis.py). theta0 is always the model's base checkpoint.
# Analyses pairing ES with GRPO (cosine, interpolation) need both an `es` and a `grpo` block.

ANALYSIS = analysis_config(config)
ANALYSIS_DIR = f"{RESULTS}/analysis"


# The analysis jobs as records (esgrpo.analysis.jobs): kind, model, task, run and outputs; fixed for the run,
# computed once, not again in every paper table's input function.
ANALYSIS_JOBS = analysis_jobs(config, RESULTS)
ALL_ANALYSIS_TARGETS = [path for job in ANALYSIS_JOBS for path in job.outputs]


def analysis_eval(wildcards):
    settings = analysis_eval_settings(eval_params(wildcards.model), ANALYSIS["eval"])
    return with_plan("analysis_sparsity", wildcards, settings)


def analysis_interpolation_eval(wildcards):
    overrides = {**ANALYSIS["eval"], **ANALYSIS["interpolation_eval"]}
    settings = analysis_eval_settings(eval_params(wildcards.model), overrides)
    return with_plan("analysis_interpolation", wildcards, settings)


def analysis_kl_settings(wildcards):
    kl = dict(ANALYSIS["kl"])
    if kl.get("max_new_tokens") is None:
        kl["max_new_tokens"] = eval_params(wildcards.model).get("max_new_tokens", 24)
    return kl


def kl_base_samples(wildcards):
    """The base model's fixed continuations on every evaluation task of the model (KL's reference)."""
    return expand(f"{ANALYSIS_DIR}/{wildcards.model}/base_samples/{{t}}.jsonl", t=eval_tasks(wildcards))


def _main_run_model(wildcards, main_name, seed):
    return f"{run_dir(wildcards.model, wildcards.task, main_name(config, seed))}/model"


def run_start_dtype(model, task, run):
    """The dtype of a run's start: a run of a paper's arithmetic starts from its weights' copy (esgrpo.runs.
    IN_PLACE_DTYPE; on the vLLM backend the engines' dtype), every other run from the checkpoint's values."""
    if parse_run_name(run).arithmetic is None:
        return "float32"
    es = config.get("es") or {}
    if es.get("backend", "hf") == "vllm":
        return (es.get("engine") or {}).get("dtype", IN_PLACE_DTYPE)
    return IN_PLACE_DTYPE


def start_dtype(wildcards):
    return run_start_dtype(wildcards.model, wildcards.task, wildcards.run)


def pair_es_run(wildcards):
    """The ES end of a pair analysis: the seed's main ES run, or the run of the paper's arithmetic it names."""
    seed, arithmetic = pair_seed(wildcards.pair), pair_arithmetic(wildcards.pair)
    if arithmetic is None:
        return main_es_name(config, seed)
    return arithmetic_run_name(config, seed, arithmetic)


def pair_es_model(wildcards):
    """The model of the pair's ES run: the ES end of the pair analyses."""
    return f"{run_dir(wildcards.model, wildcards.task, pair_es_run(wildcards))}/model"


def pair_es_start_dtype(wildcards):
    return run_start_dtype(wildcards.model, wildcards.task, pair_es_run(wildcards))


def pair_grpo_model(wildcards):
    """The model of this seed's main GRPO run: the GRPO end of the pair analyses."""
    return _main_run_model(wildcards, main_grpo_name, pair_seed(wildcards.pair))


def analysis_cosine_pairs(wildcards):
    """es-grpo of this pair; for the main runs' pair also es-es and grpo-grpo of this seed with the next
    configured seed. An ES end's delta is from its start (`a_start_dtype`)."""
    seed = pair_seed(wildcards.pair)
    pairs = [
        {
            "pair": "es-grpo",
            "a": pair_es_model(wildcards),
            "b": pair_grpo_model(wildcards),
            "seed_b": seed,
            "a_start_dtype": pair_es_start_dtype(wildcards),
        }
    ]
    if pair_arithmetic(wildcards.pair) is not None:
        return pairs
    for method, main_name in (("es", main_es_name), ("grpo", main_grpo_name)):
        other = next_seed(config, method, seed)
        if other is not None:
            pairs.append(
                {
                    "pair": f"{method}-{method}",
                    "a": _main_run_model(wildcards, main_name, seed),
                    "b": _main_run_model(wildcards, main_name, other),
                    "seed_b": other,
                    "a_start_dtype": "float32",
                }
            )
    return pairs


def analysis_cosine_models(wildcards):
    return sorted({ref for p in analysis_cosine_pairs(wildcards) for ref in (p["a"], p["b"])})
