"""Tiny synthetic state dicts with known answers, shared by the analysis tests."""


import torch

NAMES = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.1.self_attn.k_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
]


def tiny_model(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    sd = {n: torch.randn(3, 4, generator=g).to(dtype) for n in NAMES}
    sd["model.rotary_emb.inv_freq_ids"] = torch.arange(4)  # integer buffer: not a parameter
    return sd


def add(sd, d):
    return {n: (t + d[n].to(t.dtype) if n in d else t.clone()) for n, t in sd.items()}
