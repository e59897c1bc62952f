"""Where a grid's time goes: job-seconds per rule family, read from Snakemake's run logs.

A job's seconds run from the timestamp Snakemake prints when it starts the job to the one it prints
when the job finishes (1-s resolution), so they include process start and imports: what a job costs
on the machine, as opposed to the stage's own timers. Train and eval jobs are split by run family
(es, grpo, snapshot, sequential, continual; esgrpo.runs). Prints the machine's dense fp32 matmul
GFLOP/s beside the totals, so times compare across machines.

    python benchmarks/job_seconds.py .snakemake/log/2026-12-03T...snakemake.log [another.log]

Several logs (a run resumed after a kill) add up. With two logs and ``--compare``, the second is
"after": a table of both side by side, with the ratio.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from esgrpo.models.fingerprint import matmul_gflops  # noqa: E402
from esgrpo.runs import parse_run_name  # noqa: E402

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
START = re.compile(r"^(?:local)?rule (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
RUN = re.compile(r"^\s+wildcards: .*\brun=([\w.-]+)")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")


def family(rule: str, run: str | None) -> str:
    """The rule, split by the run's family for training and evaluation jobs."""
    if rule in ("train_run", "eval_run") and run:
        return f"{rule}:{parse_run_name(run).family}"
    return rule


def job_seconds(log: Path) -> tuple[dict[str, list[float]], float]:
    """{family: [seconds of each job]} and the log's wall time (first to last timestamp)."""
    stamp = first = None
    pending: dict[str, tuple[str, str | None, datetime]] = {}  # jobid -> (rule, run, started)
    block: dict | None = None  # the job-start block being read: rule, jobid, run, stamp
    out: dict[str, list[float]] = defaultdict(list)
    for line in log.read_text().splitlines():
        if block and not line.startswith(" "):  # the indented block of a job start has ended
            if block.get("jobid"):
                pending[block["jobid"]] = (block["rule"], block.get("run"), block["stamp"])
            block = None
        if m := STAMP.match(line):
            stamp = datetime.strptime(m[1], "%a %b %d %H:%M:%S %Y")
            first = first or stamp
        elif m := START.match(line):
            block = {"rule": m[1], "stamp": stamp}
        elif block and (m := JOBID.match(line)):
            block["jobid"] = m[1]
        elif block and (m := RUN.match(line)):
            block["run"] = m[1]
        elif m := FINISHED.match(line):
            rule, run, began = pending.pop(m[1], (m[2], None, stamp))
            out[family(rule, run)].append((stamp - began).total_seconds())
    return out, (stamp - first).total_seconds() if first else 0.0


def totals(logs: list[Path]) -> tuple[dict[str, list[float]], float]:
    merged: dict[str, list[float]] = defaultdict(list)
    wall = 0.0
    for log in logs:
        seconds, w = job_seconds(log)
        wall += w
        for k, v in seconds.items():
            merged[k] += v
    return merged, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--compare", action="store_true", help="two logs: before and after")
    args = parser.parse_args()
    # the size and duration of benchmarks/es_throughput.py's matmul_flops, so the numbers compare
    print(f"machine: dense fp32 matmul {matmul_gflops(size=2048, seconds=1.0):.0f} GFLOP/s (one thread)")
    runs = [totals([log]) for log in args.logs] if args.compare else [totals(args.logs)]
    names = sorted(set().union(*(r[0] for r in runs)), key=lambda k: -sum(runs[-1][0].get(k, [])))
    header = "family".ljust(34) + "".join(f"{'jobs':>6}{'job-s':>9}" for _ in runs) + ("   after/before" if args.compare else "")
    print(header)
    for name in names:
        cells = [(len(r[0].get(name, [])), sum(r[0].get(name, []))) for r in runs]
        line = name.ljust(34) + "".join(f"{n:>6}{s:>9.0f}" for n, s in cells)
        if args.compare and cells[0][1]:
            line += f"   {cells[1][1] / cells[0][1]:.2f}"
        print(line)
    for label, (seconds, wall) in zip(("before", "after") if args.compare else ("all",), runs, strict=False):
        n = sum(len(v) for v in seconds.values())
        print(f"{label}: {n} jobs, {sum(sum(v) for v in seconds.values()):.0f} job-seconds, wall {wall / 60:.1f} min")


if __name__ == "__main__":
    main()
