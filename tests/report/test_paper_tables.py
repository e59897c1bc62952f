"""Paper tables, figures and claims (esgrpo.report) on SYNTHETIC tidy inputs with known answers,
the claims engine, plus a dry run of the paper targets on configs/ci.yaml."""

from __future__ import annotations

import copy
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tests.report.synthetic as synthetic_results
from esgrpo.analysis.jobs import AnalysisJob
from esgrpo.analysis.settings import ANALYSES
from esgrpo.report import claim_estimates, frames, loading, planning, registry, stats
from esgrpo.report.arithmetic import ARITHMETIC_LABELS
from esgrpo.report.claims import CLAIMS, VERDICTS, Claim, claims_table, verdict
from esgrpo.runs import planned_runs
from tests.conftest import REPO, run_workflow
from tests.report.synthetic import (
    ARITHMETIC_AGREEMENT,
    ARITHMETIC_BARRIER,
    ARITHMETIC_COSINE,
    ARITHMETIC_DRIFT,
    ARITHMETIC_SPARSITY,
    CONFIG,
    TASKS,
    _outputs,
    build,
    fewer_bootstrap_replicates,  # noqa: F401 (autouse)
    make_results,
    stage_inputs,
)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("paper_synthetic")
    return root, make_results(root, grpo_sharp=True)


@pytest.fixture(scope="module")
def synthetic_flipped(tmp_path_factory):
    root = tmp_path_factory.mktemp("paper_synthetic_flipped")
    return root, make_results(root, grpo_sharp=False)


# --------------------------------------------------------------------------- units


def test_run_names_classify_and_carry_their_seed():
    kinds = {run: planning.run_kind(run, 16, 8) for run in
             ["base", "es-n16-s0", "es-n4-s1", "es-n16-norm_rank-s0", "es-n16-anti-s2", "grpo-g8-s0",
              "grpo-g4-s0", "es-then-grpo-s1", "grpo-then-es-s0", "cl_es-s3-k2"]}
    assert kinds == {"base": "base", "es-n16-s0": "es", "es-n4-s1": "es_pop", "es-n16-norm_rank-s0": "es_norm",
                     "es-n16-anti-s2": "es_anti", "grpo-g8-s0": "grpo", "grpo-g4-s0": "grpo_group",
                     "es-then-grpo-s1": "es->grpo", "grpo-then-es-s0": "grpo->es", "cl_es-s3-k2": "cl_es"}
    assert [loading.seed_of(r) for r in ("es-n16-s3", "cl_grpo-s2-k4", "es-then-grpo-s1", "base")] == [3, 2, 1, -1]
    assert loading.variant_of("cl_es-s3-k2") == "cl_es-k2" and loading.variant_of("es-n16-norm_rank-s0") == "es-n16-norm_rank"
    # a snapshot of the main ES run: its own kind, its budget in the method column, its seed
    assert planning.run_kind("es-n16-it100-s2", 16, 8) == "es_snap" and loading.seed_of("es-n16-it100-s2") == 2
    # low-rank noise other than the main runs' is a kind of its own (es.ablations.ranks), never a main ES row;
    # under a low-rank main config (es.settings.noise lowrank, rank 4) its own rank is the main run
    assert planning.run_kind("es-n16-r4-s0", 16, 8) == "es_rank" and planning.run_kind("es-n16-r4-s0", 16, 8, 4) == "es"
    assert planning.run_kind("es-n16-s0", 16, 8, 4) == "es_rank" and planning.run_kind("es-n4-r4-s0", 16, 8, 4) == "es_pop"
    assert loading.run_labels("es-n16-r4-s0")["noise_rank"] == 4 and math.isnan(loading.run_labels("es-n16-s0")["noise_rank"])
    assert loading.variant_of("es-n16-r4-s1") == "es-n16-r4"
    # a paper's arithmetic (es.ablations.arithmetic) is a kind of its own, whatever the main noise, a method of
    # its own, read by the ES arithmetic table and the drift and update-norm tables
    assert planning.run_kind("es-n16-arith_paper_a-s0", 16, 8) == "es_arith" == planning.run_kind(
        "es-n16-arith_paper_b-s0", 16, 8, 4)
    assert planning.method_of("es-n16-arith_paper_b-s0", "es_arith") == "ES (paper B arithmetic)"
    assert loading.variant_of("es-n16-arith_paper_b-s0") == "es-n16-arith_paper_b"
    assert [name for name, needs in planning.NEEDS.items()
            if any("es_arith" in kinds for kinds in needs.values())] == [
        "a_update_norms", "b_drift", "claims", "claims_stability", "es_arithmetic"]  # the claims: their union
    assert planning.method_of("es-n16-it100-s2", "es_snap") == "ES (100 it)" and planning.method_of("x", "es") == "ES"
    assert loading.variant_of("es-n16-it100-s2") == "es-n16-it100"


def test_matched_rollouts_picks_the_last_step_within_the_smaller_total():
    # ES: 64 rollouts per iteration (total 640); GRPO: 50 per step (total 500) -> budget 500:
    # ES iteration 7 (448 <= 500 < 512), GRPO its final step 10.
    rows = [{"model": "m", "task": "t", "run": "es-n4-s0", "variant": "es-n4", "seed": 0, "method": "ES",
             "iteration": t, "rollouts": 64 * t, "fitness_mean": t / 10} for t in range(1, 11)]
    rows += [{"model": "m", "task": "t", "run": "grpo-g4-s0", "variant": "grpo-g4", "seed": 0, "method": "GRPO",
              "iteration": t, "rollouts": 50 * t, "fitness_mean": t / 20} for t in range(1, 11)]
    sel = stats.matched_rows(pd.DataFrame(rows), ["es-n4", "grpo-g4"], "rollouts").set_index("variant")
    assert sel.loc["es-n4", "iteration"] == 7 and sel.loc["es-n4", "rollouts"] == 448
    assert sel.loc["grpo-g4", "iteration"] == 10
    assert set(sel["matched_at"]) == {500}
    # a single method has nothing to be matched with
    assert stats.matched_rows(pd.DataFrame(rows[:10]), ["es-n4", "grpo-g4"]).empty


def test_smallest_population_within_tolerance():
    assert stats.smallest_sufficient({8: 0.60, 16: 0.695, 32: 0.69, 64: 0.70}) == 16
    assert stats.smallest_sufficient({8: 0.71, 16: 0.5, 64: 0.70}) == 8  # a better small N also suffices
    assert stats.smallest_sufficient({8: 0.5, 16: 0.6, 64: 0.70}) == 64
    assert stats.smallest_sufficient({}) is None


