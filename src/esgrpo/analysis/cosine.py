"""Cosine similarity between two updates (e.g. dES and dGRPO), globally and per group.

Group cosines are computed from the group's own dot product and norms, so they answer
"do the two methods move this layer the same way", independent of other layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable

import pandas as pd
import torch

from esgrpo.analysis.drift import StateDict, l2, layer_index, module_type

__all__ = ["cosine", "cosine_by", "cosine_by_layer", "cosine_by_module_type", "cosine_rows"]


def _common_names(d1: StateDict, d2: StateDict) -> list[str]:
    if set(d1) != set(d2):
        raise KeyError(f"deltas differ in keys: {sorted(set(d1) ^ set(d2))[:5]}")
    for name in d1:
        if d1[name].shape != d2[name].shape:
            raise ValueError(f"shape mismatch for {name}")
    return [n for n in d1 if d1[n].is_floating_point()]


def _stats(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    a = a.detach().to("cpu", torch.float64).ravel()
    b = b.detach().to("cpu", torch.float64).ravel()
    return float(a @ b), float(a @ a), float(b @ b)


def _cos(dot: float, sa: float, sb: float) -> float:
    # undefined when either update is zero on this group
    return dot / math.sqrt(sa * sb) if sa > 0 and sb > 0 else math.nan


def cosine(d1: StateDict, d2: StateDict) -> float:
    """Global cosine of two deltas, treating all tensors as one flat vector (NaN if either is zero)."""
    dot = sa = sb = 0.0
    for name in _common_names(d1, d2):
        x, y, z = _stats(d1[name], d2[name])
        dot, sa, sb = dot + x, sa + y, sb + z
    return _cos(dot, sa, sb)


def cosine_by(d1: StateDict, d2: StateDict, key: Callable[[str], Hashable], column: str) -> pd.DataFrame:
    """Cosine per group of tensors, grouped by ``key(name)``; columns ``column, cosine, norm_a, norm_b, numel``."""
    acc: dict[Hashable, list[float]] = {}
    for name in _common_names(d1, d2):
        x, y, z = _stats(d1[name], d2[name])
        a = acc.setdefault(key(name), [0.0, 0.0, 0.0, 0])
        a[0] += x
        a[1] += y
        a[2] += z
        a[3] += d1[name].numel()
    rows = [
        {
            column: k,
            "cosine": _cos(v[0], v[1], v[2]),
            "norm_a": math.sqrt(v[1]),
            "norm_b": math.sqrt(v[2]),
            "numel": int(v[3]),
        }
        for k, v in acc.items()
    ]
    return pd.DataFrame(rows, columns=[column, "cosine", "norm_a", "norm_b", "numel"])


def cosine_by_layer(d1: StateDict, d2: StateDict) -> pd.DataFrame:
    """Cosine per decoder layer (sorted); tensors outside the layers (embeddings, final norm,
    head) form one last row with ``layer`` = <NA>."""
    df = cosine_by(d1, d2, layer_index, "layer")
    df["layer"] = df["layer"].astype("Int64")
    return df.sort_values("layer", na_position="last").reset_index(drop=True)


def cosine_by_module_type(d1: StateDict, d2: StateDict) -> pd.DataFrame:
    """Cosine per module type (embedding, attention, mlp, norm, lm_head, other), sorted by name."""
    return cosine_by(d1, d2, module_type, "module_type").sort_values("module_type").reset_index(drop=True)


def _key(value) -> str:
    return "none" if value is None or pd.isna(value) else str(value)


def cosine_rows(d_a: StateDict, d_b: StateDict, pair: str) -> list[dict]:
    """Rows scope/key/cosine/pair/norm_a/norm_b/numel: global, per layer, per module type."""
    na, nb = l2(d_a), l2(d_b)
    rows = [{"scope": "global", "key": "all", "cosine": cosine(d_a, d_b), "pair": pair, "norm_a": na, "norm_b": nb,
             "numel": sum(t.numel() for t in d_a.values())}]
    for scope, table, column in (("layer", cosine_by_layer(d_a, d_b), "layer"),
                                 ("module_type", cosine_by_module_type(d_a, d_b), "module_type")):
        for r in table.to_dict("records"):
            rows.append({"scope": scope, "key": _key(r[column]), "cosine": r["cosine"], "pair": pair,
                         "norm_a": r["norm_a"], "norm_b": r["norm_b"], "numel": r["numel"]})
    return rows
