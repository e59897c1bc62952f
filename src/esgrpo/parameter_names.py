"""What a parameter's name says: its module type (embedding, attention, mlp, norm, lm_head, other) and its
decoder layer. The drift analysis groups by them, and ES's step agreement counts changed coordinates by them
(`esgrpo.distance.StepAgreement`): a basic both sides share, below es/ and analysis/."""

from __future__ import annotations

import re

MODULE_TYPES = ("embedding", "attention", "mlp", "norm", "lm_head", "other")

_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)\.")


def module_type(param_name: str) -> str:
    """Classify an HF parameter name as embedding / attention / mlp / norm / lm_head / other.

    Covers Llama, Qwen2 and Qwen3 names (and GPT-2-style ``wte``/``attn``/``ln_`` names).
    Norms are matched before attention because Qwen3 keeps ``q_norm``/``k_norm`` inside
    ``self_attn``; they are normalisation weights, the kind Paper B groups as LayerNorm.
    """
    parts = param_name.lower().split(".")
    if "lm_head" in parts:
        return "lm_head"
    if any(p in ("embed_tokens", "wte", "wpe", "embed_positions", "embeddings") for p in parts):
        return "embedding"
    if any("norm" in p or p.startswith("ln_") or p == "ln_f" for p in parts):
        return "norm"
    if any(p in ("self_attn", "attn", "attention", "self_attention") for p in parts):
        return "attention"
    if any(p in ("mlp", "feed_forward", "ffn") for p in parts):
        return "mlp"
    return "other"


def layer_index(param_name: str) -> int | None:
    """Decoder-layer index parsed from ``...layers.N...`` (None for embeddings, final norm, head)."""
    m = _LAYER_RE.search(param_name)
    return int(m.group(1)) if m else None
