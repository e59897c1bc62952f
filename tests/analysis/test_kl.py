"""Unit tests of esgrpo.analysis.kl with known answers."""


import pytest
import torch

from esgrpo.analysis.kl import per_sequence_kl, sequence_kl_stats, token_kl

# ------------------------------------------------------------------ KL


def test_token_kl():
    g = torch.Generator().manual_seed(0)
    lp = torch.log_softmax(torch.randn(2, 5, 7, generator=g), -1)
    lq = torch.log_softmax(torch.randn(2, 5, 7, generator=g), -1)
    assert torch.allclose(token_kl(lp, lp), torch.zeros(2, 5), atol=1e-6)
    kl = token_kl(lp, lq)
    assert kl.shape == (2, 5) and bool((kl > 0).all())
    ref = (lp.exp() * (lp - lq)).sum(-1)
    assert torch.allclose(kl, ref, atol=1e-6)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    km = token_kl(lp, lq, mask)
    assert bool((km[0, 3:] == 0).all()) and torch.allclose(km[1], kl[1])
    # zero-probability tokens under p contribute nothing even where q is -inf there
    p = torch.tensor([[[0.0, 0.5, 0.5]]]).log()
    q = torch.tensor([[[0.0, 0.5, 0.5]]]).log()
    assert float(token_kl(p, q)) == pytest.approx(0.0)
    # logits are accepted (normalised internally)
    assert torch.allclose(token_kl(lp + 3.0, lq - 1.0), kl, atol=1e-5)


def test_sequence_kl_stats():
    tok = torch.tensor([[1.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.5, 0.5, 0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    sums, counts = per_sequence_kl(tok, mask)
    assert sums.tolist() == [2.0, 2.0, 1.5] and counts.tolist() == [2.0, 1.0, 3.0]
    s = sequence_kl_stats(sums, counts)
    assert s["token_mean"] == pytest.approx(5.5 / 6)
    assert s["prompt_mean"] == pytest.approx((1.0 + 2.0 + 0.5) / 3)
    assert s["sequence_mean"] == pytest.approx(5.5 / 3)
    assert (s["n_tokens"], s["n_sequences"], s["n_prompts"]) == (6, 3, 3)
    s2 = sequence_kl_stats(sums, counts, prompt_ids=["a", "a", "b"])
    assert s2["prompt_mean"] == pytest.approx((4.0 / 3 + 0.5) / 2)
    assert s2["n_prompts"] == 2
