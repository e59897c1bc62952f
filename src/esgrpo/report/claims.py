"""The claims of papers A and B, each judged from the analogue this pipeline measures.

A claim compares a metric's estimate with a ``threshold`` (usually 0 for a difference such as
"ES - GRPO Pass@32") allowing a non-negative ``margin``. With the CI ``[lo, hi]``:

- ``>``:   b = threshold + margin; holds if lo > b, does not hold if hi <= b;
- ``>=``:  b = threshold - margin; holds if lo >= b, does not hold if hi < b;
- ``<``:   b = threshold - margin; holds if hi < b, does not hold if lo >= b;
- ``<=``:  b = threshold + margin; holds if hi <= b, does not hold if lo > b;
- ``~=0``: holds if [lo, hi] lies inside [threshold - margin, threshold + margin], does not
  hold if it lies entirely outside (hi < threshold - margin or lo > threshold + margin).

Everything else is "inconclusive" (the CI straddles the bound), as is any NaN input. So
``>`` with margin asks for a superiority of more than ``margin``; ``>=`` / ``<=`` are
non-inferiority tests ("not worse by more than margin"); ``~=0`` is an equivalence test
("within +-margin of threshold"), which can only hold when the CI is narrower than 2*margin.

``CLAIMS`` (read from ``claims.yaml`` next to this file) is every checkable finding of the two
papers, plus one the grid's low-rank ablation asks (``es_lowrank_matches``: does low-rank ES, as EGGROLL
arXiv 2511.16652 trains it, match full-rank ES?): the list of questions and the tolerance each one is asked with, nothing measured. The
estimates and their 95% bootstrap CIs come from :mod:`esgrpo.report.claim_estimates`, which also
writes ``{results_dir}/tables/claims.*``.

``{k}``, ``{k1}`` and ``{k2}`` in a statement or metric are filled with the Pass@k values the
evaluation actually has (paper B uses 16 and 32; a CI config with n = 8 uses 4 and 8).
Margins are tolerances at toy scale, chosen before looking at results:

- equivalence (``~=0``) claims: ``margin`` is the largest difference still called "the same";
- non-inferiority (``>=``) claims: ``margin`` is the largest shortfall still called "not worse"
  ("matches or exceeds" is one: a lead of any size holds);
- magnitude claims (a ratio the paper reports, e.g. 44.1x): the verdict is on the direction (ratio > 1);
  ``paper_value`` is the paper's figure, shown beside ours with ours / paper, since toy scale is not
  expected to reach the paper's magnitude.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

__all__ = ["CLAIMS", "Claim", "COMPARISONS", "VERDICTS", "claims_table", "fill_pass_at_k", "load_claims", "verdict"]

COMPARISONS = (">", ">=", "<", "<=", "~=0")
VERDICTS = ("holds", "does not hold", "inconclusive")


@dataclass(frozen=True)
class Claim:
    """One checkable statement: ``metric`` (as estimated) ``comparison`` ``threshold`` up to ``margin``."""

    id: str
    paper: str
    statement: str
    metric: str
    comparison: str
    threshold: float = 0.0
    margin: float = 0.0
    paper_value: float | None = None  # the paper's own figure for a magnitude claim (44.1x), shown beside ours

    def __post_init__(self) -> None:
        if self.comparison not in COMPARISONS:
            raise ValueError(f"comparison must be one of {COMPARISONS}, got {self.comparison!r}")
        if not self.margin >= 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")


def fill_pass_at_k(claim: Claim, **ks: int) -> Claim:
    """The claim with ``{k}``, ``{k1}``, ``{k2}`` in its statement and metric filled in."""
    return replace(claim, statement=claim.statement.format(**ks), metric=claim.metric.format(**ks))


def verdict(estimate: float, lo: float, hi: float, claim: Claim) -> str:
    """ "holds", "does not hold" or "inconclusive" for ``claim`` given a CI ``[lo, hi]`` (see module doc).

    ``estimate`` is only checked for NaN: the decision rests on the interval.
    """
    if any(math.isnan(float(v)) for v in (estimate, lo, hi)):
        return "inconclusive"
    if lo > hi:
        raise ValueError(f"lo ({lo}) > hi ({hi})")
    t, m, cmp = claim.threshold, claim.margin, claim.comparison
    if cmp == ">":
        b = t + m
        ok, bad = lo > b, hi <= b
    elif cmp == ">=":
        b = t - m
        ok, bad = lo >= b, hi < b
    elif cmp == "<":
        b = t - m
        ok, bad = hi < b, lo >= b
    elif cmp == "<=":
        b = t + m
        ok, bad = hi <= b, lo > b
    else:  # "~=0": equivalence to threshold within margin
        ok = lo >= t - m and hi <= t + m
        bad = hi < t - m or lo > t + m
    if ok:
        return "holds"
    if bad:
        return "does not hold"
    return "inconclusive"


def claims_table(rows: Iterable[Mapping[str, Any] | tuple]) -> pd.DataFrame:
    """Tidy table of judged claims.

    Each row is ``(claim, estimate, lo, hi)`` or a mapping with keys ``claim, estimate, lo,
    hi`` plus any extra columns (e.g. model, task) that are carried through. Columns: the
    claim's fields, extras, estimate, lo, hi, verdict.
    """
    out = []
    for row in rows:
        if isinstance(row, Mapping):
            extra = {k: v for k, v in row.items() if k not in ("claim", "estimate", "lo", "hi")}
            claim, est, lo, hi = row["claim"], row["estimate"], row["lo"], row["hi"]
        else:
            (claim, est, lo, hi), extra = row, {}
        out.append(
            {
                **asdict(claim),
                **extra,
                "estimate": float(est),
                "lo": float(lo),
                "hi": float(hi),
                "verdict": verdict(est, lo, hi, claim),
            }
        )
    base = ["id", "paper", "statement", "metric", "comparison", "threshold", "margin", "paper_value"]
    cols = base + [
        c for r in out for c in r if c not in base and c not in ("estimate", "lo", "hi", "verdict")
    ]
    cols = list(dict.fromkeys(cols)) + ["estimate", "lo", "hi", "verdict"]
    return pd.DataFrame(out, columns=cols)


CATALOG = Path(__file__).with_name("claims.yaml")


def load_claims(path: Path = CATALOG) -> tuple[Claim, ...]:
    """The claims of a catalog file (id -> paper, statement, metric, comparison, threshold, margin,
    paper_value)."""
    entries = yaml.safe_load(path.read_text())
    return tuple(Claim(claim_id, str(e["paper"]), e["statement"], e["metric"], e["comparison"],
                       float(e.get("threshold", 0.0)), float(e.get("margin", 0.0)),
                       None if e.get("paper_value") is None else float(e["paper_value"]))
                 for claim_id, e in entries.items())


CLAIMS = load_claims()
