"""Unit tests of esgrpo.analysis.drift on tiny synthetic state dicts with known answers."""

import math

import pandas as pd
import pytest
import torch

from esgrpo.analysis.drift import delta, drift_by, drift_table, l2, layer_index, module_type, relative_l2
from tests.analysis.helpers import NAMES, add, tiny_model

# ------------------------------------------------------------------ drift


def test_module_type_and_layer():
    assert module_type("model.embed_tokens.weight") == "embedding"
    assert module_type("model.layers.3.self_attn.o_proj.weight") == "attention"
    assert module_type("model.layers.3.self_attn.q_proj.bias") == "attention"
    assert module_type("model.layers.3.self_attn.q_norm.weight") == "norm"  # Qwen3
    assert module_type("model.layers.3.mlp.gate_proj.weight") == "mlp"
    assert module_type("model.layers.3.post_attention_layernorm.weight") == "norm"
    assert module_type("model.norm.weight") == "norm"
    assert module_type("lm_head.weight") == "lm_head"
    assert module_type("something.else") == "other"
    assert layer_index("model.layers.12.mlp.up_proj.weight") == 12
    assert layer_index("model.norm.weight") is None
    assert layer_index("lm_head.weight") is None


def test_delta_l2_relative():
    t0 = {"a": torch.zeros(2), "b": torch.tensor([3.0, 0.0])}
    t1 = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([3.0, 4.0])}
    d = delta(t1, t0)
    assert d["a"].dtype == torch.float64
    assert l2(d) == pytest.approx(5.0)
    assert relative_l2(t1, t0) == pytest.approx(5.0 / 3.0)
    with pytest.raises(KeyError):
        delta({"a": torch.zeros(2)}, t0)


def test_drift_table_and_by():
    t0 = tiny_model(0)
    d = {n: torch.zeros(3, 4) for n in NAMES}
    d["model.layers.0.self_attn.q_proj.weight"][0, 0] = 3.0
    d["model.layers.1.self_attn.k_proj.weight"][1, 1] = 4.0
    d["model.norm.weight"][2, 2] = 12.0
    t1 = add(t0, d)
    df = drift_table(t1, t0)
    assert len(df) == len(NAMES)  # integer buffer skipped
    assert set(df.columns) >= {"name", "module_type", "layer", "numel", "l2", "relative_l2"}
    row = df.set_index("name").loc["model.norm.weight"]
    assert row["l2"] == pytest.approx(12.0, rel=1e-6)
    assert pd.isna(row["layer"])
    by_type = drift_by(df, "module_type").set_index("module_type")
    assert by_type.loc["attention", "l2"] == pytest.approx(5.0, rel=1e-6)
    assert by_type.loc["mlp", "l2"] == 0.0
    assert by_type.loc["attention", "numel"] == 24
    assert math.sqrt((by_type["l2"] ** 2).sum()) == pytest.approx(13.0, rel=1e-6)
    assert by_type["share_sq"].sum() == pytest.approx(1.0)
    by_layer = drift_by(df, "layer")
    assert len(by_layer) == 3  # layers 0, 1 and the non-layer group
    assert math.sqrt((by_layer["l2"] ** 2).sum()) == pytest.approx(l2(delta(t1, t0)))