def test_inputs_follow_the_config(tmp_path):
    es_only = copy.deepcopy(CONFIG)
    del es_only["grpo"]
    es_only["sequential"] = {}
    inputs = planning.paper_inputs(es_only, "b_passk")
    assert not any("grpo" in p for p in inputs["prompts"])
    assert "results/tiny/base/eval_prompts.jsonl" in inputs["prompts"]
    assert planning.paper_inputs(es_only, "a_sequential")["prompts"] == ["results/tiny/base/eval_prompts.jsonl"]
    population = planning.paper_inputs(CONFIG, "b_population")["metrics"]
    assert sorted(Path(p).parent.name for p in population) == sorted(
        f"es-n{n}-s{s}" for n in (2, 4, 8) for s in (0, 1))
    assert all("/countdown3/" in p for p in population)
    drift = [AnalysisJob("drift", "tiny", "countdown3", "es-n4-s0", ("results/analysis/tiny/drift/countdown3/es-n4-s0.csv",)),
             AnalysisJob("drift", "tiny", "countdown3", "es-n2-s0", ("results/analysis/tiny/drift/countdown3/es-n2-s0.csv",)),
             AnalysisJob("theory", "tiny", "countdown3", "es-n4-s0", ("results/analysis/tiny/theory/countdown3/es-n4-s0.csv",
                                                                       "results/analysis/tiny/theory/countdown3/es-n4-s0.json")),
             AnalysisJob("drift", "other", "x", "es-n4-s0", ("results/analysis/other/drift/x/es-n4-s0.csv",))]
    assert planning.paper_inputs(CONFIG, "b_drift", drift)["drift"] == [drift[0].outputs[0]]


# --------------------------------------------------------------------------- the claims engine


def test_claim_verdicts_flip_with_numbers():
    gt = Claim("B1", "B", "ES beats GRPO on Pass@32", "pass32_es_minus_grpo", ">")
    assert verdict(0.02, 0.01, 0.03, gt) == "holds"
    assert verdict(-0.02, -0.03, -0.01, gt) == "does not hold"
    assert verdict(0.01, -0.01, 0.03, gt) == "inconclusive"
    lt = Claim("B2", "B", "GRPO below base", "d", "<")
    assert verdict(-0.02, -0.03, -0.01, lt) == "holds"
    assert verdict(0.02, 0.01, 0.03, lt) == "does not hold"
    eq = Claim("A4", "A", "cosine ~ 0", "cos", "~=0", margin=0.05)
    assert verdict(0.0, -0.01, 0.02, eq) == "holds"
    assert verdict(0.3, 0.2, 0.4, eq) == "does not hold"
    assert verdict(0.04, 0.0, 0.08, eq) == "inconclusive"
    le = Claim("X", "A", "no forgetting", "drop", "<=", threshold=0.0, margin=0.02)
    assert verdict(0.01, 0.0, 0.015, le) == "holds"
    assert verdict(0.05, 0.03, 0.07, le) == "does not hold"
    ge = Claim("Y", "A", "ratio at least 10", "ratio", ">=", threshold=10.0)
    assert verdict(40, 30, 50, ge) == "holds" and verdict(5, 4, 6, ge) == "does not hold"
    assert verdict(float("nan"), 0.1, 0.2, gt) == "inconclusive"
    with pytest.raises(ValueError):
        Claim("Z", "A", "bad", "m", "!=")
    with pytest.raises(ValueError):
        verdict(0.0, 1.0, -1.0, gt)


def test_claims_table():
    c1 = Claim("B1", "B", "ES beats GRPO", "m1", ">")
    c2 = Claim("A4", "A", "orthogonal", "cos", "~=0", margin=0.1)
    df = claims_table(
        [(c1, 0.02, 0.01, 0.03), {"claim": c2, "estimate": 0.5, "lo": 0.4, "hi": 0.6, "model": "q"}]
    )
    assert list(df["verdict"]) == ["holds", "does not hold"]
    assert list(df.columns[:7]) == ["id", "paper", "statement", "metric", "comparison", "threshold", "margin"]
    assert list(df.columns[-4:]) == ["estimate", "lo", "hi", "verdict"]
    assert df.loc[1, "model"] == "q" and pd.isna(df.loc[0, "model"])


def test_registry_runs_every_planned_stage():
    """Every stage of the registry names a function that exists, reads inputs the planner knows, has its
    report page, and (a table) its caption; the claims read what every paper table reads."""
    import inspect

    assert registry.stage_names("Claims") == ["claims", "claims_stability", "es_arithmetic"]
    assert len(registry.stage_names("Paper A", "table")) == 5 and len(registry.stage_names("Paper B", "table")) == 8
    for name, stage in registry.STAGES.items():
        function = registry.stage_function(name)
        assert list(inspect.signature(function).parameters) == ["data", "output"], name
        assert function.__name__ == f"{stage.kind}_{name}" and stage.paper in registry.PAPERS
        assert (stage.caption is not None) == (stage.kind == "table"), name
        assert set(stage.needs) <= {"prompts", "metrics", "heldout", "where", *ANALYSES}, name
        assert (REPO / "report" / f"{name}.rst").exists(), name
    assert planning.NEEDS == {name: stage.needs for name, stage in registry.STAGES.items()}
    claims = registry.STAGES["claims"].needs
    for name in registry.stage_names("Paper A", "table") + registry.stage_names("Paper B", "table"):
        for key, kinds in registry.STAGES[name].needs.items():
            assert key == "where" or claims[key] == "all" or set(kinds) <= claims[key], (name, key)
    with pytest.raises(KeyError, match="unknown paper stage 'a_acuracy'"):
        registry.stage_function("a_acuracy")
    assert "{sequence}" not in registry.table_caption("a_sequential", sequence="x -> y")


