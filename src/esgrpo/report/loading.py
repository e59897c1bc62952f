"""Tidy files -> the frames the paper stages read.

Per-prompt evaluations (``eval_prompts.jsonl``), training curves (``metrics.jsonl``) and the
model analyses under ``{results_dir}/analysis/{model}/``; every row gets its run's seed, kind, method and
variant (the run name without its seed) from :mod:`esgrpo.runs`' grammar.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from esgrpo.estimators import pass_at_k
from esgrpo.files import read_jsonl
from esgrpo.report.planning import (
    ALIASED_ANALYSES,
    BASE,
    judged_tasks,
    method_of,
    run_kind,
    stage_one_aliases,
)
from esgrpo.report.registry import STAGES, stage_function
from esgrpo.runs import pair_arithmetic, pair_seed, parse_run_name


@functools.lru_cache(maxsize=65536)
def cached_pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k of one prompt (NaN for k > n), cached: the same (n, c, k) recur in every table."""
    return pass_at_k(n, c, k) if k <= n else math.nan


def seed_of(run: str) -> int:
    """The training seed of a run; -1 for the base model (one unit of its own)."""
    return -1 if run == BASE else parse_run_name(run).seed


def variant_of(run: str) -> str:
    """The run name without its seed: what seeds are averaged over (``es-n16``, ``cl_es-k2``)."""
    return BASE if run == BASE else parse_run_name(run).variant


def run_labels(run: str) -> dict:
    """population / normalization / antithetic / noise_rank / stage of a run (NaN / None where it does not
    apply; noise_rank NaN: full-rank noise)."""
    out = {"population": np.nan, "normalization": None, "antithetic": None, "noise_rank": np.nan, "stage": np.nan}
    if run == BASE:
        return out
    name = parse_run_name(run)
    if name.family in ("es", "snapshot"):
        out.update(population=name.population, normalization=name.normalization, antithetic=name.antithetic,
                   noise_rank=np.nan if name.rank is None else name.rank)
    elif name.family == "continual":
        out["stage"] = name.stage
    return out


def with_labels(df: pd.DataFrame) -> pd.DataFrame:
    """Adds population / normalization / antithetic / noise_rank / stage columns parsed from the run names."""
    if df.empty:
        return df.assign(population=np.nan, normalization=None, antithetic=None, noise_rank=np.nan, stage=np.nan)
    labels = pd.DataFrame([run_labels(r) for r in df["run"]], index=df.index)
    return df.drop(columns=[c for c in labels.columns if c in df]).join(labels)


def _kinds(runs: pd.Series, setup: dict) -> pd.Series:
    return runs.map(lambda r: run_kind(r, setup["main_n"], setup["main_g"], setup.get("main_rank")))


def _with_run_columns(df: pd.DataFrame, setup: dict, kind_column: str = "kind") -> pd.DataFrame:
    """seed, kind (named `kind_column`), method and variant of every row's run."""
    kinds = _kinds(df["run"], setup)
    return df.assign(**{"seed": df["run"].map(seed_of), kind_column: kinds,
                        "method": [method_of(r, k) for r, k in zip(df["run"], kinds, strict=True)],
                        "variant": df["run"].map(variant_of)})


def with_stage_one(frame: pd.DataFrame, task_column: str, setup: dict, key: str) -> pd.DataFrame:
    """`frame` plus a copy of every stage-1 main run's rows under its continual name, then only the
    kinds the stage reads (setup["wanted"], planning.NEEDS): a continual table sees stage 1, an ES
    table does not see it twice."""
    kinds = (setup.get("wanted") or {}).get(key)
    wanted = None if kinds is None or kinds == "all" else set(kinds)
    aliases = stage_one_aliases(setup)
    if frame.empty or not aliases:
        return frame
    keys = list(zip(frame[task_column], frame["run"], strict=True))
    alias = pd.Series([aliases.get(k) for k in keys], index=frame.index)
    copies = frame[alias.notna()].assign(run=alias[alias.notna()])
    out = pd.concat([frame, copies], ignore_index=True)
    if wanted is not None:
        out = out[_kinds(out["run"], setup).isin(wanted) | (out["run"] == BASE)].reset_index(drop=True)
    return out


def load_prompts(paths: Iterable[str], setup: dict) -> pd.DataFrame:
    """Per-prompt evaluation rows with seed, kind, method, variant, prompt key, ``on_task`` (the
    evaluation measures the run's own training, e.g. DeepScaleR -> MATH-500) and per-prompt metrics
    (greedy, mean@n, pass@k for every configured k, entropy per token)."""
    rows = [r for p in paths for r in read_jsonl(p)]
    columns = ["model", "run", "train_task", "eval_task", "id", "n", "correct", "greedy", "mean@n",
               "entropy", "seed", "kind", "method", "variant", "prompt", "on_task"]
    if not rows:
        return pd.DataFrame(columns=columns)
    df = _with_run_columns(with_stage_one(pd.DataFrame(rows), "train_task", setup, "prompts"), setup)
    df["prompt"] = df["model"] + "|" + df["eval_task"] + "|" + df["id"].astype(str)
    df["on_task"] = [e in judged_tasks(setup, m, t) for m, t, e in zip(df["model"], df["train_task"], df["eval_task"],
                                                                     strict=True)]
    df["greedy"] = df["greedy_correct"].astype(float) if "greedy_correct" in df else np.nan
    df["mean@n"] = df["correct"] / df["n"]
    df["entropy"] = df["entropy_sum"] / df["tokens"].clip(lower=1) if "entropy_sum" in df else np.nan
    ks = sorted({k for m in setup["ks"].values() for k in m})
    for k in ks:
        df[f"pass@{k}"] = [cached_pass_at_k(int(n), int(c), k) for n, c in zip(df["n"], df["correct"], strict=True)]
    return df


