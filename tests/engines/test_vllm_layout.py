"""vLLM's weight layout (esgrpo.engines.vllm_layout) on a CPU: fusing and unfusing real Llama names and shapes,
and fused noise that is the transformers noise stacked."""

from __future__ import annotations

import pytest
import torch

from esgrpo.engines.vllm_layout import (
    fuse_state_dict,
    fused_noise,
    fused_weighted_sum,
    parts_of,
    unfuse_state_dict,
)
from esgrpo.noise import Noise, tensor_noise
from tests.engines.vllm_helpers import fused_of, tiny_llama

# --------------------------------------------------------------------------- layout


@pytest.mark.parametrize("head_dim,bias", [(None, False), (16, True)])
def test_fuse_and_unfuse_match_real_llama_names_and_shapes(head_dim, bias):
    model = tiny_llama(head_dim=head_dim, bias=bias)
    hf = {k: v.detach() for k, v in model.state_dict().items()}
    fused = fuse_state_dict(hf, model.config)
    hd = head_dim or 32 // 4
    assert fused["model.layers.0.self_attn.qkv_proj.weight"].shape == ((4 + 2 * 2) * hd, 32)
    assert fused["model.layers.1.mlp.gate_up_proj.weight"].shape == (2 * 40, 32)
    if bias:
        assert fused["model.layers.0.self_attn.qkv_proj.bias"].shape == ((4 + 2 * 2) * hd,)
    assert not any(f".{p}." in n for n in fused for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))
    back = unfuse_state_dict(fused, model.config)
    assert set(back) == set(hf)
    for name, value in hf.items():
        assert back[name].shape == value.shape and torch.equal(back[name], value), name
        assert back[name].is_contiguous()
    fresh = tiny_llama(head_dim=head_dim, bias=bias, seed=1)
    fresh.load_state_dict(back, strict=True)  # transformers takes the unfused names as they are


def test_unfuse_works_from_a_plain_dict_config_and_drops_a_tied_head():
    model = tiny_llama(tie=True)
    fused = fused_of(model)
    fused["lm_head.weight"] = fused["model.embed_tokens.weight"]  # vLLM may list the tied head
    config = {"num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True}
    back = unfuse_state_dict(fused, config)
    assert "lm_head.weight" not in back and "model.layers.0.self_attn.q_proj.weight" in back


def test_parts_refuse_shapes_that_do_not_split():
    config = {"num_attention_heads": 4, "num_key_value_heads": 2}
    with pytest.raises(ValueError, match="heads"):
        parts_of("model.layers.0.self_attn.qkv_proj.weight", (63, 32), config)
    with pytest.raises(ValueError, match="halves"):
        parts_of("model.layers.0.mlp.gate_up_proj.weight", (81, 32), config)
    assert [p.name for p in parts_of("model.norm.weight", (32,), config)] == ["model.norm.weight"]


def test_fused_noise_is_the_hf_noise_stacked():
    model = tiny_llama()
    fused = fused_of(model)
    noise = {n: fused_noise(1234, n, v.shape, model.config) for n, v in fused.items()}
    unfused = unfuse_state_dict(noise, model.config)
    for name, value in model.state_dict().items():
        assert torch.equal(unfused[name], tensor_noise(1234, name, value.shape)), name
    # q, k and v get independent noise (the trap: one seed for every tensor)
    q = unfused["model.layers.0.self_attn.q_proj.weight"]
    k = unfused["model.layers.0.self_attn.k_proj.weight"]
    assert not torch.equal(q[: k.shape[0]], k)


def test_fused_lowrank_noise_and_update_sum_are_the_hf_parts_stacked():
    """Low-rank noise in vLLM layout: each HF part its own A B^T / sqrt(r) (q, k, v independent), the update's
    weighted sum likewise; the layout is ready for low-rank members, which the backend still refuses."""
    model = tiny_llama()
    fused = fused_of(model)
    low = Noise("lowrank", 2)
    noise = unfuse_state_dict({n: fused_noise(5, n, v.shape, model.config, noise=low) for n, v in fused.items()},
                              model.config)
    coefficients = {5: 0.5, 6: -2.0}
    sums = unfuse_state_dict({n: fused_weighted_sum(coefficients, n, v.shape, model.config, noise=low)
                              for n, v in fused.items()}, model.config)
    for name, value in model.state_dict().items():
        assert torch.equal(noise[name], low.dense(5, name, value.shape)), name
        torch.testing.assert_close(sums[name], low.weighted_sum(coefficients, name, value.shape), rtol=0, atol=1e-6)
    assert torch.linalg.matrix_rank(noise["model.layers.0.self_attn.q_proj.weight"]) == 2
