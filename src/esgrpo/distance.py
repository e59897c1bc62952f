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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from esgrpo.parameter_names import module_type

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["NORM_CHUNK_ELEMENTS", "StepAgreement", "distance", "squared_norm"]

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
        # one float64 chunk, reused: a fresh 32 MiB chunk is a fresh mapping (page faults) every time
        buffer = torch.empty(min(chunk, flat.numel()), dtype=torch.float64, device=flat.device)
        total = 0.0
        for start in range(0, flat.numel(), chunk):
            part = buffer[:min(chunk, flat.numel() - start)].copy_(flat[start:start + chunk])
            if other is not None:
                part.sub_(other[start:start + chunk].to(part.device))
            total += float(part.mul_(part).sum())  # x * x: pow(2)'s floats
    return total


def distance(theta: Mapping[str, Tensor], reference: Mapping[str, Tensor]) -> float:
    """``||theta - reference||_2`` over the tensors of `theta` (each in `reference` under its name)."""
    return math.sqrt(sum(squared_norm(value, reference[name]) for name, value in theta.items()))


@dataclass
class StepAgreement:
    """The step the weights took against the step ES meant, summed tensor by tensor: their cosine and the
    share of coordinates that changed. These tell rounding from learning: with the exact arithmetic the
    applied step is the intended one up to float32 rounding of ``theta + step`` (a cosine of 1 to about
    seven digits); in place in bf16, steps below half a weight's spacing are lost and the restores drift.

    applied: ``theta_{t+1} - theta_t`` as the weights hold it; intended: the fp32 sum of the members'
    coefficients times their noise (`esgrpo.es.ops.apply_update`). Both are read a quarter of a norm chunk
    at a time in float64, so the working set stays within the update's (`esgrpo.plan.memory.es_tensor_bytes`).
    """

    dot: float = 0.0
    applied_sq: float = 0.0
    intended_sq: float = 0.0
    changed: int = 0
    elements: int = 0
    changed_by_module: dict[str, int] = field(default_factory=dict)
    elements_by_module: dict[str, int] = field(default_factory=dict)

    def add(self, applied: Tensor, intended: Tensor, name: str | None = None,
            chunk: int = NORM_CHUNK_ELEMENTS // 4) -> None:
        """Count one tensor's (or one piece's) applied and intended steps; `name`, the parameter's, also
        counts its changed coordinates under its module type (`esgrpo.parameter_names.module_type`)."""
        import torch

        with torch.no_grad():
            a_flat, i_flat = applied.detach().reshape(-1), intended.detach().reshape(-1)
            if a_flat.numel() != i_flat.numel():
                raise ValueError(f"shape mismatch: {tuple(applied.shape)} vs {tuple(intended.shape)}")
            changed = 0
            for start in range(0, a_flat.numel(), chunk):
                a = a_flat[start:start + chunk].double()
                i = i_flat[start:start + chunk].to(a.device).double()
                self.dot += float(torch.dot(a, i))
                self.applied_sq += float(torch.dot(a, a))
                self.intended_sq += float(torch.dot(i, i))
                changed += int(torch.count_nonzero(a))
            self.changed += changed
            self.elements += a_flat.numel()
            if name is not None:
                kind = module_type(name)
                self.changed_by_module[kind] = self.changed_by_module.get(kind, 0) + changed
                self.elements_by_module[kind] = self.elements_by_module.get(kind, 0) + a_flat.numel()

    def to_dict(self) -> dict[str, Any]:
        """{"step_cosine": cos(applied, intended), "changed_share": changed coordinates / all}, plus
        "changed_share_by_module" ({module type: share}) where names were given; NaN where a step is zero."""
        norms = math.sqrt(self.applied_sq * self.intended_sq)
        out: dict[str, Any] = {"step_cosine": self.dot / norms if norms > 0 else math.nan,
                               "changed_share": self.changed / self.elements if self.elements else math.nan}
        if self.elements_by_module:
            out["changed_share_by_module"] = {kind: self.changed_by_module[kind] / n
                                              for kind, n in sorted(self.elements_by_module.items())}
        return out