def test_planning_stays_light_for_the_dag_parse():
    """rules/targets.smk imports esgrpo.report.planning at every `snakemake` start: no pandas, no torch."""
    code = ("import sys, esgrpo.report.planning; "
            "print(sorted(m for m in ('pandas', 'torch', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# --------------------------------------------------------------------------- tables on synthetic data


def test_constant_data_gives_zero_width_ci_and_three_formats(synthetic):
    root, analysis = synthetic
    out = build(root, "a_accuracy", analysis)
    for ext in ("csv", "md", "tex"):
        assert Path(out[ext]).stat().st_size > 100, ext
    table = pd.read_csv(out["csv"])
    es = table[(table["method"] == "ES") & (table["metric"] == "test greedy accuracy")]
    assert len(es) == len(TASKS)
    assert (es["value"] == 1.0).all() and (es["value_lo"] == es["value"]).all() and (es["value_hi"] == 1.0).all()
    base = table[(table["method"] == "base") & (table["metric"] == "test greedy accuracy")]
    assert (base["value_hi"] > base["value_lo"]).all()  # random data: a real interval
    assert set(table["budget"]) == {"iterations", "rollouts", "generated_tokens"}
    md = Path(out["md"]).read_text()
    assert "1.000 [1.000, 1.000]" in md and "budget" in md
    assert "\\begin{tabular}" in Path(out["tex"]).read_text()


def test_rollout_matched_rows_in_a_table(synthetic):
    root, analysis = synthetic
    table = pd.read_csv(build(root, "a_accuracy", analysis)["csv"])
    rows = table[(table["budget"] == "rollouts") & (table["task"] == "sum_yesno")].set_index("method")
    # ES 64 rollouts/iteration, GRPO 50/step, 10 steps: matched at 500 -> ES iteration 7, GRPO step 10;
    # each value is the mean of the 3-step window ending there (stats.window_size(10) = 3)
    assert (rows["matched_at"] == "rollouts <= 500").all()
    assert int(rows.loc["ES", "at_step"]) == 7 and int(rows.loc["GRPO", "at_step"]) == 10
    assert rows.loc["ES", "window"] == "steps 5-7" and rows.loc["GRPO", "window"] == "steps 8-10"
    assert "(steps 5-7)" in Path(build(root, "a_accuracy", analysis)["md"]).read_text()
    assert rows.loc["ES", "value"] == pytest.approx(0.3 + 0.03 * 6)
    assert rows.loc["GRPO", "value"] == pytest.approx(0.3 + 0.04 * 9)
    # two seeds x 3 iterations: a real interval around the window mean
    assert rows.loc["GRPO", "value_lo"] < rows.loc["GRPO", "value"] < rows.loc["GRPO", "value_hi"]


def test_easy_setting_count(synthetic, synthetic_flipped):
    root, analysis = synthetic
    table = pd.read_csv(build(root, "b_easy_setting", analysis)["csv"])
    totals = table[table["scope"] == "total"].set_index(["method", "k"])
    # sharpened GRPO: 0.9 on 60% of prompts, 0 on the rest -> Pass@8 ~0.6 < base ~0.94 on all 3 tasks
    assert totals.loc[("GRPO", 8), "n_cells"] == 3 and totals.loc[("GRPO", 8), "n_below"] == 3
    assert totals.loc[("GRPO", 4), "n_below"] == 3
    assert totals.loc[("ES", 8), "n_below"] == 0
    root2, analysis2 = synthetic_flipped
    flipped = pd.read_csv(build(root2, "b_easy_setting", analysis2)["csv"])
    assert flipped[(flipped["scope"] == "total") & (flipped["method"] == "GRPO")]["n_below"].sum() == 0


def test_population_table_marks_smallest_sufficient_n(synthetic):
    root, analysis = synthetic
    table = pd.read_csv(build(root, "b_population", analysis)["csv"])
    final = table[table["budget"] == "iterations"].set_index("population")
    assert sorted(final.index) == [2, 4, 8]
    assert final.loc[8, "reward"] == pytest.approx(0.70) and final.loc[4, "reward"] == pytest.approx(0.695)
    assert final["smallest_sufficient"].astype(str).tolist() == ["False", "True", "False"]


def test_claims_verdicts_follow_the_numbers(synthetic, synthetic_flipped):
    sharp = pd.read_csv(build(synthetic[0], "claims", synthetic[1])["csv"]).set_index("id")
    flat = pd.read_csv(build(synthetic_flipped[0], "claims", synthetic_flipped[1])["csv"]).set_index("id")
    assert list(sharp.index) == [c.id for c in CLAIMS]
    assert set(sharp["verdict"]) <= set(VERDICTS) | {"not run", "not measured"}
    # the same claim, two datasets: sharpened GRPO loses coverage, flat GRPO (0.6 everywhere) does not
    for cid in ("b_grpo_below_base_k1", "b_grpo_below_base_k2"):
        assert sharp.loc[cid, "verdict"] == "holds", cid
        assert flat.loc[cid, "verdict"] == "does not hold", cid
        assert sharp.loc[cid, "hi"] < 0 < flat.loc[cid, "lo"], cid
    assert sharp.loc["b_es_passk_ge_grpo", "verdict"] == "holds"
    assert flat.loc["b_grpo_pass1_ge_es", "verdict"] == "holds"  # 0.6 vs 0.45
    assert sharp.loc["b_grpo_pass1_ge_es", "verdict"] == "holds"  # 0.54 vs 0.45
    assert "Pass@8" in sharp.loc["b_grpo_below_base_k2", "statement"]
    assert "Pass@4" in sharp.loc["b_grpo_below_base_k1", "statement"]
    # analysis-based claims, from the synthetic geometry
    expect = {"a_norm_theory": "holds", "a_no_barrier": "holds", "a_orthogonal": "holds", "a_kl_off_task": "holds",
              "b_drift_ratio": "holds", "a_norm_ratio_continual": "holds", "b_sparsity": "holds",
              "b_entropy_es_stable": "holds", "b_entropy_grpo_collapses": "holds", "b_zscore_vs_none": "holds",
              "b_zscore_vs_rank": "holds", "b_population": "not measured"}  # N in {2, 4, 8}: no 16 vs 64
    for cid, expected in expect.items():
        assert sharp.loc[cid, "verdict"] == expected, (cid, sharp.loc[cid].to_dict())
    assert sharp.loc["a_norm_theory", "estimate"] == pytest.approx(1.02)
    assert sharp.loc["b_sparsity", "estimate"] == pytest.approx(0.8)
    assert sharp.loc["b_drift_ratio", "estimate"] == pytest.approx(20.0)
    assert (sharp.drop(index="b_population")["status"] == "measured").all()
    assert sharp.loc["b_drift_ratio", "ours / paper"] == pytest.approx(20.0 / 44.1)
    # statements such as "||theta_K - theta_0||" must not split Markdown cells
    md_rows = [line for line in Path(build(synthetic[0], "claims", synthetic[1])["md"]).read_text().splitlines()
               if line.startswith("|")]
    cells = {len(re.split(r"(?<!\\)\|", line)) for line in md_rows}
    assert len(md_rows) == len(CLAIMS) + 2 and len(cells) == 1, cells
    assert any("\\|\\|" in line for line in md_rows)


def test_claims_not_run_without_grpo(tmp_path):
    config = copy.deepcopy(CONFIG)
    del config["grpo"]
    config["sequential"] = {}
    analysis = make_results(tmp_path, config=config)
    claims = pd.read_csv(build(tmp_path, "claims", analysis, config=config)["csv"]).set_index("id")
    for cid in ("a_es_matches_grpo", "b_grpo_below_base_k2", "b_es_then_grpo", "b_drift_ratio", "a_heldout_es",
                "b_entropy_grpo_collapses"):
        assert claims.loc[cid, "verdict"] == "not run", cid
        assert claims.loc[cid, "status"].startswith("not run"), cid
    assert claims.loc["a_es_improves", "verdict"] in VERDICTS
    assert claims.loc["b_population", "verdict"] == "not measured"
    # the ES-vs-GRPO tables still build, saying GRPO was not run
    assert "GRPO: not run" in Path(build(tmp_path, "a_accuracy", analysis, config=config)["md"]).read_text()
    seq = pd.read_csv(build(tmp_path, "a_sequential", analysis, config=config)["csv"])
    assert seq["status"].tolist() == ["not run"]


@pytest.mark.parametrize("name", registry.stage_names("Paper A", "table") + registry.stage_names("Paper B", "table"))
def test_every_table_builds_with_cis(synthetic, name):
    root, analysis = synthetic
    out = build(root, name, analysis)
    table = pd.read_csv(out["csv"])
    assert not table.empty and "status" not in table, name
    lo_cols = [c for c in table.columns if c.endswith("_lo")]
    assert lo_cols, name
    for lo in lo_cols:
        m, hi = table[lo[:-3]], table[lo[:-3] + "_hi"]
        ok = m.isna() | table[lo].isna() | ((table[lo] <= m + 1e-12) & (m <= hi + 1e-12))
        assert ok.all(), (name, lo)


def _mean_at_n(root: Path, run: str, task: str = "countdown3") -> pd.Series:
    rows = pd.DataFrame([json.loads(line) for line in
                         (root / "results" / "tiny" / task / run / "eval_prompts.jsonl").read_text().splitlines()])
    rows = rows[rows["eval_task"] == task]
    return (rows["correct"] / rows["n"]).set_axis(rows["id"])


def test_lowrank_ablation_rows_stand_beside_full_rank(synthetic):
    """es.ablations.ranks [1, 4]: each rank is a setting of b_ablations with a paired contrast against the
    full-rank main runs at the same N, whose mean@n is the mean of the per-prompt differences of the
    evaluation files; the main rows keep only full-rank runs (their greedy is 1 on every prompt by
    construction, the low-rank runs' is not)."""
    root, analysis = synthetic
    table = pd.read_csv(build(root, "b_ablations", analysis)["csv"])
    cell = table.set_index(["setting", "metric"])["value"]
    assert {"low-rank r=1", "low-rank r=4", "low-rank r=1 - full-rank", "low-rank r=4 - full-rank"} <= set(table["setting"])
    assert cell[("zscore", "test greedy")] == 1.0 and cell[("low-rank r=1", "test greedy")] < 1.0
    for r in (1, 4):
        diff = pd.concat([_mean_at_n(root, f"es-n4-r{r}-s{s}") - _mean_at_n(root, f"es-n4-s{s}") for s in (0, 1)])
        assert cell[(f"low-rank r={r} - full-rank", "test mean@n")] == pytest.approx(diff.mean())
        assert cell[(f"low-rank r={r}", "test mean@n")] == pytest.approx(
            pd.concat([_mean_at_n(root, f"es-n4-r{r}-s{s}") for s in (0, 1)]).mean())
    # the norm theory applies to low-rank runs (E||A B^T / sqrt(r)||_F^2 = m n): their slope ratios count
    # and in the norm-theory figure they are points of their own (crosses; it renders in test_every_figure_renders)
    from esgrpo.report.figures import noise_of

    ratios = frames.theory_ratios(stage_inputs(root, "es_norm_theory", analysis).analysis("theory")).set_index("run")
    assert ratios.loc[["es-n4-r1-s0", "es-n4-r4-s1"], "applies"].all()
    assert ratios.loc["es-n4-r1-s0", "ratio"] == pytest.approx(1.02)
    assert noise_of("es-n4-r1-s0") == "low-rank" and noise_of("es-n4-s0") == "full-rank"
    assert noise_of("es-n4-arith_paper_a-s0") == "paper's arithmetic"  # diamonds, with their theory line


def test_sequential_table_forgetting(synthetic):
    root, analysis = synthetic
    table = pd.read_csv(build(root, "a_sequential", analysis)["csv"])
    acc = table[table["row"] == "accuracy"]
    # stage 1 is the main run on the first task (no cl_*-k1 run is trained), read under its continual name
    assert not any(run.endswith("-k1") for m in CONFIG["models"] for _, run in planned_runs(CONFIG, m))
    assert sorted(acc["stage"].unique()) == [0, 1, 2]
    assert set(acc["method"]) == {"ES", "GRPO"}
    forgetting = table[table["stage_task"] == "forgetting"]
    assert set(forgetting["method"]) == {"ES", "GRPO"} and len(forgetting) == 2 * len(TASKS)
    held = pd.read_csv(build(root, "a_heldout", analysis)["csv"])
    assert held.loc[held["eval_task"] == "leg_count", "held_out"].all()
    assert not held.loc[held["eval_task"] == "countdown3", "held_out"].any()


QUICK_FIGURES = ["sequential_matrix", "js_diversity_vs_passk_gain"]


@pytest.mark.parametrize("name", [
    n if n in QUICK_FIGURES else pytest.param(n, marks=pytest.mark.slow)
    for n in registry.stage_names(kind="figure")])
def test_every_figure_renders(synthetic, name):
    root, analysis = synthetic
    out = build(root, name, analysis, figure=True)
    assert Path(out["png"]).stat().st_size > 5000 and Path(out["pdf"]).stat().st_size > 1000


def test_figures_say_not_run_without_inputs(tmp_path):
    config = copy.deepcopy(CONFIG)
    config["sequential"] = {}
    out = _outputs(tmp_path, "sequential_matrix", figure=True)
    loading.run_paper_stage(input={"prompts": []}, output=out,
                           params={"stage": "sequential_matrix", "setup": planning.paper_setup(config),
                                   "jobs": {"prompts": []}},
                           wildcards={}, threads=1)
    assert Path(out["png"]).stat().st_size > 1000 and Path(out["pdf"]).stat().st_size > 1000


def _drawn_figure(monkeypatch, synthetic, name: str):
    """The matplotlib figure a figure stage draws (captured just before it is saved), laid out."""
    from esgrpo.report import figures

    root, analysis = synthetic
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, png, pdf=None: drawn.append(fig) or fig.canvas.draw())
    build(root, name, analysis, figure=True)
    return drawn[0]


