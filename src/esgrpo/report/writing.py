"""The one table writer: CSV (the numbers, tidy), Markdown, LaTeX and HTML (the same numbers for reading).

In the CSV a cell with an interval is three columns (``value``, ``value_lo``, ``value_hi``); in
Markdown, LaTeX and HTML it is one text cell ``mean [lo, hi]`` and other floats have three decimals.
The HTML page (an output named ``html``) is what `snakemake --report` shows for a table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from esgrpo.files import atomic_write_text
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
    if "saturated" in long:  # a cell that cannot tell methods apart (stats.saturated) says so
        cells = [f"{c} (saturated)" if isinstance(s, bool | np.bool_) and s else c
                 for c, s in zip(cells, long["saturated"], strict=True)]
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


# The report shows a table's page in a frame of its own: a standalone document, styled here. Short cells
# stay on one line; long text (a claim's statement, a note in a cell) wraps.
HTML_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; font-size: 14px; color: #1f2937;
       margin: 16px; }
h1 { font-size: 17px; margin: 0 0 8px; }
p { max-width: 110ch; line-height: 1.45; margin: 0 0 8px; }
p.note { color: #4b5563; font-size: 13px; }
.wrap { overflow-x: auto; margin-top: 12px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #d1d5db; padding: 3px 7px; text-align: left; vertical-align: top; white-space: nowrap; }
th { background: #f3f4f6; position: sticky; top: 0; }
td { font-variant-numeric: tabular-nums; }
td.long { white-space: normal; min-width: 22ch; max-width: 46ch; }
tbody tr:nth-child(even) { background: #f9fafb; }
"""
LONG_CELL = 32  # characters: a longer cell may wrap
CI_TEXT = re.compile(r"-?\d+\.\d+ \[-?\d+\.\d+, -?\d+\.\d+\]")  # fmt_ci's "mean [lo, hi]": never broken


def _html_cell(value) -> str:
    from html import escape

    text = "" if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)) else str(value)
    text = CI_TEXT.sub(lambda m: m.group(0).replace(" ", "\u00a0"), text)
    return f'<td class="long">{escape(text)}</td>' if len(text) > LONG_CELL else f"<td>{escape(text)}</td>"


def html_page(title: str, caption: str, notes: Sequence[str], shown: pd.DataFrame) -> str:
    """A standalone HTML page of a display frame: its title, caption and notes, then the table."""
    from html import escape

    if shown.empty:
        table = "<p>(no rows)</p>"
    else:
        head = "".join(f"<th>{escape(str(c))}</th>" for c in shown.columns)
        rows = "\n".join("<tr>" + "".join(_html_cell(v) for v in row) + "</tr>"
                          for row in shown.itertuples(index=False, name=None))
        table = f"<table><thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody></table>"
    paragraphs = "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{HTML_STYLE}</style></head><body><h1>{escape(title)}</h1><p>{escape(caption)}</p>{paragraphs}"
            f'<div class="wrap">{table}</div></body></html>\n')


def write_table(table: pd.DataFrame, output: dict, caption: str, shown: pd.DataFrame | None = None,
                notes: Sequence[str] = ()) -> None:
    """`output` csv = `table` (tidy numbers); md, tex and html (when `output` names one) = `shown`, the
    frame for reading (default: ``display_frame(table)``), after the caption and `notes`."""
    atomic_write_text(output["csv"], table.to_csv(index=False))
    shown = display_frame(table) if shown is None else shown
    text = caption + "".join(f"\n\n{n}" for n in notes)
    atomic_write_text(output["md"], f"{text}\n\n{markdown_table(shown)}\n")
    latex_caption = " ".join([caption, *notes])
    latex = shown.to_latex(index=False, caption=latex_caption, escape=True) if not shown.empty else (
        "% " + latex_caption.replace("\n", " ") + "\n% (no rows)\n")
    atomic_write_text(output["tex"], latex)
    if "html" in output:
        title = Path(output["html"]).stem
        atomic_write_text(output["html"], html_page(title, caption, notes, shown))


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
