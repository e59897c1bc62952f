"""The numbers the papers report, keyed by the cell of our tables they belong to, so a table built
from a paper config shows the paper's value beside ours.

A key is ``(table, model source, task, method, detail)``: the model as the Hub names it (a config's
``models.<name>.source``, so a model keyed here is the paper's model whatever the config calls it),
the config's task name (paper A's loaders: countdown, math, chemistry, boolq; paper B's gsm8k, and
math = MATH-500 for the DeepScaleR model), the method column, and what else tells the cell apart:
the continual stage (a_update_norms), the metric (b_passk), before / after / after - before
(a_heldout), the quantity (b_drift), None where nothing else does (a_accuracy). A table built from
any other config (the default grid's tiny model and toy tasks) finds no key and shows no paper value.

Every value cites where it comes from (docs/references.md, and the papers' public code where the
number is in it); ``secondary`` marks the (2°) figures of secondary summaries. The claims catalog's
``paper_value`` figures (report/claims.yaml) are these numbers too: tests/report/test_paper_tables.py checks it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from esgrpo.report.planning import snapshot_method

PAPER_A_QWEN = "Qwen/Qwen3-4B-Instruct-2507"
PAPER_A_ORDER = ("countdown", "math", "chemistry", "boolq")  # its continual sequence
PAPER_B_QWEN_1_5B = "Qwen/Qwen2.5-1.5B-Instruct"
PAPER_B_QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"
PAPER_B_R1_DISTILL = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"


@dataclass(frozen=True)
class PaperValue:
    """One reported number: its value, the paper, where it is written down, and whether it is (2°)."""

    value: float
    paper: str
    source: str
    secondary: bool = False

    @property
    def label(self) -> str:
        """``paper A (docs/references.md)``, with ``2°`` for a secondary figure."""
        return f"paper {self.paper} ({'2°, ' if self.secondary else ''}{self.source})"


_REFERENCES = "docs/references.md"
# paper B's public code (github.com/yunpengba7/understanding-es), its GSM8K reference evaluation
_PAPER_B_CODE = "docs/references.md; understanding-es reference/results.json"
# paper B's hard-maths figures average several benchmarks: b_passk's task "average" row (BENCHMARK_AVERAGE)
BENCHMARK_AVERAGE = "average"
_PAPER_B_HARD = "docs/references.md, hard-maths average; ours: the mean over the config's benchmarks"


def _paper_a_values() -> dict[tuple, PaperValue]:
    values: dict[tuple, PaperValue] = {}
    # Update norm ||theta - theta0||_2 after each continual stage (= alpha sqrt(T d/N) at T = 100..400).
    norms = {"ES": (87.28, 122.76, 149.99, 173.00), "GRPO": (1.00, 1.15, 1.65, 1.84)}
    for method, per_stage in norms.items():
        for stage, (task, norm) in enumerate(zip(PAPER_A_ORDER, per_stage, strict=True), 1):
            values[("a_update_norms", PAPER_A_QWEN, task, method, stage)] = PaperValue(norm, "A", _REFERENCES)
    # Test greedy accuracy (2°), Qwen3-4B: base / ES 100 it / ES 300 it / GRPO, as fractions.
    accuracy = {"countdown": (20.5, 75.1, 78.6, 74.5), "math": (61.8, 72.4, 74.0, 68.8),
                "chemistry": (63.4, 68.1, 76.5, 74.9), "boolq": (83.7, 87.2, 88.1, 86.6)}
    for task, row in accuracy.items():
        for method, percent in zip(("base", snapshot_method(100), "ES", "GRPO"), row, strict=True):
            values[("a_accuracy", PAPER_A_QWEN, task, method, None)] = PaperValue(
                percent / 100, "A", _REFERENCES, secondary=True)
    # Held-out accuracy before -> after the continual sequence (MMLU, IFEval), as fractions.
    heldout = {("mmlu", "ES"): (77.5, 73.8), ("ifeval", "ES"): (79.7, 81.9),
               ("mmlu", "GRPO"): (77.5, 78.3), ("ifeval", "GRPO"): (79.7, 78.4)}
    for (task, method), (before, after) in heldout.items():
        for detail, percent in (("before", before), ("after", after), ("after - before", after - before)):
            values[("a_heldout", PAPER_A_QWEN, task, method, detail)] = PaperValue(percent / 100, "A", _REFERENCES)
    return values


# Paper B's code's reference evaluation of Qwen2.5-1.5B-Instruct on GSM8K's 1,319 test questions
# (github.com/yunpengba7/understanding-es reference/results.json at 6e7e67d, and expected_results.json's
# mean_absolute_tolerance at 240d878): greedy, and n=32 at T=0.6 (Pass@1 = mean@32), graded by its
# is_gsm8k_correct (`rewards.rules: paper_b`), for the base and for ES after step 234 (two epochs). Its
# code evaluates no step-117 checkpoint, so the one-epoch snapshot (es-n32-it117-s0) has no reference.
PAPER_B_GSM8K_REFERENCE: dict[str, dict[str, float]] = {
    "base": {"greedy_correct": 988, "greedy_total": 1319, "pass@1": 0.702710386656558,
             "pass@16": 0.9482999740850728, "pass@32": 0.9636087945413192},
    "ES": {"greedy_correct": 966, "greedy_total": 1319, "pass@1": 0.7319939347990903,
           "pass@16": 0.9489579075954446, "pass@32": 0.9658832448824868},
}
PAPER_B_GSM8K_TOLERANCE = 0.005  # its expected_results.json: mean absolute tolerance of an accuracy


def _paper_b_values() -> dict[tuple, PaperValue]:
    values: dict[tuple, PaperValue] = {}
    gsm8k = {method: tuple(ref[m] for m in ("pass@1", "pass@16", "pass@32"))
             for method, ref in PAPER_B_GSM8K_REFERENCE.items()}
    # Hard setting (2°): DeepSeek-R1-Distill-Qwen-1.5B trained on DeepScaleR, Pass@1/16/32 in %.
    hard = {"base": (47.7, 73.5, 77.4), "ES": (49.9, 75.0, 78.9), "GRPO": (52.9, 74.7, 78.0),
            "ES->GRPO": (52.3, 75.8, 79.2)}
    for method, row in gsm8k.items():
        for metric, value in zip(("pass@1", "pass@16", "pass@32"), row, strict=True):
            values[("b_passk", PAPER_B_QWEN_1_5B, "gsm8k", method, metric)] = PaperValue(value, "B", _PAPER_B_CODE)
    for method, row in hard.items():
        for metric, percent in zip(("pass@1", "pass@16", "pass@32"), row, strict=True):
            values[("b_passk", PAPER_B_R1_DISTILL, BENCHMARK_AVERAGE, method, metric)] = PaperValue(
                percent / 100, "B", _PAPER_B_HARD, secondary=True)
    # ES drifts up to 44.1x farther than GRPO (whole-model relative L2), at Qwen2.5-7B-Instruct on GSM8K.
    values[("b_drift", PAPER_B_QWEN_7B, "gsm8k", "ES/GRPO", "relative L2 ratio")] = PaperValue(44.1, "B", _REFERENCES)
    # Not keyed: "up to 92.64% of ES's changed coordinates can be dropped" (Llama-3.2-3B) is a droppable
    # fraction; b_sparsity reports accuracy and retained gain per keep fraction (0.0736 = 1 - 0.9264 is one).
    return values


PAPER_VALUES: dict[tuple, PaperValue] = {**_paper_a_values(), **_paper_b_values()}


def paper_value(setup: dict, table: str, model: str, task: str, method: str,
                detail: object = None) -> PaperValue | None:
    """The paper's value of a cell, or None (the config's model is not the paper's, or no value reported)."""
    source = setup.get("sources", {}).get(model)
    return PAPER_VALUES.get((table, source, task, method, detail))


