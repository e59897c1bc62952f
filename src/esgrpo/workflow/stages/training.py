"""Stages: train one run (ES or GRPO) from its start checkpoint, as its run name specifies; and
turn a main ES run's exported snapshot (`ESConfig.snapshots`) into a run of its own."""

from __future__ import annotations

import os
import shutil
from contextlib import nullcontext
from pathlib import Path

from esgrpo.files import atomic_directory, read_json, read_jsonl, write_json, write_jsonl
from esgrpo.live import live_settings
from esgrpo.models.loading import load_model
from esgrpo.progress import WriterLock
from esgrpo.provenance import provenance
from esgrpo.run_record import RunSummary
from esgrpo.runs import IN_PLACE_DTYPE
from esgrpo.tasks.rewards import reward
from esgrpo.workflow.progress_store import ProgressStore
from esgrpo.workflow.stages.data import load_rows


def train_run(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    method, settings = params["method"], dict(params["settings"])
    rows = load_rows(input["train"])
    verifier = read_json(input["info"])["verifier"]
    out_dir = Path(output["summary"]).parent
    progress_dir = Path(params["progress_dir"])
    print(f"{method} on {wildcards['task']} from {params['init_model']}: {settings}", flush=True)
    # the config's logging block, through the environment (esgrpo.live.live_settings says why)
    live = live_settings(wildcards["model"], wildcards["task"], wildcards["run"], {"method": method, **settings})
    # Without a shared filesystem the progress folder lives in the workflow's storage too (a default storage
    # provider: esgrpo.workflow.progress_store): fetched before training, stored as checkpoints appear.
    with ProgressStore.from_env(progress_dir) or nullcontext():
        if method == "es":
            from esgrpo.es.loop import train_es
            from esgrpo.es.settings import ESConfig

            cfg = ESConfig.from_dict(settings)

            def reward_fn(text: str, row: dict) -> float:
                return reward(verifier, text, row["answer"], row["meta"], cfg.reward_scheme, cfg.format_bonus,
                              cfg.reward_rules)

            # The folder's writer lock before the engines start: a held folder stops the job in seconds.
            with WriterLock(progress_dir):
                in_place = cfg.arithmetic != "exact"  # a paper's arithmetic (esgrpo.es.arithmetic)
                if params.get("es_backend", "hf") == "vllm":
                    engine = params.get("es_engine") or {}
                    # one engine: with no master, several engines' inexact restores would drift apart
                    backend = vllm_backend(params["init_model"], rows, cfg, reward_fn,
                                           {**engine, "num_engines": 1} if in_place else engine)
                else:
                    from esgrpo.engines.panel_matmul import kernel_name
                    from esgrpo.es.hf_backend import HFESBackend, make_population_evaluator

                    dtype = params.get("dtype", "float32")
                    if in_place and dtype == "float32":  # what the papers' arithmetic rounds to: a bf16 copy
                        dtype = IN_PLACE_DTYPE
                    model, tokenizer = load_model(params["init_model"], dtype=dtype)
                    # Below fp32 the loaded weights are rounded: theta0 comes from the checkpoint's own tensors.
                    backend = HFESBackend(model, tokenizer, make_population_evaluator(model, tokenizer, reward_fn),
                                          master_from=None if dtype == "float32" else params["init_model"])
                summary = train_es(backend, rows, cfg, out_dir, progress_dir, live=live).to_dict()
                if params.get("es_backend", "hf") != "vllm":  # the population engine's matmul: kernels round differently
                    summary["member_matmul"] = kernel_name(next(model.parameters()).device)
        elif method == "grpo":
            from esgrpo.grpo.settings import GRPOSettings

            grpo = GRPOSettings.from_dict(settings)
            if grpo.num_processes > 1:  # one process per GPU of the job, through accelerate (DDP, ZeRO-3 or FSDP)
                from esgrpo.grpo.launch import launch_grpo as train_grpo
            else:
                from esgrpo.grpo.trainer import train_grpo
            summary = train_grpo(params["init_model"], rows, verifier, grpo, out_dir, progress_dir, live=live).to_dict()
        else:
            raise ValueError(f"run {wildcards['run']}: unknown method {method!r}; allowed: es, grpo")
    # the one writer of a run's summary.json: the trainer's record and what the workflow knows
    write_json(output["summary"], {**summary, "init_model": params["init_model"], "labels": params.get("labels", {}),
                                   "provenance": provenance(params, settings.get("seed"))})


def vllm_backend(init_model: str, rows: list[dict], cfg, reward_fn, engine: dict):
    """ES with one vLLM engine per GPU (`esgrpo.es.vllm_backend`): the es.backend = vllm path of `train_run`.

    Each engine's max_model_len is the longest training prompt (or the engine block's
    max_prompt_tokens) + the run's max_new_tokens (`esgrpo.engines.vllm_engine.context_length`).
    """
    from transformers import AutoTokenizer

    from esgrpo.engines.vllm_engine import engine_kwargs, prompt_token_ids
    from esgrpo.es.vllm_backend import VLLMESBackend, VLLMESPool

    tokenizer = AutoTokenizer.from_pretrained(init_model)
    ids = prompt_token_ids(tokenizer, rows)
    engine = engine_kwargs(engine, ids, cfg.max_new_tokens)
    pool = VLLMESPool.launch(init_model, num_engines=engine.pop("num_engines", None),
                             dtype=engine.pop("dtype", "bfloat16"), seed=cfg.seed, trainable=cfg.trainable, **engine)
    return VLLMESBackend(pool, init_model, dict(zip([r["id"] for r in rows], ids, strict=True)), reward_fn)


def export_snapshot(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """The model `params["parent"]` exported after `params["iteration"]` iterations, as run `wildcards["run"]`:
    its weights hard-linked (copied across file systems), the parent's first K metric rows, a summary."""
    from esgrpo.es.loop import snapshot_dir

    k, parent = int(params["iteration"]), params["parent"]
    source = snapshot_dir(Path(input["summary"]).parent, k)
    if not (source / "snapshot.json").exists() or not (source / "model").is_dir():
        raise FileNotFoundError(f"{source}: {parent} exported no snapshot after {k} iterations (trained before "
                                f"es.snapshots listed {k}?); retrain it: snakemake --forcerun {input['summary']}")
    metrics = read_jsonl(input["metrics"])[:k]
    if [m["iteration"] for m in metrics] != list(range(1, k + 1)):
        raise ValueError(f"{input['metrics']}: the first {k} rows are not iterations 1..{k}")
    with atomic_directory(output["model"]) as tmp:
        for path in sorted((source / "model").iterdir()):
            _link_or_copy(path, tmp / path.name)
    write_jsonl(output["metrics"], metrics)
    record = read_json(source / "snapshot.json")
    write_json(output["summary"], {
        "method": "es", **record, "iterations": k, "snapshot_of": parent,
        "init_model": read_json(input["summary"]).get("init_model"),
        **RunSummary.fitness(metrics), "settings": params["settings"], "labels": params.get("labels", {}),
        "provenance": provenance(params, params["settings"].get("seed"))})


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link (no second copy of a multi-GB checkpoint), or a copy where links cannot cross."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
