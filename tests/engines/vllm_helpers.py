"""A tiny random Llama and its weights in vLLM's fused layout, shared by the vLLM layout and backend tests."""

from __future__ import annotations

import torch

from esgrpo.engines.vllm_layout import fuse_state_dict


def tiny_llama(head_dim: int | None = None, bias: bool = False, tie: bool = False, seed: int = 0):
    """A real transformers Llama with GQA (4 query heads, 2 KV heads): the names and shapes vLLM fuses."""
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = {"head_dim": head_dim} if head_dim else {}
    config = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attention_bias=bias,
                         tie_word_embeddings=tie, max_position_embeddings=64, **kwargs)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def fused_of(model) -> dict[str, torch.Tensor]:
    return fuse_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()}, model.config)
