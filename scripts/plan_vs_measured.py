"""The resource plan's host memory beside each job's measured peak, for a grid that has run (docs/rehearsal.md).

    python scripts/plan_vs_measured.py results/rehearsal            # Markdown on stdout

Reads {grid}/plan.csv (`snakemake --configfile=... plan`) and the Snakemake benchmark file of every job
({grid}/benchmarks/...: max_rss and max_pss in MiB, summed over the job's process tree, which holds its vLLM
engine processes and Ray's). The held-out benchmark jobs (lm-eval) have no plan row of their own: their rules
take the memory planned for the same checkpoint's evaluation (rules/heldout.smk), and are compared with it.
Prints one row per job kind (rule, method, backend): the planned host memory, the largest measured RSS and
PSS, and measured PSS / planned of each job; then one row per job. A kind with a job whose PSS is more than 25%
away from its plan is marked; PSS counts a page shared by the job's processes (torch's libraries) once, as the
job's cgroup does, where RSS counts it in every process.
"""

from __future__ import annotations

import csv
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


def rows(grid: Path) -> list[dict[str, object]]:
    """One row per job that has both a plan row and a benchmark file."""
    out = []
    with (grid / "plan.csv").open(newline="") as f:
        plan = list(csv.DictReader(f))
    for row in plan:
        planned_mib = float(row["host_mem_gib"]) * 1024
        kind = f"{row['rule']} ({row['method']})"
        jobs = [(kind, benchmark_file(grid, row))]
        jobs += [(f"{p.stem.split('_', 1)[0]}_{row['rule'].split('_')[1]} (lm-eval)", p) for p in heldout_files(grid, row)]
        for name, path in jobs:
            if not path.exists():
                continue
            label = f"{row['model']}/{row['task']}/{row['run']}" + (f" {path.stem}" if "lm-eval" in name else "")
            out.append({"kind": name, "job": label, "planned_mib": planned_mib, "mem_mb": int(row["mem_mb"]),
                        **measured(path)})
    return out


def kind_table(found: list[dict[str, object]]) -> list[str]:
    """One row per job kind: the planned and measured ranges and each job's PSS / plan (a kind is within the
    tolerance when every one of its jobs is)."""
    lines = ["| job kind | jobs | planned host GiB | measured max RSS GiB | measured max PSS GiB | PSS / plan per job "
             "| within 25% |", "|---|---|---|---|---|---|---|"]
    kinds: dict[str, list[dict[str, object]]] = {}
    for r in found:
        kinds.setdefault(str(r["kind"]), []).append(r)

    def span(values: list[float], scale: float = 1024, digits: int = 2) -> str:
        low, high = min(values) / scale, max(values) / scale
        return f"{low:.{digits}f}" if f"{low:.{digits}f}" == f"{high:.{digits}f}" else f"{low:.{digits}f}-{high:.{digits}f}"

    for kind, jobs in sorted(kinds.items()):
        ratios = [float(j["pss"]) / float(j["planned_mib"]) for j in jobs]
        ok = "yes" if all(abs(r - 1) <= TOLERANCE for r in ratios) else "**no**"
        lines.append(f"| {kind} | {len(jobs)} | {span([float(j['planned_mib']) for j in jobs])} | "
                     f"{span([float(j['rss']) for j in jobs])} | {span([float(j['pss']) for j in jobs])} | "
                     f"{span(ratios, 1)} | {ok} |")
    return lines


def job_table(found: list[dict[str, object]]) -> list[str]:
    lines = ["| job kind | job | planned GiB | mem_mb asked | max RSS GiB | max PSS GiB | PSS / plan | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(found, key=lambda r: (str(r["kind"]), str(r["job"]))):
        lines.append(f"| {r['kind']} | {r['job']} | {float(r['planned_mib']) / 1024:.2f} | {r['mem_mb']} | "
                     f"{float(r['rss']) / 1024:.2f} | {float(r['pss']) / 1024:.2f} | "
                     f"{float(r['pss']) / float(r['planned_mib']):.2f} | {float(r['s']):.0f} |")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    grid = Path(argv[0])
    if not (grid / "plan.csv").exists():
        print(f"{grid / 'plan.csv'}: not found; write it with `snakemake --configfile=<config> plan`", file=sys.stderr)
        return 2
    found = rows(grid)
    print("\n".join(["## Host memory by job kind", "", *kind_table(found), "", "## Every job", "", *job_table(found)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