def load_metrics(paths: Iterable[str], jobs: Iterable[dict], setup: dict) -> pd.DataFrame:
    """Training curves: metrics.jsonl rows with model, task, run (each file's job: `jobs`, in the order of
    `paths`), seed, kind, variant."""
    frames = []
    for path, job in zip(paths, jobs, strict=True):
        rows = read_jsonl(path)
        if not rows:
            continue
        frames.append(pd.DataFrame(rows).assign(model=job["model"], task=job["task"], run=job["run"]))
    if not frames:
        return pd.DataFrame(columns=["model", "task", "run", "iteration", "fitness_mean", "rollouts",
                                     "generated_tokens", "entropy", "seed", "kind", "method", "variant"])
    df = _with_run_columns(with_stage_one(pd.concat(frames, ignore_index=True), "task", setup, "metrics"), setup)
    for column in ("entropy", "js_diversity", "generated_tokens", "rollouts"):
        if column not in df:
            df[column] = np.nan
    return df.sort_values(["model", "task", "run", "iteration"]).reset_index(drop=True)


def load_analysis(paths: Iterable[str], jobs: Iterable[dict], analysis: str, setup: dict) -> pd.DataFrame:
    """The CSVs of `analysis` with model, task and run (or, of an ES-GRPO pair, its seed and the arithmetic of
    its ES end: ``exact`` or a key of esgrpo.runs.ARITHMETIC_VARIANTS) of each file's job (`jobs`, in the order
    of `paths`)."""
    frames = []
    for path, job in zip(paths, jobs, strict=True):
        frame = pd.read_csv(path)
        if frame.empty:
            continue
        frame = frame.assign(model=job["model"], task=job["task"])
        seed = pair_seed(job["run"])
        if seed is not None:  # a pair analysis: its ES end is the main run (exact) or a paper's arithmetic's
            frame = frame.assign(seed=seed, run=job["run"], arithmetic=pair_arithmetic(job["run"]) or "exact")
        else:
            frame = frame.assign(run=job["run"])
            if analysis in ALIASED_ANALYSES:
                frame = with_stage_one(frame, "task", setup, analysis)
            frame = _with_run_columns(frame, setup, kind_column="run_kind")
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


class StageInputs:
    """The input frames of one stage, each loaded on first use. `input`: the rule's input (file lists by
    name); `jobs`: the job of each of those files, in the same order (esgrpo.report.planning.paper_input_jobs;
    needed for metrics and analyses, whose rows do not name their run)."""

    def __init__(self, input: dict, setup: dict, jobs: dict[str, list[dict]]):
        self.input, self.setup, self.jobs = input, setup, jobs

    def _list(self, key: str) -> list[str]:
        value = self.input.get(key, [])
        return [value] if isinstance(value, str) else list(value)

    def _jobs(self, key: str) -> list[dict]:
        paths, jobs = self._list(key), self.jobs.get(key, [])
        if len(jobs) != len(paths):
            raise ValueError(f"input {key!r}: {len(paths)} files but {len(jobs)} job records (params 'jobs')")
        return jobs

    @functools.cached_property
    def prompts(self) -> pd.DataFrame:
        return load_prompts(self._list("prompts"), self.setup)

    @functools.cached_property
    def metrics(self) -> pd.DataFrame:
        return load_metrics(self._list("metrics"), self._jobs("metrics"), self.setup)

    def analysis(self, name: str) -> pd.DataFrame:
        if name not in self.__dict__:
            self.__dict__[name] = load_analysis(self._list(name), self._jobs(name), name, self.setup)
        return self.__dict__[name]

    def on_task(self, kinds: Iterable[str]) -> pd.DataFrame:
        """Prompts of runs of `kinds` evaluated on their own training task; base rows on every task,
        with ``task`` = the task the row speaks for."""
        prompts = self.prompts
        if prompts.empty:
            return prompts.assign(task=pd.Series(dtype=str))
        kinds = set(kinds)
        own = prompts[prompts["kind"].isin(kinds - {BASE}) & prompts["on_task"]]
        base = prompts[prompts["kind"].eq(BASE)] if BASE in kinds else prompts.iloc[0:0]
        return pd.concat([own, base]).assign(task=lambda d: d["eval_task"])

    def base_prompts(self) -> pd.DataFrame:
        """The base model's evaluation rows."""
        prompts = self.prompts
        return prompts[prompts["kind"] == BASE] if not prompts.empty else prompts


def run_paper_stage(input, output, params, wildcards, threads) -> None:
    """Runs the table or figure params["stage"] on its inputs, reading only the run kinds it needs."""
    name = params["stage"]
    setup = {**params["setup"], "wanted": STAGES[name].needs}
    stage_function(name)(StageInputs(input, setup, params["jobs"]), output)
