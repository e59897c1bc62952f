"""Distances in weight space, one implementation for ES, GRPO and the analyses: the update norm, the
distance from the start, the drift from the base. The ES/GRPO distance ratio is a headline number, so
both methods are measured by the same arithmetic: the difference taken in float64 (never in the
weights' own dtype, which rounds the difference of a weight that crosses zero or moves by more than a
factor of two), squared and summed in float64, tensor by tensor.

torch is imported inside the functions: the resource plan (`esgrpo.plan.memory`) reads
`NORM_CHUNK_ELEMENTS` without importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["NORM_CHUNK_ELEMENTS", "distance", "squared_norm"]

# Elements of one tensor that a float64 norm takes at a time: a 4M-element chunk's float64 copy and
# square are 64 MiB, where a whole Qwen3-4B embedding's (389M elements) were 5.8 GiB beside the engine.
# Every tensor of the offline default model is smaller, so its norms are whole-tensor sums.
NORM_CHUNK_ELEMENTS = 1 << 22


def squared_norm(tensor: Tensor, minus: Tensor | None = None, chunk: int = NORM_CHUNK_ELEMENTS) -> float:
    """``sum((tensor - minus)^2)`` in float64, `chunk` elements at a time (`minus` None: of `tensor`).

    Each chunk is cast to float64 (and `minus`'s chunk moved to `tensor`'s device and cast, then
    subtracted there), squared and summed, so the float64 copies never exceed one chunk. A tensor of
    at most `chunk` elements is one chunk, the same sum as over the whole tensor; a larger one is a
    sum of chunk sums, which may differ from the whole-tensor sum in the last bits.
    """
    import torch

    with torch.no_grad():
        flat = tensor.detach().reshape(-1)
        other = None if minus is None else minus.detach().reshape(-1)
        if other is not None and other.numel() != flat.numel():
            raise ValueError(f"shape mismatch: {tuple(tensor.shape)} vs {tuple(minus.shape)}")
        total = 0.0
        for start in range(0, flat.numel(), chunk):
            part = flat[start:start + chunk].double()
            if other is not None:
                part = part - other[start:start + chunk].to(part.device).double()
            total += float(part.pow(2).sum())
    return total


def distance(theta: Mapping[str, Tensor], reference: Mapping[str, Tensor]) -> float:
    """``||theta - reference||_2`` over the tensors of `theta` (each in `reference` under its name)."""
    return math.sqrt(sum(squared_norm(value, reference[name]) for name, value in theta.items()))
