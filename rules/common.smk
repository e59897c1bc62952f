# Helpers shared by the rule files: names, paths and parameters derived from the config.
import json

from esgrpo.config import check_config
from esgrpo.runs import RUN_PATTERN, planned_runs, run_spec

check_config(config)

RESULTS = "results"
MODELS = list(config["models"])
TASKS = list(config["tasks"])


def _alternatives(names):
    return "|".join(re.escape(n) for n in names)


wildcard_constraints:
    model=_alternatives(MODELS),
    task=_alternatives(TASKS),
    evaltask=_alternatives(TASKS),
    run=RUN_PATTERN,


def model_tasks(model):
    return config["models"][model]["tasks"]


def base_model_is_built(model):
    """Built here: the offline default, or a GGUF model converted once to HF layout."""
    spec = config["models"][model]
    return spec["source"] == "default" or bool(spec.get("gguf_file"))


def base_model_files(wildcards):
    """The built base checkpoint, when the model is built here (not a Hub id or a folder)."""
    if base_model_is_built(wildcards.model):
        return f"{RESULTS}/{wildcards.model}/base/model"
    return []


def base_model_ref(wildcards):
    if base_model_is_built(wildcards.model):
        return f"{RESULTS}/{wildcards.model}/base/model"
    return config["models"][wildcards.model]["source"]


def eval_params(model):
    """Evaluation settings: the global block, overridden per model."""
    return {**config["eval"], **config["models"][model].get("eval", {})}


def base_eval_targets():
    return [f"{RESULTS}/{m}/base/eval.json" for m in MODELS]


def table_targets(name):
    return [f"{RESULTS}/tables/{name}.{ext}" for ext in ("csv", "md", "tex")]


def run_dir(model, task, run):
    return f"{RESULTS}/{model}/{task}/{run}"


def run_eval_targets(model=None):
    models = [model] if model else MODELS
    return [f"{run_dir(m, t, r)}/eval.json" for m in models for t, r in planned_runs(config, m)]


def all_targets():
    """Every evaluation, analysis, table and figure (analysis.smk and paper.smk define theirs)."""
    targets = [*table_targets("base_passk"), f"{RESULTS}/figures/base_passk.png", *run_eval_targets()]
    targets += [path for model in MODELS for path in analysis_targets(model)]
    return [*targets, *paper_targets()]
