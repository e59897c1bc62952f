"""Markdown tables of what changed between plan.csv files of one config (docs/plan_changes.md).

    python scripts/compare_plans.py NAME BEFORE.csv LABEL=AFTER.csv [LABEL=AFTER.csv ...]

Each plan.csv is what `snakemake --configfile=... plan` writes (results/<grid>/plan.csv). Printed: GPU-hours
by rule in every file, then every job whose GPUs, GPU memory per GPU or GPU-hours differ between any
two files; jobs of one rule and model with the same numbers everywhere share a row (their tasks and
runs listed).
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict

KEY = ("rule", "model", "task", "run")


def read(path: str) -> dict[tuple[str, ...], dict[str, str]]:
    with open(path, newline="") as f:
        return {tuple(r[k] for k in KEY): r for r in csv.DictReader(f)}


def by_rule(plan: dict[tuple[str, ...], dict[str, str]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for row in plan.values():
        out[f"{row['rule']} ({row['method']})"] += float(row["gpu_hours"])
    return out


def numbers(row: dict[str, str]) -> tuple[str, str, str]:
    return row["gpus"], row["gpu_mem_gib"] or "-", row["gpu_hours"]


def main(name: str, before: str, afters: list[str]) -> None:
    plans = {"before": read(before)} | {a.split("=", 1)[0]: read(a.split("=", 1)[1]) for a in afters}
    labels = list(plans)
    first = plans["before"]
    if any(set(p) != set(first) for p in plans.values()):
        raise SystemExit(f"{name}: the plans list different jobs")
    print(f"### {name}: GPU-hours by rule\n")
    print("| rule | " + " | ".join(labels) + " |")
    print("|---|" + "---:|" * len(labels))
    rules = by_rule(first)
    sums = {label: by_rule(plan) for label, plan in plans.items()}
    for rule in sorted(rules):
        print(f"| {rule} | " + " | ".join(f"{sums[label][rule]:.1f}" for label in labels) + " |")
    print("| **total** | " + " | ".join(f"**{sum(sums[label].values()):.1f}**" for label in labels) + " |\n")

    groups: dict[tuple, list[tuple[str, ...]]] = defaultdict(list)
    for key in first:
        values = tuple(numbers(plans[label][key]) for label in labels)
        if len(set(values)) > 1:
            groups[(key[0], key[1], values)].append(key)
    print(f"### {name}: jobs whose GPUs, GPU GiB per GPU or GPU-hours changed ({sum(map(len, groups.values()))} "
          f"of {len(first)})\n")
    print("| rule | model | tasks | runs | " + " | ".join(f"{label}: GPUs, GiB/GPU, GPU-h" for label in labels) + " |")
    print("|---|---|---|---|" + "---|" * len(labels))
    for (rule, model, values), keys in groups.items():
        tasks = ", ".join(dict.fromkeys(k[2] for k in keys))
        runs = ", ".join(dict.fromkeys(k[3] for k in keys))
        cells = " | ".join(f"{g} x {m}, {h}" for g, m, h in values)
        print(f"| {rule} | {model} | {tasks} | {runs} | {cells} |")
    print()


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
