"""bootstrap_ci_grouped (training seeds, then prompts within each seed) against simulations whose
between-seed variance is known.

Design: y[s, p] = a_s + e_sp with a seed effect a_s ~ N(0, tau^2) and prompt noise e_sp ~ N(0, sigma^2),
S seeds x P prompts, true mean 0. The grand mean's sampling variance is tau^2/S + sigma^2/(S P). The
two-stage bootstrap's expected variance (seeds, then prompts within each, both with replacement) is

    (S-1)/S * tau^2/S + sigma^2/(S P) * ((S-1)/S + (P-1)/P):

the seed term is too small by (S-1)/S and the prompt noise is counted about twice (in the spread of the
seed means and again within seeds), so with tau = 0 the interval is conservative by up to sqrt(2). With
3 seeds the percentile interval is also discrete: all three draws are the lowest seed with probability
1/27 > 2.5%, so the interval is about [lowest, highest seed mean], which covers 1 - 2/2^3 = 75% when the
seeds dominate. The tests assert these, and that a bootstrap ignoring seeds undercovers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from esgrpo.estimators import bootstrap_ci_grouped

R, N_BOOT, P = 150, 500, 20  # simulated datasets per design, bootstrap replicates, prompts per seed


def hierarchical(df: pd.DataFrame, seed: int) -> tuple[float, float, float]:
    return bootstrap_ci_grouped(df, "y", groups=("seed", "prompt"), n_boot=N_BOOT, seed=seed)


def cells_ignoring_seeds(df: pd.DataFrame, seed: int) -> tuple[float, float, float]:
    """Wrong: every (seed, prompt) cell an independent unit."""
    cells = df.assign(cell=df["seed"].astype(str) + "|" + df["prompt"].astype(str))
    return bootstrap_ci_grouped(cells, "y", groups=("cell",), n_boot=N_BOOT, seed=seed)


def prompts_across_seeds(df: pd.DataFrame, seed: int) -> tuple[float, float, float]:
    """Wrong: prompts resampled as units, each carrying every seed's cell (seeds never resampled)."""
    return bootstrap_ci_grouped(df, "y", groups=("prompt",), n_boot=N_BOOT, seed=seed)


def simulate(ci, n_seeds: int, tau: float, sigma: float, omega: float = 0.0) -> dict[str, np.ndarray]:
    """R datasets (fixed rng): every dataset's grand mean, interval and mean prompt effect. `omega` adds a
    prompt effect b_p ~ N(0, omega^2) shared by all seeds (the test prompts are the same for every seed)."""
    rng = np.random.default_rng(1)
    seeds, prompts = np.repeat(np.arange(n_seeds), P), np.tile(np.arange(P), n_seeds)
    out = {"mean": [], "lo": [], "hi": [], "prompt_effect": []}
    for r in range(R):
        b = rng.normal(0, omega, P)
        y = rng.normal(0, tau, n_seeds)[:, None] + b[None, :] + rng.normal(0, sigma, (n_seeds, P))
        mean, lo, hi = ci(pd.DataFrame({"seed": seeds, "prompt": prompts, "y": y.ravel()}), r)
        for key, v in (("mean", mean), ("lo", lo), ("hi", hi), ("prompt_effect", b.mean())):
            out[key].append(v)
    return {k: np.asarray(v) for k, v in out.items()}


def true_sd(n_seeds: int, tau: float, sigma: float) -> float:
    return float(np.sqrt(tau**2 / n_seeds + sigma**2 / (n_seeds * P)))


def bootstrap_sd(n_seeds: int, tau: float, sigma: float) -> float:
    s = n_seeds
    return float(np.sqrt((s - 1) / s * tau**2 / s + sigma**2 / (s * P) * ((s - 1) / s + (P - 1) / P)))


def width_over(sim: dict, sd: float) -> float:
    """Mean interval width in units of a 95% normal interval of standard deviation `sd`."""
    return float(np.mean(sim["hi"] - sim["lo"]) / (2 * 1.96 * sd))


def coverage(sim: dict, target: np.ndarray | float = 0.0) -> float:
    return float(np.mean((sim["lo"] <= target) & (target <= sim["hi"])))


@pytest.mark.parametrize("tau", [1.0, 0.0], ids=["seeds dominate", "no seed effect"])
def test_interval_width_tracks_the_sampling_sd_with_eight_seeds(tau):
    sim = simulate(hierarchical, 8, tau, sigma=1.0)
    # the simulation has the variance it is meant to have
    assert np.std(sim["mean"]) == pytest.approx(true_sd(8, tau, 1.0), rel=0.15)
    # width = 2 x 1.96 x the two-stage bootstrap's SD (closed form above), not counting seeds as prompts
    assert width_over(sim, bootstrap_sd(8, tau, 1.0)) == pytest.approx(1.0, abs=0.1)
    if tau:  # against the true SD: narrow by about sqrt(7/8), and covering near nominal
        assert 0.8 <= width_over(sim, true_sd(8, tau, 1.0)) <= 1.02
        assert coverage(sim) >= 0.85
        assert coverage(simulate(cells_ignoring_seeds, 8, tau, sigma=1.0)) < 0.45  # ignoring seeds: far below
    else:  # prompt noise counted twice: conservative
        assert 1.15 <= width_over(sim, true_sd(8, tau, 1.0)) <= 1.45
        assert coverage(sim) >= 0.95


def test_three_seeds_are_too_few_for_nominal_coverage_but_far_better_than_ignoring_them():
    sim = simulate(hierarchical, 3, tau=1.0, sigma=1.0)
    assert np.std(sim["mean"]) == pytest.approx(true_sd(3, 1.0, 1.0), rel=0.15)
    # about [lowest, highest seed mean]: ~0.7 of the nominal width, ~75% coverage
    assert 0.6 <= width_over(sim, true_sd(3, 1.0, 1.0)) <= 0.85
    assert 0.62 <= coverage(sim) <= 0.85
    for wrong in (cells_ignoring_seeds, prompts_across_seeds):
        bad = simulate(wrong, 3, tau=1.0, sigma=1.0)
        assert width_over(bad, true_sd(3, 1.0, 1.0)) < 0.3, wrong.__name__
        assert coverage(bad) < 0.45 and coverage(sim) - coverage(bad) > 0.25, wrong.__name__


def test_the_interval_is_about_the_evaluated_prompts():
    """A prompt effect shared by every seed (the same test set) is not resampled across seeds: the interval
    covers the mean over these prompts (the tables' question), not over new prompts of the task."""
    sim = simulate(hierarchical, 8, tau=0.3, sigma=0.5, omega=1.0)
    assert coverage(sim, sim["prompt_effect"]) >= 0.9
    assert coverage(sim) < 0.8
