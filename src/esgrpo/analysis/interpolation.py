"""Weight-space paths: linear mode connectivity between two updates and scans along directions.

Arithmetic runs in float64 per tensor and the result is cast back to ``theta0``'s dtype,
so the endpoints reproduce the two models exactly when the deltas were taken in float64.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from esgrpo.analysis.drift import StateDict, l2
from esgrpo.noise import tensor_seed

__all__ = ["PathPoint", "PathStates", "interpolate", "along_direction", "interpolation_points", "random_direction_like"]


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


def _coef_key(c_es: float, c_grpo: float, c_rand: float) -> tuple:
    return tuple(round(float(c), 10) + 0.0 for c in (c_es, c_grpo, c_rand))


@dataclass(frozen=True)
class PathPoint:
    """One point of the paths and scans between theta0, the ES and the GRPO update.

    path: es-grpo (theta0 + (1-lam) dES + lam dGRPO), base-es / base-grpo (theta0 + lam d), or dir-es /
    dir-grpo / dir-random (theta0 + step * d / ||d||); step: its L2 distance from theta0 (signed for
    the scans); key: its coefficients on (dES, dGRPO, random), so coinciding points are evaluated once;
    direction ("es", "grpo", "random"; None on the es-grpo path): what `PathStates.state` moves along.
    """

    path: str
    lam: float
    step: float
    key: tuple
    direction: str | None = None


class PathStates:
    """The weights of `PathPoint`s: theta0, the two updates and the random direction."""

    def __init__(self, theta0: StateDict, d_es: StateDict, d_grpo: StateDict, random_seed: int):
        self.theta0, self.d_es, self.d_grpo = theta0, d_es, d_grpo
        self.norm_es, self.norm_grpo = l2(d_es), l2(d_grpo)
        self.directions: dict[str, StateDict] = {"es": d_es, "grpo": d_grpo}
        if self.norm_es > 0:  # the scans travel the ES update's distances: none without one
            self.directions["random"] = random_direction_like(d_es, random_seed,
                                                              dtype=next(iter(d_es.values())).dtype)

    def state(self, point: PathPoint) -> dict[str, torch.Tensor]:
        if point.direction is None:
            return interpolate(self.theta0, self.d_es, self.d_grpo, point.lam)
        if point.step == 0:
            return dict(self.theta0)
        return along_direction(self.theta0, self.directions[point.direction], point.step)


def interpolation_points(states: PathStates, steps: int, multiples: Sequence[float]) -> Iterator[PathPoint]:
    """Every point: the es-grpo and base-es / base-grpo paths at lam in linspace(0, 1, steps), then the
    dir-es / dir-grpo / dir-random scans at s = lam * ||dES|| for lam in `multiples` (all three
    directions travel the same distances, those of the ES update; none when it is zero, and a
    zero-norm direction is skipped)."""
    d_es, d_grpo, n_es, n_grpo = states.d_es, states.d_grpo, states.norm_es, states.norm_grpo
    dot = sum(float((d_es[k].double() * d_grpo[k].double()).sum()) for k in d_es)
    lams = [i / (steps - 1) for i in range(steps)] if steps > 1 else [0.0]
    for lam in lams:
        dist = math.sqrt(max(0.0, (1 - lam) ** 2 * n_es ** 2 + lam ** 2 * n_grpo ** 2 + 2 * lam * (1 - lam) * dot))
        yield PathPoint("es-grpo", lam, dist, _coef_key(1 - lam, lam, 0))
    for direction, norm, which in (("es", n_es, 0), ("grpo", n_grpo, 1)):
        for lam in lams:
            coefs = [0.0, 0.0, 0.0]
            coefs[which] = lam
            yield PathPoint(f"base-{direction}", lam, lam * norm, _coef_key(*coefs), direction)
    if n_es == 0:
        return
    for direction, norm, which in (("es", n_es, 0), ("grpo", n_grpo, 1), ("random", 1.0, 2)):
        if norm == 0:
            continue
        for m in multiples:
            s = float(m) * n_es
            coefs = [0.0, 0.0, 0.0]
            coefs[which] = s / norm
            yield PathPoint(f"dir-{direction}", float(m), s, _coef_key(*coefs), direction)
