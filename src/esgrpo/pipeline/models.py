"""Stage: build the offline default model (tokenizer + tiny Llama + warm-up), saved in HF layout."""

from __future__ import annotations

import time
from pathlib import Path

from esgrpo.io import read_json, write_json
from esgrpo.models import TinyLlamaSpec, build_tiny_llama, count_parameters, save_model, train_tokenizer
from esgrpo.pipeline.data import load_rows
from esgrpo.provenance import provenance
from esgrpo.tasks.offline import worked_solution
from esgrpo.warmup import WarmupConfig, warm_up


def build_default_model(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    spec = TinyLlamaSpec(**params["architecture"])
    warmup_cfg = WarmupConfig(**params["warmup"], seed=int(params["seed"]))
    tasks = params["tasks"]
    train = {task: load_rows(path) for task, path in zip(tasks, input["train"], strict=True)}
    verifiers = {task: read_json(path)["verifier"] for task, path in zip(tasks, input["info"], strict=True)}
    # The tokenizer sees every text the model will read or write: prompts and both answer formats.
    texts = [r["prompt"][-1]["content"] + " " + worked_solution(r) + " " + worked_solution(r, True)
             for rows in train.values() for r in rows]
    tokenizer = train_tokenizer(texts, vocab_size=int(params["vocab_size"]))
    model = build_tiny_llama(tokenizer, spec, int(params["seed"]))
    started = time.time()
    history = warm_up(model, tokenizer, train, verifiers, warmup_cfg)
    save_model(model, tokenizer, output["model"])
    write_json(Path(output["info"]), {
        "parameters": count_parameters(model), "vocab_size": len(tokenizer),
        "warmup": history, "seconds": time.time() - started,
        "provenance": provenance(params, int(params["seed"])),
    })
