"""Functional sparsity of an update: keep only its largest coordinates, or drop a module type.

Selection is global over the whole model and exact: among the *changed* coordinates
(nonzero delta), the ``k = round(keep_fraction * n_changed)`` largest ``|delta|`` are kept
(round half up). Ties at the threshold go to the earliest coordinates in state-dict order,
then flat index order, so the mask is a deterministic function of the inputs.

Memory: the k-th largest value is found with ``numpy.partition`` over all changed values
when there are at most ``exact_limit`` of them. Above that (multi-billion-parameter
models) a seeded random sample brackets the threshold, one pass collects only the values
inside the bracket, and the threshold is picked exactly from those; the bracket is widened
and the pass repeated in the rare case the sample misled it. The result is identical to
the small-model path; only peak memory differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from esgrpo.analysis.drift import MODULE_TYPES, StateDict, delta, float_names, module_type
from esgrpo.noise import tensor_seed

__all__ = ["SparsityPoint", "top_fraction_mask", "sparsify", "reset_module_type", "n_kept", "sparsity_points"]

DEFAULT_EXACT_LIMIT = 50_000_000
DEFAULT_SAMPLE_SIZE = 2_000_000

AbsFn = Callable[[str], np.ndarray]


def _n_keep(keep_fraction: float, n_changed: int) -> int:
    if not 0.0 <= keep_fraction <= 1.0 or math.isnan(keep_fraction):
        raise ValueError(f"keep_fraction must be in [0, 1], got {keep_fraction}")
    return min(n_changed, int(math.floor(keep_fraction * n_changed + 0.5)))


def _sample_changed(
    names: list[str], absfn: AbsFn, numels: dict[str, int], size: int, seed: int
) -> np.ndarray:
    """Uniform sample (with replacement) of |delta| over all coordinates, zeros dropped."""
    total = sum(numels.values())
    out = []
    for name in names:
        m = math.ceil(size * numels[name] / total)
        g = torch.Generator().manual_seed(tensor_seed(seed, name))
        idx = torch.randint(numels[name], (m,), generator=g).numpy()
        v = absfn(name)[idx]
        out.append(v[v > 0])
    return np.concatenate(out) if out else np.empty(0)


def _kth_largest_bracketed(
    names: list[str],
    absfn: AbsFn,
    numels: dict[str, int],
    n_changed: int,
    k: int,
    sample_size: int,
    seed: int,
) -> float:
    """Exact k-th largest changed |delta| without holding all values at once."""
    s = np.sort(_sample_changed(names, absfn, numels, sample_size, seed))[::-1]  # descending
    p = k / n_changed
    widen = 1.0
    for attempt in range(4):
        if s.size == 0 or attempt == 3:
            lo, hi = 0.0, math.inf  # last resort: the bracket is everything (still exact)
        else:
            r = p * s.size
            margin = widen * (5.0 * math.sqrt(s.size * p * (1 - p)) + 50.0)
            i_hi, i_lo = int(math.floor(r - margin)), int(math.ceil(r + margin))
            hi = float(s[i_hi]) if i_hi >= 0 else math.inf
            lo = float(s[i_lo]) if i_lo < s.size else 0.0
        n_above, inside = 0, []
        for name in names:
            v = absfn(name)
            v = v[v > 0]
            n_above += int(np.count_nonzero(v > hi))
            inside.append(v[(v >= lo) & (v <= hi)])
        vals = np.concatenate(inside)
        if n_above < k <= n_above + vals.size:
            j = k - n_above  # j-th largest inside the bracket
            return float(np.partition(vals, vals.size - j)[vals.size - j])
        widen *= 4.0
    raise AssertionError("unreachable: the full bracket always contains the threshold")


def _select(
    names: list[str],
    absfn: AbsFn,
    shapes: dict[str, torch.Size],
    keep_fraction: float,
    exact_limit: int,
    sample_size: int,
    seed: int,
) -> dict[str, torch.Tensor]:
    numels = {n: math.prod(shapes[n]) for n in names}
    counts = {n: int(np.count_nonzero(absfn(n))) for n in names}
    n_changed = sum(counts.values())
    k = _n_keep(keep_fraction, n_changed)
    if k == 0:
        return {n: torch.zeros(shapes[n], dtype=torch.bool) for n in names}
    if k == n_changed:
        return {n: torch.from_numpy(absfn(n) > 0).reshape(shapes[n]) for n in names}
    if n_changed <= exact_limit:
        v = np.concatenate([a[a > 0] for a in map(absfn, names)])
        tau = float(np.partition(v, v.size - k)[v.size - k])
        n_above = int(np.count_nonzero(v > tau))
        del v
    else:
        tau = _kth_largest_bracketed(names, absfn, numels, n_changed, k, sample_size, seed)
        n_above = sum(int(np.count_nonzero(absfn(n) > tau)) for n in names)
    ties_left = k - n_above  # >= 1: tau itself is among the kept values
    masks = {}
    for n in names:
        a = absfn(n)
        m = a > tau
        if ties_left > 0:
            eq = np.flatnonzero(a == tau)[:ties_left]
            m[eq] = True
            ties_left -= eq.size
        masks[n] = torch.from_numpy(m).reshape(shapes[n])
    return masks


def top_fraction_mask(
    delta: StateDict,
    keep_fraction: float,
    exact_limit: int = DEFAULT_EXACT_LIMIT,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Boolean masks (shaped like each tensor) of the globally largest-|delta| changed coordinates.

    ``keep_fraction`` 1.0 keeps every changed coordinate, 0.0 none. ``exact_limit`` /
    ``sample_size`` / ``seed`` only steer the memory-saving path (see module docstring);
    they do not change the result.
    """
    names = [n for n, t in delta.items() if t.is_floating_point()]

    def absfn(name: str) -> np.ndarray:
        return delta[name].detach().to("cpu", torch.float64).abs().ravel().numpy()

    return _select(
        names, absfn, {n: delta[n].shape for n in names}, keep_fraction, exact_limit, sample_size, seed
    )


