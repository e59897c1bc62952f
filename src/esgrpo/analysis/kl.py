"""Token-level KL divergence between two models' next-token distributions, and its summaries.

The model-running code scores the same completions (sampled from p) under both models and
passes the full log-probability tensors here. Summing the exact per-position KL(p || q)
over a completion gives a low-variance, unbiased estimate of the sequence-level KL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

__all__ = ["token_kl", "per_sequence_kl", "sequence_kl_stats", "continuation_logits", "kl_on_samples"]


def token_kl(
    logp_p: torch.Tensor, logp_q: torch.Tensor, mask: torch.Tensor | None = None, normalise: bool = True
) -> torch.Tensor:
    """Per-position ``KL(p || q) = sum_v p_v (log p_v - log q_v)`` from ``[B, T, V]`` log-probs.

    Returns ``[B, T]`` float32 (float64 if the inputs are float64), with masked-out positions
    (``mask == 0``) set to 0. ``normalise`` re-applies ``log_softmax`` so raw logits are
    accepted too; it is a no-op on proper log-probs. Terms with ``p_v = 0`` contribute 0.
    """
    if logp_p.shape != logp_q.shape:
        raise ValueError(f"shape mismatch: {tuple(logp_p.shape)} vs {tuple(logp_q.shape)}")
    dtype = torch.float64 if logp_p.dtype == torch.float64 else torch.float32  # bf16 is too coarse here
    lp, lq = logp_p.to(dtype), logp_q.to(dtype)
    if normalise:
        lp, lq = torch.log_softmax(lp, dim=-1), torch.log_softmax(lq, dim=-1)
    p = lp.exp()
    # where p_v == 0 the term is 0 even if log q_v == -inf (avoid 0 * inf = nan)
    terms = torch.where(p > 0, p * (lp - lq), torch.zeros_like(p))
    kl = terms.sum(dim=-1).clamp_min(0.0)  # KL >= 0; clip float rounding
    if mask is not None:
        if mask.shape != kl.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} != {tuple(kl.shape)}")
        kl = torch.where(mask.to(torch.bool), kl, torch.zeros_like(kl))
    return kl


def per_sequence_kl(tok_kl: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of token KL, number of counted tokens)`` per sequence, both ``[B]`` float64.

    Concatenate these over batches before calling :func:`sequence_kl_stats`.
    """
    m = mask.to(torch.float64)
    return (tok_kl.to(torch.float64) * m).sum(dim=-1), m.sum(dim=-1)


def sequence_kl_stats(
    seq_sums: torch.Tensor, seq_counts: torch.Tensor, prompt_ids: torch.Tensor | list | None = None
) -> dict[str, float]:
    """Summaries of per-sequence KL sums and token counts (from :func:`per_sequence_kl`).

    - ``token_mean``: total KL / total tokens (token-weighted; long completions weigh more);
    - ``prompt_mean``: per prompt, its completions' KL / their tokens, then the mean over
      prompts (each prompt weighs the same; with ``prompt_ids`` None each sequence is a prompt);
    - ``sequence_mean``: mean over sequences of the summed KL (sequence-level KL estimate);
    - ``n_tokens``, ``n_sequences``, ``n_prompts``.
    Sequences with no counted token are ignored in ``prompt_mean``.
    """
    s = torch.as_tensor(seq_sums, dtype=torch.float64).ravel()
    c = torch.as_tensor(seq_counts, dtype=torch.float64).ravel()
    if s.shape != c.shape or s.numel() == 0:
        raise ValueError("seq_sums and seq_counts must be non-empty and of equal length")
    if prompt_ids is None:
        groups = torch.arange(s.numel())
    else:
        ids = list(prompt_ids.tolist() if isinstance(prompt_ids, torch.Tensor) else prompt_ids)
        if len(ids) != s.numel():
            raise ValueError("prompt_ids must have one entry per sequence")
        index: dict = {}
        groups = torch.tensor([index.setdefault(i, len(index)) for i in ids])
    n_groups = int(groups.max()) + 1
    g_sum = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, s)
    g_cnt = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, c)
    valid = g_cnt > 0
    total = float(c.sum())
    return {
        "token_mean": float(s.sum()) / total if total > 0 else float("nan"),
        "prompt_mean": float((g_sum[valid] / g_cnt[valid]).mean()) if bool(valid.any()) else float("nan"),
        "sequence_mean": float(s.mean()),
        "n_tokens": int(total),
        "n_sequences": int(s.numel()),
        "n_prompts": n_groups,
    }


@torch.inference_mode()
def continuation_logits(model, batch: list[tuple[list[int], list[int]]], pad_id: int):
    """Raw logits [B, T, V] at the positions predicting each completion token, and the [B, T] mask."""
    lengths = [len(p) + len(c) for p, c in batch]
    width = max(lengths)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for b, (p, c) in enumerate(batch):  # right padding: positions of real tokens are 0..len-1
        ids[b, :lengths[b]] = torch.tensor(p + c)
        attention[b, :lengths[b]] = 1
    start = min(len(p) for p, _ in batch) - 1  # logits at t predict token t+1
    stop = width - 1
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits[:, start:stop]
    pos = torch.arange(start, stop).unsqueeze(0)
    first = torch.tensor([len(p) - 1 for p, _ in batch]).unsqueeze(1)
    last = torch.tensor([len(p) + len(c) - 1 for p, c in batch]).unsqueeze(1)
    mask = (pos >= first) & (pos < last)
    return logits.float(), mask.to(logits.device)


def kl_on_samples(model_p, model_q, samples: Sequence[Mapping], pad_id: int, batch_size: int = 16) -> dict:
    """KL(p || q) per completion token on fixed continuations (teacher-forced, full vocabulary),
    summarised by ``sequence_kl_stats`` (token, prompt and sequence means)."""
    seqs = [(s["id"], list(s["prompt_ids"]), list(c)) for s in samples for c in s["completion_ids"]]
    sums, counts, ids = [], [], []
    for i in range(0, len(seqs), batch_size):
        chunk = seqs[i:i + batch_size]
        batch = [(p, c) for _, p, c in chunk]
        lp, mask = continuation_logits(model_p, batch, pad_id)
        lq, _ = continuation_logits(model_q, batch, pad_id)
        s, n = per_sequence_kl(token_kl(lp, lq.to(lp.device), mask), mask)
        sums.append(s.cpu())
        counts.append(n.cpu())
        ids += [sid for sid, _, _ in chunk]
    return sequence_kl_stats(torch.cat(sums), torch.cat(counts), ids)