@pytest.mark.parametrize("name", ["interpolation", "passk_curves", "entropy_curves", "sparsity_curves"])
def test_figures_have_one_legend_outside_every_panel(monkeypatch, synthetic, name):
    """What a reader needs to take a figure in at a glance: no panel carries its own legend, and the
    figure's one legend overlaps no panel (it used to sit on the curves, one per panel)."""
    fig = _drawn_figure(monkeypatch, synthetic, name)
    panels = [ax for ax in fig.axes if ax.axison]
    assert panels and all(ax.get_legend() is None for ax in panels)
    assert len(fig.legends) == 1
    box = fig.legends[0].get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in panels)


def test_interpolation_has_a_panel_per_trained_task_and_path(monkeypatch, synthetic):
    """Paper A's layout: a row per trained task, a column per path (lam paths, then direction scans), a line
    per evaluation task in the same colour everywhere, the row's own task thick."""
    fig = _drawn_figure(monkeypatch, synthetic, "interpolation")
    panels = [ax for ax in fig.axes if ax.axison]
    tasks = sorted(CONFIG["models"][next(iter(CONFIG["models"]))]["tasks"])
    assert len(panels) == len(tasks) * 2  # the synthetic analyses hold es-grpo and dir-random
    assert [ax.get_title() for ax in panels[:2]] == ["ES -> GRPO", "along a random direction"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:len(TASKS)] == sorted(TASKS) and legend[-1] == "thick: the row's trained task"
    for row, task in enumerate(tasks):
        widths = {line.get_color(): line.get_linewidth() for line in panels[2 * row].get_lines()}
        assert len(widths) == len(TASKS) and max(widths.values()) > 2 * min(widths.values())
        assert panels[2 * row].get_ylabel().startswith(f"trained on {task}")


def test_entropy_curves_name_what_an_estimated_entropy_is():
    from esgrpo.report.frames import entropy_labels

    curves = pd.DataFrame({"method": ["ES", "ES", "GRPO"],
                           "entropy_estimator": ["exact", "top20_lumped_lower_bound", np.nan]})
    assert entropy_labels(curves).tolist() == ["ES", "ES (top20 lumped lower bound)", "GRPO"]
    assert entropy_labels(curves.drop(columns="entropy_estimator")).tolist() == ["ES", "ES", "GRPO"]


