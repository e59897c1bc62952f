"""The paper configs: their settings are the papers' (docs/references.md), and `snakemake -n`
builds each paper's whole grid, with the number of jobs per rule computed here from the grid."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from esgrpo.config import check_config
from esgrpo.runs import RUN_PATTERN, eval_settings, planned_runs, run_spec
from tests.conftest import REPO, load_script, run_workflow

CONFIGS = {name: REPO / "configs" / f"{name}.yaml" for name in ("paper_a", "paper_b", "smollm2")}


def load(name: str) -> dict:
    return yaml.safe_load(CONFIGS[name].read_text())


# --------------------------------------------------------------------------- the grids, independently

PAPER_A_MODELS = {"qwen3_4b": "Qwen/Qwen3-4B-Instruct-2507", "llama3_2_3b": "meta-llama/Llama-3.2-3B-Instruct"}
PAPER_A_TASKS = ["countdown", "math", "chemistry", "boolq"]  # also the continual order
PAPER_B_EASY = {"qwen2_5_1_5b": "Qwen/Qwen2.5-1.5B-Instruct", "qwen2_5_3b": "Qwen/Qwen2.5-3B-Instruct",
                "qwen2_5_7b": "Qwen/Qwen2.5-7B-Instruct", "llama3_2_3b_gsm8k": "meta-llama/Llama-3.2-3B-Instruct"}
PAPER_B_HARD = {"r1_distill_1_5b": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"}
# The hard model trains on DeepScaleR (train split only) and is judged on MATH-500 (eval_tasks).
PAPER_B_HARD_TRAIN_TASKS = ["deepscaler"]
PAPER_B_HARD_EVAL_TASKS = ["math", "aime24", "amc23", "minerva", "olympiadbench"]  # MATH-500 and the other benchmarks


def expected_jobs(name: str) -> dict[str, int]:
    """Jobs per rule of `snakemake -n` (target `all`), from the papers' grids."""
    if name == "paper_a":
        single = len(PAPER_A_MODELS) * len(PAPER_A_TASKS) * 2            # ES N=30 and GRPO G=8, one seed
        # stages 2-4 x {ES, GRPO}, and ES stage 1 at the continual budget (100 it; GRPO's 1 = its main run)
        continual = len(PAPER_A_MODELS) * ((len(PAPER_A_TASKS) - 1) * 2 + 1)
        arithmetic = len(PAPER_A_MODELS)  # paper A's own arithmetic beside the main ES run on countdown (issue 31)
        runs = single + continual + arithmetic
        snapshots = len(PAPER_A_MODELS) * len(PAPER_A_TASKS)            # ES after 100 of its 300 iterations
        return {"prepare_task": 4, "eval_base": 2, "train_run": runs, "es_snapshot": snapshots,
                "eval_run": runs + snapshots, "table_base_passk": 1}
    if name == "paper_b":
        # ES N=32; N in {8,16,64}; rank, none; antithetic; paper B's own arithmetic (issue 31); GRPO
        easy = len(PAPER_B_EASY) * (1 + 3 + 2 + 1 + 1 + 1)
        hard = len(PAPER_B_HARD_TRAIN_TASKS) * 2 + 2    # ES and GRPO per task; ES->GRPO, GRPO->ES on DeepScaleR
        runs = easy + hard
        snapshots = len(PAPER_B_EASY) + len(PAPER_B_HARD_TRAIN_TASKS)  # each main ES run after one epoch (117 it)
        return {"prepare_task": 2 + len(PAPER_B_HARD_EVAL_TASKS), "eval_base": 5, "train_run": runs, "es_snapshot": snapshots,
                "eval_run": runs + snapshots, "pin_model": 1, "table_base_passk": 1}  # pinned: Qwen2.5-1.5B
    if name == "smollm2":
        # seeds 0, 1, 2 x {ES N=8 full-rank, ES N=8 rank 4, paper A's and paper B's arithmetic, GRPO G=4}
        runs = 3 * 5
        return {"convert_gguf_model": 1, "prepare_task": 1, "eval_base": 1, "train_run": runs, "eval_run": runs,
                # drift: the main ES and GRPO runs and both arithmetic runs per seed (tables/es_arithmetic);
                # norm theory: every ES run (full-rank, rank 4, arithmetic)
                "analysis_drift": 4 * 3, "analysis_theory": 4 * 3, "table_base_passk": 1}
    raise KeyError(name)


# --------------------------------------------------------------------------- settings


