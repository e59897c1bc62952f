"""No claim holds by construction: each one, fed a synthetic result that contradicts the paper, does
not hold (or says it was not measured), through the same estimators and verdict the claims table uses."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

import tests.report.synthetic as synthetic_results
from esgrpo.report import claim_estimates, stats
from esgrpo.report.claims import CLAIMS, verdict
from tests.report.synthetic import CONFIG, build, make_results


@pytest.fixture(autouse=True)
def fewer_bootstrap_replicates(monkeypatch):
    monkeypatch.setattr(stats, "N_BOOT", 200)


@pytest.mark.parametrize("claim", CLAIMS, ids=[c.id for c in CLAIMS])
def test_every_claim_fails_on_an_estimate_beyond_its_bound(claim):
    """A CI wholly on the wrong side of the claim's bound (by more than its margin) never holds."""
    t, m = claim.threshold, claim.margin
    wrong = t - m - 1.0 if claim.comparison in (">", ">=") else t + m + 1.0
    assert verdict(wrong, wrong - 0.1, wrong + 0.1, claim) == "does not hold"


def _prompts(diff: float, kinds=("ES", "GRPO")) -> pd.DataFrame:
    """Per-prompt greedy accuracy of two methods, two seeds, 40 prompts: ES = GRPO + diff on average."""
    rng = np.random.default_rng(0)
    rows = []
    for seed in (0, 1):
        for i in range(40):
            grpo = float(rng.random() < 0.6)
            es = float(np.clip(grpo + diff + rng.normal(0, 0.05), 0, 1))
            rows += [{"method": kinds[0], "seed": seed, "prompt": f"p{i}", "greedy": es},
                     {"method": kinds[1], "seed": seed, "prompt": f"p{i}", "greedy": grpo}]
    frame = pd.DataFrame(rows)
    return frame.assign(**{"pass@1": frame["greedy"]})


class _OnTask:
    def __init__(self, prompts: pd.DataFrame):
        self.prompts = prompts

    def on_task(self, kinds):
        return self.prompts


def test_es_matches_or_exceeds_grpo_is_non_inferiority():
    """A 10-point ES lead holds (an equivalence test would say "does not hold"); a shortfall well beyond the
    margin (ES = GRPO - 0.3, clipped to [0, 1]: ~18 points) fails."""
    ks = {"k": 1, "k1": 1, "k2": 1}
    claim = next(c for c in CLAIMS if c.id == "a_es_matches_grpo")
    for diff, expected in ((0.1, "holds"), (-0.3, "does not hold")):
        est = claim_estimates.test_difference_claims(_OnTask(_prompts(diff)), ks)["a_es_matches_grpo"]
        assert verdict(est["estimate"], est["lo"], est["hi"], claim) == expected, (diff, est)


def test_population_claim_is_16_against_64_per_model(tmp_path, monkeypatch):
    config = copy.deepcopy(CONFIG)
    config["es"]["population_sizes"] = [16]
    config["es"]["ablations"]["population_sizes"] = [4, 64]
    monkeypatch.setattr(synthetic_results, "POP_REWARD", {4: 0.9, 16: 0.60, 64: 0.70})
    claims = pd.read_csv(build(tmp_path, "claims", make_results(tmp_path, config=config), config=config)["csv"])
    row = claims.set_index("id").loc["b_population"]
    assert row["verdict"] == "does not hold" and row["estimate"] == pytest.approx(-0.10)
    assert "N=16 - N=64" in row["budget"]
    # no N=64 run: not measured (N=4 never stands in, though it would "hold")
    config["es"]["ablations"]["population_sizes"] = [4]
    root = tmp_path / "no64"
    claims = pd.read_csv(build(root, "claims", make_results(root, config=config), config=config)["csv"])
    assert claims.set_index("id").loc["b_population", "verdict"] == "not measured"


def test_heldout_claims_read_only_untrained_tasks(tmp_path):
    """With every task in the continual sequence no task is held out: "not measured", never the trained tasks."""
    config = copy.deepcopy(CONFIG)
    config["sequential"]["continual"] = list(config["models"]["tiny"]["tasks"])
    claims = pd.read_csv(build(tmp_path, "claims", make_results(tmp_path, config=config), config=config)["csv"])
    claims = claims.set_index("id")
    for cid in ("a_heldout_es", "a_heldout_grpo"):
        assert claims.loc[cid, "verdict"] == "not measured", claims.loc[cid].to_dict()


def _drift(run: str, kind: str, method: str, scale: float) -> list[dict]:
    return [{"model": "tiny", "task": "t", "run": run, "run_kind": kind, "method": method, "variant": run[:-3],
             "seed": 0, "name": f"w{i}", "l2": scale * (1 + i), "base_l2": 10.0} for i in range(6)]


def test_one_seed_norm_ratio_has_a_tensor_ci_and_fails_when_grpo_moves_farther():
    from esgrpo.report.frames import drift_norms

    drift = pd.DataFrame(_drift("cl_es-s0-k2", "cl_es", "ES", 0.5) + _drift("cl_grpo-s0-k2", "cl_grpo", "GRPO", 1.0))
    drift.loc[drift["method"] == "GRPO", "l2"] *= np.linspace(0.8, 1.2, 6)  # tensors disagree: a real interval
    est = claim_estimates._continual_norm_ratio(drift, drift_norms(drift))
    claim = next(c for c in CLAIMS if c.id == "a_norm_ratio_continual")
    assert est["lo"] < est["estimate"] < est["hi"] < 1 and "one seed" in est["budget"]
    assert verdict(est["estimate"], est["lo"], est["hi"], claim) == "does not hold"


def test_lowrank_claim_is_equivalence_on_the_farthest_rank(tmp_path, monkeypatch):
    """es_lowrank_matches: low-rank - full-rank test mean@n at the same N for every rank of es.ablations.ranks.
    Low-rank runs that are the full-rank runs' evaluations again (difference 0 on every prompt) hold; rank 4
    at 0.2 success against ES's 0.45 does not, and the claim is judged on that rank; no ranks: not run."""
    claim = next(c for c in CLAIMS if c.id == "es_lowrank_matches")
    assert claim.comparison == "~=0" and claim.margin > 0
    for case, success, expected in (("same", {1: "main", 4: "main"}, "holds"),
                                    ("worse", {1: "main", 4: 0.2}, "does not hold")):
        monkeypatch.setattr(synthetic_results, "LOWRANK_SUCCESS", success)
        root = tmp_path / case
        row = pd.read_csv(build(root, "claims", make_results(root))["csv"]).set_index("id").loc["es_lowrank_matches"]
        assert row["verdict"] == expected, row.to_dict()
        assert "low-rank r=1 - full-rank +0.000" in row["budget"]
        if case == "same":
            assert row["estimate"] == row["lo"] == row["hi"] == 0
        else:
            assert row["budget"].endswith("judged on low-rank r=4 - full-rank") and row["hi"] < -claim.margin
    config = copy.deepcopy(CONFIG)
    del config["es"]["ablations"]["ranks"]
    root = tmp_path / "none"
    row = pd.read_csv(build(root, "claims", make_results(root, config=config), config=config)["csv"]).set_index("id")
    assert row.loc["es_lowrank_matches", "verdict"] == "not run"
    assert "es.ablations.ranks" in row.loc["es_lowrank_matches", "status"]
