"""Checks of a config beyond its JSON schema: cross-references between blocks.

The schema (schemas/config.schema.yaml) checks types, ranges and fills defaults; this
checks what a schema cannot say (a model's task must be a configured task, k <= n, ...).
Every error names the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from esgrpo.es.settings import LOWRANK_ON_VLLM, ESConfig
from esgrpo.grpo.settings import GRPOSettings
from esgrpo.runs import continual_stage_one, eval_settings, trainer_settings
from esgrpo.settings import yaml_number_hint
from esgrpo.tasks.base import prompt_setting
from esgrpo.tasks.registry import TASKS, get_task
from esgrpo.tasks.rewards import RULES

# Folders of a grid's results folder (esgrpo.grids) that a model or task name would collide with.
RESERVED_NAMES = {"base", "data", "tables", "figures", "logs", "benchmarks", "analysis", "report", "progress"}


class ConfigError(ValueError):
    pass


def check_config(config: dict) -> None:
    """Stop at the first cross-reference that does not hold, naming the key and what is allowed."""
    unknown = sorted(set(config["tasks"]) - set(TASKS))
    if unknown:
        raise ConfigError(f"tasks.{unknown[0]}: unknown task; known tasks: {sorted(TASKS)}")
    for task, options in config["tasks"].items():
        _check_task_options(task, options)
    for model, spec in config["models"].items():
        _check_model(config, model, spec)
    for block in ("models", "tasks"):
        clash = RESERVED_NAMES & set(config[block])
        if clash:
            raise ConfigError(f"{block}: names {sorted(clash)} are reserved for output folders")
    _check_trainers(config)
    _check_sequential(config)
    _check_eval(config)


def _check_task_options(task: str, options: dict) -> None:
    """`prompt` only on tasks whose loader fills a template, with fields it knows; `selection` a value it knows."""
    spec = get_task(task)
    if "prompt" in options:
        if not spec.prompt_fields:
            raise ConfigError(f"tasks.{task}.prompt: {task} keeps its own prompt (an offline miniature); "
                              f"tasks with a prompt option: {sorted(t for t, s in TASKS.items() if s.prompt_fields)}")
        try:
            prompt_setting(options["prompt"], None, spec.prompt_fields)
        except ValueError as err:
            raise ConfigError(f"tasks.{task}.{err}") from None
    if "selection" in options and options["selection"] not in spec.selections:
        allowed = list(spec.selections) or f"none ({task} has one way to choose its rows)"
        raise ConfigError(f"tasks.{task}.selection: {options['selection']!r} is not known; allowed: {allowed}")
    files = options.get("files") or {}
    unknown = sorted(set(files) - set(spec.splits))
    if unknown:
        raise ConfigError(f"tasks.{task}.files: {unknown} are not splits of {task}; allowed: {list(spec.splits)}")
    if options.get("revision") and not files:
        raise ConfigError(f"tasks.{task}.revision: pins the revision its files are read at; name them in "
                          f"tasks.{task}.files")
    unfetchable = sorted(s for s in files if not options.get("source") and s not in spec.hub_ids)
    if unfetchable:
        raise ConfigError(f"tasks.{task}.files: {task} has no Hub dataset to fetch the {unfetchable} files from; "
                          f"set tasks.{task}.source to a local copy")


_SCHEMA_TYPES = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
                 "object": "a mapping", "array": "a list", "null": "null"}


def schema_error(error: Any) -> str:
    """One line for a jsonschema ValidationError of the config: the key, what is wrong, what to write
    (Snakemake's own message prints the failing part of the schema and of the config, up to the whole
    of both for a key at the top level)."""
    key = ".".join(str(p) for p in error.absolute_path) or "the config"
    value, kind = error.instance, error.validator
    if kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(value) - set(allowed)) if isinstance(value, dict) else []
        where = f"{key}." if error.absolute_path else ""
        return (f"{where}{extra[0] if extra else '?'}: unknown key; allowed here: {allowed} "
                f"(schemas/config.schema.yaml)")
    if kind == "type":
        types = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        wanted = " or ".join(_SCHEMA_TYPES.get(t, t) for t in types)
        shown = repr(value) if not isinstance(value, (dict, list)) else f"a {type(value).__name__}"
        return f"{key}: must be {wanted}, got {shown}{yaml_number_hint(value)} (schemas/config.schema.yaml)"
    message = error.message if len(error.message) <= 200 else error.message[:197] + "..."
    return f"{key}: {message} (schemas/config.schema.yaml)"


def _looks_like_a_folder(source: str) -> bool:
    """A path rather than a Hub id (`org/name`) or the `default` / `package:NAME` sources."""
    return source.startswith(("/", "./", "../", "~")) or source.count("/") > 1


def _check_source(model: str, spec: dict) -> None:
    """A folder `source` exists and holds a model in Hugging Face layout (or the model's GGUF file)."""
    source, gguf = str(spec["source"]), spec.get("gguf_file")
    if source == "default" or source.startswith("package:"):
        return
    folder = Path(source).expanduser()
    if not folder.exists() and _looks_like_a_folder(source):
        wanted = f"the folder that holds {gguf} or package:NAME" if gguf else \
            "an existing folder in Hugging Face layout, a Hub id such as Qwen/Qwen2.5-1.5B-Instruct, or default"
        raise ConfigError(f"models.{model}.source: the folder {source} does not exist; give {wanted}")
    if folder.is_dir() and gguf and not (folder / gguf).is_file():
        raise ConfigError(f"models.{model}.gguf_file: {gguf} is not in the folder {source}")
    if folder.is_dir() and not gguf and not (folder / "config.json").is_file():
        raise ConfigError(f"models.{model}.source: the folder {source} has no config.json; point it at a model "
                          f"saved in Hugging Face layout (config.json, tokenizer, safetensors)")


def _check_model(config: dict, model: str, spec: dict) -> None:
    """A model's tasks are configured, have the splits it uses, and some evaluation judges each."""
    _check_source(model, spec)
    if spec.get("sha256") and not spec.get("revision") and not Path(str(spec["source"])).expanduser().is_dir():
        raise ConfigError(f"models.{model}.sha256: a Hub model's files are pinned at a revision; "
                          f"set models.{model}.revision")
    tasks = set(config["tasks"])
    for key in ("tasks", "eval_tasks"):
        unknown = [t for t in spec.get(key, []) if t not in tasks]
        if unknown:
            raise ConfigError(f"models.{model}.{key}: {unknown} are not in the tasks block; "
                              f"allowed: {sorted(tasks)}")
    for key, split, names in (("tasks", "train", spec["tasks"]), ("eval_tasks", "test", model_eval_tasks(config, model))):
        lacking = [t for t in names if split not in get_task(t).splits]
        if lacking:
            raise ConfigError(f"models.{model}.{key}: {lacking} have no {split} split"
                              + ("; list them under tasks and evaluate on another task with eval_tasks"
                                 if split == "test" else ""))
    unjudged = [t for t in spec["tasks"] if not judged_on(config, model, t)]
    if unjudged:
        raise ConfigError(f"models.{model}.eval_tasks: nothing measures training on {unjudged}; "
                          f"evaluate on them or on a task the model does not train on")
    if spec["source"] == "default" and "default_model" not in config:
        raise ConfigError(f"models.{model}.source is 'default' but there is no default_model block")
    no_train = [t for t in model_warmup_tasks(config, model) if "train" not in get_task(t).splits]
    if spec["source"] == "default" and no_train:
        raise ConfigError(f"models.{model}.eval_tasks: {no_train} have no train split for the default model's warm-up")


def _check_trainers(config: dict) -> None:
    """The es and grpo blocks build their trainer's settings (so a typo stops the workflow before any job)."""
    tasks = set(config["tasks"])
    for block in ("es", "grpo"):
        if block in config:
            _check_overridden(f"{block}.settings", block, config[block]["settings"])
    if "es" in config:
        _check_settings("es.settings", ESConfig, config["es"]["settings"],
                        population_size=config["es"]["population_sizes"][0])
        _check_settings("es.snapshots", ESConfig, config["es"]["settings"],
                        population_size=config["es"]["population_sizes"][0],
                        snapshots=list(config["es"].get("snapshots") or []))
        low = config["es"]["settings"].get("noise") == "lowrank" or (config["es"].get("ablations") or {}).get("ranks")
        if low and config["es"].get("backend", "hf") == "vllm":
            raise ConfigError(f"es.settings.noise / es.ablations.ranks: {LOWRANK_ON_VLLM}")
        ablation_task = (config["es"].get("ablations") or {}).get("task")
        if ablation_task is not None and ablation_task not in tasks:
            raise ConfigError(f"es.ablations.task: {ablation_task!r} is not in the tasks block; "
                              f"allowed: {sorted(tasks)}")
    if "grpo" in config:
        _check_settings("grpo.settings", GRPOSettings, config["grpo"]["settings"],
                        num_generations=config["grpo"]["group_sizes"][0])
    for model in config["models"]:
        _check_model_settings(config, model)


# ES settings that the run names say for the whole grid (the main runs' noise rank): not a model's to change.
GRID_ES_SETTINGS = {"noise": "es.settings.noise (the run names say the noise rank: es-n16-r4-s0)",
                    "rank": "es.settings.rank (the run names say the noise rank: es-n16-r4-s0)"}


def _check_model_settings(config: dict, model: str) -> None:
    """A model's overrides of es.settings / grpo.settings (`models.<model>.es.settings`, and per training task
    `models.<model>.per_task.<task>.es.settings`): blocks the config has, tasks the model trains on, keys its
    trainer knows that no other key sets; then every (task, method) the model trains builds its settings."""
    spec = config["models"][model]
    overrides = [(f"models.{model}.{m}.settings", m, (spec.get(m) or {}).get("settings")) for m in ("es", "grpo")]
    for task, blocks in (spec.get("per_task") or {}).items():
        if task not in spec["tasks"]:
            raise ConfigError(f"models.{model}.per_task.{task}: {model} does not train on {task}; "
                              f"allowed: {spec['tasks']} (its tasks)")
        overrides += [(f"models.{model}.per_task.{task}.{m}.settings", m, (blocks.get(m) or {}).get("settings"))
                      for m in ("es", "grpo")]
    for key, method, settings in overrides:
        if settings is None:
            continue
        if method not in config:
            raise ConfigError(f"{key}: the config has no {method} block for it to override")
        _check_overridden(key, method, settings)
        for name, use in GRID_ES_SETTINGS.items() if method == "es" else ():
            if name in settings:
                raise ConfigError(f"{key}.{name}: one for the whole grid: {use}, not per model")
        _check_keys(key, ESConfig if method == "es" else GRPOSettings, settings)
    if not any(settings is not None for *_, settings in overrides):
        return
    es, grpo = config.get("es"), config.get("grpo")
    for task in spec["tasks"]:
        on_task = (spec.get("per_task") or {}).get(task) or {}
        where = {m: f"models.{model}{f'.per_task.{task}' if m in on_task else ''}.{m}.settings "
                    f"(merged over {m}.settings, on {task})" for m in ("es", "grpo")}
        if es:
            _check_settings(where["es"], ESConfig, trainer_settings(config, "es", model, task),
                            population_size=es["population_sizes"][0], snapshots=list(es.get("snapshots") or []))
        if grpo:
            _check_settings(where["grpo"], GRPOSettings, trainer_settings(config, "grpo", model, task),
                            num_generations=grpo["group_sizes"][0])


def _check_sequential(config: dict) -> None:
    tasks = set(config["tasks"])
    seq = config.get("sequential") or {}
    if "task" in seq and seq["task"] not in tasks:
        raise ConfigError(f"sequential.task: {seq['task']!r} is not in the tasks block; allowed: {sorted(tasks)}")
    bad_order = [t for t in seq.get("continual", []) if t not in tasks]
    if bad_order:
        raise ConfigError(f"sequential.continual: {bad_order} are not in the tasks block; allowed: {sorted(tasks)}")
    _check_stage_one(config)


def _check_stage_one(config: dict) -> None:
    """Stage 1 of a continual sequence is the main run for every model or for none (the tables read one
    grid-wide alias, esgrpo.report.planning): a model's own budget may not split it."""
    seq = config.get("sequential") or {}
    if not seq.get("continual"):
        return
    for method in [m for m in seq.get("continual_methods", ["es", "grpo"]) if config.get(m)]:
        for seed in config[method].get("seeds", [0]):
            aliased = {m: continual_stage_one(config, m, method, seed) is not None for m in config["models"]}
            if len(set(aliased.values())) > 1:
                raise ConfigError(
                    f"models.<model>.{method}.settings: sequential.continual_budget equals the main {method} run's "
                    f"budget for {sorted(m for m, a in aliased.items() if a)} and not for "
                    f"{sorted(m for m, a in aliased.items() if not a)}: stage 1 of the continual sequence would be "
                    f"the main run for some models only; give those models the same budget")


def _check_eval(config: dict) -> None:
    """eval.ks within n_samples; engine blocks (vllm.LLM arguments) only with the vllm backend."""
    ev = config.get("eval", {})
    for key, block in [("eval", ev)] + [(f"models.{m}.eval", eval_settings(config, m)) for m in config["models"]]:
        n = block.get("n_samples", 32)
        bad = [k for k in block.get("ks", []) if k > n]
        if bad:
            merged = "" if key == "eval" else " (merged over eval)"
            raise ConfigError(f"{key}.ks: {bad} exceed n_samples={n}{merged}; every k must be <= n_samples")
        _check_engine_block(f"{key}.engine", block.get("engine") or {}, block.get("backend", "hf"), _EVAL_ENGINE_OWN)
    es = config.get("es") or {}
    _check_engine_block("es.engine", {k: v for k, v in (es.get("engine") or {}).items()
                                      if k not in ("num_engines", "dtype")}, es.get("backend", "hf"), _ES_ENGINE_OWN)


# Arguments the engines set themselves: a second value would be a duplicate-keyword TypeError.
_EVAL_ENGINE_OWN = ("model", "dtype", "seed", "llm")
_ES_ENGINE_OWN = (*_EVAL_ENGINE_OWN, "worker_extension_cls", "tensor_parallel_size")


def _check_engine_block(key: str, engine: dict, backend: str, own_arguments: Sequence[str]) -> None:
    """`engine` holds further vllm.LLM arguments: only with the vllm backend, none the engine sets itself."""
    if engine and backend != "vllm":
        raise ConfigError(f"{key}: vllm.LLM arguments {sorted(engine)} but the backend is {backend!r}; "
                          f"set backend: vllm or remove them")
    own = sorted(set(engine) & set(own_arguments))
    if own:
        raise ConfigError(f"{key}: {own} are set by the engine itself (dtype goes in the block above it)")


# Trainer settings that another key of the config sets for every run: a value under `settings` would be
# overridden without a word. Each names the key to use instead.
OVERRIDDEN = {
    "es": {"population_size": "es.population_sizes (the main run is the first)",
           "seed": "es.seeds", "snapshots": "es.snapshots (the main ES runs export them, each a run of its own)",
           "reward_rules": f"rewards.rules, once for training and evaluation (allowed: {list(RULES)})"},
    "grpo": {"num_generations": "grpo.group_sizes (the main run is the first)", "seed": "grpo.seeds",
             "reward_rules": f"rewards.rules, once for training and evaluation (allowed: {list(RULES)})"},
}
# ES settings that the run names set: the main runs' values may be stated, others go to es.ablations.
MAIN_ES_VALUES = {"normalization": ("zscore", "es.ablations.normalization"),
                  "antithetic": (False, "es.ablations.antithetic")}


def _check_overridden(key: str, block: str, settings: dict) -> None:
    """Refuse a trainer setting (at `key`, of trainer `block`) that another key overrides, naming the key to use."""
    for name, use in OVERRIDDEN[block].items():
        if name in settings:
            raise ConfigError(f"{key}.{name}: set by {use}, not here")
    for name, (main, use) in MAIN_ES_VALUES.items() if block == "es" else ():
        if name in settings and settings[name] != main:
            raise ConfigError(f"{key}.{name}: the main runs use {main!r}; ablation runs take theirs from {use}")


def _check_keys(key: str, settings_class, settings: dict) -> None:
    """An unknown setting lists the keys allowed here (not those another key sets, OVERRIDDEN)."""
    fields = {f.name for f in dataclasses.fields(settings_class)}
    unknown = sorted(set(settings) - fields)
    if unknown:
        allowed = sorted(fields - set(OVERRIDDEN["es" if settings_class is ESConfig else "grpo"]))
        raise ConfigError(f"{key}: unknown setting(s) {unknown}; allowed: {allowed}")


def _check_settings(key: str, settings_class, settings: dict, **grid_values) -> None:
    """Build the trainer's settings once so a typo stops the workflow before any job runs; an unknown key
    lists the keys allowed here (not those another key sets, OVERRIDDEN)."""
    _check_keys(key, settings_class, settings)
    try:
        settings_class.from_dict({**settings, **grid_values})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{key}: {err}") from None


def software_env(config: dict) -> str:
    """'gpu' when any job of the config needs CUDA or vLLM (envs/gpu.yaml), else 'cpu' (envs/cpu.yaml)."""
    evals = [config.get("eval", {})] + [spec.get("eval", {}) for spec in config["models"].values()]
    gpu_eval = any(ev.get("backend") == "vllm" or str(ev.get("device", "cpu")).startswith("cuda") for ev in evals)
    grpo_vllm = "grpo" in config and any(trainer_settings(config, "grpo", m, t).get("use_vllm")
                                         for m, spec in config["models"].items() for t in spec["tasks"])
    gpu_train = grpo_vllm or (config.get("es") or {}).get("backend") == "vllm"
    return "gpu" if gpu_eval or gpu_train else "cpu"


def model_eval_tasks(config: dict, model: str) -> list[str]:
    """The tasks every checkpoint of `model` is evaluated on: `eval_tasks`, else its training tasks."""
    spec = config["models"][model]
    return list(spec.get("eval_tasks") or spec["tasks"])


def model_warmup_tasks(config: dict, model: str) -> list[str]:
    """The tasks the offline default model is warmed up on: its training tasks, then its other eval
    tasks. A held-out task is then a skill the base has and no run trains, so forgetting is measurable."""
    return list(dict.fromkeys([*config["models"][model]["tasks"], *model_eval_tasks(config, model)]))


def judged_on(config: dict, model: str, train_task: str) -> list[str]:
    """The evaluation tasks that measure training on `train_task` (the 'on-task' accuracy): the task
    itself when it is evaluated, else the eval tasks the model does not train on (DeepScaleR ->
    MATH-500)."""
    evals = model_eval_tasks(config, model)
    if train_task in evals:
        return [train_task]
    return [t for t in evals if t not in config["models"][model]["tasks"]]


def task_splits(config: dict, task: str) -> list[str]:
    """The splits of `task` some model uses: train if a model trains on it, test if one evaluates on
    it (a task no model uses: every split its source has)."""
    splits = set()
    for model, spec in config["models"].items():
        if task in spec["tasks"] or (spec["source"] == "default" and task in model_warmup_tasks(config, model)):
            splits.add("train")
        if task in model_eval_tasks(config, model):
            splits.add("test")
    return [s for s in ("train", "test") if s in splits] or list(get_task(task).splits)