def test_paper_a_settings_are_the_papers():
    c = load("paper_a")
    assert {m: s["source"] for m, s in c["models"].items()} == PAPER_A_MODELS
    assert all(s["tasks"] == PAPER_A_TASKS for s in c["models"].values())
    assert all(c["tasks"][t]["train_size"] == 200 for t in PAPER_A_TASKS)
    es = c["es"]
    assert es["population_sizes"] == [30]
    s = es["settings"]
    assert (s["sigma"], s["alpha"]) == (1.5e-3, 7.5e-4)
    assert (s["fitness_temperature"], s["fitness_top_p"], s["max_new_tokens"]) == (1.0, 0.95, 1024)
    assert s["iterations"] == 300 and s["prompts_per_iteration"] == 200 and s["resample_prompts"] is False
    assert es["snapshots"] == [100]  # the paper's 100-iteration budget, from the same runs
    assert s["normalization"] == "zscore" and s["reward_scheme"] == "binary"
    g = c["grpo"]
    assert g["group_sizes"] == [8]
    gs = g["settings"]
    assert (gs["epsilon"], gs["beta"], gs["max_grad_norm"], gs["lr_scheduler_type"]) == (0.2, 0.0, 1.0, "linear")
    assert gs["prompts_per_step"] * gs["steps"] * 8 == pytest.approx(40_000, rel=0.01)  # ~40k completions
    assert (gs["temperature"], gs["top_p"], gs["max_new_tokens"]) == (1.0, 0.95, 1024)
    assert c["sequential"]["continual"] == PAPER_A_TASKS
    # per task: 100 ES iterations, 40,000 GRPO completions (configs/sequential/qwen_es.json, qwen_grpo.json)
    budget = c["sequential"]["continual_budget"]
    assert budget["es_iterations"] == 100
    assert gs["prompts_per_step"] * budget["grpo_steps"] * 8 == pytest.approx(40_000, rel=0.01)
    ev = c["eval"]
    assert ev["greedy"] and ev["max_new_tokens"] == 1024 and ev["backend"] == "vllm" and ev["test_size"] is None


def test_paper_b_settings_are_the_papers():
    c = load("paper_b")
    assert {m: s["source"] for m, s in c["models"].items()} == {**PAPER_B_EASY, **PAPER_B_HARD}
    assert all(c["models"][m]["tasks"] == ["gsm8k"] for m in PAPER_B_EASY)
    es = c["es"]
    s = es["settings"]
    assert es["population_sizes"] == [32]
    assert (s["sigma"], s["alpha"], s["prompts_per_iteration"]) == (1.5e-3, 2.5e-4, 64)
    assert s["iterations"] == 2 * -(-7473 // 64) == 234  # 2 epochs of GSM8K
    assert s["fitness_temperature"] == 0.0 and s["max_new_tokens"] == 2048 and s["reward_scheme"] == "boxed_partial"
    # its code's schedule (seed 42, epochs of a permutation) and checkpoints (steps 117 and 234)
    assert (s["prompt_schedule"], s["prompt_seed"], es["snapshots"]) == ("epochs", 42, [117])
    ab = es["ablations"]
    assert ab["task"] == "gsm8k" and sorted(ab["population_sizes"] + es["population_sizes"]) == [8, 16, 32, 64]
    assert sorted(ab["normalization"]) == ["none", "rank"] and ab["antithetic"] is True
    assert c["grpo"]["group_sizes"] == [8] and c["grpo"]["settings"]["reward_scheme"] == "boxed_partial"
    assert c["sequential"]["task"] == "deepscaler"
    hard = c["models"]["r1_distill_1_5b"]
    assert (hard["tasks"], hard["eval_tasks"]) == (PAPER_B_HARD_TRAIN_TASKS, PAPER_B_HARD_EVAL_TASKS)
    # the hard setting's own rollout length (models.<m>.es / grpo / eval; DeepScaleR's 8K stage): every run of
    # R1-Distill trains and is evaluated at 8,192 new tokens, the easy models at the grid's 2,048
    for model in c["models"]:
        tokens = 8192 if model in PAPER_B_HARD else 2048
        for task, run in planned_runs(c, model):
            assert run_spec(c, model, task, run).settings["max_new_tokens"] == tokens, (model, run)
        assert eval_settings(c, model)["max_new_tokens"] == tokens
    ev = c["eval"]
    assert (ev["n_samples"], ev["temperature"], ev["top_p"]) == (32, 0.6, 1.0)
    assert ev["ks"][-1] == 32 and ev["backend"] == "vllm" and ev["test_size"] is None


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_names_and_runs_fit_the_wildcards(name):
    """Model names without dots (wildcards), every planned run a valid run name whose settings validate."""
    import jsonschema

    c = load(name)
    schema = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
    jsonschema.validate(c, schema)
    check_config(c)
    for model in c["models"]:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", model), model
        for task, run in planned_runs(c, model):
            assert re.fullmatch(RUN_PATTERN, run), run
            run_spec(c, model, task, run)


# --------------------------------------------------------------------------- dry runs


def job_counts(workdir: Path, configfile: Path, targets: list[str]) -> tuple[dict[str, int], float]:
    """Jobs per rule of `snakemake -n` (its 'Job stats' table; scripts/job_counts.py) and the wall time it took."""
    started = time.perf_counter()
    counts = load_script("scripts/job_counts.py").dry_run_counts(configfile, targets, workdir)
    return counts, time.perf_counter() - started


def paper_rules() -> dict[str, list[str]]:
    """The table/figure rules of each paper (rules/paper.smk)."""
    from esgrpo.report.registry import STAGES, stage_names

    return {target: [f"{STAGES[n].kind}_{n}" for n in stage_names(paper)]
            for target, paper in (("paper_a", "Paper A"), ("paper_b", "Paper B"))}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["paper_a", "paper_b", "smollm2"])