def test_entropy_table_keeps_an_estimated_entropy_apart_from_exact_ones(synthetic):
    """b_entropy: an ES run whose entropy is a vLLM bound gets its own, labelled method, never pooled
    with exact values; with exact entropies only, the methods are the plain ones."""
    from esgrpo.report.paper_b import build_b_entropy

    root, _ = synthetic
    data = stage_inputs(root, "b_entropy", [])
    exact = build_b_entropy(data)
    assert set(exact["method"]) <= {"base", "ES", "GRPO"} and {"ES", "GRPO"} <= set(exact["method"])

    metrics = data.metrics.copy()
    es_runs = sorted(metrics.loc[metrics["kind"] == "es", "run"].unique())  # a main ES run
    metrics["entropy_estimator"] = np.where(metrics["run"] == es_runs[0], "top20_lumped_lower_bound", "exact")
    data.__dict__["metrics"] = metrics
    mixed = build_b_entropy(data)
    train = mixed[mixed["metric"].str.startswith("train entropy")]
    assert "ES (top20 lumped lower bound)" in set(train["method"])
    assert {"GRPO"} <= set(train["method"])


# --------------------------------------------------------------------------- the workflow


def test_paper_targets_dry_run_on_ci_config(tmp_path):
    run_workflow(tmp_path, REPO / "configs" / "ci.yaml", targets=["paper_a", "paper_b", "claims"], dryrun=True)


def test_every_paper_file_is_a_target_of_the_rules():
    text = (REPO / "rules" / "paper.smk").read_text()
    assert 'include: "rules/paper.smk"' in (REPO / "Snakefile").read_text()
    for rule in ("rule paper_a:", "rule paper_b:", "rule claims:"):
        assert rule in text
    assert "def paper_targets():" in (REPO / "rules" / "targets.smk").read_text()
    for name in registry.STAGES:
        assert (REPO / "report" / f"{name}.rst").exists(), name


# --------------------------------------------------------------------------- the papers' values beside ours

PAPER_A_CONFIG = {
    "models": {"qwen3_4b": {"source": "Qwen/Qwen3-4B-Instruct-2507", "tasks": ["countdown", "math", "chemistry",
                                                                              "boolq"]}},
    "eval": {"n_samples": 8, "ks": [1, 2, 4, 8]},
    "es": {"population_sizes": [30], "seeds": [0], "settings": {"iterations": 300}},
    "grpo": {"group_sizes": [8], "seeds": [0], "settings": {"steps": 79}},
    "sequential": {"continual": ["countdown", "math", "chemistry", "boolq"], "continual_methods": ["es", "grpo"],
                   "continual_budget": {"es_iterations": 100, "grpo_steps": 79}},
}


def test_update_norms_show_the_papers_norms_beside_ours_and_the_theorys(tmp_path):
    """Under paper A's model and tasks, a_update_norms carries the paper's four norms per method (and ours -
    paper's) in the continual ||theta - theta0|| cells, and the ES theory from the base; the default-style
    config shows no paper value."""
    analysis = make_results(tmp_path, config=PAPER_A_CONFIG)
    table = pd.read_csv(build(tmp_path, "a_update_norms", analysis, config=PAPER_A_CONFIG)["csv"])
    continual = table[table["setting"] == "continual"].set_index(["stage", "quantity", "method"])["value"]
    paper = {"ES": (87.28, 122.76, 149.99, 173.00), "GRPO": (1.00, 1.15, 1.65, 1.84)}
    label = "||theta - theta0||: paper A (docs/references.md)"
    for method, norms in paper.items():
        for k, (task, norm) in enumerate(zip(PAPER_A_CONFIG["sequential"]["continual"], norms, strict=True), 1):
            stage = f"{k}: {task}"
            assert continual[(stage, label, method)] == pytest.approx(norm)
            ours = continual[(stage, "||theta - theta0||", method)]
            # synthetic drift: 4 tensors of l2 scale*(1, 1, 1, 2), scale = sqrt(k) (x 0.05 for GRPO)
            assert ours == pytest.approx(math.sqrt(7 * k) * (0.05 if method == "GRPO" else 1.0))
            assert continual[(stage, "||theta - theta0||: ours - paper A", method)] == pytest.approx(ours - norm)
        # the theory from the base: stage k sums k stages' final theory_sq (0.01 x 10 updates each)
        if method == "ES":
            for k, task in enumerate(PAPER_A_CONFIG["sequential"]["continual"], 1):
                theory = continual[(f"{k}: {task}", "||theta - theta0|| theory alpha*sqrt(T d/N)", "ES")]
                assert theory == pytest.approx(math.sqrt(0.1 * k))
    md = Path(build(tmp_path, "a_update_norms", analysis, config=PAPER_A_CONFIG)["md"]).read_text()
    assert "87.280" in md and "173.000" in md and "1.840" in md
    default = pd.read_csv(build(tmp_path / "default", "a_update_norms", make_results(tmp_path / "default"))["csv"])
    assert not default["quantity"].str.contains("paper").any()
    assert default["quantity"].str.contains("theory").any()


def _paper_cells(table: pd.DataFrame, label: str, keys: list[str]) -> dict[tuple, dict]:
    """(*keys, method) -> {"ours", "paper", "diff", "paper_label"} for every cell that carries a paper row."""
    cells = {}
    for _, row in table[table[label].astype(str).str.contains(": ours - paper ")].iterrows():
        base = row[label].split(": ours - paper ")[0]
        others = [k for k in keys if k != label] + ["method"]
        same = (table[others] == row[others]).all(axis=1)
        paper = table[same & table[label].astype(str).str.startswith(f"{base}: paper ")]
        ours = table[same & (table[label] == base)]
        assert len(paper) == 1 and len(ours) == 1, row.to_dict()
        cells[(*(row[k] for k in keys if k != label), base, row["method"])] = {
            "ours": ours["value"].iloc[0], "paper": paper["value"].iloc[0], "diff": row["value"],
            "paper_label": paper[label].iloc[0]}
    return cells


def _assert_paper_cells(cells: dict, expected: dict) -> None:
    """Every expected cell carries the paper's value and ours - paper; no other cell carries one."""
    assert set(cells) == set(expected)
    for key, value in expected.items():
        cell = cells[key]
        assert cell["paper"] == pytest.approx(value), key
        assert cell["diff"] == pytest.approx(cell["ours"] - value), key


