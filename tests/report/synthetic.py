"""Synthetic inputs with known answers for the report's tests: a results/ tree of every tidy file the paper
stages read (make_results, from the success rates and curves set here), and a paper stage built from it
(build). tests/report/test_claims.py changes POP_REWARD and LOWRANK_SUCCESS here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from esgrpo.analysis.jobs import AnalysisJob
from esgrpo.config import judged_on, model_eval_tasks
from esgrpo.report import loading, planning, registry, stats
from esgrpo.report.arithmetic import arithmetic_of
from esgrpo.runs import es_name, pair_name, parse_run_name, planned_runs

TASKS = ["countdown3", "sum_yesno", "leg_count"]
CONFIG = {
    "models": {"tiny": {"source": "default", "tasks": TASKS}},
    "eval": {"n_samples": 8, "ks": [1, 2, 4, 8]},
    "es": {"population_sizes": [4], "seeds": [0, 1], "settings": {},
           "ablations": {"task": "countdown3", "population_sizes": [2, 8], "normalization": ["rank", "none"],
                         "antithetic": True, "ranks": [1, 4], "arithmetic": ["paper_a", "paper_b"]}},
    "grpo": {"group_sizes": [4], "seeds": [0, 1], "settings": {}},
    "sequential": {"task": "countdown3", "continual": ["countdown3", "sum_yesno"],
                   "continual_methods": ["es", "grpo"]},
}
N_PROMPTS, N = 40, 8
MODULES = {"model.embed_tokens.weight": "embedding", "model.layers.0.self_attn.q_proj.weight": "attention",
           "model.layers.0.mlp.up_proj.weight": "mlp", "model.layers.0.input_layernorm.weight": "norm"}
# final train reward per population (over the last window of the sweep's curves, stats.window_size: 3 of
# the 10 logged steps): N=4 is within 0.01 of N=8
POP_REWARD = {2: 0.60, 4: 0.695, 8: 0.70}
FINAL_WINDOW = 3
# low-rank ablation runs (kind es_rank) by noise rank: a success probability, or "main" for a copy of the
# full-rank main run's prompts of the same seed (no difference at all); a rank not listed: ES's 0.45
LOWRANK_SUCCESS: dict = {}
# metrics.jsonl's step agreement (esgrpo.distance.StepAgreement) by arithmetic; the papers' runs drift 3x further
ARITHMETIC_AGREEMENT = {"exact": {"step_cosine": 1.0, "changed_share": 1.0,
                                  "changed_share_by_module": {"mlp": 1.0, "norm": 1.0}},
                        "paper_a": {"step_cosine": 0.6, "changed_share": 0.4,
                                    "changed_share_by_module": {"mlp": 0.45, "norm": 0.05}},
                        "paper_b": {"step_cosine": 0.8, "changed_share": 0.7,
                                    "changed_share_by_module": {"mlp": 0.75, "norm": 0.1}}}
ARITHMETIC_DRIFT = 3.0
# the pair and sparsity analyses of the papers' runs: cosine with GRPO's update, the barrier on the path to GRPO,
# the gain kept at keep fraction 0.1 (main runs: 0.01 / -0.01, no barrier, 0.8)
ARITHMETIC_COSINE, ARITHMETIC_BARRIER, ARITHMETIC_SPARSITY = 0.4, 0.2, 0.3


def _success(kind: str, on_task: bool, i: int, grpo_sharp: bool) -> float:
    """Per-prompt success probability of a sample. Base: 0.3 everywhere. GRPO (grpo_sharp): sharpened,
    0.9 on 60% of the prompts and 0 on the rest (Pass@1 up, Pass@8 below base); else 0.6 everywhere."""
    if not on_task or kind == "base":
        return 0.3
    if kind in ("grpo", "cl_grpo", "es->grpo"):
        return (0.9 if i % 5 < 3 else 0.0) if grpo_sharp else 0.6
    if kind == "es_norm":
        return 0.2
    return 0.45


def _prompt_rows(model, run, train_task, kind, rng, grpo_sharp, config=CONFIG, success=None):
    """success: the on-task success probability instead of the kind's (_success)."""
    rows = []
    judged = judged_on(config, model, train_task) if kind != "base" else []
    continual = (config.get("sequential") or {}).get("continual") or []
    for eval_task in model_eval_tasks(config, model):  # the default CONFIG: TASKS
        on = eval_task in judged or (kind.startswith("cl_") and eval_task in continual)
        for i in range(N_PROMPTS):
            p = success if (success is not None and on) else _success(kind, on, i, grpo_sharp)
            correct = int(rng.binomial(N, p))
            # ES greedy is right on every prompt of its own task: a constant column (zero-width CI)
            greedy = True if (kind == "es" and eval_task == train_task) else bool(rng.random() < p)
            tokens = 80
            entropy = 1.0 if kind in ("base", "es") else 0.4
            rows.append({"model": model, "run": run, "train_task": train_task, "eval_task": eval_task,
                         "id": f"{eval_task}-{i}", "n": N, "correct": correct, "greedy_correct": greedy,
                         "tokens": tokens, "entropy_sum": entropy * tokens, "boxed": N})
    return rows


