"""Unit tests of esgrpo.analysis.cosine on tiny synthetic state dicts with known answers."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from esgrpo.analysis.cosine import cosine, cosine_by_layer, cosine_by_module_type
from tests.analysis.helpers import NAMES, tiny_model

# ------------------------------------------------------------------ cosine


def test_cosine_global_and_grouped():
    d1 = {n: torch.zeros(3, 4) for n in NAMES}
    d2 = {n: torch.zeros(3, 4) for n in NAMES}
    d1["model.layers.0.self_attn.q_proj.weight"][0, 0] = 1.0
    d2["model.layers.0.self_attn.q_proj.weight"][0, 1] = 1.0  # orthogonal
    assert cosine(d1, d2) == pytest.approx(0.0)
    assert cosine(d1, {k: 2 * v for k, v in d1.items()}) == pytest.approx(1.0)
    assert cosine(d1, {k: -v for k, v in d1.items()}) == pytest.approx(-1.0)
    # layer 1: parallel; layer 0: orthogonal
    d1["model.layers.1.mlp.down_proj.weight"][:] = 1.0
    d2["model.layers.1.mlp.down_proj.weight"][:] = 3.0
    by_layer = cosine_by_layer(d1, d2)
    assert list(by_layer["layer"].iloc[:2]) == [0, 1]
    assert pd.isna(by_layer["layer"].iloc[2])
    assert by_layer["cosine"].iloc[0] == pytest.approx(0.0)
    assert by_layer["cosine"].iloc[1] == pytest.approx(1.0)
    assert math.isnan(by_layer["cosine"].iloc[2])  # zero update outside the layers
    by_type = cosine_by_module_type(d1, d2).set_index("module_type")
    assert by_type.loc["mlp", "cosine"] == pytest.approx(1.0)
    assert by_type.loc["attention", "cosine"] == pytest.approx(0.0)
    # a global cosine from random dense deltas agrees with numpy
    a, b = tiny_model(1), tiny_model(2)
    va = np.concatenate([a[n].numpy().ravel() for n in NAMES])
    vb = np.concatenate([b[n].numpy().ravel() for n in NAMES])
    a.pop("model.rotary_emb.inv_freq_ids")
    b.pop("model.rotary_emb.inv_freq_ids")
    assert cosine(a, b) == pytest.approx(va @ vb / np.linalg.norm(va) / np.linalg.norm(vb), rel=1e-6)
