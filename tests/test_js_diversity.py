"""Paper B's verifier-projected JS diversity: the estimator against its closed form, and the trainer's
per-member success probabilities from several sampled rollouts (`ESConfig.js_samples`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from esgrpo.es.backend import BackendStart, ESBackend, FitnessResult
from esgrpo.es.loop import train_es
from esgrpo.es.settings import ESConfig
from esgrpo.estimators import bernoulli_js_divergence, population_js_diversity
from esgrpo.files import read_jsonl


def _kl_bernoulli(p: float, q: float) -> float:
    return sum(a * math.log(a / b) for a, b in ((p, q), (1 - p, 1 - q)) if a > 0)


def _js_two(p1: float, p2: float) -> float:
    """JS of two Bernoullis from its definition, 1/2 KL(P1 || M) + 1/2 KL(P2 || M)."""
    m = (p1 + p2) / 2
    return 0.5 * _kl_bernoulli(p1, m) + 0.5 * _kl_bernoulli(p2, m)


@pytest.mark.parametrize("p1, p2", [(0.1, 0.9), (0.3, 0.3), (0.0, 1.0), (0.2, 0.65), (0.0, 0.4)])
def test_two_member_js_is_the_mean_kl_to_the_mixture(p1, p2):
    assert bernoulli_js_divergence([p1, p2]) == pytest.approx(_js_two(p1, p2), abs=1e-12)
    assert population_js_diversity(np.array([[p1], [p2]])) == pytest.approx(_js_two(p1, p2), abs=1e-12)


def test_population_js_averages_the_per_prompt_divergence_over_prompts():
    success = np.array([[0.0, 0.1, 1.0], [1.0, 0.5, 1.0]])  # [members, prompts]
    want = np.mean([_js_two(0.0, 1.0), _js_two(0.1, 0.5), 0.0])
    assert population_js_diversity(success) == pytest.approx(want, abs=1e-12)
    assert _js_two(0.0, 1.0) == pytest.approx(math.log(2))  # disjoint outcomes: the maximum, ln 2


# --------------------------------------------------------------------------- through the trainer

# member n's success probability on prompt q: member 0 alternates 0.1 / 0.9 over prompts, member 1 is 0.5
PROBS = np.array([[0.1, 0.9] * 8, [0.5] * 16])
TRUE_JS = float(np.mean([_js_two(p, 0.5) for p in PROBS[0]]))
ROWS = [{"id": str(q), "prompt": f"q{q}", "answer": "x"} for q in range(PROBS.shape[1])]


class BernoulliBackend(ESBackend):
    """Member n succeeds on prompt q with probability PROBS[n, q], drawn from the rollout seed
    (greedy fitness: the same draw, standing in for a deterministic outcome); records every call."""

    name = "bernoulli"

    def __init__(self) -> None:
        self.calls: list[tuple[int, FitnessResult]] = []
        self.weights: list[np.ndarray] = []

    def start(self, cfg: ESConfig) -> BackendStart:
        return BackendStart(parameters=1, tensors=1)

    def evaluate(self, seeds_signs, batch, cfg, rollout_seed) -> FitnessResult:
        p = PROBS[:, [int(row["id"]) for row in batch]]
        success = np.random.default_rng(rollout_seed).random(p.shape) < p
        result = FitnessResult(fitness=success.mean(axis=1), success=success)
        self.calls.append((len(batch), result))
        return result

    def apply_update(self, seeds_signs, weights, alpha) -> float:
        self.weights.append(np.asarray(weights).copy())
        return 0.0

    def distance_from_init(self) -> float:
        return 0.0

    def save_state(self, folder: Path) -> None:
        (folder / "theta.txt").write_text("0")

    def load_state(self, folder: Path) -> None:
        pass

    def export(self, model_dir: Path) -> None:
        model_dir.mkdir(parents=True, exist_ok=True)


def _train(tmp_path: Path, name: str, **settings) -> tuple[BernoulliBackend, list[dict]]:
    cfg = ESConfig(population_size=2, iterations=4, prompts_per_iteration=len(ROWS), resample_prompts=False,
                   checkpoint_every=0, **settings)
    backend = BernoulliBackend()
    train_es(backend, ROWS, cfg, tmp_path / name, tmp_path / f"{name}_p", log=lambda s: None)
    return backend, read_jsonl(tmp_path / name / "metrics.jsonl")


def test_greedy_fitness_takes_the_js_of_the_fitness_rollouts_at_no_extra_cost(tmp_path):
    backend, rows = _train(tmp_path, "greedy", fitness_temperature=0.0, js_samples=50)
    assert [n for n, _ in backend.calls] == [len(ROWS)] * 4  # one evaluation per iteration, whatever js_samples
    assert [r["js_diversity"] for r in rows] == [population_js_diversity(res.success) for _, res in backend.calls]


def test_sampled_fitness_estimates_each_members_success_probability_from_several_samples(tmp_path):
    backend, rows = _train(tmp_path, "many", fitness_temperature=1.0, js_samples=400, js_every=1)
    assert [n for n, _ in backend.calls] == [len(ROWS), 399 * len(ROWS)] * 4
    for r in rows:  # plug-in bias at 400 samples ~ 1/800 nats; sampling noise ~ 0.01
        assert r["js_diversity"] == pytest.approx(TRUE_JS, abs=0.03)
    _, proxy = _train(tmp_path, "one", fitness_temperature=1.0, js_samples=1)
    # one 0/1 draw per member and prompt: near the entropy of the success rate, far above the truth
    assert all(r["js_diversity"] > TRUE_JS + 0.2 for r in proxy)


def test_the_extra_js_rollouts_leave_the_trajectory_alone_and_follow_js_every(tmp_path):
    one, rows_one = _train(tmp_path, "one", fitness_temperature=1.0, js_samples=1)
    four, rows_four = _train(tmp_path, "four", fitness_temperature=1.0, js_samples=4, js_every=2)
    for a, b in zip(one.weights, four.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    drop = ("js_diversity", "seconds")
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows_one] == \
        [{k: v for k, v in r.items() if k not in drop} for r in rows_four]
    assert rows_four[-1]["rollouts"] == 4 * 2 * len(ROWS)  # the run's rollouts are the fitness ones
    measured = [not math.isnan(r["js_diversity"]) for r in rows_four]
    assert measured == [False, True, False, True]  # iterations 2 and 4
    assert [n for n, _ in four.calls] == [len(ROWS), len(ROWS), 3 * len(ROWS)] * 2


def test_js_settings_are_checked_and_do_not_enter_the_resume_fingerprint():
    with pytest.raises(ValueError, match="js_samples"):
        ESConfig(js_samples=0)
    with pytest.raises(ValueError, match="js_every"):
        ESConfig(js_every=0)
    assert ESConfig(js_samples=8, js_every=3).trajectory_settings() == ESConfig().trajectory_settings()