def test_paper_a_tables_show_the_papers_accuracy_and_heldout_cells(tmp_path):
    """Under paper A's model and tasks (with its 100-iteration snapshot and MMLU / IFEval evaluated),
    a_accuracy carries paper A's base / ES 100 it / ES 300 it / GRPO accuracy (2°) per task and a_heldout
    its MMLU / IFEval before, after and change, each beside ours with ours - paper."""
    config = copy.deepcopy(PAPER_A_CONFIG)
    config["es"]["snapshots"] = [100]
    spec = config["models"]["qwen3_4b"]
    spec["eval_tasks"] = [*spec["tasks"], "mmlu", "ifeval"]
    analysis = make_results(tmp_path, config=config)
    out = build(tmp_path, "a_accuracy", analysis, config=config)
    cells = _paper_cells(pd.read_csv(out["csv"]), "metric", ["model", "task", "budget", "metric"])
    accuracy = {"countdown": (20.5, 75.1, 78.6, 74.5), "math": (61.8, 72.4, 74.0, 68.8),
                "chemistry": (63.4, 68.1, 76.5, 74.9), "boolq": (83.7, 87.2, 88.1, 86.6)}  # docs/references.md
    _assert_paper_cells(cells, {("qwen3_4b", task, "iterations", "test greedy accuracy", method): percent / 100
                                for task, row in accuracy.items()
                                for method, percent in zip(("base", "ES (100 it)", "ES", "GRPO"), row, strict=True)})
    assert all("2°" in c["paper_label"] for c in cells.values())
    md = Path(out["md"]).read_text()
    assert "test greedy accuracy: paper A (2°, docs/references.md)" in md and "0.205" in md and "0.881" in md

    held = pd.read_csv(build(tmp_path, "a_heldout", analysis, config=config)["csv"])
    cells = _paper_cells(held, "metric", ["model", "eval_task", "metric", "quantity"])
    before_after = {("mmlu", "ES"): (77.5, 73.8), ("ifeval", "ES"): (79.7, 81.9),
                    ("mmlu", "GRPO"): (77.5, 78.3), ("ifeval", "GRPO"): (79.7, 78.4)}
    final = "after (stage 4)"
    _assert_paper_cells(cells, {("qwen3_4b", task, quantity, "greedy", method): value / 100
                                for (task, method), (before, after) in before_after.items()
                                for quantity, value in (("before (base)", before), (final, after),
                                                        ("after - before", after - before))})
    assert held.loc[held["eval_task"].isin(["mmlu", "ifeval"]), "held_out"].all()


PAPER_B_CONFIG = {
    "models": {"qwen2_5_1_5b": {"source": "Qwen/Qwen2.5-1.5B-Instruct", "tasks": ["gsm8k"]},
               "qwen2_5_7b": {"source": "Qwen/Qwen2.5-7B-Instruct", "tasks": ["gsm8k"]},
               "r1_distill_1_5b": {"source": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "tasks": ["deepscaler"],
                                   "eval_tasks": ["math", "aime24"]}},
    "eval": {"n_samples": 32, "ks": [1, 2, 4, 8, 16, 32]},
    "es": {"population_sizes": [32], "seeds": [0, 1], "settings": {"iterations": 234}},
    "grpo": {"group_sizes": [8], "seeds": [0, 1], "settings": {"steps": 234}},
    "sequential": {"task": "deepscaler"},
}


def test_paper_b_tables_show_the_papers_passk_and_drift_cells(tmp_path, monkeypatch):
    """Under paper B's models and tasks, b_passk carries its public code's GSM8K reference (Qwen2.5-1.5B base
    and ES) and the hard-maths averages (2°; R1-Distill judged on MATH-500) for base, ES, GRPO and ES->GRPO
    at Pass@1/16/32; b_drift the 44.1x whole-model ratio at Qwen2.5-7B; and the claims catalog's figures
    are the same numbers (report.paper_values is their one source)."""
    from esgrpo.report.paper_values import PAPER_VALUES

    monkeypatch.setattr(synthetic_results, "N", 32)  # 32 samples per prompt, as paper B's Pass@32 needs
    analysis = make_results(tmp_path, config=PAPER_B_CONFIG)
    out = build(tmp_path, "b_passk", analysis, config=PAPER_B_CONFIG)
    cells = _paper_cells(pd.read_csv(out["csv"]), "metric", ["model", "task", "budget", "metric"])
    # understanding-es reference/results.json (docs/references.md quotes them rounded: 0.7027, 0.9483, ...)
    gsm8k = {"base": (0.702710386656558, 0.9482999740850728, 0.9636087945413192),
             "ES": (0.7319939347990903, 0.9489579075954446, 0.9658832448824868)}
    hard = {"base": (47.7, 73.5, 77.4), "ES": (49.9, 75.0, 78.9), "GRPO": (52.9, 74.7, 78.0),
            "ES->GRPO": (52.3, 75.8, 79.2)}
    expected = {("qwen2_5_1_5b", "gsm8k", "iterations", metric, method): value
                for method, row in gsm8k.items() for metric, value in zip(("pass@1", "pass@16", "pass@32"), row,
                                                                           strict=True)}
    expected |= {("r1_distill_1_5b", "average", "iterations", metric, method): percent / 100
                 for method, row in hard.items() for metric, percent in zip(("pass@1", "pass@16", "pass@32"), row,
                                                                             strict=True)}
    _assert_paper_cells(cells, expected)
    assert all(("2°" in c["paper_label"]) == (key[0] == "r1_distill_1_5b") for key, c in cells.items())
    assert "understanding-es reference/results.json" in Path(out["md"]).read_text()
    # the hard setting's average: per seed the mean of its benchmarks' Pass@k, each weighing the same
    table = pd.read_csv(out["csv"])
    ours = table[~table["metric"].str.contains("paper")]
    cell = ours[(ours["model"] == "r1_distill_1_5b") & (ours["method"] == "GRPO") & (ours["metric"] == "pass@1")]
    per_task = dict(zip(cell["task"], cell["value"], strict=True))
    assert set(per_task) == {"math", "aime24", "average"}
    assert per_task["average"] == pytest.approx((per_task["math"] + per_task["aime24"]) / 2)

    drift = pd.read_csv(build(tmp_path, "b_drift", analysis, config=PAPER_B_CONFIG)["csv"])
    cells = _paper_cells(drift, "quantity", ["model", "task", "module_type", "quantity"])
    _assert_paper_cells(cells, {("qwen2_5_7b", "gsm8k", "all", "relative L2 ratio", "ES/GRPO"): 44.1})
    assert cells[("qwen2_5_7b", "gsm8k", "all", "relative L2 ratio", "ES/GRPO")]["ours"] == pytest.approx(20.0)

    claimed = {c.id: c.paper_value for c in CLAIMS}
    assert claimed["b_drift_ratio"] == PAPER_VALUES[("b_drift", "Qwen/Qwen2.5-7B-Instruct", "gsm8k", "ES/GRPO",
                                                     "relative L2 ratio")].value
    es, grpo = (PAPER_VALUES[("a_update_norms", "Qwen/Qwen3-4B-Instruct-2507", "boolq", m, 4)].value
                for m in ("ES", "GRPO"))
    assert claimed["a_norm_ratio_continual"] == pytest.approx(es / grpo, abs=0.05)  # 173.00 / 1.84, rounded


@pytest.mark.parametrize("name,label", [("a_accuracy", "metric"), ("a_heldout", "metric"),
                                        ("a_update_norms", "quantity"), ("b_passk", "metric"),
                                        ("b_drift", "quantity")])
def test_default_config_tables_show_no_paper_rows(synthetic, name, label):
    """The toy model is no paper's: no paper row, no paper note."""
    root, analysis = synthetic
    out = build(root, name, analysis)
    assert not pd.read_csv(out["csv"])[label].astype(str).str.contains("paper").any()
    assert "ours - paper" not in Path(out["md"]).read_text()


