"""Training-curve values in tables are window means with their spread (esgrpo.report.stats), not one
logged step: synthetic curves whose last value is far from the window's mean."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from esgrpo.report import stats


def _curve(run: str, method: str, values, rollouts_per_step: int, seed: int = 0) -> list[dict]:
    variant = run.rsplit("-s", 1)[0]
    return [{"model": "m", "task": "t", "run": run, "variant": variant, "seed": seed, "method": method,
             "iteration": t, "rollouts": rollouts_per_step * t, "generated_tokens": 10 * rollouts_per_step * t,
             "fitness_mean": float(v)} for t, v in enumerate(values, start=1)]


@pytest.mark.parametrize("logged, size", [(1, 1), (2, 1), (4, 2), (10, 3), (30, 3), (40, 4), (79, 8), (234, 24)])
def test_window_is_the_last_tenth_at_least_three_steps_at_most_half_the_run(logged, size):
    assert stats.window_size(logged) == size


def test_first_and_last_windows_never_overlap():
    for logged in range(2, 50):
        run = pd.DataFrame(_curve("es-n4-s0", "ES", np.arange(logged), 1))
        first, last = stats.tail(run, first=True), stats.tail(run)
        assert len(first) == len(last) == stats.window_size(logged)
        assert first["iteration"].max() < last["iteration"].min()


def test_final_train_reward_is_the_window_mean_not_the_last_noisy_batch():
    # GRPO-like: ~0.3 for 40 steps, its last batch an outlier (0.047); ES steady at 0.5
    rng = np.random.default_rng(0)
    grpo = 0.3 + 0.02 * rng.standard_normal(40)
    grpo[-1] = 0.047
    rows = _curve("grpo-g8-s0", "GRPO", grpo, 128) + _curve("es-n16-s0", "ES", np.full(30, 0.5), 64 * 16)
    table = pd.DataFrame(stats.budget_rows(pd.DataFrame(rows), ["grpo-g8", "es-n16"], "fitness_mean",
                                           "train reward"))
    final = table[table["budget"] == "iterations"].set_index("variant")
    g = final.loc["grpo-g8"]
    assert g["at_step"] == "40" and g["window"] == "steps 37-40"  # window_size(40) = 4
    assert g["value"] == pytest.approx(grpo[-4:].mean())
    assert g["value"] > 0.047 + 0.15  # the outlier no longer is the table's number
    assert g["value_lo"] < g["value"] < g["value_hi"]  # one seed: the spread over the window's steps
    assert final.loc["es-n16", "window"] == "steps 28-30" and final.loc["es-n16", "value"] == pytest.approx(0.5)


def test_matched_budget_window_ends_at_the_matched_step():
    # ES 100 rollouts/iteration for 10 iterations (total 1000); GRPO 50/step for 40 steps (total 2000):
    # the budget is 1000, GRPO's matched step is 20, its window (window_size(40) = 4) steps 17-20
    grpo = np.arange(1, 41) / 100.0
    rows = _curve("grpo-g8-s0", "GRPO", grpo, 50) + _curve("es-n16-s0", "ES", np.arange(1, 11) / 10.0, 100)
    table = pd.DataFrame(stats.budget_rows(pd.DataFrame(rows), ["grpo-g8", "es-n16"], "fitness_mean",
                                           "train reward"))
    matched = table[table["budget"] == "rollouts"].set_index("variant")
    assert matched.loc["grpo-g8", "at_step"] == "20" and matched.loc["grpo-g8", "window"] == "steps 17-20"
    assert matched.loc["grpo-g8", "value"] == pytest.approx(grpo[16:20].mean())
    assert matched.loc["es-n16", "window"] == "steps 8-10"
    assert matched.loc["es-n16", "value"] == pytest.approx(0.9)


def test_a_window_pools_the_seeds_and_is_shorter_when_the_chosen_step_is_early():
    rows = _curve("grpo-g8-s0", "GRPO", np.full(40, 0.2), 50, seed=0) \
        + _curve("grpo-g8-s1", "GRPO", np.full(40, 0.4), 50, seed=1) \
        + _curve("es-n16-s0", "ES", np.full(10, 0.5), 10)  # total 100 rollouts: GRPO matched at step 2
    table = pd.DataFrame(stats.budget_rows(pd.DataFrame(rows), ["grpo-g8", "es-n16"], "fitness_mean",
                                           "train reward"))
    g = table[(table["budget"] == "rollouts") & (table["variant"] == "grpo-g8")].iloc[0]
    assert g["at_step"] == "2" and g["window"] == "steps 1-2"
    assert g["value"] == pytest.approx(0.3) and g["n_seeds"] == 2
    final = table[(table["budget"] == "iterations") & (table["variant"] == "grpo-g8")].iloc[0]
    assert final["value"] == pytest.approx(0.3) and final["value_lo"] < final["value_hi"]  # CI over the seeds
