"""The ES noise: one member's standard-normal fp32 noise for one tensor, a pure function of (member seed,
tensor name).

Shared by the ES weight math (`esgrpo.es.ops`) and the engines that perturb weights in their own
layout (`esgrpo.engines.vllm_layout` builds a fused vLLM tensor's noise from its HF parts), so it lives
below both: torch and hashlib only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

MASK63 = (1 << 63) - 1


def stable_name_hash(name: str) -> int:
    """64-bit hash of a tensor name that is the same in every process (Python's `hash` is salted)."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")


def mix_seeds(*values: int) -> int:
    """A 63-bit seed from several integers; a hash, so nearby inputs give unrelated seeds."""
    data = b"".join(int(v & ((1 << 64) - 1)).to_bytes(8, "little") for v in values)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & MASK63


def tensor_noise(member_seed: int, name: str, shape: Sequence[int] | torch.Size,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Standard normal fp32 noise of one member for one tensor.

    Seeded by a mix of the member seed and the tensor's name, so same-shaped tensors get
    independent noise (the public-code trap: one seed for every tensor) and the same call
    always regenerates the same values. CPU and CUDA generators give different streams.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(mix_seeds(int(member_seed), stable_name_hash(name)))
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32, device=device)
