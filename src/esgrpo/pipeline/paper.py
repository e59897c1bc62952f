"""Stages: every table and figure of papers A and B, and the claims table.

All of them read tidy files only: per-prompt evaluations (``eval_prompts.jsonl``), training
curves (``metrics.jsonl``) and the model analyses under ``results/analysis/{model}/``.

Statistics, everywhere the same:

- a cell is a mean with a 95% percentile-bootstrap CI. Test metrics resample training seeds
  and, within each, prompts (``bootstrap_ci_grouped(groups=("seed", "prompt"))``); the seed is
  the ``-s{seed}`` of the run name (the base model is one unit). Training-curve values resample
  seeds and logged iterations; analysis values (norms, cosines, KL) resample runs. A single unit
  (one seed, one run) has no interval: its bounds are NaN (shown without brackets), and a claim
  resting on it is "inconclusive";
- a difference between two checkpoints is paired: per (seed, prompt) when both have the seed,
  per prompt against the base model;
- tables are written as CSV (numbers: ``value``, ``value_lo``, ``value_hi``) and as Markdown
  and LaTeX (the same numbers shown as ``mean [lo, hi]``).

Budgets (ES-vs-GRPO comparisons carry a ``budget`` column):

- ``iterations``: final checkpoints, i.e. the ES iterations and GRPO steps as configured;
- ``rollouts`` / ``generated_tokens``: a training-curve value (train reward, entropy) of each
  method at the last logged step whose cumulative rollouts (generated tokens) are at most the
  smaller of the two methods' totals; ``matched_at`` says at how many. Test metrics exist for
  final checkpoints only, so these rows report the curve from ``metrics.jsonl``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from esgrpo.analysis.claims import claims_table
from esgrpo.claims_catalog import CLAIMS
from esgrpo.config import judged_on
from esgrpo.io import atomic_write_text, read_jsonl
from esgrpo.metrics import barrier_height, bootstrap_ci, bootstrap_ci_grouped, pass_at_k
from esgrpo.report import markdown_table, plt, save_figure
from esgrpo.runs import CL_RE, ES_RE, GRPO_RE, SEQ_RE, SNAPSHOT_RE, continual_stage_one, planned_runs

N_BOOT = 2000
TAIL = 0.1  # "first" / "final" value of a training curve: mean over the first / last 10% of steps
BUDGETS = ("rollouts", "generated_tokens")
ANALYSES = ("drift", "theory", "cosine", "sparsity", "kl", "interpolation")
SEED_RE = re.compile(r"-s(\d+)(?=$|-k\d+$)")
METHOD = {"base": "base", "es": "ES", "grpo": "GRPO", "es->grpo": "ES->GRPO", "grpo->es": "GRPO->ES",
          "cl_es": "ES", "cl_grpo": "GRPO", "es_pop": "ES", "es_norm": "ES", "es_anti": "ES",
          "grpo_group": "GRPO"}
METHOD_ORDER = ["base", "ES", "GRPO", "ES->GRPO", "GRPO->ES"]
ES_KINDS = {"es", "es_pop", "es_norm", "es_anti"}

# --------------------------------------------------------------------------- runs and config


def seed_of(run: str) -> int:
    """The training seed of a run name (``-s{seed}``); -1 for the base model."""
    m = SEED_RE.search(run)
    return int(m[1]) if m else -1


def variant_of(run: str) -> str:
    """The run name without its seed: what seeds are averaged over (``es-n16``, ``cl_es-k2``)."""
    return SEED_RE.sub("", run)


def run_kind(run: str, main_n: int | None, main_g: int | None) -> str:
    """base | es | es_pop | es_norm | es_anti | es_snap | grpo | grpo_group | es->grpo | grpo->es | cl_es | cl_grpo."""
    if run == "base":
        return "base"
    if SNAPSHOT_RE.fullmatch(run):
        return "es_snap"
    if m := ES_RE.fullmatch(run):
        if (m["norm"] or "zscore") != "zscore":
            return "es_norm"
        if m["anti"]:
            return "es_anti"
        return "es" if int(m["n"]) == main_n else "es_pop"
    if m := GRPO_RE.fullmatch(run):
        return "grpo" if int(m["g"]) == main_g else "grpo_group"
    if m := SEQ_RE.fullmatch(run):
        return f"{m['first']}->{m['second']}"
    if m := CL_RE.fullmatch(run):
        return f"cl_{m['method']}"
    raise ValueError(f"not a run name: {run!r}")


def method_of(run: str, kind: str) -> str:
    """The method column: METHOD of the kind; a snapshot says its budget (``ES (100 it)``)."""
    if kind == "es_snap":
        return f"ES ({SNAPSHOT_RE.fullmatch(run)['it']} it)"
    return METHOD[kind]


def _methods(runs: pd.Series, kinds: pd.Series) -> list[str]:
    return [method_of(r, k) for r, k in zip(runs, kinds, strict=True)]


def run_labels(run: str) -> dict:
    """population / normalization / antithetic / stage of a run name (NaN where it does not apply)."""
    out = {"population": np.nan, "normalization": None, "antithetic": None, "stage": np.nan}
    if m := ES_RE.fullmatch(run):
        out.update(population=int(m["n"]), normalization=m["norm"] or "zscore", antithetic=bool(m["anti"]))
    elif m := SNAPSHOT_RE.fullmatch(run):
        out.update(population=int(m["n"]), normalization="zscore", antithetic=False)
    elif m := CL_RE.fullmatch(run):
        out["stage"] = int(m["stage"])
    return out


def paper_setup(config: dict) -> dict:
    """What the paper stages need to know of the config (passed to every rule as a param)."""
    es, grpo = config.get("es"), config.get("grpo")
    seq = config.get("sequential") or {}
    models, ks, n_samples, judged = {}, {}, {}, {}
    for model, spec in config["models"].items():
        ev = {**config.get("eval", {}), **spec.get("eval", {})}
        n = int(ev.get("n_samples", 32))
        models[model] = list(spec["tasks"])
        judged[model] = {task: judged_on(config, model, task) for task in spec["tasks"]}
        ks[model] = sorted({int(k) for k in ev.get("ks", [1, 2, 4, 8, 16, 32]) if k <= n} | {1})
        n_samples[model] = n
    continual = list(seq.get("continual") or [])
    methods = [m for m in seq.get("continual_methods", ["es", "grpo"]) if config.get(m)] if continual else []
    stage_one = [dict(zip(("task", "run", "alias"), continual_stage_one(config, m, s), strict=True))
                 for m in methods for s in config[m].get("seeds", [0])]
    return {
        "models": models,
        "judged_on": judged,
        "ks": ks,
        "n_samples": n_samples,
        "has_es": bool(es),
        "has_grpo": bool(grpo),
        "main_n": int(es["population_sizes"][0]) if es else None,
        "main_g": int(grpo["group_sizes"][0]) if grpo else None,
        "sequential_task": seq.get("task") if (es and grpo) else None,
        "continual": continual,
        "continual_methods": methods,
        "continual_stage_one": stage_one,
        "ablation_task": ((es or {}).get("ablations") or {}).get("task"),
    }


# What each table / figure reads: input key -> run kinds ("base" = the base evaluation), and
# where the runs must lie ("ablation" / "sequential": that task only).
_TEST_ES_GRPO = {"base", "es", "grpo"}
_ALL_SINGLE = {"base", "es", "grpo", "es->grpo", "grpo->es"}
_CONTINUAL = {"base", "cl_es", "cl_grpo"}
NEEDS: dict[str, dict] = {
    "a_accuracy": {"prompts": _TEST_ES_GRPO | {"es_snap"}, "metrics": {"es", "grpo"}},
    "a_sequential": {"prompts": _CONTINUAL},
    "a_update_norms": {"drift": {"cl_es", "cl_grpo", "es", "grpo"}},
    "a_heldout": {"prompts": _CONTINUAL},
    "a_geometry": {"cosine": "all", "interpolation": "all", "kl": {"es", "grpo"}},
    "b_passk": {"prompts": _ALL_SINGLE, "metrics": {"es", "grpo"}},
    "b_easy_setting": {"prompts": _TEST_ES_GRPO},
    "b_sequential": {"prompts": _ALL_SINGLE, "where": "sequential"},
    "b_drift": {"drift": {"es", "grpo"}},
    "b_sparsity": {"sparsity": "all", "prompts": {"base"}},
    "b_ablations": {"prompts": {"es", "es_norm", "es_anti"}, "metrics": {"es", "es_norm", "es_anti"},
                    "where": "ablation"},
    "b_population": {"prompts": {"es", "es_pop"}, "metrics": {"es", "es_pop"}, "where": "ablation"},
    "b_entropy": {"prompts": _TEST_ES_GRPO, "metrics": {"es", "grpo"}},
    "passk_curves": {"prompts": _ALL_SINGLE},
    "entropy_curves": {"metrics": {"es", "grpo"}},
    "fitness_curves": {"metrics": {"es", "grpo"}},
    "population_curves": {"metrics": {"es", "es_pop"}, "where": "ablation"},
    "js_diversity_vs_passk_gain": {"prompts": ES_KINDS | {"base"}, "metrics": ES_KINDS},
    "es_norm_theory": {"theory": "all"},
    "drift_by_module": {"drift": {"es", "grpo"}},
    "sparsity_curves": {"sparsity": "all", "prompts": {"base"}},
    "interpolation": {"interpolation": "all"},
    "kl_heatmap": {"kl": {"es", "grpo"}},
    "sequential_matrix": {"prompts": _CONTINUAL},
}
PAPER_A_TABLES = ["a_accuracy", "a_sequential", "a_update_norms", "a_heldout", "a_geometry"]
PAPER_B_TABLES = ["b_passk", "b_easy_setting", "b_sequential", "b_drift", "b_sparsity", "b_ablations",
                  "b_population", "b_entropy"]
PAPER_A_FIGURES = ["sequential_matrix", "es_norm_theory", "interpolation", "kl_heatmap", "fitness_curves"]
PAPER_B_FIGURES = ["passk_curves", "entropy_curves", "population_curves", "js_diversity_vs_passk_gain",
                   "drift_by_module", "sparsity_curves"]


def _merge_needs(names: Iterable[str]) -> dict:
    out: dict = {}
    for name in names:
        for key, kinds in NEEDS[name].items():
            if key == "where":
                continue
            if kinds == "all" or out.get(key) == "all":
                out[key] = "all"
            else:
                out[key] = set(out.get(key, set())) | set(kinds)
    return out


NEEDS["claims"] = _merge_needs(PAPER_A_TABLES + PAPER_B_TABLES + ["js_diversity_vs_passk_gain", "es_norm_theory"])


def parse_analysis_path(path: str) -> dict | None:
    """``.../analysis/{model}/{analysis}/{task}/{run or s<seed>}.csv`` -> its parts (None if not one)."""
    parts = Path(path).parts
    if len(parts) < 5 or parts[-5] != "analysis" or parts[-3] not in ANALYSES or not path.endswith(".csv"):
        return None
    return {"model": parts[-4], "analysis": parts[-3], "task": parts[-2], "stem": Path(path).stem}


def stage_one_aliases(setup: dict) -> dict[tuple[str, str], str]:
    """(task, main run) -> the continual name it also stands for (stage 1: ``cl_es-s0-k1``)."""
    return {(a["task"], a["run"]): a["alias"] for a in setup.get("continual_stage_one", [])}


def _wanted(setup: dict, key: str) -> set[str] | None:
    """The run kinds the running stage reads for input `key` (NEEDS; None = every kind)."""
    kinds = (setup.get("wanted") or {}).get(key)
    return None if kinds is None or kinds == "all" else set(kinds)


def _with_stage_one(frame: pd.DataFrame, task_column: str, setup: dict, key: str) -> pd.DataFrame:
    """`frame` plus a copy of every stage-1 main run's rows under its continual name, then only the
    kinds the stage reads: a continual table sees stage 1, an ES table does not see it twice."""
    wanted = _wanted(setup, key)
    aliases = stage_one_aliases(setup)
    if frame.empty or not aliases:
        return frame
    keys = list(zip(frame[task_column], frame["run"], strict=True))
    alias = pd.Series([aliases.get(k) for k in keys], index=frame.index)
    copies = frame[alias.notna()].assign(run=alias[alias.notna()])
    out = pd.concat([frame, copies], ignore_index=True)
    if wanted is not None:
        kinds = out["run"].map(lambda r: run_kind(r, setup["main_n"], setup["main_g"]))
        out = out[kinds.isin(wanted) | (out["run"] == "base")].reset_index(drop=True)
    return out


def _run_kinds(task: str, run: str, setup: dict) -> set[str]:
    """The kinds a (task, run) file serves: its own, plus cl_* when it is stage 1 of a sequence."""
    kinds = {run_kind(run, setup["main_n"], setup["main_g"])}
    alias = stage_one_aliases(setup).get((task, run))
    return kinds | {run_kind(alias, setup["main_n"], setup["main_g"])} if alias else kinds


# Per-run analyses computed for every planned run: a stage-1 main run's file also stands for its
# continual alias. (Sparsity and KL are computed for main runs only and are not aliased.)
ALIASED_ANALYSES = ("drift", "theory")


def paper_inputs(config: dict, name: str, analysis_paths: Sequence[str] = (), results: str = "results") -> dict:
    """Input files of table / figure `name`: only what the config trains (via planned_runs)."""
    setup = paper_setup(config)
    needs = NEEDS[name]
    where = {"sequential": setup["sequential_task"], "ablation": setup["ablation_task"]}.get(needs.get("where"))
    files: dict[str, list[str]] = {}
    for key, filename in (("prompts", "eval_prompts.jsonl"), ("metrics", "metrics.jsonl")):
        kinds = needs.get(key)
        if not kinds:
            continue
        paths = []
        for model in setup["models"]:
            if "base" in kinds and key == "prompts":
                paths.append(f"{results}/{model}/base/{filename}")
            for task, run in planned_runs(config, model):
                if where is not None and task != where:
                    continue
                if _run_kinds(task, run, setup) & set(kinds):
                    paths.append(f"{results}/{model}/{task}/{run}/{filename}")
        files[key] = paths
    for analysis in ANALYSES:
        kinds = needs.get(analysis)
        if not kinds:
            continue
        chosen = []
        for path in analysis_paths:
            parts = parse_analysis_path(str(path))
            if parts is None or parts["analysis"] != analysis or parts["model"] not in setup["models"]:
                continue
            if kinds != "all" and not _run_kinds(parts["task"], parts["stem"], setup) & set(kinds):
                continue
            chosen.append(str(path))
        files[analysis] = sorted(set(chosen))
    return files


# --------------------------------------------------------------------------- loading


@functools.lru_cache(maxsize=65536)
def _pass_at_k(n: int, c: int, k: int) -> float:
    return pass_at_k(n, c, k) if k <= n else math.nan


def judged_tasks(setup: dict, model: str, train_task: str) -> list[str]:
    """The evaluation tasks that measure training on `train_task` (esgrpo.config.judged_on)."""
    return setup.get("judged_on", {}).get(model, {}).get(train_task, [train_task])


def load_prompts(paths: Iterable[str], setup: dict) -> pd.DataFrame:
    """Per-prompt evaluation rows with seed, kind, method, variant, prompt key, ``on_task`` (the
    evaluation measures the run's own training, e.g. DeepScaleR -> MATH-500) and per-prompt metrics
    (greedy, mean@n, pass@k for every configured k, entropy per token)."""
    rows = [r for p in paths for r in read_jsonl(p)]
    columns = ["model", "run", "train_task", "eval_task", "id", "n", "correct", "greedy", "mean@n",
               "entropy", "seed", "kind", "method", "variant", "prompt", "on_task"]
    if not rows:
        return pd.DataFrame(columns=columns)
    df = _with_stage_one(pd.DataFrame(rows), "train_task", setup, "prompts")
    df["seed"] = df["run"].map(seed_of)
    df["kind"] = df["run"].map(lambda r: run_kind(r, setup["main_n"], setup["main_g"]))
    df["method"] = _methods(df["run"], df["kind"])
    df["variant"] = df["run"].map(variant_of)
    df["prompt"] = df["model"] + "|" + df["eval_task"] + "|" + df["id"].astype(str)
    df["on_task"] = [e in judged_tasks(setup, m, t) for m, t, e in zip(df["model"], df["train_task"], df["eval_task"],
                                                                     strict=True)]
    df["greedy"] = df["greedy_correct"].astype(float) if "greedy_correct" in df else np.nan
    df["mean@n"] = df["correct"] / df["n"]
    df["entropy"] = df["entropy_sum"] / df["tokens"].clip(lower=1) if "entropy_sum" in df else np.nan
    ks = sorted({k for m in setup["ks"].values() for k in m})
    for k in ks:
        df[f"pass@{k}"] = [_pass_at_k(int(n), int(c), k) for n, c in zip(df["n"], df["correct"], strict=True)]
    return df


def _run_from_path(path: str) -> tuple[str, str, str]:
    parts = Path(path).parts
    return parts[-4], parts[-3], parts[-2]


def load_metrics(paths: Iterable[str], setup: dict) -> pd.DataFrame:
    """Training curves: metrics.jsonl rows with model, task, run (from the path), seed, kind, variant."""
    frames = []
    for path in paths:
        rows = read_jsonl(path)
        if not rows:
            continue
        model, task, run = _run_from_path(path)
        frames.append(pd.DataFrame(rows).assign(model=model, task=task, run=run))
    if not frames:
        return pd.DataFrame(columns=["model", "task", "run", "iteration", "fitness_mean", "rollouts",
                                     "generated_tokens", "entropy", "seed", "kind", "method", "variant"])
    df = _with_stage_one(pd.concat(frames, ignore_index=True), "task", setup, "metrics")
    df["seed"] = df["run"].map(seed_of)
    df["kind"] = df["run"].map(lambda r: run_kind(r, setup["main_n"], setup["main_g"]))
    df["method"] = _methods(df["run"], df["kind"])
    df["variant"] = df["run"].map(variant_of)
    for column in ("entropy", "js_diversity", "generated_tokens", "rollouts"):
        if column not in df:
            df[column] = np.nan
    return df.sort_values(["model", "task", "run", "iteration"]).reset_index(drop=True)


def load_analysis(paths: Iterable[str], setup: dict) -> pd.DataFrame:
    """Analysis CSVs with model / task and run (or seed) taken from their paths."""
    frames = []
    for path in paths:
        parts = parse_analysis_path(str(path))
        frame = pd.read_csv(path)
        if parts is None or frame.empty:
            continue
        frame = frame.assign(model=parts["model"], task=parts["task"])
        stem = parts["stem"]
        if re.fullmatch(r"s\d+", stem):
            frame = frame.assign(seed=int(stem[1:]), run=stem)
        else:
            frame = frame.assign(run=stem)
            if parts["analysis"] in ALIASED_ANALYSES:
                frame = _with_stage_one(frame, "task", setup, parts["analysis"])
            kinds = frame["run"].map(lambda r: run_kind(r, setup["main_n"], setup["main_g"]))
            frame = frame.assign(seed=frame["run"].map(seed_of), run_kind=kinds, method=_methods(frame["run"], kinds),
                                 variant=frame["run"].map(variant_of))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


class Data:
    """Lazily loaded inputs of one stage."""

    def __init__(self, input: dict, setup: dict):
        self.input, self.setup = input, setup

    def _list(self, key: str) -> list[str]:
        value = self.input.get(key, [])
        return [value] if isinstance(value, str) else list(value)

    @functools.cached_property
    def prompts(self) -> pd.DataFrame:
        return load_prompts(self._list("prompts"), self.setup)

    @functools.cached_property
    def metrics(self) -> pd.DataFrame:
        return load_metrics(self._list("metrics"), self.setup)

    def analysis(self, name: str) -> pd.DataFrame:
        if name not in self.__dict__:
            self.__dict__[name] = load_analysis(self._list(name), self.setup)
        return self.__dict__[name]

    def on_task(self, kinds: Iterable[str]) -> pd.DataFrame:
        """Prompts of runs of `kinds` evaluated on their own training task; base rows on every task,
        with ``task`` = the task the row speaks for."""
        p = self.prompts
        if p.empty:
            return p.assign(task=pd.Series(dtype=str))
        kinds = set(kinds)
        own = p[p["kind"].isin(kinds - {"base"}) & p["on_task"]]
        base = p[p["kind"].eq("base")] if "base" in kinds else p.iloc[0:0]
        return pd.concat([own, base]).assign(task=lambda d: d["eval_task"])


# --------------------------------------------------------------------------- statistics


def _grouped(df: pd.DataFrame, value: str, groups: tuple[str, str]) -> tuple[float, float, float]:
    """bootstrap_ci_grouped over `groups`; one unit only (a single cell) has no CI: (mean, NaN, NaN)."""
    d = df[[*groups, value]].dropna()
    if d.empty:
        return (math.nan,) * 3
    if len(d.drop_duplicates(list(groups))) < 2:
        return float(d[value].mean()), math.nan, math.nan
    return bootstrap_ci_grouped(d, value, groups=groups, n_boot=N_BOOT)


def ci_prompts(df: pd.DataFrame, value: str) -> tuple[float, float, float]:
    """Mean and 95% CI, resampling seeds then prompts within each seed."""
    return _grouped(df, value, ("seed", "prompt"))


def ci_values(values: Iterable[float]) -> tuple[float, float, float]:
    """Mean and 95% CI of independent units (runs, seeds); a single unit has no CI (NaN bounds)."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if x.size == 0:
        return (math.nan,) * 3
    if x.size == 1:
        return float(x[0]), math.nan, math.nan
    return bootstrap_ci(x, n_boot=N_BOOT)


def ci_curve(df: pd.DataFrame, value: str) -> tuple[float, float, float]:
    """Mean and 95% CI of training-curve values, resampling seeds then logged iterations."""
    return _grouped(df, value, ("seed", "iteration"))


def paired(a: pd.DataFrame, b: pd.DataFrame, value: str, unit: str = "prompt") -> pd.DataFrame:
    """Rows of ``a - b`` on `value`, matched on (seed, unit) when b has a's seeds, else on unit
    alone with b averaged over its seeds (e.g. against the base model). Column ``diff``."""
    if a.empty or b.empty:
        return pd.DataFrame(columns=["seed", unit, "diff"])
    a = a.groupby(["seed", unit], as_index=False)[value].mean()
    b = b.groupby(["seed", unit], as_index=False)[value].mean()
    if set(a["seed"]) & set(b["seed"]) and not (b["seed"] < 0).all():
        m = a.merge(b, on=["seed", unit], suffixes=("_a", "_b"))
    else:
        m = a.merge(b.groupby(unit, as_index=False)[value].mean(), on=unit, suffixes=("_a", "_b"))
    return m.assign(diff=m[f"{value}_a"] - m[f"{value}_b"])[["seed", unit, "diff"]]


def paired_ci(a: pd.DataFrame, b: pd.DataFrame, value: str, unit: str = "prompt") -> tuple[float, float, float]:
    return _grouped(paired(a, b, value, unit), "diff", ("seed", unit))


def stat(keys: dict, triple: tuple[float, float, float], **extra) -> dict:
    m, lo, hi = triple
    return {**keys, **extra, "value": m, "value_lo": lo, "value_hi": hi}


def passk_display_ks(ks: Sequence[int]) -> list[int]:
    """Pass@1 and the two largest ks (16 and 32 when n = 32, as in paper B)."""
    big = sorted(k for k in ks if k > 1)[-2:]
    return [1, *big]


def _ks(setup: dict) -> list[int]:
    """ks every model has (the smallest set, so pooled claims compare like with like)."""
    sets = [set(v) for v in setup["ks"].values()] or [{1}]
    return sorted(set.intersection(*sets))


def tail(df: pd.DataFrame, first: bool = False, frac: float = TAIL) -> pd.DataFrame:
    """The last (first) ``max(1, ceil(frac * T))`` logged iterations of every run."""
    out = []
    for _, g in df.groupby("run", sort=False):
        g = g.sort_values("iteration")
        n = max(1, math.ceil(frac * len(g)))
        out.append(g.head(n) if first else g.tail(n))
    return pd.concat(out) if out else df.iloc[0:0]


def matched_rows(metrics: pd.DataFrame, variants: Sequence[str], column: str = "rollouts") -> pd.DataFrame:
    """Rows of a budget-matched comparison of `variants` (run names without seed).

    Per (model, task) where at least two of the variants ran: the budget is the smallest final
    cumulative `column` over their runs; each run contributes its last logged step with `column`
    at most that budget (a run whose first step already exceeds it contributes nothing). Adds
    ``matched_at`` (the budget).
    """
    cols = list(metrics.columns) + ["matched_at"]
    if metrics.empty or column not in metrics:
        return pd.DataFrame(columns=cols)
    out = []
    sub = metrics[metrics["variant"].isin(variants)].dropna(subset=[column])
    for _, g in sub.groupby(["model", "task"], sort=True):
        if g["variant"].nunique() < 2:
            continue
        budget = g.groupby("run")[column].max().min()
        for _, r in g.groupby("run", sort=True):
            within = r[r[column] <= budget]
            if not within.empty:
                out.append(within.loc[[within["iteration"].idxmax()]].assign(matched_at=budget))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


def _steps(iterations: Iterable[float]) -> str:
    return "/".join(str(int(i)) for i in sorted(set(iterations)))


def budget_rows(metrics: pd.DataFrame, variants: Sequence[str], value: str, label: str,
                keys: Sequence[str] = ("model", "task")) -> list[dict]:
    """Training-curve `value` of each variant: at its final step (budget "iterations") and at
    matched rollouts and generated tokens (see :func:`matched_rows`). ``at_step`` says which
    logged step each value comes from; a variant whose first step already exceeds the matched
    budget gets a NaN value and says so."""
    rows = []
    m = metrics[metrics["variant"].isin(variants)].dropna(subset=[value])
    metric = f"{label} (train curve)"
    for key, g in m.groupby([*keys, "variant"], sort=True):
        final = g.sort_values("iteration").groupby("run").tail(1)
        rows.append(stat(dict(zip([*keys, "variant"], key, strict=True)), ci_values(final[value]),
                         method=g["method"].iloc[0], budget="iterations", matched_at="final step",
                         at_step=_steps(final["iteration"]), metric=metric, n_seeds=g["seed"].nunique()))
    for column in BUDGETS:
        sel = matched_rows(m, variants, column)
        for key, g in m.dropna(subset=[column]).groupby(list(keys), sort=True):
            if g["variant"].nunique() < 2:
                continue
            budget = g.groupby("run")[column].max().min()
            for variant, gv in g.groupby("variant", sort=True):
                chosen = sel[(sel["variant"] == variant)
                             & np.logical_and.reduce([sel[k] == v for k, v in zip(keys, key, strict=True)])]
                base = {**dict(zip(keys, key, strict=True)), "variant": variant}
                common = {"method": gv["method"].iloc[0], "budget": column, "matched_at": f"{column} <= {int(budget)}",
                          "metric": metric, "n_seeds": gv["seed"].nunique()}
                if chosen.empty:
                    rows.append(stat(base, (math.nan,) * 3, **common,
                                     at_step=f"none: first step uses {int(gv[column].min())}"))
                else:
                    rows.append(stat(base, ci_values(chosen[value]), **common, at_step=_steps(chosen["iteration"])))
    return rows


def _main_variants(setup: dict) -> list[str]:
    out = []
    if setup["main_n"] is not None:
        out.append(f"es-n{setup['main_n']}")
    if setup["main_g"] is not None:
        out.append(f"grpo-g{setup['main_g']}")
    return out


def smallest_sufficient(rewards: dict[int, float], tol: float = 0.01) -> int | None:
    """Smallest N whose final reward is at least (largest N's reward - tol)."""
    if not rewards:
        return None
    target = rewards[max(rewards)] - tol
    return min(n for n, r in rewards.items() if r >= target - 1e-12)


def pearson_ci(x: Sequence[float], y: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """Pearson r with a 95% bootstrap CI over units; NaN with fewer than 3 units or no spread."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return (math.nan,) * 3
    r = float(np.corrcoef(x, y)[0, 1])
    idx = np.random.default_rng(seed).integers(0, x.size, size=(N_BOOT, x.size))
    xs, ys = x[idx], y[idx]
    xs = xs - xs.mean(axis=1, keepdims=True)
    ys = ys - ys.mean(axis=1, keepdims=True)
    den = np.sqrt((xs**2).sum(axis=1) * (ys**2).sum(axis=1))
    ok = den > 0
    if not ok.any():
        return r, math.nan, math.nan
    lo, hi = np.quantile((xs * ys).sum(axis=1)[ok] / den[ok], [0.025, 0.975])
    return r, float(lo), float(hi)


# --------------------------------------------------------------------------- writing


def fmt_ci(m: float, lo: float, hi: float, digits: int = 3) -> str:
    if m is None or pd.isna(m):
        return "n/a"
    if pd.isna(lo) or pd.isna(hi):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def display_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Columns X, X_lo, X_hi -> one text column X = "mean [lo, hi]"; other floats to 3 decimals."""
    out = df.copy()
    for column in list(out.columns):
        if f"{column}_lo" in out and f"{column}_hi" in out:
            out[column] = [fmt_ci(m, lo, hi) for m, lo, hi in
                           zip(out[column], out[f"{column}_lo"], out[f"{column}_hi"], strict=True)]
            out = out.drop(columns=[f"{column}_lo", f"{column}_hi"])
    for column in out.columns:
        if pd.api.types.is_float_dtype(out[column]):
            out[column] = out[column].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    return out.astype(object).where(out.notna(), "")


def wide(long: pd.DataFrame, index: Sequence[str], columns: str = "method", order: Sequence[str] = ()) -> pd.DataFrame:
    """A display pivot of a long table: one text cell "mean [lo, hi]" per (index, column)."""
    if long.empty:
        return long
    cells = [fmt_ci(m, lo, hi) for m, lo, hi in zip(long["value"], long["value_lo"], long["value_hi"], strict=True)]
    if "at_step" in long:  # budget rows: say which logged step each value comes from
        cells = [c if pd.isna(s) or s == "" else (f"{c} (step {s})" if c != "n/a" else f"n/a ({s})")
                 for c, s in zip(cells, long["at_step"], strict=True)]
    cell = long.assign(_cell=cells)
    table = cell.pivot_table(index=list(index), columns=columns, values="_cell", aggfunc="first", sort=False)
    present = [c for c in order if c in table.columns] + [c for c in table.columns if c not in order]
    table = table[present].fillna("").reset_index()
    table.columns.name = None
    return table


def write_paper_table(long: pd.DataFrame, output: dict, caption: str, shown: pd.DataFrame | None = None,
                      notes: Sequence[str] = ()) -> None:
    """CSV = the numbers (tidy); Markdown and LaTeX = `shown` (default: `long` with CIs as text)."""
    atomic_write_text(output["csv"], long.to_csv(index=False))
    shown = display_frame(long) if shown is None else display_frame(shown)
    text = caption + "".join(f"\n\n{n}" for n in notes)
    markdown = markdown_table(shown)
    atomic_write_text(output["md"], f"{text}\n\n{markdown}\n")
    latex_caption = " ".join([caption, *notes])
    latex = shown.to_latex(index=False, caption=latex_caption, escape=True) if not shown.empty else (
        "% " + latex_caption.replace("\n", " ") + "\n% (no rows)\n")
    atomic_write_text(output["tex"], latex)


def not_run_table(output: dict, caption: str, reason: str) -> None:
    write_paper_table(pd.DataFrame([{"status": "not run", "reason": reason}]), output, caption)


def _absent(setup: dict) -> list[str]:
    notes = []
    if not setup["has_grpo"]:
        notes.append("GRPO: not run in this config (no `grpo` block); GRPO columns are absent.")
    if not setup["has_es"]:
        notes.append("ES: not run in this config (no `es` block).")
    return notes


# --------------------------------------------------------------------------- paper A tables


def build_a_accuracy(data: Data) -> pd.DataFrame:
    setup, rows = data.setup, []
    test = data.on_task({"base", "es", "es_snap", "grpo"})
    for (model, task, method), g in test.groupby(["model", "task", "method"], sort=True):
        # a snapshot's final checkpoint is its parent after K iterations; the method says K
        rows.append(stat({"model": model, "task": task, "variant": g["variant"].iloc[0]}, ci_prompts(g, "greedy"),
                         method=method, budget="iterations", matched_at="final checkpoint",
                         metric="test greedy accuracy", n_seeds=g["seed"].nunique(),
                         n_prompts=g["prompt"].nunique()))
    rows += budget_rows(data.metrics, _main_variants(setup), "fitness_mean", "train reward")
    return _order(pd.DataFrame(rows), ["model", "task", "budget", "metric", "method"])


def _order(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    if df.empty:
        return df
    df = df.copy()
    if "method" in df:
        df["_m"] = df["method"].map(lambda m: METHOD_ORDER.index(m) if m in METHOD_ORDER else 99)
        by = [c if c != "method" else "_m" for c in by]
    if "budget" in df:
        order = ["iterations", *BUDGETS]
        df["_b"] = df["budget"].map(lambda b: order.index(b) if b in order else 99)
        by = [c if c != "budget" else "_b" for c in by]
    lead = [c for c in ["model", "task", "budget", "metric", "method", "variant"] if c in df]
    rest = [c for c in df.columns if c not in lead and c not in ("value", "value_lo", "value_hi", "_m", "_b")]
    return df.sort_values([c for c in by if c in df], kind="stable")[
        [*lead, *rest, "value", "value_lo", "value_hi"]].reset_index(drop=True)


def table_a_accuracy(input, output, params, wildcards, threads):
    data = Data(input, params["setup"])
    long = build_a_accuracy(data)
    caption = ("Paper A: test greedy accuracy on each task's own test set, base vs ES vs GRPO "
               "(mean [95% CI] over seeds and prompts). budget=iterations: final checkpoints after the "
               "configured ES iterations / GRPO steps (ES (K it): the main ES run after K iterations, "
               "es.snapshots); budget=rollouts / generated_tokens: train reward "
               "(metrics.jsonl fitness_mean; ES: mean over the population) at the last step within the "
               "smaller of the two methods' totals.")
    if long.empty:
        return not_run_table(output, caption, "no base / ES / GRPO evaluations in this config")
    shown = wide(long, ["model", "task", "budget", "matched_at", "metric"], order=_with_snapshot_methods(long))
    write_paper_table(long, output, caption, shown, notes=_absent(data.setup))


def _with_snapshot_methods(long: pd.DataFrame) -> list[str]:
    """METHOD_ORDER with the snapshot columns (``ES (K it)``, by K) just before ES."""
    snaps = sorted({m for m in long["method"] if isinstance(m, str) and m.startswith("ES (")},
                   key=lambda m: int(re.search(r"\d+", m)[0]))
    i = METHOD_ORDER.index("ES")
    return [*METHOD_ORDER[:i], *snaps, *METHOD_ORDER[i:]]


def _stage_frame(data: Data) -> pd.DataFrame:
    """Continual prompts with stage (0 = base) per method; base rows duplicated for each method."""
    p = data.prompts
    setup = data.setup
    if p.empty:
        return p
    cl = p[p["kind"].isin(["cl_es", "cl_grpo"])].copy()
    cl["stage"] = cl["run"].map(lambda r: run_labels(r)["stage"]).astype(int)
    frames = [cl]
    base = p[p["kind"].eq("base")]
    for method in cl["method"].unique():
        frames.append(base.assign(method=method, stage=0))
    out = pd.concat(frames, ignore_index=True)
    order = setup["continual"]
    out["stage_task"] = out["stage"].map(lambda s: "base" if s == 0 else order[s - 1])
    return out


def build_a_sequential(data: Data) -> pd.DataFrame:
    df = _stage_frame(data)
    if df.empty or not df["kind"].isin(["cl_es", "cl_grpo"]).any():
        return pd.DataFrame()
    rows = []
    for (model, method, stage, eval_task), g in df.groupby(["model", "method", "stage", "eval_task"], sort=True):
        rows.append(stat({"model": model, "method": method, "stage": int(stage),
                          "stage_task": g["stage_task"].iloc[0], "eval_task": eval_task},
                         ci_prompts(g, "greedy"), row="accuracy"))
    acc = pd.DataFrame(rows)
    for (model, method, eval_task), g in acc.groupby(["model", "method", "eval_task"]):
        final_stage = g["stage"].max()
        earlier = g[(g["stage"] >= 1) & (g["stage"] < final_stage)]
        if earlier.empty:
            continue
        best = int(earlier.loc[earlier["value"].idxmax(), "stage"])
        sel = df[(df["model"] == model) & (df["method"] == method) & (df["eval_task"] == eval_task)]
        rows.append(stat({"model": model, "method": method, "stage": best, "stage_task": "forgetting",
                          "eval_task": eval_task},
                         paired_ci(sel[sel["stage"] == best], sel[sel["stage"] == final_stage], "greedy"),
                         row=f"forgetting = stage {best} (best earlier) - stage {final_stage} (final)"))
    return pd.DataFrame(rows)


def table_a_sequential(input, output, params, wildcards, threads):
    setup = params["setup"]
    caption = ("Paper A: continual sequence " + " -> ".join(setup["continual"] or ["(none)"]) +
               ". Test greedy accuracy (mean [95% CI], seeds x prompts) on every task (columns) after each "
               "stage k (rows; stage 0 = base), per method; forgetting = best earlier stage (1..K-1) - final "
               "stage, paired per prompt.")
    long = build_a_sequential(Data(input, setup))
    if long.empty:
        return not_run_table(output, caption, "no continual sequence (sequential.continual) in this config")
    shown = wide(long, ["model", "method", "row", "stage", "stage_task"], columns="eval_task")
    write_paper_table(long, output, caption, shown, notes=_absent(setup))


def _drift_norms(drift: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Per run (and `by` groups): l2 = sqrt(sum l2^2), base_l2 likewise, relative = l2 / base_l2."""
    keys = ["model", "task", "run", "run_kind", "method", "variant", "seed", *by]
    d = drift.assign(_sq=drift["l2"] ** 2, _bsq=drift["base_l2"] ** 2)
    g = d.groupby(keys, sort=True, dropna=False).agg(_sq=("_sq", "sum"), _bsq=("_bsq", "sum")).reset_index()
    g["l2"] = g["_sq"] ** 0.5
    g["base_l2"] = g["_bsq"] ** 0.5
    g["relative_l2"] = g["l2"] / g["base_l2"].where(g["base_l2"] > 0)
    totals = d.groupby(keys[:7])["_sq"].sum().rename("_tot")
    g = g.join(totals, on=keys[:7])
    g["share_sq"] = g["_sq"] / g["_tot"].where(g["_tot"] > 0)
    return g.drop(columns=["_sq", "_bsq", "_tot"])


def _ratio_rows(a: pd.DataFrame, b: pd.DataFrame, value: str) -> tuple[float, float, float]:
    """ES / GRPO ratio of `value`: per shared seed when possible (CI over seeds), else of the means."""
    shared = sorted(set(a["seed"]) & set(b["seed"]))
    if shared:
        ra = a.groupby("seed")[value].mean()
        rb = b.groupby("seed")[value].mean()
        return ci_values([ra[s] / rb[s] for s in shared if rb[s] > 0])
    if a.empty or b.empty or b[value].mean() <= 0:
        return (math.nan,) * 3
    r = a[value].mean() / b[value].mean()
    return r, math.nan, math.nan


def build_a_update_norms(data: Data) -> pd.DataFrame:
    drift = data.analysis("drift")
    if drift.empty:
        return pd.DataFrame()
    norms = _drift_norms(drift)
    norms["setting"] = np.where(norms["run_kind"].str.startswith("cl_"), "continual", "single-task")
    norms["stage"] = [f"{int(run_labels(r)['stage'])}: {t}" if s == "continual" else t
                      for r, t, s in zip(norms["run"], norms["task"], norms["setting"], strict=True)]
    rows = []
    for (setting, model, stage), g in norms.groupby(["setting", "model", "stage"], sort=True):
        keys = {"setting": setting, "model": model, "stage": stage}
        for method, gm in g.groupby("method", sort=True):
            rows.append(stat({**keys, "quantity": "||theta - theta0||", "method": method}, ci_values(gm["l2"]),
                             n_seeds=gm["seed"].nunique()))
            rows.append(stat({**keys, "quantity": "relative L2", "method": method}, ci_values(gm["relative_l2"]),
                             n_seeds=gm["seed"].nunique()))
        es, grpo = g[g["method"] == "ES"], g[g["method"] == "GRPO"]
        if not es.empty and not grpo.empty:
            rows.append(stat({**keys, "quantity": "||theta - theta0|| ratio", "method": "ES/GRPO"},
                             _ratio_rows(es, grpo, "l2"), n_seeds=len(set(es["seed"]) & set(grpo["seed"]))))
    return pd.DataFrame(rows)


def table_a_update_norms(input, output, params, wildcards, threads):
    setup = params["setup"]
    caption = ("Paper A: update norm ||theta - theta0||_2 (theta0 = the base model; sqrt of the sum of the "
               "per-tensor squared L2 of the drift analysis) after each continual stage, per method, and the "
               "ES/GRPO ratio (per shared seed, 95% CI over seeds). Single-task rows: the main runs of each task.")
    long = build_a_update_norms(Data(input, setup))
    if long.empty:
        return not_run_table(output, caption, "no parameter-drift analyses (results/analysis/*/drift) for "
                                              "this config's runs")
    notes = _absent(setup)
    if not setup["continual"]:
        notes.append("Continual sequence: not run in this config; only single-task rows.")
    shown = wide(long, ["setting", "model", "stage", "quantity"], order=["ES", "GRPO", "ES/GRPO"])
    write_paper_table(long, output, caption, shown, notes=notes)


def build_a_heldout(data: Data) -> pd.DataFrame:
    df = _stage_frame(data)
    if df.empty or not df["kind"].isin(["cl_es", "cl_grpo"]).any():
        return pd.DataFrame()
    order = data.setup["continual"]
    rows = []
    for (model, method, eval_task), g in df.groupby(["model", "method", "eval_task"], sort=True):
        final = g["stage"].max()
        before, after = g[g["stage"] == 0], g[g["stage"] == final]
        held = eval_task not in order
        for metric in ("greedy", "mean@n"):
            keys = {"model": model, "method": method, "eval_task": eval_task, "held_out": held, "metric": metric}
            rows.append(stat(keys, ci_prompts(before, metric), quantity="before (base)"))
            rows.append(stat(keys, ci_prompts(after, metric), quantity=f"after (stage {final})"))
            rows.append(stat(keys, paired_ci(after, before, metric), quantity="after - before"))
    return pd.DataFrame(rows)


def table_a_heldout(input, output, params, wildcards, threads):
    setup = params["setup"]
    data = Data(input, setup)
    caption = ("Paper A: held-out scores before (base) -> after the continual sequence (final stage), per "
               "method, greedy accuracy and mean@n with 95% CIs (seeds x prompts; the change paired per prompt). "
               "held_out = the task is not in the sequence (paper A: MMLU, IFEval). At toy scale, when every "
               "task is in the sequence, no task is held out and each row reports a trained task before and "
               "after the whole sequence.")
    long = build_a_heldout(data)
    if long.empty:
        return not_run_table(output, caption, "no continual sequence (sequential.continual) in this config")
    shown = wide(long, ["model", "method", "eval_task", "held_out", "metric"], columns="quantity")
    notes = _absent(setup)
    if not long["held_out"].astype(bool).any():
        notes.append("Every task is in the continual sequence: no task is held out.")
    write_paper_table(long, output, caption, shown, notes=notes)


def build_a_geometry(data: Data) -> pd.DataFrame:
    rows = []
    cos = data.analysis("cosine")
    if not cos.empty:
        glob = cos[cos["scope"] == "global"]
        for (model, task, pair), g in glob.groupby(["model", "task", "pair"], sort=True):
            rows.append(stat({"model": model, "task": task, "quantity": f"cosine global ({pair})", "method": "pair"},
                             ci_values(g["cosine"]), n=len(g)))
            rows.append(stat({"model": model, "task": task, "quantity": f"|cosine| global ({pair})",
                              "method": "pair"}, ci_values(g["cosine"].abs()), n=len(g)))
        for (model, task, scope, pair), g in cos[cos["scope"] != "global"].groupby(
                ["model", "task", "scope", "pair"], sort=True):
            rows.append(stat({"model": model, "task": task, "quantity": f"mean |cosine| per {scope} ({pair})",
                              "method": "pair"}, ci_values(g["cosine"].abs()), n=len(g)))
    for row in _barriers(data.analysis("interpolation")):
        rows.append(row)
    kl = data.analysis("kl")
    if not kl.empty:
        for (model, task, method), g in kl.groupby(["model", "task", "method"], sort=True):
            on, off = g[g["eval_task"] == task], g[g["eval_task"] != task]
            rows.append(stat({"model": model, "task": task, "quantity": "KL on-task (token mean)",
                              "method": method}, ci_values(on["token_mean"]), n=len(on)))
            rows.append(stat({"model": model, "task": task, "quantity": "KL off-task (token mean)",
                              "method": method}, ci_values(off["token_mean"]), n=len(off)))
    return pd.DataFrame(rows)


def _barriers(interp: pd.DataFrame) -> list[dict]:
    """Barrier heights along the ES-GRPO path (esgrpo.metrics.barrier_height), per
    (model, task, seed, eval_task), for greedy accuracy and mean@n; on-task and off-task means."""
    if interp.empty or "path" not in interp:
        return []
    path = interp[interp["path"] == "es-grpo"]
    rows, per = [], []
    for (model, task, seed, eval_task), g in path.groupby(["model", "task", "seed", "eval_task"]):
        for metric in ("greedy", "mean@n"):
            if metric in g and g[metric].notna().all():
                per.append({"model": model, "task": task, "seed": seed, "on_task": eval_task == task,
                            "metric": metric, "barrier": barrier_height(g["lam"], g[metric])})
    per = pd.DataFrame(per)
    if per.empty:
        return []
    for (model, task, metric, on), g in per.groupby(["model", "task", "metric", "on_task"]):
        where = "on-task" if on else "off-task mean"
        rows.append(stat({"model": model, "task": task, "quantity": f"barrier ES-GRPO ({metric}, {where})",
                          "method": "pair"}, ci_values(g["barrier"]), n=len(g)))
    return rows


def table_a_geometry(input, output, params, wildcards, threads):
    setup = params["setup"]
    caption = ("Paper A: update geometry. cosine(dES, dGRPO) over all parameters (and mean |cos| per "
               "layer / module type); barrier height of the linear path theta0 + (1-l) dES + l dGRPO "
               "(max over interior l of the straight line between the end points minus the accuracy, >= 0; "
               "computed from the interpolation curves); token-mean KL(base || model) on the base model's own "
               "continuations, on the training task and averaged over the other tasks. es-es / grpo-grpo "
               "cosines (two seeds of one method) are the reference for 'orthogonal'. 95% CIs over seeds (and tasks for off-task means).")
    long = build_a_geometry(Data(input, setup))
    if long.empty:
        return not_run_table(output, caption, "no cosine / interpolation / KL analyses for this config "
                                              "(they need both ES and GRPO runs and results/analysis)")
    shown = wide(long, ["model", "task", "quantity"], order=["pair", "ES", "GRPO"])
    write_paper_table(long, output, caption, shown, notes=_absent(setup))


# --------------------------------------------------------------------------- paper B tables


def build_b_passk(data: Data) -> pd.DataFrame:
    setup = data.setup
    rows = []
    test = data.on_task({"base", "es", "grpo", "es->grpo", "grpo->es"})
    for (model, task, method), g in test.groupby(["model", "task", "method"], sort=True):
        for k in passk_display_ks(setup["ks"][model]):
            rows.append(stat({"model": model, "task": task, "variant": g["variant"].iloc[0]},
                             ci_prompts(g, f"pass@{k}"), method=method, budget="iterations",
                             matched_at="final checkpoint", metric=f"pass@{k}", n_seeds=g["seed"].nunique(),
                             n_prompts=g["prompt"].nunique()))
    rows += budget_rows(data.metrics, _main_variants(setup), "fitness_mean", "train reward")
    return _order(pd.DataFrame(rows), ["model", "task", "budget", "metric", "method"])


def table_b_passk(input, output, params, wildcards, threads):
    setup = params["setup"]
    caption = ("Paper B: Pass@1 and Pass@k at the two largest evaluated k (paper: 16, 32) on each task's test "
               "set, unbiased estimator per prompt, mean [95% CI] over seeds and prompts, for base, ES, GRPO, "
               "ES->GRPO and GRPO->ES (sequential runs on the sequential task only). budget=iterations: final "
               "checkpoints; budget=rollouts / generated_tokens: train reward at matched budgets (metrics.jsonl).")
    long = build_b_passk(Data(input, setup))
    if long.empty:
        return not_run_table(output, caption, "no evaluations in this config")
    notes = _absent(setup)
    if not setup["sequential_task"]:
        notes.append("ES->GRPO / GRPO->ES: not run in this config (no sequential.task, or no GRPO).")
    shown = wide(long, ["model", "task", "budget", "matched_at", "metric"], order=METHOD_ORDER)
    write_paper_table(long, output, caption, shown, notes=notes)


def easy_setting_cells(data: Data) -> pd.DataFrame:
    """Per (model, task, method in ES/GRPO, k in the two largest ks): method - base Pass@k, paired
    per prompt; ``below`` = point estimate < 0, ``significant`` = CI upper bound < 0."""
    rows = []
    test = data.on_task({"base", "es", "grpo"})
    for (model, task), g in test.groupby(["model", "task"], sort=True):
        base = g[g["method"] == "base"]
        ks = sorted(k for k in data.setup["ks"][model] if k > 1)[-2:]
        for method in ("ES", "GRPO"):
            run = g[g["method"] == method]
            if run.empty or base.empty:
                continue
            for k in ks:
                col = f"pass@{k}"
                d, lo, hi = paired_ci(run, base, col)
                rows.append({"model": model, "task": task, "method": method, "k": k,
                             "base": ci_prompts(base, col)[0], "trained": ci_prompts(run, col)[0],
                             "value": d, "value_lo": lo, "value_hi": hi,
                             "below": bool(d < 0), "significant": bool(hi < 0)})
    return pd.DataFrame(rows)


def easy_setting_counts(cells: pd.DataFrame) -> pd.DataFrame:
    if cells.empty:
        return pd.DataFrame(columns=["method", "k", "n_cells", "n_below", "n_significant", "cells_below"])
    out = []
    for (method, k), g in cells.groupby(["method", "k"], sort=True):
        out.append({"method": method, "k": int(k), "n_cells": len(g), "n_below": int(g["below"].sum()),
                    "n_significant": int(g["significant"].sum()),
                    "cells_below": ", ".join(f"{m}/{t}" for m, t in zip(g.loc[g["below"], "model"],
                                                                         g.loc[g["below"], "task"], strict=True))})
    return pd.DataFrame(out)


def table_b_easy_setting(input, output, params, wildcards, threads):
    setup = params["setup"]
    data = Data(input, setup)
    cells = easy_setting_cells(data)
    caption = ("Paper B (easy setting): number of (model, task) cells where the trained model falls below the "
               "base at Pass@k for the two largest evaluated k (paper: 16 and 32; GRPO below base in 15 of 18). "
               "n_below counts point estimates (trained - base < 0, paired per prompt); n_significant counts "
               "cells whose 95% CI lies below 0.")
    if cells.empty:
        return not_run_table(output, caption, "no trained runs to compare with the base model")
    counts = easy_setting_counts(cells)
    long = pd.concat([counts.assign(scope="total"), cells.assign(scope="cell")], ignore_index=True)
    long = long[["scope", "method", "k", "n_cells", "n_below", "n_significant", "cells_below", "model", "task",
                 "base", "trained", "value", "value_lo", "value_hi", "below", "significant"]]
    long = long.rename(columns={"value": "diff", "value_lo": "diff_lo", "value_hi": "diff_hi"})
    long = long.astype({"k": int, "n_cells": "Int64", "n_below": "Int64", "n_significant": "Int64",
                        "below": "boolean", "significant": "boolean"})
    write_paper_table(long, output, caption, long, notes=_absent(setup))


def build_b_sequential(data: Data) -> pd.DataFrame:
    setup = data.setup
    task = setup["sequential_task"]
    if task is None:
        return pd.DataFrame()
    test = data.on_task({"base", "es", "grpo", "es->grpo", "grpo->es"})
    test = test[test["task"] == task]
    if not test["kind"].isin(["es->grpo", "grpo->es"]).any():
        return pd.DataFrame()
    rows = []
    for model, gm in test.groupby("model"):
        kmax = max(setup["ks"][model])
        by = {m: g for m, g in gm.groupby("method")}
        for metric in ("pass@1", f"pass@{kmax}"):
            for method in [m for m in METHOD_ORDER if m in by]:
                g = by[method]
                rows.append(stat({"model": model, "task": task, "metric": metric, "method": method},
                                 ci_prompts(g, metric), contrast=""))
            for a, b in (("ES->GRPO", "ES"), ("ES->GRPO", "GRPO"), ("GRPO->ES", "GRPO"), ("GRPO->ES", "ES"),
                         ("ES->GRPO", "base"), ("GRPO->ES", "base")):
                if a in by and b in by:
                    rows.append(stat({"model": model, "task": task, "metric": metric, "method": f"{a} - {b}"},
                                     paired_ci(by[a], by[b], metric), contrast="paired difference"))
    return pd.DataFrame(rows)


def table_b_sequential(input, output, params, wildcards, threads):
    setup = params["setup"]
    caption = ("Paper B: sequential training on one task. ES->GRPO (GRPO started from the ES run) and GRPO->ES: "
               "Pass@1 vs Pass@K (K = largest evaluated k) against their single-method starts and the base; "
               "differences paired per (seed, prompt). 95% CIs over seeds and prompts.")
    long = build_b_sequential(Data(input, setup))
    if long.empty:
        return not_run_table(output, caption, "no ES->GRPO / GRPO->ES runs in this config "
                                              "(needs es, grpo and sequential.task)")
    shown = wide(long, ["model", "task", "method"], columns="metric")
    write_paper_table(long, output, caption, shown)


def build_b_drift(data: Data) -> pd.DataFrame:
    drift = data.analysis("drift")
    if drift.empty:
        return pd.DataFrame()
    drift = drift[drift["run_kind"].isin(["es", "grpo"])]
    whole = _drift_norms(drift).assign(module_type="all")
    by_type = _drift_norms(drift, ["module_type"])
    norms = pd.concat([whole, by_type], ignore_index=True)
    rows = []
    for (model, task, module), g in norms.groupby(["model", "task", "module_type"], sort=True):
        for method, gm in g.groupby("method"):
            keys = {"model": model, "task": task, "module_type": module, "method": method}
            rows.append(stat(keys, ci_values(gm["relative_l2"]), quantity="relative L2",
                             n_seeds=gm["seed"].nunique()))
            rows.append(stat(keys, ci_values(gm["share_sq"]), quantity="share of squared update",
                             n_seeds=gm["seed"].nunique()))
        es, grpo = g[g["method"] == "ES"], g[g["method"] == "GRPO"]
        if not es.empty and not grpo.empty:
            rows.append(stat({"model": model, "task": task, "module_type": module, "method": "ES/GRPO"},
                             _ratio_rows(es, grpo, "relative_l2"), quantity="relative L2 ratio",
                             n_seeds=len(set(es["seed"]) & set(grpo["seed"]))))
    return pd.DataFrame(rows)


def table_b_drift(input, output, params, wildcards, threads):
    setup = params["setup"]
    caption = ("Paper B: parameter drift of the single-task runs. Relative L2 ||theta - theta0|| / ||theta0|| "
               "(theta0 = base) of the whole model (module_type = all) and by module type, each method's share "
               "of its squared update by module type, and the ES/GRPO ratio (per shared seed; 95% CI over "
               "seeds). Paper B: ES moves up to 44x farther; ES's largest changes in norms and attention.")
    long = build_b_drift(Data(input, setup))
    if long.empty:
        return not_run_table(output, caption, "no parameter-drift analyses for this config's runs")
    shown = wide(long, ["model", "task", "module_type", "quantity"], order=["ES", "GRPO", "ES/GRPO"])
    write_paper_table(long, output, caption, shown, notes=_absent(setup))


def _base_on_task(data: Data) -> pd.DataFrame:
    p = data.prompts
    return p[p["kind"] == "base"] if not p.empty else p


SPARSITY_METRICS = ("greedy", "mean@n")


def sparsity_frame(data: Data) -> pd.DataFrame:
    """Sparsity rows with, per run and metric, the base (``base_<m>``: keep fraction 0, else the base
    evaluation) and full-update (``full_<m>``: keep fraction 1) accuracies and ``retained_<m>`` =
    (acc - base) / (full - base) (NaN where the run gained nothing) / ``lost_<m>`` for resets."""
    sp = data.analysis("sparsity")
    if sp.empty:
        return sp
    base = _base_on_task(data)
    parts = []
    if "eval_task" not in sp:  # files from before evaluation tasks were recorded: the training task
        sp = sp.assign(eval_task=sp["task"])
    for (model, _task, _run, eval_task), r in sp.groupby(["model", "task", "run", "eval_task"], sort=True):
        r = r.copy()
        top = r[r["kind"] == "top_fraction"]
        for metric in (m for m in SPARSITY_METRICS if m in r):
            zero = top.loc[np.isclose(top["keep_fraction"], 0.0), metric]
            full = top.loc[np.isclose(top["keep_fraction"], 1.0), metric]
            b_rows = base[(base["model"] == model) & (base["eval_task"] == eval_task)] if not base.empty else base
            b = float(zero.iloc[0]) if len(zero) else (float(b_rows[metric].mean()) if len(b_rows) else math.nan)
            f = float(full.iloc[0]) if len(full) else math.nan
            gain = f - b if f - b > 0 else math.nan
            r[f"base_{metric}"], r[f"full_{metric}"] = b, f
            r[f"retained_{metric}"] = (r[metric] - b) / gain
            r[f"lost_{metric}"] = (f - r[metric]) / gain
        parts.append(r)
    return pd.concat(parts, ignore_index=True)


def build_b_sparsity(data: Data) -> pd.DataFrame:
    sp = sparsity_frame(data)
    if sp.empty:
        return pd.DataFrame()
    rows = []
    for (model, task, method), g in sp.groupby(["model", "task", "method"], sort=True):
        for metric in (m for m in SPARSITY_METRICS if m in g):
            keys = {"model": model, "task": task, "method": method, "metric": metric}
            for kf, gk in g[g["kind"] == "top_fraction"].groupby("keep_fraction", sort=True):
                extra = {"kind": "top_fraction", "keep_fraction": float(kf), "module_type": "",
                         "n_kept": float(gk["n_kept"].mean()) if "n_kept" in gk else np.nan,
                         "n_changed": float(gk["n_changed"].mean()) if "n_changed" in gk else np.nan,
                         "n_runs": gk["run"].nunique()}
                rows.append(stat(keys, ci_values(gk[metric]), quantity="accuracy", **extra))
                rows.append(stat(keys, ci_values(gk[f"retained_{metric}"]), quantity="retained gain", **extra))
            for mt, gk in g[g["kind"] == "reset_module"].groupby("module_type", sort=True):
                extra = {"kind": "reset_module", "keep_fraction": np.nan, "module_type": mt,
                         "n_runs": gk["run"].nunique()}
                rows.append(stat(keys, ci_values(gk[metric]), quantity="accuracy", **extra))
                rows.append(stat(keys, ci_values(gk[f"lost_{metric}"]), quantity="share of gain lost", **extra))
    return pd.DataFrame(rows)


def table_b_sparsity(input, output, params, wildcards, threads):
    setup = params["setup"]
    caption = ("Paper B: functional sparsity. Keeping only the largest-|delta| fraction of the changed "
               "coordinates (kind = top_fraction): accuracy and retained gain = (acc - base) / (full update - "
               "base) with base = keep fraction 0 (or the base evaluation) and full = keep fraction 1. "
               "Resetting one module type to the base (kind = reset_module): accuracy and share of the gain "
               "lost. 95% CIs over runs (seeds).")
    long = build_b_sparsity(Data(input, setup))
    if long.empty:
        return not_run_table(output, caption, "no sparsity analyses for this config's runs")
    long = long.assign(keep=long["keep_fraction"].map(lambda v: "" if pd.isna(v) else f"{v:g}"))
    shown = wide(long, ["model", "task", "method", "kind", "keep", "module_type"], columns="quantity")
    write_paper_table(long.drop(columns=["keep"]), output, caption, shown)


def with_labels(df: pd.DataFrame) -> pd.DataFrame:
    """Adds population / normalization / antithetic / stage columns parsed from the run names."""
    if df.empty:
        return df.assign(population=np.nan, normalization=None, antithetic=None, stage=np.nan)
    labels = pd.DataFrame([run_labels(r) for r in df["run"]], index=df.index)
    return df.drop(columns=[c for c in labels.columns if c in df]).join(labels)


def _ablation_frames(data: Data) -> tuple[pd.DataFrame, pd.DataFrame]:
    task = data.setup["ablation_task"]
    p, m = data.prompts, data.metrics
    if not p.empty:
        p = with_labels(p[(p["train_task"] == task) & (p["eval_task"] == task)])
    if not m.empty:
        m = with_labels(m[m["task"] == task])
    return p, m


ABLATION_CONTRASTS = (("zscore - none", "norm", "zscore", "none"), ("zscore - rank", "norm", "zscore", "rank"),
                      ("antithetic - one-sided", "anti", True, False))


def _ablation_sets(p: pd.DataFrame, n: int) -> dict:
    """variant label -> prompts for the main population (z-score/one-sided, rank, none, antithetic)."""
    out = {}
    if p.empty:
        return out
    q = p[p["population"] == n]
    out["zscore"] = q[(q["normalization"] == "zscore") & ~q["antithetic"].astype(bool)]
    out["rank"] = q[q["normalization"] == "rank"]
    out["none"] = q[q["normalization"] == "none"]
    out["one-sided"] = out["zscore"]
    out["antithetic"] = q[(q["normalization"] == "zscore") & q["antithetic"].astype(bool)]
    return {k: v for k, v in out.items() if not v.empty}


def build_b_ablations(data: Data) -> pd.DataFrame:
    setup = data.setup
    task, n = setup["ablation_task"], setup["main_n"]
    if task is None or n is None:
        return pd.DataFrame()
    p, m = _ablation_frames(data)
    if p.empty and m.empty:
        return pd.DataFrame()
    model_ks = {model: max(ks) for model, ks in setup["ks"].items()}
    rows = []
    for model in sorted(set(p["model"]) if not p.empty else set(m["model"])):
        pm = p[p["model"] == model] if not p.empty else p
        mm = m[m["model"] == model] if not m.empty else m
        sets = _ablation_sets(pm, n)
        if len(sets) < 2 or not ({"rank", "none", "antithetic"} & set(sets)):
            continue
        kmax = model_ks[model]
        metrics = ["greedy", "mean@n", f"pass@{kmax}"]
        for label, g in sets.items():
            if label == "one-sided":
                continue
            variant = g["variant"].iloc[0]
            for metric in metrics:
                rows.append(stat({"model": model, "task": task, "variant": variant, "setting": label,
                                  "metric": f"test {metric}"}, ci_prompts(g, metric), n_seeds=g["seed"].nunique()))
            curve = tail(mm[mm["variant"] == variant])
            rows.append(stat({"model": model, "task": task, "variant": variant, "setting": label,
                              "metric": "final train reward"}, ci_curve(curve, "fitness_mean"),
                             n_seeds=curve["seed"].nunique()))
        for name, _, a, b in ABLATION_CONTRASTS:
            la, lb = (a, b) if isinstance(a, str) else ("antithetic", "one-sided")
            if la not in sets or lb not in sets:
                continue
            for metric in metrics:
                rows.append(stat({"model": model, "task": task, "variant": "", "setting": name,
                                  "metric": f"test {metric}"}, paired_ci(sets[la], sets[lb], metric),
                                 n_seeds=sets[la]["seed"].nunique()))
            ca = tail(mm[mm["variant"] == sets[la]["variant"].iloc[0]])
            cb = tail(mm[mm["variant"] == sets[lb]["variant"].iloc[0]])
            rows.append(stat({"model": model, "task": task, "variant": "", "setting": name,
                              "metric": "final train reward"}, paired_ci(ca, cb, "fitness_mean", unit="iteration"),
                             n_seeds=ca["seed"].nunique() if not ca.empty else 0))
    return pd.DataFrame(rows)


def table_b_ablations(input, output, params, wildcards, threads):
    setup = params["setup"]
    caption = (f"Paper B: ES ablations on {setup['ablation_task']} at N = {setup['main_n']}: fitness "
               "normalisation (z-score vs rank vs none) and one-sided vs antithetic (two-point) members. Test "
               "greedy / mean@n (= Pass@1) / Pass@K with 95% CIs over seeds and prompts; final train reward = "
               "mean fitness over the last 10% of iterations (CI over seeds and iterations). Contrast rows are "
               "paired differences (per prompt; per iteration for the train reward). All settings share N, "
               "iterations and prompts per iteration, hence rollouts: iterations and rollouts budgets coincide.")
    long = build_b_ablations(Data(input, setup))
    if long.empty:
        return not_run_table(output, caption, "no ES ablation runs in this config (es.ablations.normalization / "
                                              "antithetic)")
    shown = wide(long, ["model", "task", "setting", "variant"], columns="metric")
    write_paper_table(long, output, caption, shown)


def population_rewards(metrics: pd.DataFrame) -> pd.DataFrame:
    """Final train reward (mean over the last 10% of iterations) per (model, population) with CIs."""
    rows = []
    m = metrics[metrics["kind"].isin(["es", "es_pop"])]
    if m.empty:
        return pd.DataFrame(columns=["model", "task", "population", "value", "value_lo", "value_hi"])
    m = m.assign(population=m["run"].map(lambda r: run_labels(r)["population"]))
    for (model, task, n), g in m.groupby(["model", "task", "population"], sort=True):
        last = tail(g)
        rows.append(stat({"model": model, "task": task, "population": int(n)}, ci_curve(last, "fitness_mean"),
                         iterations=int(g.groupby("run")["iteration"].max().mean()),
                         rollouts=float(g.groupby("run")["rollouts"].max().mean()), n_seeds=g["seed"].nunique()))
    return pd.DataFrame(rows)


def build_b_population(data: Data) -> pd.DataFrame:
    setup = data.setup
    if setup["ablation_task"] is None:
        return pd.DataFrame()
    _, m = _ablation_frames(data)
    rewards = population_rewards(m)
    if rewards.empty or rewards["population"].nunique() < 2:
        return pd.DataFrame()
    rows = [r.assign(budget="iterations", matched_at="final (last 10% of iterations)") for _, r in
            rewards.groupby("model")]
    out = pd.concat(rows, ignore_index=True)
    out["smallest_sufficient"] = False
    for model, g in out.groupby("model"):
        best = smallest_sufficient(dict(zip(g["population"], g["value"], strict=True)))
        out.loc[(out["model"] == model) & (out["population"] == best), "smallest_sufficient"] = True
    # each population's curve at the smallest total rollouts of the sweep
    m_es = m[m["kind"].isin(["es", "es_pop"])]
    extra = [{**r, "population": run_labels(f"{r['variant']}-s0")["population"], "smallest_sufficient": None}
             for r in budget_rows(m_es, sorted(set(m_es["variant"])), "fitness_mean", "train reward")
             if r["budget"] == "rollouts"]
    if extra:
        out = pd.concat([out, pd.DataFrame(extra)], ignore_index=True)
    out["population"] = out["population"].astype(int)
    if "at_step" not in out:
        out["at_step"] = None
    out["at_step"] = out["at_step"].where(out["budget"] == "rollouts", out["iterations"].astype(str))
    cols = ["model", "task", "budget", "matched_at", "population", "at_step", "total_rollouts", "n_seeds",
            "smallest_sufficient", "value", "value_lo", "value_hi"]
    out = out.rename(columns={"rollouts": "total_rollouts"})
    return out[cols].sort_values(["model", "budget", "population"], kind="stable").reset_index(drop=True)


def table_b_population(input, output, params, wildcards, threads):
    setup = params["setup"]
    caption = (f"Paper B: population sweep on {setup['ablation_task']}. Final train reward (mean fitness over the "
               "last 10% of iterations, 95% CI over seeds and iterations) per N at equal iterations; "
               "smallest_sufficient marks the smallest N whose reward is at least the largest N's minus 0.01 "
               "(paper: N = 16 within 0.01 of N = 64). budget=rollouts rows: each N's reward at the smallest "
               "total rollouts of the sweep.")
    long = build_b_population(Data(input, setup))
    if long.empty:
        return not_run_table(output, caption, "no population sweep (es.ablations.population_sizes) in this config")
    write_paper_table(long.rename(columns={"value": "reward", "value_lo": "reward_lo", "value_hi": "reward_hi"}),
                      output, caption)


def entropy_change(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per run: entropy over the first and the last 10% of training and last / first - 1."""
    rows = []
    m = metrics.dropna(subset=["entropy"])
    for run_key, g in m.groupby(["model", "task", "run"], sort=True):
        first, last = tail(g, first=True)["entropy"].mean(), tail(g)["entropy"].mean()
        rows.append({"model": run_key[0], "task": run_key[1], "run": run_key[2], "seed": g["seed"].iloc[0],
                     "method": g["method"].iloc[0], "variant": g["variant"].iloc[0], "first": first, "last": last,
                     "relative_change": last / first - 1 if first > 0 else math.nan})
    return pd.DataFrame(rows)


def build_b_entropy(data: Data) -> pd.DataFrame:
    setup = data.setup
    m = data.metrics
    m = m[m["variant"].isin(_main_variants(setup))] if not m.empty else m
    rows = []
    changes = entropy_change(m) if not m.empty else pd.DataFrame()
    if not changes.empty:
        for (model, task, method), g in changes.groupby(["model", "task", "method"], sort=True):
            keys = {"model": model, "task": task, "method": method, "budget": "iterations"}
            curve = m[(m["model"] == model) & (m["task"] == task) & (m["method"] == method)]
            rows.append(stat(keys, ci_curve(tail(curve, first=True), "entropy"), metric="train entropy, first 10%",
                             matched_at="whole run"))
            rows.append(stat(keys, ci_curve(tail(curve), "entropy"), metric="train entropy, last 10%",
                             matched_at="whole run"))
            rows.append(stat(keys, ci_values(g["relative_change"]), metric="train entropy last/first - 1",
                             matched_at="whole run"))
        rows += [{**r, "metric": "train entropy at budget"} for r in
                 budget_rows(m, _main_variants(setup), "entropy", "entropy") if r["budget"] != "iterations"]
    test = data.on_task({"base", "es", "grpo"})
    for (model, task, method), g in test.groupby(["model", "task", "method"], sort=True):
        rows.append(stat({"model": model, "task": task, "method": method, "budget": "iterations"},
                         ci_prompts(g, "entropy"), metric="test sampling entropy (per token)",
                         matched_at="final checkpoint"))
    return _order(pd.DataFrame(rows), ["model", "task", "budget", "metric", "method"])


def table_b_entropy(input, output, params, wildcards, threads):
    setup = params["setup"]
    caption = ("Paper B: entropy over training (mean token entropy of the training rollouts, metrics.jsonl): "
               "first vs last 10% of steps and the relative change per run (95% CI over seeds and steps / runs); "
               "budget=rollouts / generated_tokens: entropy at matched budgets; and the test-time sampling "
               "entropy per token of the final checkpoints vs base (CI over seeds and prompts). Paper B: GRPO "
               "collapses, ES stays stable.")
    long = build_b_entropy(Data(input, setup))
    if long.empty:
        return not_run_table(output, caption, "no ES / GRPO runs in this config")
    shown = wide(long, ["model", "task", "budget", "matched_at", "metric"], order=METHOD_ORDER)
    write_paper_table(long, output, caption, shown, notes=_absent(setup))


# --------------------------------------------------------------------------- claims


def _fill(claim, **values):
    return replace(claim, statement=claim.statement.format(**values), metric=claim.metric.format(**values))


def claim_estimates(data: Data) -> dict[str, dict]:
    """claim id -> {estimate, lo, hi, budget, n, status}; status "not run: ..." where inputs are absent."""
    setup = data.setup
    ks = _ks(setup)
    big = sorted(k for k in ks if k > 1)[-2:] or [1]
    k1, k2 = big[0], big[-1]
    out: dict[str, dict] = {"_ks": {"k": k2, "k1": k1, "k2": k2}}
    nan3 = (math.nan,) * 3

    def put(cid, triple, budget="iterations (final checkpoints)", n=math.nan, status="measured"):
        out[cid] = {"estimate": triple[0], "lo": triple[1], "hi": triple[2], "budget": budget, "n": n,
                    "status": status}

    def none(cid, why):
        put(cid, nan3, budget="", status=f"not run: {why}")

    test = data.on_task({"base", "es", "grpo", "es->grpo", "grpo->es"})
    by = {m: g for m, g in test.groupby("method")} if not test.empty else {}

    def diff(a, b, col, cid, why):
        if a in by and b in by:
            d = paired(by[a], by[b], col)
            put(cid, _grouped(d, "diff", ("seed", "prompt")), n=d["prompt"].nunique() if not d.empty else 0)
        else:
            none(cid, why)

    no_grpo = "config has no GRPO runs"
    diff("ES", "base", "greedy", "a_es_improves", "config has no ES runs")
    diff("ES", "GRPO", "greedy", "a_es_matches_grpo", no_grpo)
    diff("GRPO", "base", f"pass@{k1}", "b_grpo_below_base_k1", no_grpo)
    diff("GRPO", "base", f"pass@{k2}", "b_grpo_below_base_k2", no_grpo)
    diff("ES", "base", f"pass@{k2}", "b_es_not_below_base", "config has no ES runs")
    diff("ES", "GRPO", f"pass@{k2}", "b_es_passk_ge_grpo", no_grpo)
    diff("GRPO", "ES", "pass@1", "b_grpo_pass1_ge_es", no_grpo)
    no_seq = "config has no ES->GRPO / GRPO->ES runs (sequential.task)"
    diff("ES->GRPO", "GRPO", f"pass@{k2}", "b_es_then_grpo", no_seq)
    diff("GRPO->ES", "GRPO", f"pass@{k2}", "b_grpo_then_es", no_seq)

    # held-out: single-task ES on the tasks it was not trained on
    p = data.prompts
    if not p.empty and (p["kind"] == "es").any():
        es_off = p[(p["kind"] == "es") & ~p["on_task"]]
        base = p[p["kind"] == "base"]
        if es_off.empty:
            none("b_heldout", "every model has a single task")
        else:
            d = paired(es_off.assign(prompt=es_off["train_task"] + ">" + es_off["prompt"]),
                       pd.concat([base.assign(prompt=t + ">" + base["prompt"]) for t in es_off["train_task"].unique()]),
                       "greedy")
            put("b_heldout", _grouped(d, "diff", ("seed", "prompt")),
                n=d["prompt"].nunique())
    else:
        none("b_heldout", "config has no ES runs")

    # continual: norms, held-out
    stages = _stage_frame(data) if setup["continual"] else pd.DataFrame()
    for method, cid in (("ES", "a_heldout_es"), ("GRPO", "a_heldout_grpo")):
        df = stages[stages["method"] == method] if not stages.empty and "stage" in stages else pd.DataFrame()
        if df.empty or df["stage"].max() < 1:
            none(cid, f"config has no continual {method} sequence")
            continue
        held = sorted(set(df["eval_task"]) - set(setup["continual"]))
        scope = "held-out tasks " + ", ".join(held) if held else "all tasks (none held out)"
        df = df[df["eval_task"].isin(held)] if held else df
        d = paired(df[df["stage"] == df["stage"].max()], df[df["stage"] == 0], "greedy")
        put(cid, _grouped(d, "diff", ("seed", "prompt")),
            budget=f"iterations; {scope}", n=d["prompt"].nunique())

    drift = data.analysis("drift")
    if not drift.empty:
        norms = _drift_norms(drift)
        cl = norms[norms["run_kind"].isin(["cl_es", "cl_grpo"])]
        if not cl.empty and cl["method"].nunique() == 2:
            cl = cl.assign(stage=cl["run"].map(lambda r: run_labels(r)["stage"]))
            last = cl[cl["stage"] == cl["stage"].max()]
            es, grpo = last[last["method"] == "ES"], last[last["method"] == "GRPO"]
            put("a_norm_ratio_continual", _ratio_rows(es, grpo, "l2"), budget="iterations (final stage)",
                n=len(set(es["seed"]) & set(grpo["seed"])))
        else:
            none("a_norm_ratio_continual", "config has no continual ES and GRPO sequences (or no drift analysis)")
        single = norms[norms["run_kind"].isin(["es", "grpo"])]
        ratios = []
        for _, g in single.groupby(["model", "task"]):
            es, grpo = g[g["method"] == "ES"], g[g["method"] == "GRPO"]
            for s in sorted(set(es["seed"]) & set(grpo["seed"])):
                b = float(grpo[grpo["seed"] == s]["relative_l2"].mean())
                if b > 0:
                    ratios.append(float(es[es["seed"] == s]["relative_l2"].mean()) / b)
        if ratios:
            put("b_drift_ratio", ci_values(ratios), n=len(ratios))
        else:
            none("b_drift_ratio", no_grpo if not setup["has_grpo"] else "no drift analyses")
    else:
        none("a_norm_ratio_continual", "no drift analyses in this workflow")
        none("b_drift_ratio", "no drift analyses in this workflow")

    theory = data.analysis("theory")
    fits = theory_ratios(theory) if not theory.empty else pd.DataFrame(columns=["ratio", "applies"])
    ratios = fits.loc[fits["applies"].astype(bool), "ratio"].tolist()
    if ratios:
        put("a_norm_theory", ci_values(ratios), budget="per logged update", n=len(ratios))
    else:
        none("a_norm_theory", "no norm-theory analyses of z-scored one-sided ES runs in this workflow")

    interp = data.analysis("interpolation")
    if not interp.empty and "path" in interp and (interp["path"] == "es-grpo").any():
        per = []
        for (_m, task, _s, eval_task), g in interp[interp["path"] == "es-grpo"].groupby(
                ["model", "task", "seed", "eval_task"]):
            if eval_task == task and g["greedy"].notna().all():
                per.append(barrier_height(g["lam"], g["greedy"]))
        put("a_no_barrier", ci_values(per), n=len(per))
    else:
        none("a_no_barrier", "no ES-GRPO interpolation analyses (needs GRPO)")

    cos = data.analysis("cosine")
    if not cos.empty and ((cos["scope"] == "global") & (cos["pair"] == "es-grpo")).any():
        g = cos[(cos["scope"] == "global") & (cos["pair"] == "es-grpo")]
        put("a_orthogonal", ci_values(g["cosine"].abs()), n=len(g))
    else:
        none("a_orthogonal", "no ES-GRPO cosine analyses (needs GRPO)")

    kl = data.analysis("kl")
    if not kl.empty and set(kl["method"]) >= {"ES", "GRPO"}:
        off = kl[kl["eval_task"] != kl["task"]]
        per_run = off.groupby(["model", "task", "method", "seed"])["token_mean"].mean().reset_index()
        es = per_run[per_run["method"] == "ES"].set_index(["model", "task", "seed"])["token_mean"]
        grpo = per_run[per_run["method"] == "GRPO"].set_index(["model", "task", "seed"])["token_mean"]
        common = es.index.intersection(grpo.index)
        put("a_kl_off_task", ci_values((es[common] - grpo[common]).tolist()), n=len(common))
    else:
        none("a_kl_off_task", "no KL analyses for both ES and GRPO")

    m = data.metrics
    if not m.empty:
        changes = entropy_change(m[m["variant"].isin(_main_variants(setup))])
    else:
        changes = pd.DataFrame()
    for method, cid in (("ES", "b_entropy_es_stable"), ("GRPO", "b_entropy_grpo_collapses")):
        c = changes[changes["method"] == method]["relative_change"] if not changes.empty else []
        if len(c):
            put(cid, ci_values(c), budget="iterations (whole run)", n=len(c))
        elif not setup["has_es" if method == "ES" else "has_grpo"]:
            none(cid, f"config has no {method} runs")
        else:
            none(cid, f"no {method} training curve logs an entropy")

    js = js_gain_frame(data)
    if len(js) >= 3:
        put("b_js_diversity", pearson_ci(js["js_diversity"], js["gain"]), n=len(js))
    else:
        none("b_js_diversity", f"needs >= 3 ES runs with JS diversity (have {len(js)})")

    sp = sparsity_frame(data)
    if not sp.empty and "mean@n" in sp:
        top = sp[(sp["kind"] == "top_fraction") & (sp["method"] == "ES")].dropna(subset=["retained_mean@n"])
        top = top[~np.isclose(top["keep_fraction"], 1.0)]
        if not top.empty:
            kf = float(top["keep_fraction"].iloc[(top["keep_fraction"] - 0.1).abs().argmin()])
            vals = top.loc[np.isclose(top["keep_fraction"], kf), "retained_mean@n"]
            put("b_sparsity", ci_values(vals), budget=f"keep fraction {kf:g}", n=len(vals))
        else:
            none("b_sparsity", "ES gave no gain to retain (full - base <= 0) or no top-fraction rows")
    else:
        none("b_sparsity", "no sparsity analyses in this workflow")

    p_ab, m_ab = _ablation_frames(data) if setup["ablation_task"] else (pd.DataFrame(), pd.DataFrame())
    sets = _ablation_sets(p_ab, setup["main_n"]) if not p_ab.empty else {}
    for cid, a, b in (("b_zscore_vs_none", "zscore", "none"), ("b_zscore_vs_rank", "zscore", "rank"),
                      ("b_antithetic", "antithetic", "one-sided")):
        if a in sets and b in sets:
            d = paired(sets[a], sets[b], "mean@n")
            put(cid, _grouped(d, "diff", ("seed", "prompt")),
                budget="iterations = rollouts (same N)", n=d["prompt"].nunique())
        else:
            none(cid, f"config has no ES {b if a != 'antithetic' else a} ablation run")

    rewards = population_rewards(m_ab) if not m_ab.empty else pd.DataFrame()
    if not rewards.empty and rewards["population"].nunique() >= 2:
        vals = []
        for model, g in rewards.groupby("model"):
            ns = sorted(g["population"])
            n_max = ns[-1]
            # the main population against the largest (paper B: 16 vs 64); else the next largest
            n_small = setup["main_n"] if setup["main_n"] in ns and setup["main_n"] < n_max else ns[-2]
            mm = m_ab[m_ab["model"] == model]
            mm = mm[mm["kind"].isin(["es", "es_pop"])]
            ca, cb = tail(mm[mm["population"] == n_small]), tail(mm[mm["population"] == n_max])
            vals.append((n_small, n_max, paired(ca, cb, "fitness_mean", unit="iteration")))
        d = pd.concat([v[2] for v in vals])
        put("b_population", _grouped(d, "diff", ("seed", "iteration")),
            budget="iterations (last 10%); N " + ", ".join(f"{a} vs {b}" for a, b, _ in vals), n=len(d))
    else:
        none("b_population", "config has no population sweep (es.ablations.population_sizes)")
    return out


# runs the alpha*sqrt(T d/N) theory is about: z-scored fitness (sum z^2 = N), independent members
ZSCORE_ONE_SIDED = {"es", "es_pop", "cl_es", "grpo->es"}


def theory_ratios(theory: pd.DataFrame) -> pd.DataFrame:
    """Per ES run: slope of sq_distance vs updates divided by the slope of theory_sq vs updates, and
    ``applies`` = the run is z-scored and one-sided (rank / raw / antithetic runs break sum z^2 = N)."""
    rows = []
    for (model, task, run), g in theory.groupby(["model", "task", "run"]):
        g = g.dropna(subset=["sq_distance", "theory_sq"])
        x = g["updates"].to_numpy(float) if "updates" in g else g["iteration"].to_numpy(float)
        if len(g) < 2 or np.ptp(x) == 0:
            continue
        slope = np.polyfit(x, g["sq_distance"].to_numpy(float), 1)[0]
        theory_slope = np.polyfit(x, g["theory_sq"].to_numpy(float), 1)[0]
        if theory_slope > 0:
            rows.append({"model": model, "task": task, "run": run, "ratio": slope / theory_slope,
                         "applies": g["run_kind"].iloc[0] in ZSCORE_ONE_SIDED})
    return pd.DataFrame(rows, columns=["model", "task", "run", "ratio", "applies"])


def js_gain_frame(data: Data) -> pd.DataFrame:
    """Per ES run: mean population JS diversity over training and its Pass@K gain over the base."""
    m, p = data.metrics, data.prompts
    cols = ["model", "task", "run", "variant", "js_diversity", "gain", "k"]
    if m.empty or p.empty or "js_diversity" not in m:
        return pd.DataFrame(columns=cols)
    k = max(_ks(data.setup))
    rows = []
    es = m[m["kind"].isin(ES_KINDS)].dropna(subset=["js_diversity"])
    base = p[p["kind"] == "base"]
    for (model, task, run), g in es.groupby(["model", "task", "run"]):
        trained = p[(p["run"] == run) & (p["model"] == model) & (p["train_task"] == task) & p["on_task"]]
        b = base[(base["model"] == model) & base["eval_task"].isin(judged_tasks(data.setup, model, task))]
        if trained.empty or b.empty:
            continue
        rows.append({"model": model, "task": task, "run": run, "variant": variant_of(run),
                     "js_diversity": g["js_diversity"].mean(),
                     "gain": trained[f"pass@{k}"].mean() - b[f"pass@{k}"].mean(), "k": k})
    return pd.DataFrame(rows, columns=cols)


def build_claims(data: Data) -> pd.DataFrame:
    est = claim_estimates(data)
    fill = est.pop("_ks")
    rows = []
    for claim in CLAIMS:
        e = est[claim.id]
        rows.append({"claim": _fill(claim, **fill), "estimate": e["estimate"], "lo": e["lo"], "hi": e["hi"],
                     "budget": e["budget"], "n": e["n"], "status": e["status"]})
    table = claims_table(rows)
    not_run = table["status"].str.startswith("not run")
    table.loc[not_run, "verdict"] = "not run"
    return table


def table_claims(input, output, params, wildcards, threads):
    setup = params["setup"]
    table = build_claims(Data(input, setup))
    caption = ("Claims of papers A and B, each judged from its measured analogue: estimate and 95% bootstrap CI "
               "[lo, hi]; verdict by esgrpo.analysis.claims.verdict (holds / does not hold / inconclusive when "
               "the CI straddles the bound); 'not run' where the config does not train what the claim needs.")
    shown = pd.DataFrame({
        "id": table["id"], "paper": table["paper"], "statement": table["statement"],
        "measured analogue": table["metric"],
        "test": [f"{c} {t:g}" + (f" (margin {m:g})" if m else "") for c, t, m in
                 zip(table["comparison"], table["threshold"], table["margin"], strict=True)],
        "estimate [95% CI]": [fmt_ci(m, lo, hi) for m, lo, hi in
                              zip(table["estimate"], table["lo"], table["hi"], strict=True)],
        "verdict": table["verdict"],
        "budget / note": [b if st == "measured" else st for b, st in
                          zip(table["budget"], table["status"], strict=True)],
    })
    write_paper_table(table, output, caption, shown)


# --------------------------------------------------------------------------- figures


def _figure(output: dict, draw, nrows: int = 1, ncols: int = 1, size=(4.5, 3.4), **kwargs) -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, **kwargs)
    try:
        draw(fig, axes)
        fig.tight_layout()
        save_figure(fig, output["png"], output["pdf"])
    finally:
        pyplot.close(fig)


def placeholder(output: dict, title: str, reason: str) -> None:
    def draw(fig, axes):
        ax = axes[0, 0]
        ax.axis("off")
        ax.text(0.5, 0.5, f"{title}\n\nnot run: {reason}", ha="center", va="center", wrap=True)

    _figure(output, draw)


def _sns():
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return sns


def figure_passk_curves(input, output, params, wildcards, threads):
    setup = params["setup"]
    data = Data(input, setup)
    test = data.on_task({"base", "es", "grpo", "es->grpo", "grpo->es"})
    if test.empty:
        return placeholder(output, "Pass@k curves", "no evaluations")
    rows = []
    for (model, task, method), g in test.groupby(["model", "task", "method"]):
        n = int(g["n"].max())
        for k in range(1, n + 1):
            vals = [_pass_at_k(int(nn), int(c), k) for nn, c in zip(g["n"], g["correct"], strict=True)]
            rows.append({"model": model, "task": task, "method": method, "k": k, "pass@k": float(np.nanmean(vals))})
    df = pd.DataFrame(rows)
    sns = _sns()
    panels = sorted(set(zip(df["model"], df["task"], strict=True)))

    def draw(fig, axes):
        for ax, (model, task) in zip(axes.ravel(), panels, strict=False):
            d = df[(df["model"] == model) & (df["task"] == task)]
            sns.lineplot(data=d, x="k", y="pass@k", hue="method", marker="o", ax=ax,
                         hue_order=[m for m in METHOD_ORDER if m in set(d["method"])])
            ax.set_xscale("log", base=2)
            ax.set_title(f"{model} / {task}")
        for ax in axes.ravel()[len(panels):]:
            ax.axis("off")

    _figure(output, draw, 1, max(1, len(panels)))


def _curve_figure(output, metrics: pd.DataFrame, y: str, xs: Sequence[str], title: str, hue: str = "method"):
    sns = _sns()
    panels = sorted(set(zip(metrics["model"], metrics["task"], strict=True)))

    def draw(fig, axes):
        for row, x in enumerate(xs):
            for col, (model, task) in enumerate(panels):
                ax = axes[row, col]
                d = metrics[(metrics["model"] == model) & (metrics["task"] == task)].dropna(subset=[y, x])
                if d.empty:
                    ax.axis("off")
                    continue
                sns.lineplot(data=d, x=x, y=y, hue=hue, ax=ax, errorbar=("se", 1.96))
                ax.set_title(f"{model} / {task}: {y} vs {x}")

    _figure(output, draw, len(xs), max(1, len(panels)))


def figure_entropy_curves(input, output, params, wildcards, threads):
    data = Data(input, params["setup"])
    m = data.metrics.dropna(subset=["entropy"]) if not data.metrics.empty else data.metrics
    if m.empty:
        return placeholder(output, "Entropy over training", "no ES / GRPO training curves with entropy")
    _curve_figure(output, m, "entropy", ["iteration", "rollouts"], "entropy")


def figure_fitness_curves(input, output, params, wildcards, threads):
    data = Data(input, params["setup"])
    m = data.metrics
    if m.empty:
        return placeholder(output, "Train reward", "no ES / GRPO training curves")
    _curve_figure(output, m, "fitness_mean", ["iteration", "rollouts"], "train reward")


def figure_population_curves(input, output, params, wildcards, threads):
    data = Data(input, params["setup"])
    m = data.metrics
    if m.empty or m["variant"].nunique() < 2:
        return placeholder(output, "Population sweep", "no population sweep in this config")
    m = m.assign(N=m["run"].map(lambda r: run_labels(r)["population"]).astype(int).astype(str))
    _curve_figure(output, m, "fitness_mean", ["iteration", "rollouts"], "train reward", hue="N")


def figure_js_diversity_vs_passk_gain(input, output, params, wildcards, threads):
    data = Data(input, params["setup"])
    js = js_gain_frame(data)
    if js.empty:
        return placeholder(output, "JS diversity vs Pass@K gain", "no ES runs with JS diversity")
    sns = _sns()
    k = int(js["k"].iloc[0])

    def draw(fig, axes):
        ax = axes[0, 0]
        sns.scatterplot(data=js, x="js_diversity", y="gain", hue="task", style="variant", ax=ax, s=60)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("mean population JS diversity over training (nats)")
        ax.set_ylabel(f"Pass@{k} - base Pass@{k}")
        r = pearson_ci(js["js_diversity"], js["gain"])
        ax.set_title(f"ES runs (Pearson r = {fmt_ci(*r, digits=2)})")

    _figure(output, draw, size=(5.5, 4))


def figure_es_norm_theory(input, output, params, wildcards, threads):
    data = Data(input, params["setup"])
    th = data.analysis("theory")
    if th.empty:
        return placeholder(output, "ES norm vs theory", "no norm-theory analyses")
    sns = _sns()
    x = "updates" if "updates" in th else "iteration"
    fits = theory_ratios(th)
    ratio = {(m, t, r): v for m, t, r, v in zip(fits["model"], fits["task"], fits["run"], fits["ratio"], strict=True)}
    applies = fits.loc[fits["applies"].astype(bool), "ratio"]

    def draw(fig, axes):
        ax = axes[0, 0]
        th2 = th.assign(label=[f"{t}/{r} (x{ratio.get((m, t, r), math.nan):.2f})" + (
            "" if k in ZSCORE_ONE_SIDED else ", theory n/a") for m, t, r, k in
            zip(th["model"], th["task"], th["run"], th["run_kind"], strict=True)])
        sns.scatterplot(data=th2, x=x, y="sq_distance", hue="label", ax=ax, s=25)
        for _label, g in th2[th2["run_kind"].isin(ZSCORE_ONE_SIDED)].groupby("label"):
            ax.plot(g[x], g["theory_sq"], ls="--", lw=1, color="black")
        ax.set_ylabel("||theta_t - theta_0||^2")
        ax.set_xlabel("ES updates T")
        summary = f"median slope ratio {applies.median():.2f}" if len(applies) else "no z-scored runs"
        ax.set_title(f"dashed: alpha^2 T d / N (z-scored runs); {summary}")
        ax.legend(title="run (slope / theory)", bbox_to_anchor=(1.02, 1), loc="upper left", fontsize=7)

    _figure(output, draw, size=(6.5, 4))


def figure_drift_by_module(input, output, params, wildcards, threads):
    data = Data(input, params["setup"])
    drift = data.analysis("drift")
    if drift.empty:
        return placeholder(output, "Drift by module type", "no drift analyses")
    norms = _drift_norms(drift[drift["run_kind"].isin(["es", "grpo"])], ["module_type"])
    sns = _sns()
    tasks = sorted(set(zip(norms["model"], norms["task"], strict=True)))

    def draw(fig, axes):
        for ax, (model, task) in zip(axes.ravel(), tasks, strict=False):
            d = norms[(norms["model"] == model) & (norms["task"] == task)]
            sns.barplot(data=d, x="module_type", y="relative_l2", hue="method", ax=ax, errorbar=None)
            ax.set_yscale("log")
            ax.set_title(f"{model} / {task}")
            ax.tick_params(axis="x", rotation=30)

    _figure(output, draw, 1, max(1, len(tasks)))


def figure_sparsity_curves(input, output, params, wildcards, threads):
    data = Data(input, params["setup"])
    sp = data.analysis("sparsity")
    if sp.empty or not (sp["kind"] == "top_fraction").any():
        return placeholder(output, "Functional sparsity", "no sparsity analyses")
    top = sp[sp["kind"] == "top_fraction"]
    if "eval_task" not in top:
        top = top.assign(eval_task=top["task"])
    sns = _sns()
    tasks = sorted(set(zip(top["model"], top["task"], top["eval_task"], strict=True)))
    base = _base_on_task(data)

    def draw(fig, axes):
        for ax, (model, task, eval_task) in zip(axes.ravel(), tasks, strict=False):
            d = top[(top["model"] == model) & (top["task"] == task) & (top["eval_task"] == eval_task)]
            long = d.melt(id_vars=["keep_fraction", "method"], value_vars=[c for c in ("greedy", "mean@n") if c in d],
                          var_name="metric", value_name="accuracy")
            sns.lineplot(data=long, x="keep_fraction", y="accuracy", hue="method", style="metric", marker="o", ax=ax)
            b = base[(base["model"] == model) & (base["eval_task"] == eval_task)] if not base.empty else base
            if not b.empty:
                ax.axhline(b["mean@n"].mean(), color="grey", ls=":", lw=1, label="base mean@n")
            ax.set_xscale("symlog", linthresh=0.01)
            ax.set_title(f"{model} / {task}" + (f" -> {eval_task}" if eval_task != task else ""))

    _figure(output, draw, 1, max(1, len(tasks)))


def figure_interpolation(input, output, params, wildcards, threads):
    data = Data(input, params["setup"])
    it = data.analysis("interpolation")
    if it.empty:
        return placeholder(output, "Interpolation", "no interpolation analyses (needs ES and GRPO)")
    sns = _sns()
    tasks = sorted(set(zip(it["model"], it["task"], strict=True)))

    def draw(fig, axes):
        for col, (model, task) in enumerate(tasks):
            d = it[(it["model"] == model) & (it["task"] == task)]
            paths = d[~d["path"].str.startswith("dir-")]
            dirs = d[d["path"].str.startswith("dir-")]
            for row, (sub, xlabel) in enumerate(((paths, "lambda"), (dirs, "distance from theta0 / ||dES||"))):
                ax = axes[row, col]
                if sub.empty:
                    ax.axis("off")
                    continue
                sns.lineplot(data=sub, x="lam", y="greedy", hue="path", style="eval_task", ax=ax, marker="o",
                             errorbar=None)
                ax.set_xlabel(xlabel)
                ax.set_title(f"{model} / trained on {task}")

    _figure(output, draw, 2, max(1, len(tasks)))


def figure_kl_heatmap(input, output, params, wildcards, threads):
    data = Data(input, params["setup"])
    kl = data.analysis("kl")
    if kl.empty:
        return placeholder(output, "KL heatmap", "no KL analyses")
    sns = _sns()
    panels = sorted(set(zip(kl["model"], kl["method"], strict=True)))
    vmax = float(kl["token_mean"].max())

    def draw(fig, axes):
        for ax, (model, method) in zip(axes.ravel(), panels, strict=False):
            d = kl[(kl["model"] == model) & (kl["method"] == method)]
            mat = d.pivot_table(index="task", columns="eval_task", values="token_mean", aggfunc="mean")
            sns.heatmap(mat, annot=True, fmt=".3f", cmap="viridis", vmin=0, vmax=vmax, ax=ax)
            ax.set_title(f"{model} / {method}: KL(base || model)")
            ax.set_ylabel("trained on")
            ax.set_xlabel("evaluated on")

    _figure(output, draw, 1, max(1, len(panels)), size=(4.8, 4))


def figure_sequential_matrix(input, output, params, wildcards, threads):
    setup = params["setup"]
    data = Data(input, setup)
    long = build_a_sequential(data)
    if long.empty:
        return placeholder(output, "Continual sequence", "no continual sequence in this config")
    acc = long[long["row"] == "accuracy"]
    sns = _sns()
    panels = sorted(set(zip(acc["model"], acc["method"], strict=True)))

    def draw(fig, axes):
        for ax, (model, method) in zip(axes.ravel(), panels, strict=False):
            d = acc[(acc["model"] == model) & (acc["method"] == method)]
            d = d.assign(stage_label=d["stage"].astype(str) + ": " + d["stage_task"])
            mat = d.pivot_table(index="stage_label", columns="eval_task", values="value", aggfunc="mean", sort=False)
            sns.heatmap(mat, annot=True, fmt=".2f", cmap="magma", vmin=0, vmax=1, ax=ax)
            ax.set_title(f"{model} / {method}: greedy accuracy")
            ax.set_ylabel("after stage")
            ax.set_xlabel("evaluated on")

    _figure(output, draw, 1, max(1, len(panels)), size=(4.8, 4))


TABLES = {name: globals()[f"table_{name}"] for name in [*PAPER_A_TABLES, *PAPER_B_TABLES, "claims"]}
FIGURES = {name: globals()[f"figure_{name}"] for name in [*PAPER_A_FIGURES, *PAPER_B_FIGURES]}


def run_paper_stage(input, output, params, wildcards, threads):
    """Dispatch of the single workflow script: params["stage"] names the table or figure."""
    name = params["stage"]
    fn = TABLES.get(name) or FIGURES.get(name)
    if fn is None:
        raise KeyError(f"unknown paper stage {name!r}")
    params = {**params, "setup": {**params["setup"], "wanted": NEEDS[name]}}
    fn(input=input, output=output, params=params, wildcards=wildcards, threads=threads)
