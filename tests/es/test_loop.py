"""Tests of the seeds-only ES trainer (esgrpo.es.loop) over its transformers backend (esgrpo.es.hf_backend), and of
the ES maths (esgrpo.es.ops), on tiny random Llamas and synthetic fitness.

The synthetic evaluators compute fitness from the member weights they are handed (a real
objective, not a stand-in for ES logic), so the tests see exactly what ES does to theta.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from esgrpo.analysis.theory import expected_es_norm
from esgrpo.es.backend import FitnessResult
from esgrpo.es.hf_backend import HFESBackend, make_population_evaluator, theta_from_model, trainable_names
from esgrpo.es.loop import snapshot_dir, train_es
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
from esgrpo.files import read_jsonl
from esgrpo.noise import Noise, Population, lowrank_factors, stable_name_hash, tensor_noise
from esgrpo.progress import LOCK_NAME, ProgressFolder
from tests.conftest import REPO

torch.set_num_threads(1)


# --------------------------------------------------------------------------- helpers


def tiny_llama(hidden: int = 16, layers: int = 1, vocab: int = 32, seed: int = 0, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=tie,
                         bos_token_id=None, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def members_of(population):
    """[(name -> member tensor)] for a stacked dict or a sequential iterator alike."""
    if isinstance(population, Mapping):  # stacked: a dict or the lazy esgrpo.noise.Population
        n = next(iter(population.values())).shape[0]
        return [{k: v[i] for k, v in population.items()} for i in range(n)]
    return list(population)


def quadratic_evaluator(target: dict[str, torch.Tensor], seen: list | None = None):
    """fitness_n = -||theta_n - target||^2 over the tensors handed in.

    Summed with math.fsum (exactly rounded): torch's SIMD sums can differ in the last bit
    between processes (memory alignment), and the kill test compares runs bit for bit.
    """

    def evaluate(population, prompt_rows, cfg, generator=None):
        fitness = np.array([-math.fsum(x for k in m for x in (m[k].double() - target[k].double()).pow(2).ravel().tolist())
                            for m in members_of(population)])
        if seen is not None:
            seen.append(fitness.copy())
        return FitnessResult(fitness=fitness, generated_tokens=3 * len(fitness) * len(prompt_rows))

    return evaluate


def random_evaluator(population, prompt_rows, cfg, generator=None):
    """Fitness that carries no signal: seeded random values drawn from the iteration's generator."""
    n = len(members_of(population))
    return FitnessResult(fitness=torch.rand(n, generator=generator, dtype=torch.float64).numpy())


ROWS = [{"id": str(i), "prompt": f"q{i}", "answer": str(i % 3)} for i in range(10)]


def saved_weights(out_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out_dir / "model" / "model.safetensors"))


def run_es(model, tokenizer, rows, cfg, evaluate, out_dir, progress_dir, log=print, population="stacked"):
    """`train_es` over the transformers backend holding `model`; its summary record (`RunSummary.to_dict`)."""
    backend = HFESBackend(model, tokenizer, evaluate, population=population)
    return train_es(backend, rows, cfg, out_dir, progress_dir, log=log).to_dict()


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


@pytest.mark.parametrize("changes, field", [
    ({"population_size": 1}, "population_size"),
    ({"population_size": 7, "antithetic": True}, "population_size"),
    ({"sigma": 0.0}, "sigma"),
    ({"sigma": True}, "sigma"),
    ({"population_size": 8.0}, "population_size"),
    ({"sigma": -1e-3}, "sigma"),
    ({"alpha": 0}, "alpha"),
    ({"iterations": -1}, "iterations"),
    ({"normalization": "minmax"}, "normalization"),
    ({"unit_rms_weights": "yes"}, "unit_rms_weights"),
    ({"fitness_top_p": 0.0}, "fitness_top_p"),
    ({"fitness_temperature": -0.5}, "fitness_temperature"),
    ({"reward_scheme": "dense"}, "reward_scheme"),
    ({"trainable": []}, "trainable"),
    ({"seed": -3}, "seed"),
    ({"prompts_per_iteration": 0}, "prompts_per_iteration"),
    ({"noise": "sparse"}, "noise"),
    ({"noise": "lowrank", "rank": 0}, "rank"),
    ({"rank": 2.5}, "rank"),
])
def test_bad_settings_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        ESConfig(**changes)
    with pytest.raises(ValueError, match=field):
        ESConfig.from_dict(changes)


def test_full_rank_runs_keep_their_fingerprint_and_low_rank_ones_differ_by_rank():
    full = ESConfig().trajectory_settings()
    assert "noise" not in full and "rank" not in full  # as before low-rank noise existed: checkpoints resume
    assert ESConfig(rank=4).trajectory_settings() == full  # the rank of full-rank noise is moot
    low = ESConfig(noise="lowrank", rank=4).trajectory_settings()
    assert low["noise"] == "lowrank" and low["rank"] == 4
    assert ESConfig(noise="lowrank", rank=4).noise_spec == Noise("lowrank", 4)
    assert ESConfig(rank=4).noise_spec == Noise()


