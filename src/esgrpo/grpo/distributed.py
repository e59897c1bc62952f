"""What each process of a GRPO run needs when it may be one of several (`esgrpo.grpo.launch`).

Under ZeRO-3 and FSDP a process holds a shard of the model, so measuring or saving the whole model
gathers it one tensor at a time: a collective every rank joins in the same order while rank 0 keeps
the result. With one process these are plain reads of the model.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from esgrpo.distance import squared_norm
from esgrpo.files import atomic_directory
from esgrpo.grpo.settings import GRPOSettings


def rank() -> int:
    """This process's rank (torchrun's RANK; 0 when alone)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def load_policy(model_dir_or_ref: str | os.PathLike, settings: GRPOSettings, cuda: bool):
    """The model in fp32 (bf16 autocast keeps fp32 weights) and its tokenizer, on this process's device.

    Several processes: each rank's own GPU (torchrun's LOCAL_RANK); a model to shard stays on the host
    until the trainer shards it over the GPUs (DeepSpeed and FSDP move it).
    """
    from esgrpo.models.loading import load_model

    device = "cuda" if cuda else "cpu"
    if settings.num_processes > 1 and cuda:
        device = "cpu" if settings.sharding != "none" else f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return load_model(model_dir_or_ref, dtype="float32", device=device)


def main_first(cuda: bool):
    """A block rank 0 runs first and the other ranks after it (one process: a plain block)."""
    if world_size() == 1:
        return contextlib.nullcontext()
    from accelerate import PartialState

    # As TrainingArguments will ask for it (use_cpu on a CPU): the process group comes up here, once.
    return PartialState(cpu=not cuda).main_process_first()


def _full_fp32(param: torch.Tensor) -> torch.Tensor:
    """The whole of one parameter in fp32 on this process's device; for a sharded one, a collective.

    FSDP2 holds a DTensor shard (`full_tensor` gathers it); DeepSpeed ZeRO-3 an empty placeholder whose
    fp32 values live in the optimiser (`deepspeed.utils.safe_get_full_fp32_param` gathers them).
    """
    if hasattr(param, "full_tensor"):
        return param.detach().full_tensor().to(torch.float32)
    if hasattr(param, "ds_id"):
        from deepspeed.utils import safe_get_full_fp32_param

        return safe_get_full_fp32_param(param)
    return param.detach().to(torch.float32)


def _gathered(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole fp32 tensor) of every parameter, tied weights once; every rank must run it through."""
    for name, param in model.named_parameters():
        yield name, _full_fp32(param)


def host_copy(model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor] | None:
    """fp32 host copies of every parameter where `keep` (rank 0), None elsewhere; every rank gathers."""
    copies = {}
    for name, full in _gathered(model):
        if keep:
            copies[name] = full.to("cpu", torch.float32, copy=True)
    return copies if keep else None


def norm_to(model: torch.nn.Module, reference: Mapping[str, torch.Tensor] | None) -> float:
    """||theta - reference||_2 over all parameters, one tensor at a time on the parameter's device; NaN
    where `reference` is None (the ranks that keep none), which still join the gathers. Summed as ES's
    distances are (`esgrpo.distance.squared_norm`)."""
    total = 0.0
    for name, full in _gathered(model):
        if reference is not None:
            total += squared_norm(full, reference[name])
    return total ** 0.5 if reference is not None else float("nan")


def save_policy(model: torch.nn.Module, tokenizer: Any, folder: Path, main: bool) -> None:
    """The trained model in HF layout; several processes: gathered tensor by tensor, written by rank 0."""
    from esgrpo.models.loading import save_model

    if world_size() == 1:
        save_model(model, tokenizer, folder)
        return
    state = host_copy(model, main)
    if main:
        with atomic_directory(folder) as tmp:
            model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