def test_off_task_kl_covers_the_continual_stages(synthetic):
    """Paper A's KL heatmap covers its sequence: a_geometry has on/off-task KL rows per continual stage
    (stage 1 is the main run on the first task, under its continual name), and the ES-vs-GRPO off-task
    KL claim still compares the single-task main runs only."""
    root, analysis = synthetic
    table = pd.read_csv(build(root, "a_geometry", analysis)["csv"])
    kl = table[table["quantity"].str.startswith("KL off-task")]
    stage2 = kl[kl["quantity"].str.contains("continual stage 2")]
    assert set(stage2["method"]) == {"ES", "GRPO"} and set(stage2["task"]) == {"sum_yesno"}
    es2 = stage2[stage2["method"] == "ES"]["value"].iloc[0]
    assert es2 == pytest.approx(0.03 * 2.0 * 2)  # the stage-2 file's off-task KL, not the main run's
    assert kl["quantity"].str.contains("continual stage 1").any()
    single = kl[~kl["quantity"].str.contains("continual")]
    assert single[single["method"] == "ES"]["value"].max() == pytest.approx(0.03)
    claims = pd.read_csv(build(root, "claims", analysis)["csv"]).set_index("id")
    assert claims.loc["a_kl_off_task", "estimate"] == pytest.approx(0.03 - 0.003)
    assert Path(build(root, "kl_heatmap", analysis, figure=True)["png"]).stat().st_size > 10_000


# --------------------------------------------------------------------------- what the tables say (issue 22)


@pytest.fixture(scope="module")
def saturated_synthetic(tmp_path_factory):
    """The synthetic tree with every sum_yesno prompt solved by all n samples of the base and of the main ES
    runs: their Pass@4 / Pass@8 on sum_yesno are 1.000 [1.000, 1.000]."""
    root = tmp_path_factory.mktemp("paper_saturated")
    analysis = make_results(root)
    tiny = root / "results" / "tiny"
    for path in [tiny / "base" / "eval_prompts.jsonl", *sorted((tiny / "sum_yesno").glob("es-n4-s*/eval_prompts.jsonl"))]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, "correct": r["n"]} if r["eval_task"] == "sum_yesno" else r) + "\n"
                                for r in rows))
    return root, analysis


def test_saturated_cells_are_marked_and_left_out_of_the_counts(saturated_synthetic):
    root, analysis = saturated_synthetic
    out = build(root, "b_easy_setting", analysis)
    table = pd.read_csv(out["csv"])
    cells = table[table["scope"] == "cell"]
    both = cells[cells["saturated"].astype(str) == "True"]
    assert set(zip(both["method"], both["task"], both["k"], strict=True)) == {("ES", "sum_yesno", 4), ("ES", "sum_yesno", 8)}
    assert both["below"].isna().all()  # not a comparison: neither below nor not below
    totals = table[table["scope"] == "total"].set_index(["method", "k"])
    assert totals.loc[("ES", 8), "n_cells"] == 2 and totals.loc[("ES", 8), "n_saturated"] == 1
    assert totals.loc[("GRPO", 8), "n_cells"] == 3 and totals.loc[("GRPO", 8), "n_saturated"] == 0  # base alone
    assert "Saturated: 2 of 12 comparisons" in Path(out["md"]).read_text()
    passk = build(root, "b_passk", analysis)
    md = Path(passk["md"]).read_text()
    for k in (4, 8):  # base and ES on sum_yesno, in the same row
        (line,) = [row for row in md.splitlines() if row.startswith("| tiny    | sum_yesno") and f"| pass@{k} " in row]
        assert line.count("1.000 [1.000, 1.000] (saturated)") == 2, line
    assert re.search(r"Saturated: \d+ of 33 Pass@k cells are 1.000 \[1.000, 1.000\]", md)
    assert pd.read_csv(passk["csv"]).query("task == 'sum_yesno' and method == 'base' and metric == 'pass@8'")[
        "saturated"].astype(str).tolist() == ["True"]
    # the JS-diversity figure's frame knows which of its points sit at 0 by saturation
    js = frames.js_gain_frame(stage_inputs(root, "js_diversity_vs_passk_gain", analysis))
    on_sum = js[js["task"] == "sum_yesno"]
    assert len(on_sum) and on_sum["saturated"].all() and (on_sum["gain"] == 0).all()
    assert not js[js["task"] != "sum_yesno"]["saturated"].any()


def test_html_pages_are_the_markdown_tables(synthetic):
    """The report's page of a table (its .html) holds the Markdown's rows and cells, caption and notes."""
    root, analysis = synthetic
    out = build(root, "a_accuracy", analysis)
    md, html = Path(out["md"]).read_text(), Path(out["html"]).read_text()
    md_rows = [line for line in md.splitlines() if line.startswith("| tiny")]
    assert html.count("<tr") == len(md_rows) + 1  # + the header row
    assert "(steps 5-7)" in html and html.startswith("<!DOCTYPE html>") and "<table" in html
    assert "the window column and the cell" not in md and "each cell names its steps" in md  # what it shows


