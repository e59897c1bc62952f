"""docs/es_arithmetic.md's figure: per update, the cosine of the step the weights took with the step ES meant,
and the share of coordinates that changed, for the exact arithmetic and each paper's, one row per grid.

    python scripts/es_arithmetic_figure.py OUT.png CONFIG:WORKDIR [CONFIG:WORKDIR ...]

Each CONFIG:WORKDIR is a config file and the working directory its grid ran in. The runs are those the
ES arithmetic table compares (`tables/es_arithmetic`): each paper's arithmetic runs on the ablation task and
the exact main ES runs of their seeds, found from the config's planned runs (esgrpo.runs.planned_runs); the
values are their metrics.jsonl rows (`esgrpo.distance.StepAgreement`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import yaml

from esgrpo.files import read_jsonl
from esgrpo.grids import results_folder
from esgrpo.report.arithmetic import ARITHMETIC_LABELS, arithmetic_of
from esgrpo.report.figures import draw_figure, palette_for, seaborn, shared_legend
from esgrpo.report.planning import paper_setup, run_kind
from esgrpo.runs import parse_run_name, planned_runs


def compared_runs(config: dict) -> list[tuple[str, str, str]]:
    """(model, task, run) of each arithmetic run on the ablation task and of the main ES run of its population
    and seed (the runs `esgrpo.report.arithmetic` compares; kinds from `esgrpo.report.planning.run_kind`)."""
    setup = paper_setup(config)
    task = setup["ablation_task"]
    out = []
    for model in setup["models"]:
        kinds = {run: run_kind(run, setup["main_n"], setup["main_g"], setup.get("main_rank"))
                 for t, run in planned_runs(config, model) if t == task}
        arith = [r for r, k in kinds.items() if k == "es_arith"]
        cells = {(parse_run_name(r).population, parse_run_name(r).seed) for r in arith}
        exact = [r for r, k in kinds.items()
                 if k == "es" and (parse_run_name(r).population, parse_run_name(r).seed) in cells]
        out += [(model, task, r) for r in exact + arith]
    return out


def agreement_rows(configfile: str, workdir: str) -> pd.DataFrame:
    config = yaml.safe_load(Path(configfile).read_text())
    root = Path(workdir) / results_folder(config.get("results_dir"), [configfile])
    rows = []
    for model, task, run in compared_runs(config):
        for row in read_jsonl(root / model / task / run / "metrics.jsonl"):
            if "step_cosine" in row:
                rows.append({"grid": f"{model} / {task}", "run": run, "iteration": row["iteration"],
                             "arithmetic": ARITHMETIC_LABELS[arithmetic_of(run)],
                             "step cosine with the intended step": row["step_cosine"],
                             "share of coordinates changed": row["changed_share"]})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the PNG to write (a PDF beside it)")
    parser.add_argument("grids", nargs="+", help="CONFIG:WORKDIR")
    args = parser.parse_args()
    frame = pd.concat([agreement_rows(*g.split(":", 1)) for g in args.grids], ignore_index=True)
    grids = list(dict.fromkeys(frame["grid"]))
    sns = seaborn()
    colours = palette_for(sns, list(ARITHMETIC_LABELS.values()))
    columns = ["step cosine with the intended step", "share of coordinates changed"]

    def draw(fig, axes):
        for i, grid in enumerate(grids):
            d = frame[frame["grid"] == grid]
            for j, column in enumerate(columns):
                ax = axes[i, j]
                sns.lineplot(data=d, x="iteration", y=column, hue="arithmetic", units="run", estimator=None,
                             palette=colours, marker="o", markersize=3, ax=ax)
                ax.set_ylim(0, 1.02)
                ax.set_title(f"{grid}: {column}", fontsize=9)
                ax.set_xlabel("ES iteration")
                ax.set_ylabel("")
        shared_legend(fig, axes, "arithmetic")

    out = Path(args.out)
    draw_figure({"png": str(out), "pdf": str(out.with_suffix(".pdf"))}, draw, len(grids), 2, size=(4.6, 3.0))
    print(f"{out}: {len(frame)} updates of {frame['run'].nunique()} runs in {len(grids)} grids")


if __name__ == "__main__":
    main()
