"""The resource plan's host memory beside each job's measured peak, for a grid that has run (docs/rehearsal.md).

    python scripts/plan_vs_measured.py results/rehearsal [--since 2026-12-05T02:40]   # Markdown on stdout

Reads {grid}/plan.csv (`snakemake --configfile=... plan`), the Snakemake benchmark file of every job
({grid}/benchmarks/...: max_rss and max_pss in MiB, summed over the job's process tree, which holds its vLLM
engine processes and Ray's) and, where the jobs ran under Slurm, `sacct`'s MaxRSS of each job's newest
completed run. The held-out benchmark jobs (lm-eval) have no plan row of their own: their rules take the
memory planned for the same checkpoint's evaluation (rules/heldout.smk), and are compared with it.

Two samplers, both lower bounds of the true peak: Snakemake samples a benchmark every 0.5 s for a job's first
15 s, then every 30 s (snakemake/benchmark.py, BENCHMARK_INTERVAL), so a peak after a job's first 15 s can fall
between two samples; Slurm samples every JobAcctGatherFrequency seconds the job step's processes, Snakemake's
own job process (~0.1-0.2 GiB) included. scripts/slurm_local.sh sets `JobAcctGatherParams=UsePss` and a
1-s frequency: sacct's MaxRSS is then the PSS of the step. `--since T` says which Slurm jobs ran so (started at
or after T); earlier ones report RSS, which counts a page shared by several processes in each, and are
printed but not judged. The measured peak of a job is the larger PSS of the two; a kind is within 25% when
every job of it is.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

TOLERANCE = 0.25


def benchmark_file(grid: Path, row: dict[str, str]) -> Path:
    """Where the rule of a plan row writes its Snakemake benchmark (rules/*.smk, `benchmark:`)."""
    rule, model, task, run = row["rule"], row["model"], row["task"], row["run"]
    bench = grid / "benchmarks"
    if rule == "train_run":
        return bench / model / task / run / "train.tsv"
    if rule == "eval_base":
        return bench / model / "base" / "eval.tsv"
    if rule == "eval_run":
        return bench / model / task / run / "eval.tsv"
    if rule == "analysis_base_samples":
        return bench / "analysis" / model / "base_samples" / f"{task}.tsv"
    return bench / "analysis" / model / rule.removeprefix("analysis_") / task / f"{run}.tsv"


def slurm_comment(rule: str, model: str, task: str, run: str, bench: str | None = None) -> str:
    """The comment the SLURM executor plugin gives a job: rule_<rule>_wildcards_<its wildcards' values>."""
    if rule == "eval_base":
        values = [model]
    elif rule == "analysis_base_samples":
        values = [model, task]
    elif bench is not None:
        values = [model, bench] if rule == "heldout_base" else [model, task, run, bench]
    elif rule in ("analysis_cosine", "analysis_interpolation"):  # named by a seed, the plan's run "s<seed>"
        values = [model, task, run.removeprefix("s")]
    else:
        values = [model, task, run]
    return f"rule_{rule}_wildcards_{'_'.join(values)}"


def slurm_max_rss(since: str | None = None) -> dict[str, tuple[float, bool]]:
    """{job comment: (MaxRSS in MiB of its newest completed Slurm job, the largest of its steps; whether that job
    started at or after `since`, i.e. under UsePss)}; {} without sacct."""
    if shutil.which("sacct") is None:
        return {}
    out = subprocess.run(["sacct", "-a", "-S", "2026-01-01", "-n", "-P", "--units=M", "-o",
                          "JobID,Comment,MaxRSS,State,Start"], capture_output=True, text=True, check=False).stdout
    found: dict[str, tuple[float, bool]] = {}
    comment, rss, ok, pss = "", 0.0, False, False
    for line in out.splitlines() + ["||||"]:
        job, note, max_rss, state, start = (line.split("|") + [""] * 5)[:5]
        if "." not in job:  # a new job: keep the previous one if it completed (sacct lists jobs oldest first)
            if comment and ok:
                found[comment] = (rss, pss)
            comment, rss, ok, pss = note, 0.0, state == "COMPLETED", since is not None and start >= since
        elif max_rss:
            rss = max(rss, float(max_rss.rstrip("M")))
    return found


def heldout_files(grid: Path, row: dict[str, str]) -> list[Path]:
    """The held-out benchmark jobs sized by the evaluation job of `row` (same checkpoint)."""
    if row["rule"] == "eval_base":
        return sorted((grid / "benchmarks" / row["model"] / "base").glob("heldout_*.tsv"))
    if row["rule"] == "eval_run":
        return sorted((grid / "benchmarks" / row["model"] / row["task"] / row["run"]).glob("heldout_*.tsv"))
    return []


def measured(path: Path) -> dict[str, float]:
    """Seconds, max RSS and max PSS (MiB) of one Snakemake benchmark file (the last attempt's line)."""
    with path.open(newline="") as f:
        last = list(csv.DictReader(f, delimiter="\t"))[-1]
    return {"s": float(last["s"]), "rss": float(last["max_rss"]), "pss": float(last["max_pss"])}


def rows(grid: Path, slurm: dict[str, tuple[float, bool]] | None = None) -> list[dict[str, object]]:
    """One row per job that has both a plan row and a benchmark file."""
    out = []
    with (grid / "plan.csv").open(newline="") as f:
        plan = list(csv.DictReader(f))
    slurm = slurm or {}
    for row in plan:
        if row["rule"].startswith("heldout_"):
            continue  # its own row holds the memory of its checkpoint's evaluation: judged through that row below
        planned_mib = float(row["host_mem_gib"]) * 1024
        kind = f"{row['rule']} ({row['method']})"
        jobs = [(kind, benchmark_file(grid, row), None)]
        jobs += [(f"heldout_{row['rule'].split('_')[1]} (lm-eval)", p, p.stem.removeprefix("heldout_"))
                 for p in heldout_files(grid, row)]
        for name, path, bench in jobs:
            if not path.exists():
                continue
            rule = f"heldout_{row['rule'].split('_')[1]}" if bench else row["rule"]
            label = f"{row['model']}/{row['task']}/{row['run']}" + (f" {bench}" if bench else "")
            comment = slurm_comment(rule, row["model"], row["task"], row["run"], bench)
            bench_file = measured(path)
            slurm_rss, slurm_pss = slurm.get(comment, (None, False))
            peak = max(bench_file["pss"], slurm_rss if slurm_pss and slurm_rss is not None else 0.0)
            out.append({"kind": name, "job": label, "planned_mib": planned_mib, "mem_mb": int(row["mem_mb"]),
                        **bench_file, "slurm_rss": slurm_rss, "slurm_pss": slurm_pss, "peak": peak})
    return out


def kind_table(found: list[dict[str, object]]) -> list[str]:
    """One row per job kind: the planned and measured ranges and each job's peak / plan (a kind is within the
    tolerance when every one of its jobs is)."""
    lines = ["| job kind | jobs | planned host GiB | benchmark max PSS GiB | sacct MaxPSS GiB | peak / plan per job "
             "| within 25% |", "|---|---|---|---|---|---|---|"]
    kinds: dict[str, list[dict[str, object]]] = {}
    for r in found:
        kinds.setdefault(str(r["kind"]), []).append(r)

    def span(values: list[float], scale: float = 1024, digits: int = 2) -> str:
        if not values:
            return ""
        low, high = min(values) / scale, max(values) / scale
        return f"{low:.{digits}f}" if f"{low:.{digits}f}" == f"{high:.{digits}f}" else f"{low:.{digits}f}-{high:.{digits}f}"

    for kind, jobs in sorted(kinds.items()):
        ratios = [float(j["peak"]) / float(j["planned_mib"]) for j in jobs]
        ok = "yes" if all(abs(r - 1) <= TOLERANCE for r in ratios) else "**no**"
        sacct = [float(j["slurm_rss"]) for j in jobs if j.get("slurm_pss")]
        lines.append(f"| {kind} | {len(jobs)} | {span([float(j['planned_mib']) for j in jobs])} | "
                     f"{span([float(j['pss']) for j in jobs])} | {span(sacct)} | {span(ratios, 1)} | {ok} |")
    return lines


def job_table(found: list[dict[str, object]]) -> list[str]:
    lines = ["| job kind | job | planned GiB | mem_mb asked | benchmark max RSS / PSS GiB | sacct MaxRSS GiB | peak / plan "
             "| seconds |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(found, key=lambda r: (str(r["kind"]), str(r["job"]))):
        slurm = "" if r.get("slurm_rss") is None else f"{float(r['slurm_rss']) / 1024:.2f}" + (" (PSS)" if r["slurm_pss"] else " (RSS)")
        lines.append(f"| {r['kind']} | {r['job']} | {float(r['planned_mib']) / 1024:.2f} | {r['mem_mb']} | "
                     f"{float(r['rss']) / 1024:.2f} / {float(r['pss']) / 1024:.2f} | {slurm} | "
                     f"{float(r['peak']) / float(r['planned_mib']):.2f} | {float(r['s']):.0f} |")
    return lines


def main(argv: list[str]) -> int:
    since = None
    if len(argv) == 3 and argv[1] == "--since":
        argv, since = argv[:1], argv[2]
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    grid = Path(argv[0])
    if not (grid / "plan.csv").exists():
        print(f"{grid / 'plan.csv'}: not found; write it with `snakemake --configfile=<config> plan`", file=sys.stderr)
        return 2
    found = rows(grid, slurm_max_rss(since))
    print("\n".join(["## Host memory by job kind", "", *kind_table(found), "", "## Every job", "", *job_table(found)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