def test_unknown_normalization_lists_allowed_values_and_unknown_keys_are_named():
    with pytest.raises(ValueError, match="zscore.*rank.*none"):
        ESConfig(normalization="centered")
    with pytest.raises(ValueError, match="populaton_size"):
        ESConfig.from_dict({"populaton_size": 8, "sigma": 0.01})
    cfg = ESConfig.from_dict({"population_size": 8, "antithetic": True, "trainable": "*norm*"})
    assert cfg.trainable == ["*norm*"] and ESConfig.from_dict(cfg.to_dict()) == cfg


def test_settings_are_light_documented_dataclasses_and_the_trainer_imports_no_generation():
    """check_config builds the settings without the trainers; the ES loop and its maths import no
    transformers and no vLLM (the backends do)."""
    import dataclasses

    from esgrpo.grpo.settings import GRPOSettings

    code = ("import sys, esgrpo.es.settings, esgrpo.grpo.settings; "
            "heavy = [m for m in ('torch', 'transformers', 'trl', 'vllm') if m in sys.modules]; "
            "import esgrpo.es.loop, esgrpo.es.ops; "
            "print(heavy, [m for m in ('transformers', 'vllm', 'esgrpo.engines.population', 'esgrpo.es.hf_backend') "
            "if m in sys.modules])")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[0] == "[] []"
    for cls in (ESConfig, GRPOSettings):
        undocumented = [f.name for f in dataclasses.fields(cls) if len(f.metadata.get("help", "")) < 10]
        assert not undocumented, (cls.__name__, undocumented)


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


def test_the_prompt_schedule_is_checked_and_keeps_the_fingerprints_of_resampling_runs():
    with pytest.raises(ValueError, match="prompt_schedule"):
        ESConfig(prompt_schedule="shuffle")
    with pytest.raises(ValueError, match="prompt_schedule.*resample_prompts"):
        ESConfig(prompt_schedule="epochs", resample_prompts=False)
    with pytest.raises(ValueError, match="prompt_seed"):
        ESConfig(prompt_schedule="epochs", prompt_seed=-1)
    assert "prompt_schedule" not in ESConfig().trajectory_settings()  # runs before the setting resume
    epochs = ESConfig(prompt_schedule="epochs", prompt_seed=42).trajectory_settings()
    assert (epochs["prompt_schedule"], epochs["prompt_seed"]) == ("epochs", 42)


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


def test_sequential_evaluator_that_loads_members_leaves_model_restored(tmp_path):
    model = tiny_llama()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())

    def load_members_then_tie(population, rows, cfg, generator=None):
        count = 0
        for member in population:  # a sequential evaluator writes each member into the model
            with torch.no_grad():
                for k, v in member.items():
                    params[k].copy_(v)
            count += 1
        return FitnessResult(fitness=np.ones(count))  # all equal: no update may happen

    cfg = ESConfig(population_size=4, sigma=0.05, iterations=2, checkpoint_every=0)
    summary = run_es(model, None, ROWS, cfg, load_members_then_tie, tmp_path / "out", tmp_path / "prog",
                       log=lambda s: None, population="sequential")
    assert summary["updates"] == 0 and summary["skipped"] == 2
    for k, v in model.state_dict().items():
        assert torch.equal(v, init[k]), k
    saved = saved_weights(tmp_path / "out")
    for k, v in saved.items():
        assert torch.equal(v, init[k]), k


@pytest.mark.parametrize("antithetic, normalization, unit_rms", [
    (False, "zscore", False), (True, "zscore", False), (False, "rank", False), (False, "rank", True),
    (False, "none", True)])
