"""The verdict-stability table (esgrpo.report.claims_stability) on synthetic results whose seeds disagree:
seed 0's GRPO is sharpened (Pass@k below the base), seed 1's is flat (above it)."""

from __future__ import annotations

import copy
import shutil

import pandas as pd
import pytest

from esgrpo.report import loading, planning, stats
from esgrpo.report.claim_estimates import claim_ks
from esgrpo.report.claims import CLAIMS, fill_pass_at_k, verdict
from esgrpo.report.claims_stability import NOT_MEASURED
from tests.report.synthetic import CONFIG, build, fewer_bootstrap_replicates, make_results  # noqa: F401 (autouse)


@pytest.fixture(scope="module")
def seeds_disagree(tmp_path_factory):
    """Sharpened GRPO in seed 0, flat GRPO in seed 1 (every run trained by GRPO), everything else alike."""
    root = tmp_path_factory.mktemp("stability")
    analysis = make_results(root / "sharp", grpo_sharp=True)
    make_results(root / "flat", grpo_sharp=False)
    for path in (root / "flat" / "results").glob("*/*/*/eval_prompts.jsonl"):
        run = path.parent.name
        if run != "base" and loading.seed_of(run) == 1 and "grpo" in run:
            shutil.copy(path, root / "sharp" / path.relative_to(root / "flat"))
    with pytest.MonkeyPatch.context() as patch:  # a module fixture builds before the autouse one applies
        patch.setattr(stats, "N_BOOT", 200)
        out = build(root / "sharp", "claims_stability", analysis)
        claims = pd.read_csv(build(root / "sharp", "claims", analysis)["csv"]).set_index("id")
    return pd.read_csv(out["csv"], keep_default_na=False, na_values=[""]).set_index("id"), claims, out


def test_a_claim_one_seed_supports_is_not_reported_as_holding(seeds_disagree):
    table, claims, _ = seeds_disagree
    assert list(table.index) == [c.id for c in CLAIMS]
    assert list(table["verdict_pooled"]) == list(claims["verdict"])  # pooled = the claims table's verdict
    for cid in ("b_grpo_below_base_k1", "b_grpo_below_base_k2"):
        row = table.loc[cid]
        assert (row["verdict_s0"], row["verdict_s1"]) == ("holds", "does not hold"), cid
        assert row["verdict_pooled"] == "inconclusive" and row["seeds_agreeing"] == "0/2", cid
        # each seed restricted to its own runs, the base kept: equal prompt counts, so the pooled
        # mean of the paired differences is the mean of the two seeds' estimates
        assert row["estimate_s0"] < 0 < row["estimate_s1"], cid
        assert row["estimate"] == pytest.approx((row["estimate_s0"] + row["estimate_s1"]) / 2, abs=1e-12)
    es = table.loc["b_es_not_below_base"]  # ES is alike in both seeds
    assert es["verdict_pooled"] == es["verdict_s0"] == es["verdict_s1"] == "holds"
    assert es["seeds_agreeing"] == "2/2"


def test_a_claim_holds_only_when_the_pooled_ci_says_so(seeds_disagree):
    table, claims, out = seeds_disagree
    ks = claim_ks(planning.paper_setup(CONFIG))
    for claim in CLAIMS:
        row = table.loc[claim.id]
        if row["verdict_pooled"] in ("not run", "not measured"):
            assert row["seeds_agreeing"] == "n/a"
            continue
        judged = verdict(row["estimate"], row["lo"], row["hi"], fill_pass_at_k(claim, **ks))
        assert row["verdict_pooled"] == judged, claim.id
        if row["verdict_pooled"] == "holds":
            assert row["lo"] <= row["estimate"] <= row["hi"], claim.id
    assert (claims.loc[claims["verdict"] == "holds", ["lo", "hi"]].notna()).all().all()
    md = open(out["md"]).read()
    assert "verdict s0" in md and "seeds agreeing" in md and "0/2" in md


def test_a_seed_without_the_runs_a_claim_needs_says_not_measured(tmp_path):
    """GRPO trained with seed 0 only: its claims are judged for seed 0 and pooled, not for seed 1."""
    config = copy.deepcopy(CONFIG)
    config["grpo"]["seeds"] = [0]
    analysis = make_results(tmp_path, config=config)
    table = pd.read_csv(build(tmp_path, "claims_stability", analysis, config=config)["csv"],
                        keep_default_na=False, na_values=[""]).set_index("id")
    row = table.loc["a_es_matches_grpo"]
    assert row["verdict_s1"] == NOT_MEASURED and row["verdict_s0"] == row["verdict_pooled"] == "holds"
    assert row["seeds_agreeing"] == "1/2"
    assert table.loc["a_es_improves", "verdict_s1"] == "holds"  # ES and the base are there for seed 1
