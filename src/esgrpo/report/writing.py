"""The one table writer: CSV (the numbers, tidy), Markdown and LaTeX (the same numbers for reading).

In the CSV a cell with an interval is three columns (``value``, ``value_lo``, ``value_hi``); in
Markdown and LaTeX it is one text cell ``mean [lo, hi]`` and other floats have three decimals.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from esgrpo.io import atomic_write_text
from esgrpo.report.planning import METHOD_ORDER
from esgrpo.report.stats import BUDGETS


def fmt_ci(mean: float, lo: float, hi: float, digits: int = 3) -> str:
    """``mean [lo, hi]``; the mean alone where there is no interval; ``n/a`` where there is no mean."""
    if mean is None or pd.isna(mean):
        return "n/a"
    if pd.isna(lo) or pd.isna(hi):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def format_floats(df: pd.DataFrame) -> pd.DataFrame:
    """Float columns as text with 3 decimals ("" for NaN); other columns keep their type."""
    out = df.copy()
    for column in out.columns:
        if pd.api.types.is_float_dtype(out[column]):
            out[column] = out[column].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    return out


def display_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Columns X, X_lo, X_hi -> one text column X = "mean [lo, hi]"; other floats to 3 decimals; every
    missing cell empty."""
    out = df.copy()
    for column in list(out.columns):
        if f"{column}_lo" in out and f"{column}_hi" in out:
            out[column] = [fmt_ci(m, lo, hi) for m, lo, hi in
                           zip(out[column], out[f"{column}_lo"], out[f"{column}_hi"], strict=True)]
            out = out.drop(columns=[f"{column}_lo", f"{column}_hi"])
    out = format_floats(out)
    return out.astype(object).where(out.notna(), "")


def wide(long: pd.DataFrame, index: Sequence[str], columns: str = "method", order: Sequence[str] = ()) -> pd.DataFrame:
    """A display pivot of a long table: one text cell "mean [lo, hi]" per (index, column)."""
    if long.empty:
        return long
    cells = [fmt_ci(m, lo, hi) for m, lo, hi in zip(long["value"], long["value_lo"], long["value_hi"], strict=True)]
    if "at_step" in long:  # budget rows: say which logged steps each value comes from (its window)
        spans = long["window"] if "window" in long else [None] * len(long)
        cells = [c if pd.isna(s) or s == "" else (f"{c} ({w if isinstance(w, str) and w else f'step {s}'})"
                                                  if c != "n/a" else f"n/a ({s})")
                 for c, s, w in zip(cells, long["at_step"], spans, strict=True)]
    cell = long.assign(_cell=cells)
    table = cell.pivot_table(index=list(index), columns=columns, values="_cell", aggfunc="first", sort=False)
    present = [c for c in order if c in table.columns] + [c for c in table.columns if c not in order]
    table = table[present].fillna("").reset_index()
    table.columns.name = None
    return table


def order_rows(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Rows sorted by `by` (methods in METHOD_ORDER, budgets iterations first); the key columns
    first and value / value_lo / value_hi last."""
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


def markdown_table(shown: pd.DataFrame) -> str:
    """GitHub Markdown of a display frame; a `|` inside a cell (e.g. ||theta||) is escaped so it
    cannot split the cell into columns."""
    if shown.empty:
        return "(no rows)"
    escaped = shown.copy()
    escaped.columns = [str(c).replace("|", "\\|") for c in escaped.columns]
    for column in escaped.columns:
        escaped[column] = escaped[column].map(lambda v: v.replace("|", "\\|") if isinstance(v, str) else v)
    return escaped.to_markdown(index=False)


def write_table(table: pd.DataFrame, output: dict, caption: str, shown: pd.DataFrame | None = None,
                notes: Sequence[str] = ()) -> None:
    """`output` csv = `table` (tidy numbers); md and tex = `shown`, the frame for reading (default:
    ``display_frame(table)``), after the caption and `notes`."""
    atomic_write_text(output["csv"], table.to_csv(index=False))
    shown = display_frame(table) if shown is None else shown
    text = caption + "".join(f"\n\n{n}" for n in notes)
    atomic_write_text(output["md"], f"{text}\n\n{markdown_table(shown)}\n")
    latex_caption = " ".join([caption, *notes])
    latex = shown.to_latex(index=False, caption=latex_caption, escape=True) if not shown.empty else (
        "% " + latex_caption.replace("\n", " ") + "\n% (no rows)\n")
    atomic_write_text(output["tex"], latex)


def write_long_table(output: dict, caption: str, long: pd.DataFrame, not_run_reason: str, index: Sequence[str],
                     columns: str = "method", order: Sequence[str] = (), notes: Sequence[str] = ()) -> None:
    """A long table shown as its :func:`wide` pivot (`index` x `columns`); when it is empty, the
    not-run table saying `not_run_reason`."""
    if long.empty:
        return not_run_table(output, caption, not_run_reason)
    write_table(long, output, caption, display_frame(wide(long, index, columns, order)), notes=notes)


def not_run_table(output: dict, caption: str, reason: str) -> None:
    """A one-row table saying why the config produced nothing for it."""
    write_table(pd.DataFrame([{"status": "not run", "reason": reason}]), output, caption)


def absent_notes(setup: dict, continual: bool = False, sequential: bool = False) -> list[str]:
    """Notes for a table whose ES or GRPO columns are missing because the config does not train them;
    with `continual` / `sequential`, also when it has no continual sequence / no ES->GRPO runs."""
    notes = []
    if not setup["has_grpo"]:
        notes.append("GRPO: not run in this config (no `grpo` block); GRPO columns are absent.")
    if not setup["has_es"]:
        notes.append("ES: not run in this config (no `es` block).")
    if continual and not setup["continual"]:
        notes.append("Continual sequence: not run in this config; only single-task rows.")
    if sequential and not setup["sequential_task"]:
        notes.append("ES->GRPO / GRPO->ES: not run in this config (no sequential.task, or no GRPO).")
    return notes