def test_geometry_pairs_claims_tests_and_counts_read_as_they_say(synthetic):
    root, analysis = synthetic
    md = Path(build(root, "a_geometry", analysis)["md"]).read_text()
    header = next(line for line in md.splitlines() if line.startswith("| model"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["model", "task", "quantity", "pair", "pairwise",
                                                                 "ES", "GRPO"]
    assert "| dES vs dGRPO " in md and "| dES vs dES (2 seeds) " in md
    assert claim_estimates.claim_test_text("~=0", 1.0, 0.1) == "within 1 ± 0.1"
    assert claim_estimates.claim_test_text(">=", 0.0, 0.05) == ">= -0.05 (0 - margin 0.05)"
    assert claim_estimates.claim_test_text(">", 0.0, 0.1) == "> 0.1 (0 + margin 0.1)"
    assert claim_estimates.claim_test_text("<", 0.0, 0.0) == "< 0"
    claims_md = Path(build(root, "claims", analysis)["md"]).read_text()
    assert "~=0" not in claims_md and "within 0 ± 0.02" in claims_md
    population = Path(build(root, "b_population", analysis)["md"]).read_text()
    assert "| 1280 " in population and "1280.000" not in population


def test_es_arithmetic_table_puts_each_papers_arithmetic_beside_the_exact_one(tmp_path):
    """On the ablation task at the main population: the exact main runs and each paper's in-place runs, seed for
    seed; the agreement columns are metrics.jsonl's means, the distance ratio the theory analysis's final row."""
    analysis = make_results(tmp_path)
    # the stage reads the ablation task's runs and analyses only (its `where`), of every task's that exist
    inputs = planning.paper_input_files(CONFIG, "es_arithmetic", analysis)
    for key in ("drift", "sparsity", "cosine", "interpolation"):
        assert inputs[key] and {f.task for f in inputs[key]} == {"countdown3"} < {j.task for j in analysis
                                                                                if j.kind == key}, key
    out = build(tmp_path, "es_arithmetic", analysis)
    table = pd.read_csv(out["csv"])
    assert set(table["task"]) == {"countdown3"} and set(table["arithmetic"]) == set(ARITHMETIC_LABELS.values())
    assert (table["n_seeds"] == 2).all() and len(table) == 9 * 3  # seven metrics and two module types
    cell = table.set_index(["metric", "arithmetic"])["value"]
    for key, label in ARITHMETIC_LABELS.items():
        assert cell["step cosine with the intended step", label] == ARITHMETIC_AGREEMENT[key]["step_cosine"]
        assert cell["share of coordinates changed per update", label] == ARITHMETIC_AGREEMENT[key]["changed_share"]
        for kind, share in ARITHMETIC_AGREEMENT[key]["changed_share_by_module"].items():
            assert cell[f"share changed per update: {kind}", label] == pytest.approx(share)
        drift = ARITHMETIC_DRIFT if key != "exact" else 1.0
        assert cell["distance / theory (final)", label] == pytest.approx(drift * math.sqrt(1.02))
        assert cell["ES/GRPO drift ratio (relative L2)", label] == pytest.approx(drift / 0.05)
        assert cell["norm layers' share of the squared update", label] == pytest.approx(4 / 7)
        # the cosine of ES's update with GRPO's: the main runs' pairs (+-0.01 over the two seeds) or the in-place run's
        assert cell["cosine of the ES and GRPO updates", label] == pytest.approx(
            0.0 if key == "exact" else ARITHMETIC_COSINE, abs=1e-12)
    # the exact runs' accuracy is the main ES runs' (greedy right on every own-task prompt); the papers' are others
    assert cell["test greedy accuracy", ARITHMETIC_LABELS["exact"]] == 1.0
    assert cell["test greedy accuracy", ARITHMETIC_LABELS["paper_a"]] < 1.0
    assert "exact (fp32 master)" in Path(out["md"]).read_text()
    # the drift claim judged with each arithmetic's runs in the main ES runs' place: ES/GRPO 20x exact, 60x in place
    from esgrpo.report.arithmetic import claim_verdicts

    data = stage_inputs(tmp_path, "es_arithmetic", analysis)
    verdicts = claim_verdicts(data).set_index(["id", "arithmetic"])
    for key, label in ARITHMETIC_LABELS.items():
        drift = ARITHMETIC_DRIFT if key != "exact" else 1.0
        assert verdicts.loc[("b_drift_ratio", label), "estimate"] == pytest.approx(drift / 0.05)
        assert verdicts.loc[("b_drift_ratio", label), "verdict"] == "holds"
        assert verdicts.loc[("a_norm_theory", label), "estimate"] == pytest.approx(drift ** 2 * 1.02)
    # orthogonality, barrier and sparsity judged from each arithmetic's own pair and sparsity analyses: the main
    # runs' updates are orthogonal to GRPO's, with no barrier, and keep 80% of the gain in 10% of the coordinates;
    # the synthetic in-place runs' are not (cosine 0.4, a dip of 0.2, 30% kept)
    exact, paper_a = ARITHMETIC_LABELS["exact"], ARITHMETIC_LABELS["paper_a"]
    assert verdicts.loc[("a_orthogonal", exact), "estimate"] == pytest.approx(0.01)
    assert verdicts.loc[("a_orthogonal", paper_a), "estimate"] == pytest.approx(ARITHMETIC_COSINE)
    assert verdicts.loc[("a_no_barrier", exact), "estimate"] == pytest.approx(0.0, abs=1e-12)
    assert verdicts.loc[("a_no_barrier", paper_a), "estimate"] == pytest.approx(ARITHMETIC_BARRIER)
    assert verdicts.loc[("b_sparsity", exact), "estimate"] == pytest.approx(0.8)
    assert verdicts.loc[("b_sparsity", paper_a), "estimate"] == pytest.approx(ARITHMETIC_SPARSITY)
    assert verdicts.loc[("a_orthogonal", exact), "verdict"] != verdicts.loc[("a_orthogonal", paper_a), "verdict"]
    assert verdicts.loc[("a_no_barrier", exact), "verdict"] != verdicts.loc[("a_no_barrier", paper_a), "verdict"]
    # the claims table and the interpolation figure read the main runs' pairs only
    claims = pd.read_csv(build(tmp_path, "claims", analysis)["csv"]).set_index("id")
    assert claims.loc["a_orthogonal", "estimate"] == pytest.approx(0.01)
    assert claims.loc["b_sparsity", "estimate"] == pytest.approx(0.8)
    # a_geometry: the in-place runs' pairs as rows of their own
    geometry = pd.read_csv(build(tmp_path, "a_geometry", analysis)["csv"]).query("task == 'countdown3'")
    cos = geometry[geometry["quantity"] == "cosine global"].set_index("pair")["value"]
    assert cos["dES (paper A arithmetic) vs dGRPO"] == pytest.approx(ARITHMETIC_COSINE)
    assert cos["dES vs dGRPO"] == pytest.approx(0.0, abs=1e-12)
    barrier = geometry[geometry["quantity"] == "barrier height (greedy, on-task)"].set_index("pair")["value"]
    assert barrier["ES (paper B arithmetic) -> GRPO path"] == pytest.approx(ARITHMETIC_BARRIER)
    assert "Claim b_drift_ratio" in Path(out["md"]).read_text() and "Survives exact arithmetic: yes" in Path(
        out["md"]).read_text()


def test_drift_and_update_norm_tables_give_each_papers_arithmetic_its_own_column(tmp_path):
    """b_drift and a_update_norms: the runs of each paper's arithmetic as methods of their own beside the main
    (exact) ES runs, each with its ratio to GRPO; the synthetic in-place runs drift ARITHMETIC_DRIFT times farther."""
    from esgrpo.report.planning import arithmetic_method

    analysis = make_results(tmp_path)
    methods = [arithmetic_method(key) for key in ARITHMETIC_LABELS if key != "exact"]
    assert methods == ["ES (paper A arithmetic)", "ES (paper B arithmetic)"]
    drift = pd.read_csv(build(tmp_path, "b_drift", analysis)["csv"])
    ratio = drift[(drift["quantity"] == "relative L2 ratio") & (drift["module_type"] == "all")
                  & (drift["task"] == "countdown3")].set_index("method")["value"]
    assert set(ratio.index) == {"ES/GRPO", *(f"{m}/GRPO" for m in methods)}
    for method in methods:
        assert ratio[f"{method}/GRPO"] == pytest.approx(ARITHMETIC_DRIFT * ratio["ES/GRPO"])
    assert not drift[drift["method"].isin(methods) & (drift["task"] != "countdown3")].shape[0]  # ablation task only
    norms = pd.read_csv(build(tmp_path, "a_update_norms", analysis)["csv"])
    single = norms[(norms["setting"] == "single-task") & (norms["stage"] == "countdown3")].set_index(
        ["quantity", "method"])["value"]
    for method in methods:
        assert single[("||theta - theta0||", method)] == pytest.approx(
            ARITHMETIC_DRIFT * single[("||theta - theta0||", "ES")])
        assert ("||theta - theta0|| ratio", f"{method}/GRPO") in single.index
    assert Path(build(tmp_path, "b_drift", analysis)["md"]).read_text().count("ES (paper A arithmetic)") >= 1
