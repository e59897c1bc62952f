"""vLLM's weight layout against transformers' (HF) layout: pure torch, tested on a CPU with a tiny Llama.

vLLM fuses ``q_proj|k_proj|v_proj`` into ``qkv_proj`` and ``gate_proj|up_proj`` into ``gate_up_proj``,
stacked along dim 0, and pads vocabulary rows (embedding, lm_head) to a multiple of 64. ES noise is
`esgrpo.noise` of the *HF* tensor name (full-rank or low-rank), so the noise of a fused tensor is the
concatenation of its parts' noise (`fused_noise`) and the trajectory is the same function of
(seed, HF name) on the vLLM backend as on the transformers one. Exports go back to HF layout
(`unfuse_state_dict`), loadable by transformers.

Architectures whose fused tensors are qkv_proj / gate_up_proj (Llama, Qwen2, Qwen3, Mistral).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from esgrpo.noise import FULL, Noise

__all__ = ["FUSED", "Part", "config_value", "fuse_state_dict", "fused_noise", "fused_weighted_sum", "hf_names", "is_fused", "parts_of",
           "read_fused", "unfuse_items", "unfuse_state_dict", "vocab_rows"]

# fused vLLM module -> its HF modules, in the order vLLM stacks them along dim 0
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@dataclass(frozen=True)
class Part:
    """Rows [start, stop) (dim 0) of a fused tensor that are the HF tensor `name`."""

    name: str
    start: int
    stop: int


def config_value(config: Any, key: str, default: Any = None) -> Any:
    """`key` of a transformers config object or a plain dict config."""
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def _split_sizes(kind: str, rows: int, config: Any, name: str) -> list[int]:
    if kind == "gate_up_proj":
        if rows % 2:
            raise ValueError(f"{name}: {rows} rows cannot be gate + up halves")
        return [rows // 2, rows // 2]
    heads = config_value(config, "num_attention_heads")
    kv_heads = config_value(config, "num_key_value_heads") or heads
    if not heads:
        raise ValueError(f"{name}: the config has no num_attention_heads")
    # head_dim from the shape: Qwen3's head_dim is not hidden_size / heads.
    if rows % (heads + 2 * kv_heads):
        raise ValueError(f"{name}: {rows} rows are not (heads + 2 kv_heads) = {heads + 2 * kv_heads} heads")
    head_dim = rows // (heads + 2 * kv_heads)
    return [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]


def parts_of(name: str, shape: Sequence[int], config: Any) -> list[Part]:
    """The HF tensors a vLLM tensor holds: its fused parts, or itself."""
    rows = int(shape[0]) if len(shape) else 0
    for kind, pieces in FUSED.items():
        token = f".{kind}."
        if token in name:
            out, start = [], 0
            for piece, size in zip(pieces, _split_sizes(kind, rows, config, name), strict=True):
                out.append(Part(name.replace(token, f".{piece}."), start, start + size))
                start += size
            return out
    return [Part(name, 0, rows)]


def is_fused(name: str) -> bool:
    return any(f".{kind}." in name for kind in FUSED)


def vocab_rows(name: str, shape: Sequence[int], config: Any) -> int | None:
    """The checkpoint's row count of a vocabulary tensor that vLLM padded, else None.

    vLLM pads embedding and lm_head rows to a multiple of 64; the rows past ``vocab_size`` are
    not part of the model (HF layout has none).
    """
    vocab = config_value(config, "vocab_size")
    if vocab and name.endswith(("embed_tokens.weight", "lm_head.weight")) and len(shape) == 2 \
            and int(shape[0]) > int(vocab):
        return int(vocab)
    return None


def hf_names(name: str) -> list[str]:
    """The HF tensors a vLLM tensor is stacked from, in vLLM's order: its fused parts, or itself."""
    for kind, pieces in FUSED.items():
        token = f".{kind}."
        if token in name:
            return [name.replace(token, f".{piece}.") for piece in pieces]
    return [name]


def read_fused(name: str, read: Callable[[str], torch.Tensor]) -> torch.Tensor:
    """vLLM tensor `name` built from a checkpoint in HF layout, ``read(hf_name) -> tensor``: its parts
    stacked along dim 0 as vLLM fuses them (vocabulary padding is the caller's: the checkpoint has none)."""
    names = hf_names(name)
    return read(names[0]) if len(names) == 1 else torch.cat([read(n) for n in names], dim=0)