def _metrics_rows(run, kind, rng):
    rows = []
    T = 10
    pop = loading.run_labels(run)["population"]
    for t in range(1, T + 1):
        if kind in ("grpo", "cl_grpo", "es->grpo"):
            rows.append({"method": "grpo", "iteration": t, "fitness_mean": 0.3 + 0.04 * t, "fitness_std": 0.1,
                         "entropy": 1.0 - 0.08 * (t - 1), "rollouts": 50 * t, "generated_tokens": 800 * t,
                         "seconds": t, "distance_from_init": 0.01 * t, "update_norm": 0.01})
        else:
            n = pop if not math.isnan(pop) else 4
            final = t > T - FINAL_WINDOW
            fitness = POP_REWARD.get(int(n), 0.7) if (kind in ("es", "es_pop") and final) else 0.3 + 0.03 * t
            if kind == "es_norm" and final:
                fitness = 0.4
            rows.append({"method": "es", "iteration": t, "updates": t, "fitness_mean": fitness, "fitness_std": 0.1,
                         "fitness_max": fitness + 0.1, "fitness_min": fitness - 0.1, "update_norm": 0.1,
                         "distance_from_init": 0.1 * math.sqrt(t), "rollouts": int(n) * 16 * t,
                         "generated_tokens": int(n) * 16 * 20 * t, "seconds": t,
                         "entropy": 1.0 + 0.01 * rng.standard_normal(), "js_diversity": 0.02 + 0.01 * rng.random(),
                         "skipped": False, **ARITHMETIC_AGREEMENT.get(arithmetic_of(run), {})})
    return rows


