"""Stage: evaluate one checkpoint on every task of its model (Pass@k, mean@n, Maj@n, greedy, entropy).

One job per checkpoint, not per (checkpoint, task): loading torch, transformers and the model
costs seconds, more than a tiny model's evaluation, and every analysis (forgetting, off-task
drift) needs all tasks anyway.
"""

from __future__ import annotations

import time

from esgrpo.engines.local import local_engine
from esgrpo.evaluation.evaluate import EvalSettings, evaluate_rows
from esgrpo.files import read_json, write_json, write_jsonl
from esgrpo.live import Eta
from esgrpo.models.loading import load_model
from esgrpo.provenance import provenance
from esgrpo.workflow.stages.data import load_rows

ENGINE_KEYS = ("backend", "batch_size", "dtype", "device", "engine")


def make_engine(model_ref: str, settings: dict, rows: list[dict], max_new_tokens: int):
    """The rollout engine a config asks for, over the model at `model_ref`, for generating up to
    `max_new_tokens` after the prompts of `rows` (a vLLM engine's max_model_len: the longest prompt,
    or the engine block's max_prompt_tokens, + max_new_tokens; `esgrpo.engines.vllm_engine.context_length`)."""
    backend = settings.get("backend", "hf")
    if backend == "vllm":
        from transformers import AutoTokenizer

        from esgrpo.engines.vllm_engine import VLLMEngine, engine_kwargs, prompt_token_ids

        ids = prompt_token_ids(AutoTokenizer.from_pretrained(model_ref), rows)
        return VLLMEngine(model_ref, dtype=settings.get("dtype", "bfloat16"),
                          **engine_kwargs(settings.get("engine") or {}, ids, max_new_tokens))
    model, tokenizer = load_model(model_ref, dtype=settings.get("dtype", "float32"),
                                  device=settings.get("device", "cpu"))
    return local_engine(model, tokenizer, backend, batch_size=int(settings.get("batch_size", 256)))


def split_eval_settings(eval_cfg: dict) -> tuple[EvalSettings, dict, int | None]:
    """(sampling settings, engine settings, test-set limit) from a config's eval block."""
    cfg = dict(eval_cfg)
    limit = cfg.pop("test_size", None)
    engine_cfg = {k: cfg.pop(k) for k in ENGINE_KEYS if k in cfg}
    return EvalSettings(**cfg), engine_cfg, limit


def evaluate_checkpoint(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    settings, engine_cfg, limit = split_eval_settings(params["eval"])
    task_rows = [load_rows(path, limit) for path in input["test"]]
    every_row = [row for rows in task_rows for row in rows]
    engine = make_engine(params["model"], engine_cfg, every_row, settings.max_new_tokens)
    summaries, prompt_rows = [], []
    eta, done = Eta(len(every_row)), 0  # paced by prompts: every task samples n completions per prompt
    for task, rows, info_path in zip(params["eval_tasks"], task_rows, input["info"], strict=True):
        started = time.time()
        summary, per_prompt = evaluate_rows(engine, rows, read_json(info_path)["verifier"], settings)
        summary.update({"model": wildcards["model"], "run": params["run"], "train_task": params["train_task"],
                        "eval_task": task, "checkpoint": params["model"], "seconds": time.time() - started})
        summaries.append(summary)
        prompt_rows += [{"model": wildcards["model"], "run": params["run"], "train_task": params["train_task"],
                         "eval_task": task, **row} for row in per_prompt]
        done += len(rows)
        print(f"{task}: " + ", ".join(f"{k}={summary[k]:.3f}" for k in summary
                                      if k.startswith(("pass@", "greedy", "mean@")))
              + f" ({len(rows)} prompts, {summary['seconds']:.1f}s; {done}/{len(every_row)} prompts, {eta(done)})",
              flush=True)
    write_jsonl(output["prompts"], prompt_rows)
    write_json(output["summary"], {"evaluations": summaries, "provenance": provenance(params, settings.seed)})
