"""Tidy results -> tables (CSV, Markdown, LaTeX) and figures (seaborn, PNG and PDF)."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from esgrpo.io import atomic_write_text


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


def write_table(df: pd.DataFrame, paths: dict[str, str], caption: str = "", float_format: str = "{:.3f}") -> None:
    """One table in three formats; `paths` has keys csv, md, tex."""
    atomic_write_text(paths["csv"], df.to_csv(index=False))
    shown = df.copy()
    for column in shown.columns:
        if pd.api.types.is_float_dtype(shown[column]):
            shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else float_format.format(v))
    markdown = markdown_table(shown)
    atomic_write_text(paths["md"], (f"{caption}\n\n" if caption else "") + markdown + "\n")
    latex = shown.to_latex(index=False, caption=caption or None, escape=True)
    atomic_write_text(paths["tex"], latex)


def save_figure(fig, png: str, pdf: str | None = None) -> None:
    """Save through memory buffers and atomic renames (a killed job leaves no half figure)."""
    for path, fmt in ((png, "png"), (pdf, "pdf")):
        if path is None:
            continue
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, bbox_inches="tight", dpi=150)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(buffer.getvalue())
        tmp.replace(target)


def plt():
    """matplotlib.pyplot on a file-only backend (no display on CI or cluster nodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot
