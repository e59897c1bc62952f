"""Unit tests of esgrpo.analysis.interpolation on tiny synthetic state dicts, and the barrier height
(esgrpo.estimators) read off an interpolation curve."""


import numpy as np
import pytest
import torch

from esgrpo.analysis.cosine import cosine
from esgrpo.analysis.drift import delta, l2
from esgrpo.analysis.interpolation import along_direction, interpolate, random_direction_like
from esgrpo.estimators import barrier_height
from esgrpo.noise import tensor_noise
from tests.analysis.helpers import NAMES, tiny_model

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
