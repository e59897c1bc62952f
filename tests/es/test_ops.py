"""The ES maths (esgrpo.es.ops): member seeds, fitness shaping, prompt batches, the population and the update."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from esgrpo.analysis.theory import expected_es_norm
from esgrpo.es.hf_backend import theta_from_model, trainable_names
from esgrpo.es.ops import (
    all_equal,
    apply_update,
    iter_population,
    member_seeds,
    normalize_fitness,
    perturbed_population,
    prompt_batch,
)
from esgrpo.es.settings import ESConfig
from esgrpo.noise import Noise, lowrank_factors, tensor_noise
from tests.es.helpers import ROWS, tiny_llama


def test_rank1_update_of_one_member_is_the_direct_a_b_transpose():
    """theta += alpha / N * sum_n w_n sign_n A_n B_n^T / sqrt(r): with one nonzero weight and r = 1 the step is
    alpha / N * w * a b^T, here computed directly from the member's factors."""
    name, shape = "model.layers.0.mlp.down_proj.weight", (24, 40)
    theta = {name: torch.zeros(shape), "model.norm.weight": torch.zeros(24)}
    seeds, w, alpha = [(11, -1.0), (12, 1.0), (13, 1.0)], [0.7, 0.0, 0.0], 0.3
    norm = apply_update(theta, seeds, w, alpha, Noise("lowrank", 1))
    a, b = lowrank_factors(11, name, shape, 1)
    direct = alpha / 3 * 0.7 * -1.0 * (a[:, 0][:, None] * b[:, 0][None, :])
    torch.testing.assert_close(theta[name], direct, rtol=1e-6, atol=0)
    torch.testing.assert_close(theta["model.norm.weight"], alpha / 3 * -0.7 * tensor_noise(11, "model.norm.weight", (24,)))
    assert norm == pytest.approx(math.sqrt(float(direct.double().pow(2).sum() + theta["model.norm.weight"].double()
                                                 .pow(2).sum())), rel=1e-6)
    # rank 4 and several members: the one matmul of stacked weighted factors is the sum of the members' noise
    theta4 = {name: torch.zeros(shape)}
    w4 = [0.5, -1.25, 2.0]
    apply_update(theta4, seeds, w4, alpha, Noise("lowrank", 4))
    want = sum(wi * sg * Noise("lowrank", 4).dense(sd, name, shape) for (sd, sg), wi in zip(seeds, w4, strict=True))
    torch.testing.assert_close(theta4[name], alpha / 3 * want, rtol=1e-5, atol=1e-7)


def test_member_seeds_deterministic_per_iteration_and_antithetic_pairs():
    plain = member_seeds(3, 5, 8, antithetic=False)
    assert plain == member_seeds(3, 5, 8, antithetic=False)
    assert plain != member_seeds(3, 6, 8, antithetic=False)
    assert plain != member_seeds(4, 5, 8, antithetic=False)
    assert len({s for s, _ in plain}) == 8 and all(sign == 1.0 for _, sign in plain)
    assert all(0 <= s < 2**63 for s, _ in plain)
    pairs = member_seeds(3, 5, 8, antithetic=True)
    assert len(pairs) == 8 and len({s for s, _ in pairs}) == 4
    for i in range(0, 8, 2):
        assert pairs[i][0] == pairs[i + 1][0] and (pairs[i][1], pairs[i + 1][1]) == (1.0, -1.0)
    with pytest.raises(ValueError):
        member_seeds(0, 0, 7, antithetic=True)


# --------------------------------------------------------------------------- fitness shaping


def test_normalisations():
    f = np.array([0.2, 0.5, 0.5, 0.9, 0.1])
    z = normalize_fitness(f, "zscore")
    assert abs(z.mean()) < 1e-12 and abs((z**2).sum() - 5) < 1e-6
    np.testing.assert_allclose(z, (f - f.mean()) / (f.std() + 1e-8))
    # ranks 1, 2.5, 2.5, 4, 0 (ties averaged) -> /4 - 0.5
    np.testing.assert_allclose(normalize_fitness(f, "rank"), [-0.25, 0.125, 0.125, 0.5, -0.5])
    np.testing.assert_allclose(normalize_fitness([3.0, 1.0], "rank"), [0.5, -0.5])
    np.testing.assert_array_equal(normalize_fitness(f, "none"), f)
    assert all_equal([0.3, 0.3, 0.3]) and not all_equal([0.3, 0.3, 0.30001])
    with pytest.raises(ValueError, match="normalization"):
        normalize_fitness(f, "minmax")
    with pytest.raises(ValueError):
        normalize_fitness([0.1, float("nan")])


def _no_tie_fitness(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.0, 1.0, size=n)