def test_update_matches_closed_form(tmp_path, antithetic, normalization, unit_rms):
    model = tiny_llama(layers=2)
    names = trainable_names(model, ["*"])
    theta0 = {k: v.double() for k, v in theta_from_model(model, names).items()}
    target = {k: v.float() + 0.05 for k, v in theta0.items()}
    seen: list[np.ndarray] = []
    cfg = ESConfig(population_size=6, sigma=0.02, alpha=0.01, iterations=1, antithetic=antithetic,
                   normalization=normalization, unit_rms_weights=unit_rms, seed=11)
    summary = run_es(model, None, ROWS, cfg, quadratic_evaluator(target, seen), tmp_path / "o", tmp_path / "p",
                       log=lambda s: None)
    # independently: w from the recorded fitness, then theta0 + alpha/N sum_n w_n sign_n eps_n in float64
    f = seen[0]
    if normalization == "zscore":
        w = (f - f.mean()) / (np.sqrt(((f - f.mean()) ** 2).mean()) + 1e-8)
    elif normalization == "rank":
        w = (np.argsort(np.argsort(f)) / (len(f) - 1)) - 0.5  # no ties in continuous fitness
    else:
        w = f.copy()
    if unit_rms and normalization != "zscore":
        w = w / np.sqrt((w ** 2).mean())  # sum w^2 = N
    step_sq = 0.0
    final = saved_weights(tmp_path / "o")
    for name in names:
        acc = torch.zeros_like(theta0[name])
        for (seed, sign), wn in zip(member_seeds(11, 0, 6, antithetic), w, strict=True):
            acc += float(wn) * sign * tensor_noise(seed, name, theta0[name].shape).double()
        step = cfg.alpha / cfg.population_size * acc
        step_sq += float(step.pow(2).sum())
        torch.testing.assert_close(final[name].double(), theta0[name] + step, rtol=0, atol=2e-7)
    row = read_jsonl(tmp_path / "o" / "metrics.jsonl")[0]
    assert row["update_norm"] == pytest.approx(math.sqrt(step_sq), rel=1e-5)
    assert row["distance_from_init"] == pytest.approx(math.sqrt(step_sq), rel=1e-4)
    assert summary["updates"] == 1 and not row["skipped"]


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


def test_all_equal_fitness_skips_and_logs(tmp_path):
    model = tiny_llama()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    messages: list[str] = []
    cfg = ESConfig(population_size=4, sigma=0.05, iterations=3, checkpoint_every=1)
    summary = run_es(model, None, ROWS, cfg,
                       lambda pop, rows, cfg, generator=None: FitnessResult(fitness=np.full(4, 0.25)),
                       tmp_path / "o", tmp_path / "p", log=messages.append)
    rows = read_jsonl(tmp_path / "o" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert all(r["skipped"] and r["update_norm"] == 0 and r["distance_from_init"] == 0 for r in rows)
    assert summary["skipped"] == 3 and summary["updates"] == 0
    assert sum("SKIPPED" in m for m in messages) == 3
    for k, v in saved_weights(tmp_path / "o").items():
        assert torch.equal(v, init[k])


def test_zero_iterations_saves_the_starting_model(tmp_path):
    model = tiny_llama()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    summary = run_es(model, None, ROWS, ESConfig(iterations=0, population_size=4), random_evaluator,
                       tmp_path / "o", tmp_path / "p", log=lambda s: None)
    assert summary["updates"] == 0 and read_jsonl(tmp_path / "o" / "metrics.jsonl") == []
    assert all(torch.equal(v, init[k]) for k, v in saved_weights(tmp_path / "o").items())


def test_bf16_model_keeps_small_updates_in_fp32_master(tmp_path):
    model = tiny_llama(hidden=32).to(torch.bfloat16)
    names = trainable_names(model, ["*"])
    theta0 = theta_from_model(model, names)
    cfg = ESConfig(population_size=4, sigma=1e-2, alpha=1e-5, iterations=3, checkpoint_every=1)
    summary = run_es(model, None, ROWS, cfg, random_evaluator, tmp_path / "o", tmp_path / "p",
                       log=lambda s: None)
    # steps of ~1e-5 per coordinate are far below bf16 resolution, yet the master moved as theory says
    d = sum(v.numel() for v in theta0.values())
    assert summary["distance_from_init"] == pytest.approx(1e-5 * math.sqrt(3 * d / 4), rel=0.05)
    theta = load_file(str(tmp_path / "p" / "step-00000003" / "theta.safetensors"))
    assert all(v.dtype == torch.float32 for v in theta.values())
    saved = saved_weights(tmp_path / "o")
    for name in names:
        assert saved[name].dtype == torch.bfloat16 and torch.equal(saved[name], theta[name].to(torch.bfloat16))


def test_a_bf16_model_takes_its_master_from_the_fp32_checkpoint(tmp_path):
    """A stage starting from an fp32 export with the model loaded in bf16: master_from gives theta0 the
    saved fp32 tensors bit for bit (the bf16 model's would be rounded), and the model runs theta cast."""
    from transformers import AutoModelForCausalLM

    start = tiny_llama(hidden=32)
    with torch.no_grad():
        for p in start.parameters():
            p.add_(torch.randn_like(p) * 1e-4)  # bits below bf16's resolution, as an ES update leaves them
    start.save_pretrained(tmp_path / "stage1")
    saved = {k: v.detach().clone() for k, v in start.named_parameters()}
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "stage1", dtype=torch.bfloat16)
    cfg = ESConfig(population_size=4, sigma=1e-2, alpha=1e-5, iterations=0)
    backend = HFESBackend(model, None, random_evaluator, master_from=str(tmp_path / "stage1"))
    backend.start(cfg)
    assert set(backend.theta0) == set(saved) and all(torch.equal(backend.theta0[n], saved[n]) for n in saved)
    assert all(torch.equal(p, saved[n].to(torch.bfloat16)) for n, p in model.named_parameters())
    rounded = HFESBackend(model, None, random_evaluator)
    rounded.start(cfg)
    assert not all(torch.equal(rounded.theta0[n], saved[n]) for n in saved)  # what the model alone gives


