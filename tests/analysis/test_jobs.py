"""The grid's analysis jobs as records (esgrpo.analysis.jobs): what the rules' targets, the plan and the paper
stages' inputs read, so that none of them takes a path apart."""

from __future__ import annotations

import yaml

from esgrpo.analysis.jobs import analysis_jobs, pair_seeds
from esgrpo.runs import pair_arithmetic, pair_name, pair_seed, parse_run_name, planned_runs, run_spec
from tests.conftest import REPO


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def test_each_record_states_the_files_its_rule_writes_from_its_wildcards():
    """rules/analysis.smk's outputs: {results}/analysis/{model}/{kind}/{task}/{run}.csv (theory a .json beside it),
    the pair analyses' {pair}.csv (interpolation a .json beside it)."""
    config = load("configs/ci.yaml")
    jobs = analysis_jobs(config, "results/ci")
    assert len(jobs) == len({(j.kind, j.model, j.task, j.run) for j in jobs})
    for job in jobs:
        w = dict(job.wildcards)
        stem = w["pair"] if job.kind in ("cosine", "interpolation") else w["run"]
        assert stem == job.run and (w["model"], w["task"]) == (job.model, job.task)
        csv = f"results/ci/analysis/{w['model']}/{job.kind}/{w['task']}/{stem}.csv"
        extra = (csv.replace(".csv", ".json"),) if job.kind in ("theory", "interpolation") else ()
        assert job.outputs == (csv, *extra) and job.rule == f"analysis_{job.kind}"


def test_the_records_cover_what_each_analysis_is_for():
    config = load("configs/ci.yaml")
    jobs = analysis_jobs(config, "results/ci")
    runs = planned_runs(config, "tiny")
    by_kind = {kind: {(j.task, j.run) for j in jobs if j.kind == kind} for kind in {j.kind for j in jobs}}
    assert by_kind["theory"] == {(t, r) for t, r in runs if run_spec(config, "tiny", t, r).method == "es"}
    assert by_kind["cosine"] == by_kind["interpolation"] == {(t, f"s{s}") for t in config["models"]["tiny"]["tasks"]
                                                            for s in pair_seeds(config)}
    assert {r for _, r in by_kind["sparsity"]} == {"es-n4-s0", "grpo-g4-s0"}  # the main runs
    assert by_kind["drift"] == by_kind["kl"] >= {("sum_yesno", "cl_es-s0-k2"), ("countdown3", "es-n4-s0")}
    # only what the config asks for
    config["analysis"]["analyses"] = ["drift"]
    assert {j.kind for j in analysis_jobs(config, "results/ci")} == {"drift"}


def test_the_runs_of_the_papers_arithmetic_get_sparsity_and_pair_analyses_of_their_own():
    """config.yaml trains each paper's arithmetic on the ablation task (es.ablations.arithmetic): each such run
    gets a sparsity job, and a cosine and an interpolation job with it as the ES end (arith_paper_a-s0) beside
    the main runs' pair of its seed."""
    config = load("config.yaml")
    jobs = analysis_jobs(config, "results")
    arith = [(t, r) for t, r in planned_runs(config, "tiny") if parse_run_name(r).arithmetic]
    assert arith and {parse_run_name(r).arithmetic for _, r in arith} == {"paper_a", "paper_b"}
    sparsity = {(j.task, j.run) for j in jobs if j.kind == "sparsity"}
    assert set(arith) <= sparsity
    for kind in ("cosine", "interpolation"):
        pairs = {(j.task, j.run) for j in jobs if j.kind == kind}
        expected = {(t, pair_name(parse_run_name(r).seed, parse_run_name(r).arithmetic)) for t, r in arith}
        assert expected <= pairs
        assert pairs - expected == {(t, f"s{s}") for t in config["models"]["tiny"]["tasks"] for s in pair_seeds(config)}
    for job in jobs:
        if job.kind == "cosine" and pair_arithmetic(job.run):
            assert dict(job.wildcards)["pair"] == job.run == f"arith_{pair_arithmetic(job.run)}-s{pair_seed(job.run)}"
