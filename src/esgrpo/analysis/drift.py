"""Parameter drift between a trained checkpoint and its base: L2, relative L2, per module.

All reductions run tensor by tensor in float64 (`esgrpo.distance`, the trainers' own distances), so a
multi-billion-parameter model never needs a float64 copy of itself and sums of ~1e9 squares keep their
precision.

Tied embeddings: models such as Qwen2.5-1.5B or Llama-3.2-3B tie ``lm_head.weight`` to
``model.embed_tokens.weight`` and their state dicts carry the matrix once, under the
embedding's name. Its drift is then reported once, as "embedding", and no "lm_head" row
appears; an untied model has both rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import pandas as pd
import torch

from esgrpo.distance import squared_norm
from esgrpo.parameter_names import MODULE_TYPES, layer_index, module_type

StateDict = Mapping[str, torch.Tensor]

__all__ = [
    "MODULE_TYPES",
    "float_names",
    "iter_deltas",
    "delta",
    "l2",
    "relative_l2",
    "module_type",
    "layer_index",
    "drift_table",
    "drift_by",
]


def float_names(theta: StateDict, theta0: StateDict) -> list[str]:
    """Names of the floating-point tensors of ``theta``, checked to match ``theta0`` in keys and shapes.

    Integer buffers (e.g. position ids) are not parameters and are skipped.
    """
    k1, k0 = set(theta), set(theta0)
    if k1 != k0:
        raise KeyError(
            f"state dicts differ in keys: only in first {sorted(k1 - k0)[:5]}, only in second {sorted(k0 - k1)[:5]}"
        )
    names = []
    for name, t in theta.items():
        if not t.is_floating_point():
            continue
        if t.shape != theta0[name].shape:
            raise ValueError(f"shape mismatch for {name}: {tuple(t.shape)} vs {tuple(theta0[name].shape)}")
        names.append(name)
    return names


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.float64)


def iter_deltas(theta: StateDict, theta0: StateDict) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, theta - theta0)`` in float64, one tensor at a time."""
    for name in float_names(theta, theta0):
        yield name, _f64(theta[name]) - _f64(theta0[name])


def delta(theta: StateDict, theta0: StateDict, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """Update ``theta - theta0`` for every floating tensor, on CPU (float64 by default).

    Pass ``dtype=torch.float32`` for models whose float64 delta would not fit in memory.
    """
    return {name: d.to(dtype) for name, d in iter_deltas(theta, theta0)}


def l2(d: StateDict) -> float:
    """Global L2 norm over all tensors of a state dict (e.g. a delta)."""
    return math.sqrt(sum(squared_norm(t) for t in d.values() if t.is_floating_point()))


def relative_l2(theta: StateDict, theta0: StateDict) -> float:
    """Whole-model relative drift ``||theta - theta0|| / ||theta0||``."""
    num = den = 0.0
    for name in float_names(theta, theta0):
        num += squared_norm(theta[name], theta0[name])
        den += squared_norm(theta0[name])
    return math.sqrt(num) / math.sqrt(den) if den > 0 else math.nan


def drift_table(theta: StateDict, theta0: StateDict) -> pd.DataFrame:
    """One row per floating tensor: name, module_type, layer, numel, l2, l2_base, relative_l2.

    ``l2`` is ``||theta - theta0||`` of that tensor, ``l2_base`` is ``||theta0||`` and
    ``relative_l2`` their ratio (NaN for an all-zero base tensor). ``layer`` is a nullable int.
    """
    rows = []
    for name in float_names(theta, theta0):
        dl2 = math.sqrt(squared_norm(theta[name], theta0[name]))
        bl2 = math.sqrt(squared_norm(theta0[name]))
        rows.append(
            {
                "name": name,
                "module_type": module_type(name),
                "layer": layer_index(name),
                "numel": int(theta0[name].numel()),
                "l2": dl2,
                "l2_base": bl2,
                "relative_l2": dl2 / bl2 if bl2 > 0 else math.nan,
            }
        )
    df = pd.DataFrame(rows, columns=["name", "module_type", "layer", "numel", "l2", "l2_base", "relative_l2"])
    df["layer"] = df["layer"].astype("Int64")
    return df


def drift_by(df: pd.DataFrame, key: str | list[str]) -> pd.DataFrame:
    """Aggregate a :func:`drift_table` by ``key`` (e.g. "module_type", "layer").

    Norms combine as ``sqrt(sum of squares)``, so the rows of any grouping recombine to the
    whole-model L2; relative L2 is recomputed from the combined norms. Adds ``n_tensors`` and
    ``share_sq`` (the group's share of the total squared update).
    """
    keys = [key] if isinstance(key, str) else list(key)
    tmp = df.assign(_sq=df["l2"] ** 2, _bsq=df["l2_base"] ** 2)
    g = tmp.groupby(keys, dropna=False, sort=True).agg(
        n_tensors=("name", "size"), numel=("numel", "sum"), _sq=("_sq", "sum"), _bsq=("_bsq", "sum")
    )
    total = float(tmp["_sq"].sum())
    out = pd.DataFrame(index=g.index)
    out["n_tensors"] = g["n_tensors"]
    out["numel"] = g["numel"]
    out["l2"] = g["_sq"] ** 0.5
    out["l2_base"] = g["_bsq"] ** 0.5
    out["relative_l2"] = (out["l2"] / out["l2_base"]).where(out["l2_base"] > 0)
    out["share_sq"] = g["_sq"] / total if total > 0 else math.nan
    return out.reset_index()