def with_paper_rows(long: pd.DataFrame, label: str, lookup: Callable[[pd.Series], PaperValue | None]) -> pd.DataFrame:
    """`long` (value / value_lo / value_hi rows) plus, under each row the paper reports (``lookup``),
    a row with the paper's value and one with ours - paper; the column `label` says which
    (``<label>: paper A (docs/references.md)``, ``<label>: ours - paper A``). Where the paper reports
    none of the rows (any config but the papers'), `long` itself."""
    reported = [lookup(row) for _, row in long.iterrows()]
    if all(r is None for r in reported):
        return long
    rows = []
    for (_, row), paper in zip(long.iterrows(), reported, strict=True):
        rows.append(row.to_dict())
        if paper is None:
            continue
        rows.append({**row.to_dict(), label: f"{row[label]}: {paper.label}", "value": paper.value,
                     "value_lo": float("nan"), "value_hi": float("nan")})
        rows.append({**row.to_dict(), label: f"{row[label]}: ours - paper {paper.paper}",
                     "value": row["value"] - paper.value, "value_lo": row["value_lo"] - paper.value,
                     "value_hi": row["value_hi"] - paper.value})
    return pd.DataFrame(rows, columns=long.columns)


def paper_notes(setup: dict, table: str, long: pd.DataFrame, label: str) -> list[str]:
    """The note under a table with paper rows (what they are), or, when the config has a paper's model
    but none of its rows is a cell the paper reports, that note instead; nothing for any other config."""
    if not long.empty and long[label].astype(str).str.contains(": ours - paper ").any():
        return [f"From a paper config: under each cell the paper reports, '{label}: paper X (source)' is the "
                f"paper's value (2° = a secondary summary's figure) and '{label}: ours - paper X' ours minus it."]
    sources = set(setup.get("sources", {}).values())
    tasks = sorted({key[2] for key in PAPER_VALUES if key[0] == table and key[1] in sources})
    if not tasks:
        return []
    return [f"The paper reports this table's cells on {', '.join(tasks)} for this config's model(s); no row here "
            "is one of them (not evaluated in this config), so no paper value is shown."]
