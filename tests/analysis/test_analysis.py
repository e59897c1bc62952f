"""Unit tests of esgrpo.analysis on tiny synthetic state dicts with known answers."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from esgrpo.analysis.cosine import cosine, cosine_by_layer, cosine_by_module_type
from esgrpo.analysis.drift import delta, drift_by, drift_table, l2, layer_index, module_type, relative_l2
from esgrpo.analysis.interpolation import along_direction, interpolate, random_direction_like
from esgrpo.analysis.kl import per_sequence_kl, sequence_kl_stats, token_kl
from esgrpo.analysis.sparsity import n_kept, reset_module_type, sparsify, top_fraction_mask
from esgrpo.analysis.theory import expected_es_norm, expected_es_sq_norm, fit_sq_norm_vs_t
from esgrpo.estimators import barrier_height
from esgrpo.noise import tensor_noise

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


# ------------------------------------------------------------------ theory


def test_theory_fit_recovers_slope():
    alpha, n, d = 5e-4, 30, 1_000_000
    t = np.arange(1, 11)
    sq = expected_es_sq_norm(alpha, n, d, t)
    fit = fit_sq_norm_vs_t(t, sq, alpha=alpha, n_members=n, d=d)
    assert fit["slope"] == pytest.approx(alpha**2 * d / n)
    assert fit["intercept"] == pytest.approx(0.0, abs=1e-12)
    assert fit["r2"] == pytest.approx(1.0)
    assert fit["slope_ratio_to_theory"] == pytest.approx(1.0)
    assert math.isnan(fit_sq_norm_vs_t(t, 2 * t + 1)["slope_ratio_to_theory"])
    assert expected_es_norm(alpha, n, d, 4) == pytest.approx(alpha * math.sqrt(4 * d / n))
    with pytest.raises(ValueError):
        fit_sq_norm_vs_t([1, 1], [2, 3])


def test_theory_matches_simulated_es_steps():
    # simulate z-scored ES steps in d dims: ||sum of steps||^2 should follow alpha^2 T d / N
    rng = np.random.default_rng(0)
    alpha, n, d, steps = 0.01, 8, 5000, 20
    theta, sq = np.zeros(d), []
    for _ in range(steps):
        eps = rng.standard_normal((n, d))
        f = rng.standard_normal(n)
        z = (f - f.mean()) / f.std()
        theta += alpha / n * z @ eps
        sq.append(theta @ theta)
    fit = fit_sq_norm_vs_t(np.arange(1, steps + 1), sq, alpha=alpha, n_members=n, d=d)
    assert fit["slope_ratio_to_theory"] == pytest.approx(1.0, rel=0.15)


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


# ------------------------------------------------------------------ interpolation


def test_interpolation_endpoints_and_midpoint():
    t0 = tiny_model(0)
    ta, tb = tiny_model(1), tiny_model(2)
    for t in (ta, tb):
        t["model.rotary_emb.inv_freq_ids"] = t0["model.rotary_emb.inv_freq_ids"]
    da, db = delta(ta, t0), delta(tb, t0)
    m0, m1 = interpolate(t0, da, db, 0.0), interpolate(t0, da, db, 1.0)
    for n in NAMES:
        assert torch.equal(m0[n], ta[n])
        assert torch.equal(m1[n], tb[n])
        assert m0[n].dtype == t0[n].dtype
    mid = interpolate(t0, da, db, 0.5)
    assert torch.allclose(mid[NAMES[1]], (ta[NAMES[1]] + tb[NAMES[1]]) / 2, atol=1e-6)
    assert torch.equal(mid["model.rotary_emb.inv_freq_ids"], t0["model.rotary_emb.inv_freq_ids"])


def test_along_and_random_direction():
    t0 = tiny_model(0)
    d = delta(tiny_model(1), t0)
    r1, r2 = random_direction_like(d, seed=7), random_direction_like(d, seed=7)
    assert all(torch.equal(r1[n], r2[n]) for n in r1)
    assert l2(r1) == pytest.approx(1.0, rel=1e-6)
    assert not torch.equal(random_direction_like(d, seed=8)[NAMES[0]], r1[NAMES[0]])
    # a tensor's values do not depend on which other tensors are present (seeded per name)
    sub = random_direction_like({NAMES[3]: d[NAMES[3]]}, seed=7)[NAMES[3]]
    assert torch.allclose(sub / sub.norm(), r1[NAMES[3]] / r1[NAMES[3]].norm())
    # one per-tensor seeding for the whole package: a direction's tensor is the ES noise of member seed 7
    for name in (NAMES[0], NAMES[3]):
        eps = tensor_noise(7, name, d[name].shape).double()
        assert torch.allclose(r1[name].double() / r1[name].double().norm(), eps / eps.norm(), atol=1e-6)
    moved = along_direction(t0, d, 2.5)
    step = delta(moved, t0)
    assert l2(step) == pytest.approx(2.5, rel=1e-5)
    assert cosine(step, d) == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError):
        along_direction(t0, {n: torch.zeros(3, 4) for n in NAMES}, 1.0)


def test_barrier_height():
    lams = np.linspace(0, 1, 11)
    assert barrier_height(lams, 0.5 + 0.2 * lams) == pytest.approx(0.0)
    accs = np.full(11, 0.6)
    accs[5] = 0.4
    assert barrier_height(lams, accs) == pytest.approx(0.2)
    assert barrier_height(lams, 0.6 + 0.1 * np.sin(np.pi * lams)) == 0.0  # bump above the line
    assert barrier_height(lams[::-1], accs[::-1]) == pytest.approx(0.2)  # order-independent
    assert barrier_height([0, 1], [0.3, 0.5]) == 0.0


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