def make_results(root: Path, grpo_sharp: bool = True, config: dict = CONFIG, seed: int = 0) -> list[AnalysisJob]:
    """A synthetic results/ tree of every tidy file the paper stages read; returns the analysis jobs' records."""
    rng = np.random.default_rng(seed)
    res = root / "results"
    setup = planning.paper_setup(config)
    analysis = []

    def jsonl(path: Path, rows):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def csv(model: str, kind: str, task: str, run: str, rows):
        path = res / "analysis" / model / kind / task / f"{run}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(path, index=False)
        analysis.append(AnalysisJob(kind, model, task, run, (str(path),)))

    written = {}
    for model in config["models"]:
        jsonl(res / model / "base" / "eval_prompts.jsonl", _prompt_rows(model, "base", "none", "base", rng, grpo_sharp, config))
        for task, run in planned_runs(config, model):
            kind = planning.run_kind(run, setup["main_n"], setup["main_g"], setup["main_rank"])
            d = res / model / task / run
            rows = _prompt_rows(model, run, task, kind, rng, grpo_sharp, config)
            low = LOWRANK_SUCCESS.get(loading.run_labels(run)["noise_rank"]) if kind == "es_rank" else None
            if low == "main":  # main runs come first in planned_runs
                main = es_name(setup["main_n"], loading.seed_of(run))
                rows = [{**r, "run": run} for r in written[(model, task, main)]]
            elif low is not None:
                rows = _prompt_rows(model, run, task, "es_lowrank", rng, grpo_sharp, config, success=low)
            written[(model, task, run)] = rows
            jsonl(d / "eval_prompts.jsonl", rows)
            jsonl(d / "metrics.jsonl", _metrics_rows(run, kind, rng))
            scale = 0.05 if "grpo" in kind.split("->")[-1] else ARITHMETIC_DRIFT if kind == "es_arith" else 1.0
            stage = loading.run_labels(run)["stage"]
            scale *= math.sqrt(stage) if not math.isnan(stage) else 1.0
            csv(model, "drift", task, run,
                [{"model": model, "task": task, "run": run, "method": "es", "name": name, "module_type": mt,
                  "layer": 0, "numel": 100, "l2": scale * (2.0 if mt == "norm" else 1.0), "base_l2": 10.0,
                  "init_l2": scale} for name, mt in MODULES.items()])
            if kind in registry.ES_KINDS | {"cl_es", "es_arith"}:  # every run trained by ES (rules/inputs.smk)
                sq = 0.0102 * (ARITHMETIC_DRIFT if kind == "es_arith" else 1.0) ** 2
                csv(model, "theory", task, run,
                    [{"iteration": t, "updates": t, "distance": math.sqrt(sq * t), "sq_distance": sq * t,
                      "theory_sq": 0.01 * t} for t in range(1, 11)])
            if kind in ("es", "grpo", "es_arith"):
                gain = 0.3 if kind == "grpo" else 0.15
                kept = ARITHMETIC_SPARSITY if kind == "es_arith" else 0.8  # the gain kept at keep fraction 0.1
                csv(model, "sparsity", task, run,
                    [{"kind": "top_fraction", "keep_fraction": kf, "module_type": "", "n_kept": int(1000 * kf),
                      "n_changed": 1000, "greedy": 0.3 + gain * r, "mean@n": 0.3 + gain * r, "pass@1": 0.3 + gain * r}
                     for kf, r in ((1.0, 1.0), (0.5, 1.0), (0.1, kept), (0.01, 0.2), (0.0, 0.0))]
                    + [{"kind": "reset_module", "keep_fraction": float("nan"), "module_type": mt, "n_kept": 750,
                        "n_changed": 1000, "greedy": 0.4, "mean@n": 0.4, "pass@1": 0.4} for mt in MODULES.values()])
            if kind in ("es", "grpo", "cl_es", "cl_grpo"):  # KL: main runs and continual stages
                stage_scale = 1.0 if kind in ("es", "grpo") else 2.0 * stage  # later stages drift further
                csv(model, "kl", task, run,
                    [{"eval_task": t, "token_mean": (0.05 if t == task else 0.03) * ("grpo" not in kind or 0.1)
                      * stage_scale, "prompt_mean": 0.0, "sequence_mean": 0.0, "n_tokens": 100} for t in TASKS])
        pairs = [(task, s, None) for task in config["models"][model]["tasks"] for s in config["es"]["seeds"]]
        pairs += [(task, parse_run_name(run).seed, parse_run_name(run).arithmetic)
                  for task, run in planned_runs(config, model) if parse_run_name(run).arithmetic]
        for task, s, arithmetic in pairs:
            name = pair_name(s, arithmetic)
            if arithmetic is None:
                csv(model, "cosine", task, name,
                    [{"scope": "global", "key": "all", "cosine": 0.01 * (1 if s else -1), "pair": "es-grpo"},
                     {"scope": "layer", "key": "0", "cosine": 0.02, "pair": "es-grpo"},
                     {"scope": "global", "key": "all", "cosine": 0.3, "pair": "es-es"}])
            else:  # the in-place runs' updates lean towards GRPO's
                csv(model, "cosine", task, name,
                    [{"scope": "global", "key": "all", "cosine": ARITHMETIC_COSINE, "pair": "es-grpo"},
                     {"scope": "layer", "key": "0", "cosine": 0.02, "pair": "es-grpo"}])
            rows = []
            for eval_task in TASKS:
                for lam in (0.0, 0.25, 0.5, 0.75, 1.0):
                    # linear between the end points: no barrier; from an in-place run, a dip of ARITHMETIC_BARRIER
                    acc = 0.6 + 0.1 * lam - (ARITHMETIC_BARRIER * (0 < lam < 1) if arithmetic else 0.0)
                    rows.append({"path": "es-grpo", "lam": lam, "step": lam, "eval_task": eval_task,
                                 "greedy": acc, "mean@n": acc, "pass@1": acc})
                    rows.append({"path": "dir-random", "lam": lam, "step": lam, "eval_task": eval_task,
                                 "greedy": 0.3, "mean@n": 0.3, "pass@1": 0.3})
            csv(model, "interpolation", task, name, rows)
    return analysis


def _outputs(tmp: Path, name: str, figure: bool = False) -> dict:
    if figure:
        return {"png": str(tmp / "figures" / f"{name}.png"), "pdf": str(tmp / "figures" / f"{name}.pdf")}
    return {ext: str(tmp / "tables" / f"{name}.{ext}") for ext in ("csv", "md", "tex", "html")}


def build(root: Path, name: str, analysis: list, config: dict = CONFIG, figure: bool = False) -> dict:
    """Stage `name` as its rule runs it: the planned inputs, and their jobs as params."""
    inputs = planning.paper_inputs(config, name, analysis, results=str(root / "results"))
    output = _outputs(root / "out", name, figure)
    params = {"stage": name, "setup": planning.paper_setup(config),
              "jobs": planning.paper_input_jobs(config, name, analysis, results=str(root / "results"))}
    loading.run_paper_stage(input=inputs, output=output, params=params, wildcards={}, threads=1)
    return output


def stage_inputs(root: Path, name: str, analysis: list, config: dict = CONFIG) -> loading.StageInputs:
    """The input frames stage `name` reads, from the planned inputs and their jobs."""
    results = str(root / "results")
    return loading.StageInputs(planning.paper_inputs(config, name, analysis, results=results),
                               {**planning.paper_setup(config), "wanted": planning.NEEDS[name]},
                               planning.paper_input_jobs(config, name, analysis, results=results))


@pytest.fixture(autouse=True)
def fewer_bootstrap_replicates(monkeypatch):
    """200 replicates instead of 2000: the tests check bounds and verdicts, not the third decimal."""
    monkeypatch.setattr(stats, "N_BOOT", 200)
