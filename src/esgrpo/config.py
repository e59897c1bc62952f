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
    ev = config.get("eval", {})
    n = ev.get("n_samples", 32)
    bad = [k for k in ev.get("ks", []) if k > n]
    if bad:
        raise ConfigError(f"eval.ks: {bad} exceed eval.n_samples={n}; every k must be <= n_samples")