# --------------------------------------------------------------------------- checkpoints and resume


def _kill_resume_job(out_dir: str, progress_dir: str, iterations: int, sleep_s: float, noise: str = "full") -> dict:
    """The run the kill test repeats: the same model, data and evaluator in every process."""
    torch.set_num_threads(1)
    model = tiny_llama(layers=2, seed=3)
    target = {k: v.detach().float() + 0.1 for k, v in model.named_parameters()}
    quadratic = quadratic_evaluator(target)

    def slow(population, rows, cfg, generator=None):
        time.sleep(sleep_s)  # leaves the killer time to strike between checkpoints
        result = quadratic(population, rows, cfg)
        noise = torch.rand(len(result.fitness), generator=generator, dtype=torch.float64).numpy()
        return FitnessResult(fitness=result.fitness + noise, generated_tokens=result.generated_tokens)

    cfg = ESConfig(population_size=6, sigma=0.02, alpha=0.01, iterations=iterations, checkpoint_every=2,
                   prompts_per_iteration=3, resample_prompts=True, seed=5, noise=noise, rank=2)
    return run_es(model, None, ROWS, cfg, slow, out_dir, progress_dir, log=lambda s: None)


@pytest.mark.parametrize("noise", ["full", "lowrank"])
def test_sigkill_then_resume_gives_identical_weights(tmp_path, noise):
    # the uninterrupted reference, in this process
    _kill_resume_job(str(tmp_path / "ref"), str(tmp_path / "ref_prog"), 6, 0.0, noise)
    out, prog = tmp_path / "run", tmp_path / "run_prog"
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.es.test_loop import _kill_resume_job; "
            f"_kill_resume_job({str(out)!r}, {str(prog)!r}, 6, 0.4, {noise!r})")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    deadline, appended = time.time() + 120, 0
    while time.time() < deadline and child.poll() is None:
        # struck while the newest checkpoint is at 2 and metrics.jsonl has a row past it (appended every
        # iteration; a file written only at checkpoints would hold 2 rows until the checkpoint at 4)
        steps = [int(p.name.split("-")[1]) for p in prog.glob("step-*")]
        if steps and max(steps) == 2 and (out / "metrics.jsonl").exists():
            appended = len(read_jsonl(out / "metrics.jsonl"))
            if appended >= 3:
                os.kill(child.pid, signal.SIGKILL)
                break
        time.sleep(0.01)
    child.wait()
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    assert not (out / "model").exists()  # it really died before the end (the model is exported last)
    killed_rows = read_jsonl(out / "metrics.jsonl")
    assert 3 <= len(killed_rows) < 6  # rows past the last checkpoint were on disk
    assert json.loads((prog / LOCK_NAME).read_text())["pid"] == child.pid  # its lock outlived it ...
    summary = _kill_resume_job(str(out), str(prog), 6, 0.0, noise)
    assert summary["resumed_from"] in (2, 4)
    assert summary["settings"]["noise"] == noise
    assert not (prog / LOCK_NAME).exists()  # ... was taken over (a dead pid on this host) and given back
    ref, got = saved_weights(tmp_path / "ref"), saved_weights(out)
    assert ref.keys() == got.keys()
    for k in ref:
        assert torch.equal(ref[k], got[k]), k
    rows, ref_rows = read_jsonl(out / "metrics.jsonl"), read_jsonl(tmp_path / "ref" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]  # cut back to the checkpoint, then appended
    for a, b in zip(rows, ref_rows, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], float) and k != "seconds":  # to the last bit, norms included (NaN is NaN)
                assert a[k] == pytest.approx(b[k], rel=0, abs=0, nan_ok=True), k
            elif k != "seconds":
                assert a[k] == b[k], k


def test_a_second_trainer_on_a_held_progress_folder_stops_and_names_the_holder(tmp_path):
    """Two writers would interleave checkpoints: a trainer (here a subprocess) refuses a folder another
    process holds, with the folder and the holder in its message, and writes nothing."""
    out, prog = tmp_path / "out", tmp_path / "prog"
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.es.test_loop import _kill_resume_job; "
            f"_kill_resume_job({str(out)!r}, {str(prog)!r}, 2, 0.0)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    with ProgressFolder(prog, "step-"):  # this process writes the folder
        second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode != 0
    message = second.stderr.strip().splitlines()[-1]
    assert message.startswith("esgrpo.progress.ProgressFolderLocked"), second.stderr[-2000:]
    assert str(prog) in message and f"pid {os.getpid()} on host" in message
    assert not list(prog.glob("step-*")) and not (out / "model").exists()
    # the holder gave it back: now a trainer runs
    assert _kill_resume_job(str(out), str(prog), 2, 0.0)["resumed_from"] is None
    assert not (prog / LOCK_NAME).exists()