@pytest.mark.parametrize("n", [4, 16, 30])
def test_weights_second_moment_per_option(n):
    """sum w^2: z-score N; centred ranks N(N+1)/(12(N-1)) (the variance of a uniform grid on [-0.5, 0.5]);
    raw fitness sum f^2; rank / raw under unit_rms: N, the same direction as unscaled."""
    f = _no_tie_fitness(n, seed=n)
    squares = {m: float((normalize_fitness(f, m) ** 2).sum()) for m in ("zscore", "rank", "none")}
    assert squares["zscore"] == pytest.approx(n, rel=1e-6)
    assert squares["rank"] == pytest.approx(n * (n + 1) / (12 * (n - 1)), rel=1e-12)
    assert squares["none"] == pytest.approx(float(np.dot(f, f)), rel=1e-12)
    np.testing.assert_array_equal(normalize_fitness(f, "zscore", unit_rms=True), normalize_fitness(f, "zscore"))
    for method in ("rank", "none"):
        plain, scaled = normalize_fitness(f, method), normalize_fitness(f, method, unit_rms=True)
        assert float((scaled ** 2).sum()) == pytest.approx(n, rel=1e-12)
        ratio = scaled / plain
        np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)  # one positive factor: direction unchanged
        assert ratio[0] > 0
    # binary fitness (ties) and an all-zero raw fitness: still N, and zeros stay zeros (no NaN)
    binary = np.array([0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    assert float((normalize_fitness(binary, "rank", unit_rms=True) ** 2).sum()) == pytest.approx(6, rel=1e-12)
    np.testing.assert_array_equal(normalize_fitness(np.zeros(4), "none", unit_rms=True), np.zeros(4))


def _update_norm(n: int, weights: np.ndarray, alpha: float, d: int, noise_of=None) -> float:
    """||step|| of one update of a d-vector; noise_of(seed, name, shape, device) replaces the noise if given."""
    theta = {"w": torch.zeros(d)}

    def step_of(coefficients, name, shape, device):
        total = torch.zeros(tuple(shape))
        for seed, c in coefficients.items():
            total.add_(noise_of(seed, name, shape, device), alpha=c)
        return total

    return apply_update(theta, member_seeds(5, 0, n, antithetic=False), weights, alpha,
                        step_of=None if noise_of is None else step_of)


def test_update_norm_ratio_between_normalisations_at_same_alpha():
    """With the same seeds and alpha, ||step|| ~ alpha/N sqrt(d sum w^2): unscaled ranks step
    sqrt(12(N-1)/(N+1)) (~3.25 at N=16) times shorter than z-scores; under unit_rms the rank / raw steps
    match the z-score's and the theory's alpha sqrt(d/N) (Gaussian noise: up to O(1/sqrt(d)))."""
    n, d, alpha = 16, 200_000, 0.01
    f = _no_tie_fitness(n, seed=1)
    norms = {(m, u): _update_norm(n, normalize_fitness(f, m, unit_rms=u), alpha, d)
             for m in ("zscore", "rank", "none") for u in (False, True)}
    expected_ratio = math.sqrt(12 * (n - 1) / (n + 1))
    assert norms["zscore", False] / norms["rank", False] == pytest.approx(expected_ratio, rel=0.02)
    assert norms["zscore", False] / norms["rank", False] > 3.0
    theory = expected_es_norm(alpha, n, d, 1)
    for key in [("zscore", False), ("rank", True), ("none", True)]:
        assert norms[key] == pytest.approx(theory, rel=0.02), key
    assert norms["rank", False] == pytest.approx(theory / expected_ratio, rel=0.02)


def test_unit_rms_update_norms_equal_on_orthogonal_noise():
    """On noise vectors that are exactly orthogonal with norm sqrt(d), ||sum w_n eps_n||^2 = d sum w^2 with
    no sampling term: under unit_rms every normalisation's step has the z-score's norm to float precision
    (z-scores' sum is N (std / (std + 1e-8))^2)."""
    n, d, alpha = 16, 4096, 0.01
    seeds = member_seeds(5, 0, n, antithetic=False)
    basis, _ = torch.linalg.qr(torch.randn(d, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    column = {seed: basis[:, i].float() * math.sqrt(d) for i, (seed, _) in enumerate(seeds)}

    def orthogonal_noise(seed, name, shape, device):
        return column[int(seed)].reshape(tuple(shape)).to(device)

    f = _no_tie_fitness(n, seed=2)
    norms = {m: _update_norm(n, normalize_fitness(f, m, unit_rms=True), alpha, d, orthogonal_noise)
             for m in ("zscore", "rank", "none")}
    theory = expected_es_norm(alpha, n, d, 1)
    for method, norm in norms.items():
        assert norm == pytest.approx(theory, rel=1e-5), method
    unscaled_rank = _update_norm(n, normalize_fitness(f, "rank"), alpha, d, orthogonal_noise)
    assert norms["zscore"] / unscaled_rank == pytest.approx(math.sqrt(12 * (n - 1) / (n + 1)), rel=1e-5)


def test_prompt_batches_fixed_or_resampled_from_seed_and_iteration():
    fixed = ESConfig(prompts_per_iteration=4, resample_prompts=False)
    assert prompt_batch(ROWS, fixed, 0) == ROWS[:4] == prompt_batch(ROWS, fixed, 9)
    assert prompt_batch(ROWS, ESConfig(prompts_per_iteration=None, resample_prompts=False), 3) == ROWS
    drawn = ESConfig(prompts_per_iteration=4, resample_prompts=True, seed=1)
    a, b = prompt_batch(ROWS, drawn, 0), prompt_batch(ROWS, drawn, 1)
    assert a == prompt_batch(ROWS, drawn, 0) and a != b
    assert len({r["id"] for r in a}) == 4
    assert len(prompt_batch(ROWS, ESConfig(prompts_per_iteration=50), 0)) == len(ROWS)


def _paper_b_schedule(n_train: int, batch_size: int, epochs: int, seed: int) -> list[list[int]]:
    """Paper B's schedule as its data.py `build_training_schedule` (240d878) reads: one generator, one
    shuffle of arange(n_train) per epoch, each epoch cut into batches, the last one shorter."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(epochs):
        order = np.arange(n_train)
        rng.shuffle(order)
        batches += [order[i:i + batch_size].tolist() for i in range(0, n_train, batch_size)]
    return batches


def test_paper_b_s_epochs_show_every_question_once_per_epoch_and_equal_its_batches():
    """GSM8K's 7,473 training questions, 64 per step, seed 42 (configs/paper_b.yaml): 117 steps per
    epoch, the last one 49 questions; 234 steps see every question exactly twice, once per epoch."""
    rows = [{"id": i} for i in range(7473)]
    cfg = ESConfig(prompts_per_iteration=64, prompt_schedule="epochs", prompt_seed=42, seed=0, iterations=234)
    ours = [[r["id"] for r in prompt_batch(rows, cfg, t)] for t in range(234)]
    assert ours == _paper_b_schedule(7473, 64, 2, 42)
    for epoch in (ours[:117], ours[117:]):
        assert [len(b) for b in epoch] == [64] * 116 + [49]
        assert sorted(i for b in epoch for i in b) == list(range(7473))
    assert ours[:117] != ours[117:]  # a fresh permutation per epoch
    # the run seed draws it when prompt_seed is None; a third epoch goes on with the same stream
    assert prompt_batch(rows, dataclasses.replace(cfg, prompt_seed=None, seed=42), 5) == prompt_batch(rows, cfg, 5)
    assert [r["id"] for r in prompt_batch(rows, cfg, 234)] == _paper_b_schedule(7473, 64, 3, 42)[234]


# --------------------------------------------------------------------------- population and update


def test_population_members_and_exact_restore():
    model = tiny_llama()
    names = trainable_names(model, ["*"])
    theta = theta_from_model(model, names)
    before = {k: v.clone() for k, v in theta.items()}
    model_before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    seeds = member_seeds(0, 0, 4, antithetic=True)
    stacked = perturbed_population(theta, seeds, 0.1)
    sequential = list(iter_population(theta, seeds, 0.1))
    for name in names:
        assert stacked[name].shape == (4, *theta[name].shape) and stacked[name].dtype == torch.float32
        for n, (seed, sign) in enumerate(seeds):
            expected = theta[name] + sign * 0.1 * tensor_noise(seed, name, theta[name].shape)
            torch.testing.assert_close(stacked[name][n], expected, rtol=0, atol=1e-6)
            assert torch.equal(stacked[name][n], sequential[n][name])
        # antithetic partners mirror each other around theta
        torch.testing.assert_close(stacked[name][0] - theta[name], theta[name] - stacked[name][1])
    for name in names:  # theta and the model are untouched, bit for bit
        assert torch.equal(theta[name], before[name])
    for k, v in model.state_dict().items():
        assert torch.equal(v, model_before[k])
    half = perturbed_population(theta, seeds, 0.1, {n: torch.bfloat16 for n in names})
    assert all(v.dtype == torch.bfloat16 for v in half.values())


def test_update_sums_antithetic_pairs_like_members():
    shapes = {"a": (3, 4), "b": (5,)}
    seeds = member_seeds(2, 0, 4, antithetic=True)
    w = np.array([0.5, -1.0, 2.0, 0.25])
    theta = {name: torch.full(shape, 1.5) for name, shape in shapes.items()}
    norm = apply_update(theta, seeds, w, alpha=0.2)
    step_sq = 0.0
    for name, shape in shapes.items():
        step = 0.2 / 4 * sum(wn * sign * tensor_noise(seed, name, shape) for (seed, sign), wn in zip(seeds, w, strict=True))
        torch.testing.assert_close(theta[name], 1.5 + step)
        assert theta[name].dtype == torch.float32
        step_sq += float(step.double().pow(2).sum())
    assert norm == pytest.approx(math.sqrt(step_sq), rel=1e-6)
