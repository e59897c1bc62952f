"""docs/es_arithmetic.md's figure: per update, the cosine of the step the weights took with the step ES meant,
and the share of coordinates that changed; and the sparsity curve (greedy accuracy on the training task with
only the largest-|delta| fraction of the update kept, from the run's start); for the exact arithmetic and each
paper's, one row per grid.

    python scripts/es_arithmetic_figure.py OUT.png CONFIG:WORKDIR [CONFIG:WORKDIR ...]

Each CONFIG:WORKDIR is a config file and the working directory its grid ran in. The runs are those the
ES arithmetic table compares (`tables/es_arithmetic`): each paper's arithmetic runs on the ablation task and
the exact main ES runs of their seeds, found from the config's planned runs (esgrpo.runs.planned_runs); the
values are their metrics.jsonl rows (`esgrpo.distance.StepAgreement`) and their sparsity analyses'
top-fraction rows (a grid without those leaves its third panel empty).
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


def sparsity_rows(configfile: str, workdir: str) -> pd.DataFrame:
    config = yaml.safe_load(Path(configfile).read_text())
    root = Path(workdir) / results_folder(config.get("results_dir"), [configfile])
    frames = []
    for model, task, run in compared_runs(config):
        path = root / "analysis" / model / "sparsity" / task / f"{run}.csv"
        if path.exists():
            d = pd.read_csv(path)
            d = d[(d["kind"] == "top_fraction") & (d["eval_task"] == task)]
            frames.append(d.assign(grid=f"{model} / {task}", run=run,
                                   arithmetic=ARITHMETIC_LABELS[arithmetic_of(run)]))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the PNG to write (a PDF beside it)")
    parser.add_argument("grids", nargs="+", help="CONFIG:WORKDIR")
    args = parser.parse_args()
    frame = pd.concat([agreement_rows(*g.split(":", 1)) for g in args.grids], ignore_index=True)
    sparsity = pd.concat([sparsity_rows(*g.split(":", 1)) for g in args.grids], ignore_index=True)
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
            ax = axes[i, 2]
            s = sparsity[sparsity["grid"] == grid] if not sparsity.empty else sparsity
            if not s.empty:
                sns.lineplot(data=s, x="keep_fraction", y="greedy", hue="arithmetic", units="run", estimator=None,
                             palette=colours, marker="o", markersize=3, ax=ax)
                ax.set_xscale("symlog", linthresh=0.01)
                ax.set_xlim(0, 1.05)
            ax.set_title(f"{grid}: sparsity curve", fontsize=9)
            ax.set_xlabel("fraction of the update kept (largest |delta|)")
            ax.set_ylabel("greedy accuracy")
        shared_legend(fig, axes, "arithmetic")

    out = Path(args.out)
    draw_figure({"png": str(out), "pdf": str(out.with_suffix(".pdf"))}, draw, len(grids), 3, size=(4.6, 3.0))
    print(f"{out}: {len(frame)} updates of {frame['run'].nunique()} runs in {len(grids)} grids; sparsity curves of "
          f"{sparsity['run'].nunique() if not sparsity.empty else 0} runs")


if __name__ == "__main__":
    main()
