"""The ES noise (esgrpo.noise): per-tensor reproducible draws, the name hash, low-rank factors and the lazy
Population."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from esgrpo.es.hf_backend import theta_from_model, trainable_names
from esgrpo.es.ops import (
    member_seeds,
    perturbed_population,
)
from esgrpo.noise import Noise, Population, lowrank_factors, stable_name_hash, tensor_noise
from tests.es.helpers import tiny_llama

# --------------------------------------------------------------------------- seeds and noise


def test_noise_is_per_tensor_reproducible_and_per_member():
    a = tensor_noise(7, "model.layers.0.self_attn.q_proj.weight", (16, 16))
    b = tensor_noise(7, "model.layers.0.self_attn.k_proj.weight", (16, 16))
    assert a.dtype == torch.float32 and a.shape == (16, 16)
    assert not torch.equal(a, b)  # same shape, same member: still independent noise
    assert abs(float(torch.corrcoef(torch.stack([a.ravel(), b.ravel()]))[0, 1])) < 0.25
    assert torch.equal(a, tensor_noise(7, "model.layers.0.self_attn.q_proj.weight", (16, 16)))
    assert not torch.equal(a, tensor_noise(8, "model.layers.0.self_attn.q_proj.weight", (16, 16)))
    big = tensor_noise(1, "x", (100_000,))
    assert abs(float(big.mean())) < 0.02 and abs(float(big.std()) - 1) < 0.02


def test_name_hash_is_not_pythons_salted_hash():
    expected = int.from_bytes(hashlib.blake2b(b"lm_head.weight", digest_size=8).digest(), "little")
    assert stable_name_hash("lm_head.weight") == expected  # a pure function of the name's bytes


def test_lowrank_noise_is_a_b_over_sqrt_r_of_one_draw_with_unit_variance():
    name = "model.layers.0.mlp.up_proj.weight"
    for rank in (1, 4):
        noise = Noise("lowrank", rank)
        a, b = lowrank_factors(7, name, (48, 32), rank)
        assert a.shape == (48, rank) and b.shape == (32, rank)
        eps = noise.dense(7, name, (48, 32))
        torch.testing.assert_close(eps, a @ b.T / math.sqrt(rank), rtol=0, atol=1e-6)
        assert torch.equal(eps, noise.dense(7, name, (48, 32)))  # a pure function of (seed, name)
        assert not torch.equal(eps, noise.dense(8, name, (48, 32)))
        assert not torch.equal(eps, noise.dense(7, name.replace("up", "gate"), (48, 32)))
        assert torch.linalg.matrix_rank(eps) == rank
        # E ||eps||_F^2 = m n, as for full-rank noise (so the norm theory carries over)
        mean_sq = np.mean([float(noise.dense(s, name, (48, 32)).pow(2).sum()) for s in range(400)])
        assert mean_sq == pytest.approx(48 * 32, rel=0.05)
    # the factors are the first m and last n rows of one draw from the full-rank generator of (seed, name)
    assert torch.equal(torch.cat(lowrank_factors(7, name, (48, 32), 3)), tensor_noise(7, name, (80, 3)))
    # 1-D tensors keep full-rank noise
    assert torch.equal(Noise("lowrank", 4).dense(7, "model.norm.weight", (32,)), tensor_noise(7, "model.norm.weight", (32,)))
    with pytest.raises(ValueError, match="rank"):
        Noise("lowrank", 0)
    with pytest.raises(ValueError, match="lowrank"):
        Noise("sparse")


def test_lowrank_population_members_and_factors_agree():
    model = tiny_llama()
    theta = theta_from_model(model, trainable_names(model, ["*"]))
    seeds = member_seeds(0, 0, 4, antithetic=True)
    pop = Population(theta, seeds, 0.1, Noise("lowrank", 2))
    stacked = perturbed_population(theta, seeds, 0.1, noise=Noise("lowrank", 2))
    for name, value in theta.items():
        for n, member in enumerate(pop.members()):
            assert torch.equal(member[name], stacked[name][n])
        if value.dim() == 2:
            a, b = pop.factors(name)  # A scaled by sign sigma / sqrt(r): member n = theta + A_n B_n^T
            torch.testing.assert_close(stacked[name], value + a @ b.transpose(1, 2), rtol=0, atol=1e-6)
            assert torch.linalg.matrix_rank(stacked[name][0] - value) == 2
        else:
            seed, sign = seeds[0]
            assert torch.equal(stacked[name][0], value.add(tensor_noise(seed, name, value.shape), alpha=sign * 0.1))
    assert "lm_head.weight" in pop and "not.a.tensor" not in pop


@pytest.mark.parametrize("seeding", ["per_tensor", "paper_a", "paper_b"])
def test_weighted_sum_adds_each_members_draw_in_order(seeding):
    """The update's sum of weighted noises (one draw buffer for every seed) is, bit for bit, the noises drawn
    one by one and added in the coefficients' order; zero coefficients are skipped."""
    noise = Noise(seeding=seeding, dtype=torch.bfloat16 if seeding == "paper_a" else torch.float32)
    coefficients = {11: 0.5, 7: -1.25, 3: 0.0, 5: 2.0}
    for name, shape in [("model.layers.0.mlp.up_proj.weight", (48, 32)), ("model.norm.weight", (32,))]:
        expected = torch.zeros(shape)
        for seed, c in coefficients.items():
            if c:
                expected.add_(noise.draw(seed, name, shape).float(), alpha=c)
        total = noise.weighted_sum(coefficients, name, shape)
        assert torch.equal(total, expected), (seeding, name)
        assert not torch.equal(total, noise.weighted_sum({11: 0.5, 7: -1.25}, name, shape))
    assert torch.equal(noise.weighted_sum({3: 0.0}, "model.norm.weight", (32,)), torch.zeros(32))
