"""Weight-space paths: linear mode connectivity between two updates and scans along directions.

Arithmetic runs in float64 per tensor and the result is cast back to ``theta0``'s dtype,
so the endpoints reproduce the two models exactly when the deltas were taken in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from esgrpo.analysis.drift import StateDict, l2
from esgrpo.noise import tensor_seed

__all__ = ["interpolate", "along_direction", "random_direction_like"]


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def _combine(theta0: StateDict, terms: Sequence[tuple[float, StateDict]]) -> dict[str, torch.Tensor]:
    """``theta0 + sum_i c_i * d_i``; tensors absent from the deltas are passed through."""
    keys = set(terms[0][1])
    for _, d in terms[1:]:
        if set(d) != keys:
            raise KeyError("deltas differ in keys")
    missing = keys - set(theta0)
    if missing:
        raise KeyError(f"delta names missing from theta0: {sorted(missing)[:5]}")
    out = {}
    for name, t0 in theta0.items():
        if name not in keys:
            out[name] = t0
            continue
        acc = _f64(t0)
        for c, d in terms:
            if d[name].shape != t0.shape:
                raise ValueError(f"shape mismatch for {name}")
            acc = acc + c * _f64(d[name])
        out[name] = acc.to(device=t0.device, dtype=t0.dtype)
    return out


def interpolate(theta0: StateDict, d_a: StateDict, d_b: StateDict, lam: float) -> dict[str, torch.Tensor]:
    """``theta0 + (1 - lam) * d_a + lam * d_b``: lam 0 gives model A, lam 1 model B."""
    return _combine(theta0, [(1.0 - lam, d_a), (lam, d_b)])


def along_direction(theta0: StateDict, direction: StateDict, step: float) -> dict[str, torch.Tensor]:
    """``theta0 + step * direction / ||direction||``: ``step`` is the global L2 distance travelled."""
    norm = l2(direction)
    if not norm > 0:
        raise ValueError("direction has zero norm")
    return _combine(theta0, [(step / norm, direction)])


def random_direction_like(
    delta: StateDict, seed: int, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Gaussian direction shaped like ``delta`` with unit global L2 norm.

    Each tensor is drawn in float32 from its own generator seeded by `esgrpo.noise.tensor_seed`, so
    a tensor's values do not depend on which other tensors are present or their order.
    """
    raw = {}
    sq = 0.0
    for name, t in delta.items():
        if not t.is_floating_point():
            continue
        g = torch.Generator().manual_seed(tensor_seed(seed, name))
        r = torch.randn(t.shape, generator=g, dtype=torch.float32)
        sq += float(r.to(torch.float64).square().sum())
        raw[name] = r
    norm = math.sqrt(sq)
    return {name: (r.to(torch.float64) / norm).to(dtype) for name, r in raw.items()}

