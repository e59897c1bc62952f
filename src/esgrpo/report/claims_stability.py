"""Verdict stability: every claim judged on each training seed alone and on all seeds pooled.

The pooled verdict is the claims table's own (report.claim_estimates.build_claims: a test metric's CI
resamples seeds, then prompts within each seed, report.stats), and it is the only one a claim is reported by:
a claim holds when the pooled CI says so, whatever single seeds say. Each seed's verdict is the same
computation on the frames restricted to that seed (the run name's seed; the base model's rows, seed
-1, stay in every subset), so the table shows how many seeds agree with the pooled verdict. A claim a
seed cannot judge alone (not run, or measured on a single unit, e.g. one ES / GRPO ratio per seed,
so no interval) is "not measured" for that seed.
"""

from __future__ import annotations

import functools

import pandas as pd

from esgrpo.report.claim_estimates import build_claims
from esgrpo.report.loading import StageInputs
from esgrpo.report.registry import table_caption
from esgrpo.report.writing import display_frame, fmt_ci, write_table

NOT_MEASURED = "not measured"
JUDGED = ("holds", "does not hold", "inconclusive")  # a verdict resting on an interval


def only_seed(frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Rows of training seed `seed` and of the base model (seed -1); a frame without seeds is kept whole."""
    if frame.empty or "seed" not in frame:
        return frame
    return frame[frame["seed"].isin([seed, -1])].reset_index(drop=True)


class OneSeed(StageInputs):
    """The frames of `pooled` (loaded once) restricted to one training seed."""

    def __init__(self, pooled: StageInputs, seed: int):
        super().__init__(pooled.input, pooled.setup, pooled.jobs)
        self.pooled, self.seed = pooled, seed

    @functools.cached_property
    def prompts(self) -> pd.DataFrame:
        return only_seed(self.pooled.prompts, self.seed)

    @functools.cached_property
    def metrics(self) -> pd.DataFrame:
        return only_seed(self.pooled.metrics, self.seed)

    def analysis(self, name: str) -> pd.DataFrame:
        return only_seed(self.pooled.analysis(name), self.seed)


def training_seeds(data: StageInputs) -> list[int]:
    """The training seeds of the runs evaluated or logged (the base model's -1 excluded)."""
    seeds = set()
    for frame in (data.prompts, data.metrics):
        if not frame.empty:
            seeds |= {int(s) for s in frame["seed"].unique() if s >= 0}
    return sorted(seeds)


def seed_verdicts(table: pd.DataFrame) -> pd.Series:
    """A one-seed claims table's verdicts; "not measured" where it has no interval to judge by."""
    judged = (table["status"] == "measured") & table["verdict"].isin(JUDGED) & table["lo"].notna()
    return table["verdict"].where(judged, NOT_MEASURED)


def agreement(pooled: str, per_seed: list[str]) -> str:
    """"k/n": seeds whose verdict is the pooled one; "n/a" where the pooled claim is not judged."""
    if pooled not in JUDGED:
        return "n/a"
    return f"{sum(v == pooled for v in per_seed)}/{len(per_seed)}"


def build_claims_stability(data: StageInputs) -> pd.DataFrame:
    """id, paper, statement, verdict_pooled, verdict_s<seed> per seed, seeds_agreeing, the pooled
    estimate / lo / hi and each seed's estimate."""
    pooled = build_claims(data)
    seeds = training_seeds(data)
    if len(seeds) == 1:  # one seed: its subset is every row, so its table is the pooled one
        per_seed = {seeds[0]: pooled.set_index("id")}
    else:
        per_seed = {s: build_claims(OneSeed(data, s)).set_index("id").loc[pooled["id"]] for s in seeds}
    table = pooled[["id", "paper", "statement", "verdict"]].rename(columns={"verdict": "verdict_pooled"})
    for s in seeds:
        table[f"verdict_s{s}"] = seed_verdicts(per_seed[s]).to_numpy()
    table["seeds_agreeing"] = [agreement(v, [table.at[i, f"verdict_s{s}"] for s in seeds])
                               for i, v in table["verdict_pooled"].items()]
    table[["estimate", "lo", "hi"]] = pooled[["estimate", "lo", "hi"]]
    for s in seeds:
        table[f"estimate_s{s}"] = per_seed[s]["estimate"].to_numpy()
    return table


def table_claims_stability(data: StageInputs, output: dict) -> None:
    table = build_claims_stability(data)
    seeds = [c.removeprefix("verdict_") for c in table.columns if c.startswith("verdict_s")]
    caption = table_caption("claims_stability", seeds=", ".join(seeds) or "none")
    pooled_ci = [fmt_ci(m, lo, hi) for m, lo, hi in
                 zip(table["estimate"], table["lo"], table["hi"], strict=True)]
    shown = pd.DataFrame({"id": table["id"], "paper": table["paper"], "statement": table["statement"],
                          "verdict (pooled)": table["verdict_pooled"],
                          **{f"verdict {s}": table[f"verdict_{s}"] for s in seeds},
                          "seeds agreeing": table["seeds_agreeing"], "pooled estimate [95% CI]": pooled_ci})
    write_table(table, output, caption, display_frame(shown))