def test_dry_run_builds_the_whole_grid(name, tmp_path):
    tables = paper_rules().get(name, [])
    targets = ["all"] + ([name] if tables else [])
    counts, seconds = job_counts(tmp_path / name, CONFIGS[name], targets)
    print(f"\n{name}: dry run {seconds:.1f} s, {sum(counts.values())} jobs: {counts}")
    for rule, count in expected_jobs(name).items():
        assert counts.get(rule, 0) == count, (rule, counts)
    for rule in ("build_default_model", "convert_gguf_model"):
        if rule not in expected_jobs(name):
            assert counts.get(rule, 0) == 0, (rule, counts)
    for rule in tables:  # every table and figure of the paper is reachable from its rule
        assert counts.get(rule) == 1, (rule, counts)


def dry_run_jobs(workdir: Path, configfile: Path, rule: str) -> list[dict[str, str]]:
    """The wildcards of every job of `rule` in `snakemake -n` (target `all`)."""
    out = subprocess.run([sys.executable, "-m", "snakemake", "all", "-n", "--snakefile", str(REPO / "Snakefile"),
                          "--directory", str(workdir), f"--configfile={configfile}"],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs = re.findall(r"^rule (\w+):\n(.*?)(?:\n\n|\Z)", out.stdout, re.M | re.S)
    return [dict(kv.split("=", 1) for kv in m[1].split(", "))
            for name, body in jobs if name == rule and (m := re.search(r"wildcards: (.*)", body))]


@pytest.mark.slow
def test_dry_run_trains_continual_es_stages_at_the_papers_budget(tmp_path):
    """`snakemake -n` of paper A: every continual ES stage, 1 to 4, is a train_run job whose settings
    (rules/inputs.smk run_settings = run_spec) run 100 iterations; the single-task ES runs keep 300."""
    c = load("paper_a")
    jobs = dry_run_jobs(tmp_path, CONFIGS["paper_a"], "train_run")
    iterations = {(j["model"], j["run"]): run_spec(c, j["model"], j["task"], j["run"]).settings.get("iterations")
                  for j in jobs}
    for model in PAPER_A_MODELS:
        assert [iterations[(model, f"cl_es-s0-k{k}")] for k in range(1, 5)] == [100] * 4
        assert iterations[(model, "es-n30-s0")] == 300
        assert (model, "cl_grpo-s0-k1") not in iterations  # GRPO's continual budget is its main run's


@pytest.mark.slow
def test_dry_run_through_the_api(tmp_path):
    """The same DAGs through the Snakemake API (what the workflow tests use); prints the time of each."""
    for name in ("paper_a", "paper_b"):
        started = time.perf_counter()
        run_workflow(tmp_path / name, CONFIGS[name], dryrun=True)
        print(f"\n{name}: API dry run {time.perf_counter() - started:.1f} s")


def test_paper_b_reference_check_compares_with_its_tolerance(tmp_path):
    """scripts/paper_b_reference_check.py: 988/1319 and 0.7027 pass, one question or 0.006 off mean@32 more
    than the 0.005 tolerance fails; a machine without the pinned model says so and exits 0."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location("paper_b_reference_check", REPO / "scripts" / "paper_b_reference_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert [ok for _, ok in check.verdicts(988, 1319, 0.7027)] == [True, True]
    assert [ok for _, ok in check.verdicts(988 - 7, 1319, 0.7027 + 0.006)] == [False, False]  # 7/1319 = 0.0053
    assert [ok for _, ok in check.verdicts(966, 1319, 0.7320, method="ES")] == [True, True]
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "paper_b_reference_check.py")], capture_output=True,
                         text=True, env={**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0 and "skipped" in out.stdout and "989aa7980e4c" in out.stdout