def unfuse_items(fused: Iterable[tuple[str, torch.Tensor]], config: Any,
                 names: Sequence[str] = ()) -> Iterator[tuple[str, torch.Tensor]]:
    """vLLM layout -> HF layout one tensor at a time: ``qkv_proj`` -> q/k/v_proj, ``gate_up_proj`` ->
    gate/up_proj; other tensors pass through, less the vocabulary rows vLLM padded (`vocab_rows`).

    With tied embeddings a separate ``lm_head.weight`` is dropped (HF stores the embedding once) when
    `names` (every vLLM name that will come) holds the embedding. Pieces are views of their tensor.
    """
    tied = config_value(config, "tie_word_embeddings", False) and any(
        n.endswith("embed_tokens.weight") for n in names)
    seen: set[str] = set()
    for name, tensor in fused:
        if tied and name == "lm_head.weight":
            continue
        rows = vocab_rows(name, tuple(tensor.shape), config)
        pieces = [Part(name, 0, rows)] if rows is not None else parts_of(name, tuple(tensor.shape), config)
        for part in pieces:
            if part.name in seen:
                raise ValueError(f"{part.name} appears twice")
            seen.add(part.name)
            yield part.name, tensor if len(pieces) == 1 and rows is None else tensor[part.start:part.stop]


def unfuse_state_dict(fused: Mapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """`unfuse_items` of a whole state dict; pieces are contiguous copies (safetensors needs that)."""
    return {name: value if value is fused.get(name) else value.contiguous().clone()
            for name, value in unfuse_items(fused.items(), config, list(fused))}


def fuse_state_dict(hf: Mapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """HF layout -> vLLM layout (the inverse of `unfuse_state_dict`, tied lm_head left out)."""
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for name, tensor in hf.items():
        if name in used:
            continue
        for kind, pieces in FUSED.items():
            token = f".{pieces[0]}."
            if token in name:
                names = [name.replace(token, f".{p}.") for p in pieces]
                missing = [n for n in names if n not in hf]
                if missing:
                    raise KeyError(f"{name}: the fused {kind} also needs {missing}")
                out[name.replace(token, f".{kind}.")] = torch.cat([hf[n] for n in names], dim=0)
                used.update(names)
                break
        else:
            if not any(f".{p}." in name for pieces in FUSED.values() for p in pieces[1:]):
                out[name] = tensor
    return out


# --------------------------------------------------------------------------- noise


def _in_vllm_layout(name: str, shape: Sequence[int], config: Any, device: torch.device | str,
                   of_part: Callable[[str, tuple[int, ...]], torch.Tensor]) -> torch.Tensor:
    """A (possibly fused or vocabulary-padded) vLLM tensor built from `of_part(hf_name, hf_shape)` of its HF parts:
    the parts stacked along dim 0; vLLM's padding rows zero."""
    parts = parts_of(name, shape, config)
    if len(parts) == 1 and parts[0].name == name:
        rows = vocab_rows(name, shape, config)
        if rows is None:
            return of_part(name, tuple(shape))
        # the checkpoint's rows get the HF-layout noise; vLLM's padding rows stay put (zero), appended
        # after the part is built so that building it never sits beside a whole zero tensor
        part = of_part(name, (rows, *shape[1:]))
        return torch.cat([part, part.new_zeros((shape[0] - rows, *shape[1:]))])
    rest = tuple(shape[1:])
    return torch.cat([of_part(p.name, (p.stop - p.start, *rest)) for p in parts], dim=0)


def fused_noise(member_seed: int, name: str, shape: Sequence[int], config: Any,
                device: torch.device | str = "cpu", noise: Noise = FULL) -> torch.Tensor:
    """The `Noise` of the HF tensors a (possibly fused or vocabulary-padded) tensor holds, laid out as in vLLM
    (low rank: each HF part its own A B^T / sqrt(r), as on the transformers backend)."""
    return _in_vllm_layout(name, shape, config, device,
                           lambda part, part_shape: noise.dense(member_seed, part, part_shape, device))


def fused_weighted_sum(coefficients: Mapping[int, float], name: str, shape: Sequence[int], config: Any,
                       device: torch.device | str = "cpu", noise: Noise = FULL) -> torch.Tensor:
    """`Noise.weighted_sum` (the update's sum of weighted noises) of a vLLM tensor's HF parts, in vLLM layout."""
    return _in_vllm_layout(name, shape, config, device,
                           lambda part, part_shape: noise.weighted_sum(coefficients, part, part_shape, device))
