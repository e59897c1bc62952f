"""Checks of a config beyond its JSON schema: cross-references between blocks.

The schema (schemas/config.schema.yaml) checks types, ranges and fills defaults; this
checks what a schema cannot say (a model's task must be a configured task, k <= n, ...).
Every error names the key and what is allowed.
"""

from __future__ import annotations


class ConfigError(ValueError):
    pass


def check_config(config: dict) -> None:
    tasks = set(config["tasks"])
    from esgrpo.tasks.base import TASKS, get_task

    for name in tasks:
        try:
            get_task(name)
        except KeyError:
            raise ConfigError(f"tasks.{name}: unknown task; known tasks: {sorted(TASKS)}") from None
    for model, spec in config["models"].items():
        unknown = [t for t in spec["tasks"] if t not in tasks]
        if unknown:
            raise ConfigError(f"models.{model}.tasks: {unknown} are not in the tasks block; "
                              f"allowed: {sorted(tasks)}")
        if spec["source"] == "default" and "default_model" not in config:
            raise ConfigError(f"models.{model}.source is 'default' but there is no default_model block")
    reserved = {"base", "data", "tables", "figures", "logs", "benchmarks", "analysis", "report"}
    for block in ("models", "tasks"):
        clash = reserved & set(config[block])
        if clash:
            raise ConfigError(f"{block}: names {sorted(clash)} are reserved for output folders")
    if "es" in config:
        from esgrpo.es import ESConfig

        _check_settings("es.settings", ESConfig, config["es"]["settings"],
                        population_size=config["es"]["population_sizes"][0])
        ablation_task = (config["es"].get("ablations") or {}).get("task")
        if ablation_task is not None and ablation_task not in tasks:
            raise ConfigError(f"es.ablations.task: {ablation_task!r} is not in the tasks block; "
                              f"allowed: {sorted(tasks)}")
    if "grpo" in config:
        from esgrpo.grpo import GRPOSettings

        _check_settings("grpo.settings", GRPOSettings, config["grpo"]["settings"],
                        num_generations=config["grpo"]["group_sizes"][0])
    seq = config.get("sequential") or {}
    for key in ("task",):
        if key in seq and seq[key] not in tasks:
            raise ConfigError(f"sequential.{key}: {seq[key]!r} is not in the tasks block; allowed: {sorted(tasks)}")
    bad_order = [t for t in seq.get("continual", []) if t not in tasks]
    if bad_order:
        raise ConfigError(f"sequential.continual: {bad_order} are not in the tasks block; allowed: {sorted(tasks)}")
    ev = config.get("eval", {})
    n = ev.get("n_samples", 32)
    bad = [k for k in ev.get("ks", []) if k > n]
    if bad:
        raise ConfigError(f"eval.ks: {bad} exceed eval.n_samples={n}; every k must be <= n_samples")


def _check_settings(key: str, settings_class, settings: dict, **grid_values) -> None:
    """Build the trainer's settings once so a typo stops the workflow before any job runs."""
    try:
        settings_class.from_dict({**settings, **grid_values})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{key}: {err}") from None


def software_env(config: dict) -> str:
    """'gpu' when any job of the config needs CUDA or vLLM (envs/gpu.yaml), else 'cpu' (envs/cpu.yaml)."""
    evals = [config.get("eval", {})] + [spec.get("eval", {}) for spec in config["models"].values()]
    gpu_eval = any(ev.get("backend") == "vllm" or str(ev.get("device", "cpu")).startswith("cuda") for ev in evals)
    gpu_train = bool((config.get("grpo") or {}).get("settings", {}).get("use_vllm"))
    return "gpu" if gpu_eval or gpu_train else "cpu"