def test_checkpoint_schedule_and_extending_a_finished_run(tmp_path):
    target = {k: v.detach().float() + 0.1 for k, v in tiny_llama(seed=1).named_parameters()}
    evaluate = quadratic_evaluator(target)
    base = {"population_size": 4, "sigma": 0.02, "alpha": 0.01, "checkpoint_every": 2, "seed": 2}
    run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=5, **base), evaluate,
             tmp_path / "five", tmp_path / "five_p", log=lambda s: None)
    assert [p.name for p in (tmp_path / "five_p").glob("step-*")] == ["step-00000005"]  # only the newest
    assert (tmp_path / "five_p" / "run.json").exists()  # whose checkpoints these are
    assert not list((tmp_path / "five_p").glob(".tmp-*"))
    assert not (tmp_path / "five_p" / LOCK_NAME).exists()  # the writer lock goes with the run
    # a run of 3 iterations extended to 5 (same progress folder) equals a run of 5
    run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=3, **base), evaluate,
             tmp_path / "ext", tmp_path / "ext_p", log=lambda s: None)
    messages: list[str] = []
    summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=5, **base), evaluate,
                       tmp_path / "ext", tmp_path / "ext_p", log=messages.append)
    assert summary["resumed_from"] == 3 and any("resuming" in m for m in messages)
    five, ext = saved_weights(tmp_path / "five"), saved_weights(tmp_path / "ext")
    assert all(torch.equal(five[k], ext[k]) for k in five)
    assert [r["iteration"] for r in read_jsonl(tmp_path / "ext" / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    # other settings with the same progress folder: not resumed, started afresh
    messages.clear()
    summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=2, **{**base, "sigma": 0.03}), evaluate,
                       tmp_path / "ext", tmp_path / "ext_p", log=messages.append)
    assert summary["resumed_from"] is None and any("afresh" in m for m in messages)
    assert [r["iteration"] for r in read_jsonl(tmp_path / "ext" / "metrics.jsonl")] == [1, 2]


def test_snapshots_are_the_shorter_runs_and_survive_a_resume(tmp_path):
    """A 5-iteration run with snapshots at 2 and 3 exports exactly the 2- and 3-iteration runs' models, and a
    run resumed past a snapshot (killed after 3, extended to 5) still has it."""
    target = {k: v.detach().float() + 0.1 for k, v in tiny_llama(seed=1).named_parameters()}
    evaluate = quadratic_evaluator(target)
    base = {"population_size": 4, "sigma": 0.02, "alpha": 0.01, "checkpoint_every": 1, "seed": 4}
    summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=5, snapshots=[3, 2], **base), evaluate,
                       tmp_path / "long", tmp_path / "long_p", log=lambda s: None)
    assert summary["settings"]["snapshots"] == [2, 3]
    for k in (2, 3):
        short_summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=k, **base), evaluate,
                               tmp_path / f"short{k}", tmp_path / f"short{k}_p", log=lambda s: None)
        snap = load_file(str(snapshot_dir(tmp_path / "long", k) / "model" / "model.safetensors"))
        short = saved_weights(tmp_path / f"short{k}")
        assert snap.keys() == short.keys() and all(torch.equal(snap[n], short[n]) for n in snap)
        record = json.loads((snapshot_dir(tmp_path / "long", k) / "snapshot.json").read_text())
        assert record["iteration"] == k
        for key in ("updates", "distance_from_init", "theory_distance", "rollouts", "trainable_parameters"):
            assert record[key] == pytest.approx(short_summary[key], rel=1e-12), key
    # snapshots are not part of the resume fingerprint: adding one does not restart a run
    run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=3, snapshots=[2], **base), evaluate,
             tmp_path / "ext", tmp_path / "ext_p", log=lambda s: None)
    summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=5, snapshots=[2, 4], **base), evaluate,
                       tmp_path / "ext", tmp_path / "ext_p", log=lambda s: None)
    assert summary["resumed_from"] == 3
    assert sorted(p.name for p in (tmp_path / "ext" / "snapshots").iterdir()) == ["it2", "it4"]
    ext4 = load_file(str(snapshot_dir(tmp_path / "ext", 4) / "model" / "model.safetensors"))
    ext5, long5 = saved_weights(tmp_path / "ext"), saved_weights(tmp_path / "long")
    assert all(torch.equal(ext5[n], long5[n]) for n in long5)  # the resumed run ends where the long one did
    assert not all(torch.equal(ext4[n], long5[n]) for n in long5)  # and its snapshot is an earlier model