def n_kept(masks: dict[str, torch.Tensor]) -> int:
    """Number of coordinates a mask keeps."""
    return int(sum(int(m.sum()) for m in masks.values()))


def sparsify(
    theta0: StateDict,
    theta: StateDict,
    keep_fraction: float,
    exact_limit: int = DEFAULT_EXACT_LIMIT,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """``theta0 + delta * mask`` with the :func:`top_fraction_mask` of ``theta - theta0``.

    Kept coordinates are copied from ``theta`` and the others from ``theta0`` (``torch.where``),
    so keep 1.0 reproduces ``theta`` and keep 0.0 ``theta0`` bit for bit, in their dtype. The
    delta is recomputed per tensor on demand rather than stored, to bound memory.
    """
    names = float_names(theta, theta0)

    def absfn(name: str) -> np.ndarray:
        d = theta[name].detach().to("cpu", torch.float64) - theta0[name].detach().to("cpu", torch.float64)
        return d.abs().ravel().numpy()

    masks = _select(
        names, absfn, {n: theta[n].shape for n in names}, keep_fraction, exact_limit, sample_size, seed
    )
    out = dict(theta)  # non-floating buffers come from theta unchanged
    for n in names:
        out[n] = torch.where(masks[n].to(theta[n].device), theta[n], theta0[n].to(theta[n].device))
    return out


def reset_module_type(
    theta0: StateDict, theta: StateDict, module_types: str | Iterable[str]
) -> dict[str, torch.Tensor]:
    """``theta`` with the update of the given module type(s) removed (those tensors taken from ``theta0``).

    Tensors are shared with the inputs, not copied. With tied embeddings there is no
    ``lm_head`` tensor, so resetting "lm_head" changes nothing; reset "embedding" instead.
    """
    types = {module_types} if isinstance(module_types, str) else set(module_types)
    unknown = types - set(MODULE_TYPES)
    if unknown:
        raise ValueError(f"unknown module types {sorted(unknown)}; expected some of {MODULE_TYPES}")
    names = set(float_names(theta, theta0))
    return {n: (theta0[n] if n in names and module_type(n) in types else t) for n, t in theta.items()}


def module_types_present(theta: StateDict, theta0: StateDict) -> list[str]:
    """Module types with at least one changed coordinate, in MODULE_TYPES order."""
    present = set()
    for name in float_names(theta, theta0):
        if not torch.equal(theta[name], theta0[name]):
            present.add(module_type(name))
    return [t for t in MODULE_TYPES if t in present]


@dataclass(frozen=True)
class SparsityPoint:
    """One sparsified model: the top `keep_fraction` of the update kept ("top_fraction"), or one
    module type's update removed ("reset_module"); `n_kept` of the `n_changed` changed coordinates."""

    kind: str
    keep_fraction: float
    module_type: str
    n_kept: int
    n_changed: int

    def fields(self) -> dict:
        """The point's columns of the sparsity table."""
        return {"kind": self.kind, "keep_fraction": self.keep_fraction, "module_type": self.module_type,
                "n_kept": self.n_kept, "n_changed": self.n_changed}

    def key(self) -> Hashable:
        """Which model the point is: the run, the base, or its own (coinciding points are evaluated once)."""
        if self.kind == "reset_module":
            return ("reset", self.module_type)
        return "theta" if self.n_kept == self.n_changed else ("theta0" if self.n_kept == 0 else ("top", self.keep_fraction))

    def state(self, theta0: StateDict, theta: StateDict) -> dict[str, torch.Tensor]:
        """The point's weights."""
        if self.kind == "reset_module":
            return reset_module_type(theta0, theta, self.module_type)
        return sparsify(theta0, theta, self.keep_fraction)


def sparsity_points(theta0: StateDict, theta: StateDict, fractions: Iterable[float],
                    delta_dtype: torch.dtype = torch.float64) -> Iterator[SparsityPoint]:
    """Every sparsified model of the run: the top fractions, then one module type's update reset each."""
    d = delta(theta, theta0, dtype=delta_dtype)
    changed = n_kept(top_fraction_mask(d, 1.0))
    for fraction in fractions:
        yield SparsityPoint("top_fraction", float(fraction), "", n_kept(top_fraction_mask(d, float(fraction))), changed)
    for mtype in module_types_present(theta, theta0):
        removed = sum(int((d[n] != 0).sum()) for n in d if module_type(n) == mtype)
        yield SparsityPoint("reset_module", math.nan, mtype, changed - removed, changed)
