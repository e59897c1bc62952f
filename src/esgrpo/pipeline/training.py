"""Stage: train one run (ES or GRPO) from its start checkpoint, as its run name specifies."""

from __future__ import annotations

from pathlib import Path

from esgrpo.io import read_json
from esgrpo.models import load_model
from esgrpo.pipeline.data import load_rows
from esgrpo.provenance import provenance
from esgrpo.rewards import reward


def train_run(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    method, settings = params["method"], dict(params["settings"])
    rows = load_rows(input["train"])
    verifier = read_json(input["info"])["verifier"]
    out_dir = Path(output["summary"]).parent
    progress_dir = Path(params["progress_dir"])
    print(f"{method} on {wildcards['task']} from {params['init_model']}: {settings}", flush=True)
    if method == "es":
        from esgrpo.es import ESConfig, make_population_evaluator, train_es

        cfg = ESConfig.from_dict(settings)
        model, tokenizer = load_model(params["init_model"], dtype=params.get("dtype", "float32"))

        def reward_fn(text: str, row: dict) -> float:
            return reward(verifier, text, row["answer"], row["meta"], cfg.reward_scheme, cfg.format_bonus)

        evaluator = make_population_evaluator(model, tokenizer, reward_fn)
        summary = train_es(model, tokenizer, rows, cfg, evaluator, out_dir, progress_dir)
    elif method == "grpo":
        from esgrpo.grpo import GRPOSettings, train_grpo

        summary = train_grpo(params["init_model"], rows, verifier, GRPOSettings.from_dict(settings),
                             out_dir, progress_dir)
    else:
        raise ValueError(f"run {wildcards['run']}: unknown method {method!r}; allowed: es, grpo")
    from esgrpo.io import write_json

    write_json(output["summary"], {**summary, "method": method, "init_model": params["init_model"],
                                   "labels": params.get("labels", {}),
                                   "provenance": provenance(params, settings.get("seed"))})