def test_a_snapshot_before_the_checkpoint_that_was_never_exported_forces_a_fresh_start(tmp_path):
    """es.snapshots gained K after the run checkpointed past K: resuming would never export K."""
    target = {k: v.detach().float() + 0.1 for k, v in tiny_llama(seed=1).named_parameters()}
    evaluate = quadratic_evaluator(target)
    base = {"population_size": 4, "sigma": 0.02, "alpha": 0.01, "checkpoint_every": 1, "seed": 4}
    (tmp_path / "run" / "snapshots" / "it9").mkdir(parents=True)  # debris of another run: cleared
    run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=3, **base), evaluate,
             tmp_path / "run", tmp_path / "run_p", log=lambda s: None)
    assert not (tmp_path / "run" / "snapshots").exists()
    messages: list[str] = []
    summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=4, snapshots=[2], **base), evaluate,
                       tmp_path / "run", tmp_path / "run_p", log=messages.append)
    assert summary["resumed_from"] is None and any("never exported" in m for m in messages)
    run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=2, **base), evaluate,
             tmp_path / "two", tmp_path / "two_p", log=lambda s: None)
    snap = load_file(str(snapshot_dir(tmp_path / "run", 2) / "model" / "model.safetensors"))
    assert all(torch.equal(snap[k], v) for k, v in saved_weights(tmp_path / "two").items())


@pytest.mark.parametrize("snapshots", [[0], [5], [2.5], "3"])
def test_snapshots_must_lie_inside_the_run(snapshots):
    with pytest.raises(ValueError, match="snapshots"):
        ESConfig(iterations=5, snapshots=snapshots)


# --------------------------------------------------------------------------- ES behaves as theory says


def test_update_norm_follows_alpha_sqrt_t_d_over_n(tmp_path):
    model = tiny_llama(hidden=32, layers=2)
    d = sum(p.numel() for p in model.parameters())
    assert d > 20_000
    cfg = ESConfig(population_size=8, sigma=1e-3, alpha=1e-3, iterations=20, checkpoint_every=0, seed=4)
    summary = run_es(model, None, ROWS, cfg, random_evaluator, tmp_path / "o", tmp_path / "p",
                       log=lambda s: None)
    rows = read_jsonl(tmp_path / "o" / "metrics.jsonl")
    assert summary["updates"] == 20
    for r in rows:  # each step ~ alpha sqrt(d/N); the walk ~ alpha sqrt(t d/N)
        assert r["update_norm"] == pytest.approx(1e-3 * math.sqrt(d / 8), rel=0.05)
        assert r["distance_from_init"] == pytest.approx(1e-3 * math.sqrt(r["iteration"] * d / 8), rel=0.05)
    assert rows[-1]["distance_from_init"] == pytest.approx(summary["theory_distance"], rel=0.03)


@pytest.mark.parametrize("rank", [1, 4])
def test_lowrank_update_norm_follows_alpha_sqrt_t_d_over_n(tmp_path, rank):
    """E||A B^T / sqrt(r)||^2 = m n: the low-rank walk has the full-rank norm theory, over several runs."""
    model = tiny_llama(hidden=32, layers=2)
    d = sum(p.numel() for p in model.parameters())
    ratios = []
    for seed in range(3):
        cfg = ESConfig(population_size=8, sigma=1e-3, alpha=1e-3, iterations=20, checkpoint_every=0, seed=seed,
                       noise="lowrank", rank=rank)
        summary = run_es(model, None, ROWS, cfg, random_evaluator, tmp_path / f"o{seed}", tmp_path / f"p{seed}",
                         log=lambda s: None)
        assert summary["updates"] == 20
        ratios.append(summary["distance_from_init"] / summary["theory_distance"])
    assert all(abs(r - 1) < 0.05 for r in ratios), ratios
    assert summary["theory_distance"] == pytest.approx(1e-3 * math.sqrt(20 * d / 8))


def test_es_improves_a_quadratic_objective_on_chosen_tensors_only(tmp_path):
    model = tiny_llama()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = trainable_names(model, ["*norm*"])
    assert len(names) == 3
    gen = torch.Generator().manual_seed(0)
    target = {n: init[n] + 0.25 * torch.randn(init[n].shape, generator=gen) / math.sqrt(48) * 4 for n in names}
    distance = lambda w: math.sqrt(sum(float((w[n] - target[n]).pow(2).sum()) for n in names))  # noqa: E731
    start = distance(init)
    cfg = ESConfig(population_size=16, sigma=0.02, alpha=0.02, iterations=40, trainable=["*norm*"],
                   checkpoint_every=0, seed=1)
    run_es(model, None, ROWS, cfg, quadratic_evaluator(target), tmp_path / "o", tmp_path / "p",
             log=lambda s: None)
    final = saved_weights(tmp_path / "o")
    assert distance(final) < 0.5 * start
    rows = read_jsonl(tmp_path / "o" / "metrics.jsonl")
    assert np.mean([r["fitness_mean"] for r in rows[-5:]]) > np.mean([r["fitness_mean"] for r in rows[:5]])
    for k, v in init.items():  # tensors outside `trainable` are untouched
        if k not in names:
            assert torch.equal(final[k], v), k


