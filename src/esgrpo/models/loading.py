"""Load any causal LM by Hub id or local path, count its parameters, save it in HF layout."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def load_model(name_or_path: str | os.PathLike, dtype: str = "float32", device: str = "cpu",
               gguf_file: str | None = None):
    """Model and tokenizer from a Hub id or a local folder (HF layout, or a GGUF file inside it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(name_or_path)
    if Path(path).is_dir() and gguf_file is None and not (Path(path) / "config.json").exists():
        raise FileNotFoundError(f"{path}: no config.json, not a model folder in HF layout")
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), **kwargs)
    model.to(device)
    model.eval()
    return model, tokenizer


def save_model(model, tokenizer, out_dir: str | os.PathLike) -> None:
    """HF layout with safetensors, written to a temporary folder and renamed into place."""
    from esgrpo.files import atomic_directory

    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
