"""Unit tests of esgrpo.analysis.sparsity on tiny synthetic state dicts with known answers."""

import math

import pytest
import torch

from esgrpo.analysis.drift import delta, module_type
from esgrpo.analysis.sparsity import n_kept, reset_module_type, sparsify, top_fraction_mask
from tests.analysis.helpers import NAMES, add, tiny_model

# ------------------------------------------------------------------ sparsity


def _sparse_pair():
    t0 = tiny_model(0)
    g = torch.Generator().manual_seed(5)
    d = {}
    for n in NAMES:
        x = torch.randn(3, 4, generator=g)
        x[x.abs() < 0.4] = 0.0  # some coordinates unchanged
        d[n] = x
    if sum(int((x != 0).sum()) for x in d.values()) % 2:  # even count: "half" is exact
        x = d[NAMES[0]].view(-1)
        x[int(torch.nonzero(x)[0])] = 0.0
    return t0, add(t0, d), d


def test_sparsify_endpoints_exact():
    t0, t1, _ = _sparse_pair()
    s1 = sparsify(t0, t1, 1.0)
    s0 = sparsify(t0, t1, 0.0)
    for n in t0:
        assert torch.equal(s1[n], t1[n])
        assert torch.equal(s0[n], t0[n]) if t0[n].is_floating_point() else torch.equal(s0[n], t1[n])


def test_top_fraction_keeps_largest_half():
    t0, t1, _ = _sparse_pair()
    d = delta(t1, t0)
    changed = torch.cat([v.ravel() for v in d.values()])
    changed = changed[changed != 0].abs()
    n_changed = changed.numel()
    assert n_changed % 2 == 0 and 0 < n_changed < 12 * len(NAMES)
    masks = top_fraction_mask(d, 0.5)
    assert n_kept(masks) == n_changed // 2
    kept = torch.cat([d[n].abs()[masks[n]] for n in d])
    dropped = torch.cat([d[n].abs()[~masks[n] & (d[n] != 0)] for n in d])
    assert kept.min() >= dropped.max()
    assert all(not bool((masks[n] & (d[n] == 0)).any()) for n in d)  # never keeps unchanged coords
    # sparsified model: kept coordinates equal theta, the rest theta0
    s = sparsify(t0, t1, 0.5)
    for n in d:
        assert torch.equal(s[n][masks[n]], t1[n][masks[n]])
        assert torch.equal(s[n][~masks[n]], t0[n][~masks[n]])


def test_top_fraction_ties_deterministic_and_sampled_path_identical():
    # many exact ties: values drawn from a tiny set, like bf16-quantised updates
    g = torch.Generator().manual_seed(0)
    d = {n: torch.randint(-3, 4, (7, 9), generator=g).double() * 0.25 for n in NAMES}
    n_changed = sum(int((v != 0).sum()) for v in d.values())
    for f in (0.07, 0.3, 0.5, 0.93):
        exact = top_fraction_mask(d, f)
        assert n_kept(exact) == math.floor(f * n_changed + 0.5)
        # ties broken by order: among coordinates at the threshold, kept ones come first
        flat_keep = torch.cat([exact[n].ravel() for n in d])
        flat_abs = torch.cat([d[n].abs().ravel() for n in d])
        tau = flat_abs[flat_keep].min()
        at_tau = flat_keep[flat_abs == tau]
        assert torch.equal(at_tau, torch.sort(at_tau.int(), descending=True, stable=True).values.bool())
        # the memory-saving path (forced with a tiny exact_limit and sample) gives the same masks
        for sample_size in (50, 10_000):
            approx = top_fraction_mask(d, f, exact_limit=10, sample_size=sample_size, seed=1)
            assert all(torch.equal(exact[n], approx[n]) for n in d)


def test_top_fraction_sampled_path_continuous_values():
    g = torch.Generator().manual_seed(3)
    d = {n: torch.randn(20, 30, generator=g) for n in NAMES}
    for f in (0.01, 0.5, 0.99):
        exact = top_fraction_mask(d, f)
        approx = top_fraction_mask(d, f, exact_limit=100, sample_size=300, seed=2)
        assert all(torch.equal(exact[n], approx[n]) for n in d)
    with pytest.raises(ValueError):
        top_fraction_mask(d, 1.5)


def test_reset_module_type():
    t0, t1, _ = _sparse_pair()
    r = reset_module_type(t0, t1, "attention")
    for n in NAMES:
        expected = t0[n] if module_type(n) == "attention" else t1[n]
        assert torch.equal(r[n], expected)
    r2 = reset_module_type(t0, t1, ["mlp", "norm"])
    assert torch.equal(r2["model.norm.weight"], t0["model.norm.weight"])
    assert torch.equal(
        r2["model.layers.1.self_attn.k_proj.weight"], t1["model.layers.1.self_attn.k_proj.weight"]
    )
    with pytest.raises(ValueError):
        reset_module_type(t0, t1, "layernorm")