# --------------------------------------------------------------------------- the default evaluator


def reference_generate(model, stacked, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id,
                       temperature, top_p, generator):
    """Greedy decoding of each member through the model itself (no cache): a slow but plain reference."""
    from torch.func import functional_call

    n_members, batch = next(iter(stacked.values())).shape[0], input_ids.shape[0]
    tokens = torch.full((n_members, batch, max_new_tokens), pad_token_id, dtype=torch.long)
    lengths = torch.zeros(n_members, batch, dtype=torch.long)
    entropies = torch.zeros(n_members, batch, max_new_tokens)
    for n in range(n_members):
        weights = {k: v[n] for k, v in stacked.items()}
        ids, mask = input_ids.clone(), attention_mask.clone()
        done = torch.zeros(batch, dtype=torch.bool)
        for step in range(max_new_tokens):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = functional_call(model, weights, (), {"input_ids": ids, "attention_mask": mask,
                                                          "position_ids": positions}).logits[:, -1].float()
            logp = torch.log_softmax(logits, -1)
            nxt = torch.where(done, torch.full_like(logits[:, 0], pad_token_id, dtype=torch.long), logits.argmax(-1))
            tokens[n, :, step] = nxt
            entropies[n, :, step] = torch.where(done, 0.0, -(logp.exp() * logp).sum(-1))
            lengths[n] += (~done).long()
            done |= torch.isin(nxt, torch.tensor(eos_token_id).reshape(-1))
            ids, mask = torch.cat([ids, nxt[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return SimpleNamespace(tokens=tokens, lengths=lengths, entropies=entropies)


@pytest.fixture(scope="module")
def tokenizer():
    from esgrpo.models.default import train_tokenizer

    return train_tokenizer(["12+3=15", "what is 4*5? 20", "7-2=5 done"], vocab_size=280)


def test_default_evaluator_grades_each_member_like_hf_generate(tokenizer, tmp_path):
    model = tiny_llama(vocab=len(tokenizer), layers=1)
    rows = [{"id": str(i), "prompt": [{"role": "user", "content": q}], "answer": "x"}
            for i, q in enumerate(["1+2", "what is 33?", "7*8 ="])]

    def verifier(text: str, row) -> float:  # a deterministic grade with 0, 0.5 and 1 in it
        return (len(text) % 3) / 2

    evaluate = make_population_evaluator(model, tokenizer, verifier, reference_generate)
    cfg = ESConfig(population_size=4, sigma=0.5, max_new_tokens=6)  # large sigma: members differ
    theta = theta_from_model(model, trainable_names(model, ["*"]))
    seeds = member_seeds(0, 0, 4, antithetic=False)
    stacked = evaluate(perturbed_population(theta, seeds, cfg.sigma), rows, cfg)
    sequential = evaluate(iter_population(theta, seeds, cfg.sigma), rows, cfg)
    np.testing.assert_array_equal(stacked.fitness, sequential.fitness)
    assert stacked.generated_tokens == sequential.generated_tokens
    # independently: each member loaded into the model and decoded by transformers' generate
    enc_texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                 for r in rows]
    tokenizer.padding_side = "left"
    enc = tokenizer(enc_texts, return_tensors="pt", padding=True, add_special_tokens=False)
    rewards = np.zeros((4, 3))
    tokens = 0
    with torch.no_grad():
        for n, member in enumerate(iter_population(theta, seeds, cfg.sigma)):
            params = dict(model.named_parameters())
            for k, v in member.items():
                params[k].copy_(v)
            out = model.generate(**enc, do_sample=False, max_new_tokens=6, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
            for b in range(3):
                new = out[b, enc["input_ids"].shape[1]:].tolist()
                length = next((i + 1 for i, t in enumerate(new) if t == tokenizer.eos_token_id), len(new))
                tokens += length
                rewards[n, b] = verifier(tokenizer.decode(new[:length], skip_special_tokens=True), rows[b])
    np.testing.assert_allclose(stacked.fitness, rewards.mean(axis=1))
    np.testing.assert_array_equal(stacked.success, rewards >= 1)
    assert stacked.generated_tokens == tokens and stacked.rollouts == 12
    assert math.isfinite(stacked.entropy) and stacked.entropy > 0


def test_train_es_end_to_end_with_default_evaluator_saves_hf_model(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tiny_llama(vocab=len(tokenizer), layers=1)
    rows = [{"id": str(i), "prompt": [{"role": "user", "content": f"{i}+{i}"}], "answer": str(2 * i)}
            for i in range(4)]
    evaluate = make_population_evaluator(model, tokenizer, lambda text, row: float(len(text) % 2),
                                         reference_generate, prompt_chunk=2)
    cfg = ESConfig(population_size=4, sigma=0.3, alpha=0.05, iterations=2, prompts_per_iteration=2,
                   max_new_tokens=4, checkpoint_every=1)
    summary = run_es(model, tokenizer, rows, cfg, evaluate, tmp_path / "o", tmp_path / "p", log=lambda s: None)
    rows_logged = read_jsonl(tmp_path / "o" / "metrics.jsonl")
    assert len(rows_logged) == 2 and rows_logged[-1]["rollouts"] == 2 * 4 * 2
    assert all(0 <= r["js_diversity"] <= math.log(2) for r in rows_logged)
    assert summary["generated_tokens"] == rows_logged[-1]["generated_tokens"] > 0
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "o" / "model")
    AutoTokenizer.from_pretrained(tmp_path / "o" / "model")
    for k, v in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[k], v), k


def test_default_evaluator_with_the_population_engine_if_present(tokenizer):
    population = pytest.importorskip("esgrpo.engines.population")
    model = tiny_llama(vocab=len(tokenizer), layers=1)
    rows = [{"id": "0", "prompt": [{"role": "user", "content": "1+2"}], "answer": "3"},
            {"id": "1", "prompt": [{"role": "user", "content": "what is 33?"}], "answer": "33"}]
    theta = theta_from_model(model, trainable_names(model, ["*"]))
    seeds = member_seeds(0, 0, 4, antithetic=False)
    cfg = ESConfig(population_size=4, sigma=0.5, max_new_tokens=5)
    verifier = lambda text, row: float(len(text) % 3) / 2  # noqa: E731
    engine = make_population_evaluator(model, tokenizer, verifier, population.population_generate)
    reference = make_population_evaluator(model, tokenizer, verifier, reference_generate)
    got = engine(perturbed_population(theta, seeds, cfg.sigma), rows, cfg, generator=torch.Generator())
    want = reference(perturbed_population(theta, seeds, cfg.sigma), rows, cfg)
    np.testing.assert_allclose(got.fitness, want.fitness)
    assert got.generated_tokens == want.generated_tokens
    # sampled fitness repeats exactly from the same generator seed (what resume relies on)
    sampled = ESConfig(population_size=4, sigma=0.5, max_new_tokens=5, fitness_temperature=1.0, fitness_top_p=0.95)
    runs = [engine(perturbed_population(theta, seeds, cfg.sigma), rows, sampled,
                   generator=torch.Generator().manual_seed(9)) for _ in range(2)]
    np.testing.assert_array_equal(runs[0].fitness, runs[1].fitness)
    assert runs[0].generated_tokens == runs[1].generated_tokens


def test_default_evaluator_keeps_its_buffers_without_changing_fitness(tokenizer):
    """The default evaluator keeps the population engine's buffers from one iteration to the next: fresh
    members every iteration score exactly as on memory of each call's own."""
    from esgrpo.engines.population import population_generate

    model = tiny_llama(vocab=len(tokenizer), layers=2)
    rows = [{"id": str(i), "prompt": [{"role": "user", "content": q}], "answer": "x"}
            for i, q in enumerate(["1+2", "what is 33?", "7*8 =", "12+3 is what number?"])]
    theta = theta_from_model(model, trainable_names(model, ["*"]))
    cfg = ESConfig(population_size=4, sigma=0.5, max_new_tokens=5)
    verifier = lambda text, row: float(len(text) % 3) / 2  # noqa: E731
    kept = make_population_evaluator(model, tokenizer, verifier)
    for it, batch in enumerate([rows[:2], rows[1:], rows[2:]]):
        seeds = member_seeds(0, it, 4, antithetic=True)
        fresh = make_population_evaluator(model, tokenizer, verifier, population_generate)
        got = kept(perturbed_population(theta, seeds, cfg.sigma), batch, cfg)
        want = fresh(perturbed_population(theta, seeds, cfg.sigma), batch, cfg)
        np.testing.assert_array_equal(got.fitness, want.fitness)
        assert got.generated_tokens == want.generated_tokens and got.entropy == want.entropy


def test_fitness_from_rewards_is_the_mean_reward_and_success_is_a_full_reward():
    rewards = np.array([[1.0, 0.0, 0.5], [0.0, 0.0, 0.0]])
    result = FitnessResult.from_rewards(rewards, generated_tokens=12, entropy=0.25, entropy_estimator="x")
    assert result.fitness.tolist() == [0.5, 0.0] and result.rollouts == 6 and result.generated_tokens == 12
    assert result.success.tolist() == [[True, False, False], [False, False, False]]
    assert result.entropy == 0.25 and result.entropy_estimator == "x"
    with pytest.raises(ValueError, match="members, prompts"):
        FitnessResult.from_rewards(np.zeros(3), 0, math.nan)
