"""The base model's table and figure: greedy accuracy, mean@n, Maj@n and Pass@k per task, read
from the evaluation summaries (``{results_dir}/{model}/base/eval.json``)."""

from __future__ import annotations

import pandas as pd

from esgrpo.files import read_json
from esgrpo.report.figures import log2_k_axis, pyplot, save_figure
from esgrpo.report.writing import format_floats, write_table

PASSK_COLUMNS = ["pass@1", "pass@2", "pass@4", "pass@8", "pass@16", "pass@32"]


def eval_frame(paths: list[str]) -> pd.DataFrame:
    """One row per evaluation summary, with its headline metrics as columns."""
    rows = []
    for path, summary in ((p, s) for p in paths for s in read_json(p)["evaluations"]):
        n = summary["n_samples"]
        rows.append({
            "model": summary["model"], "train_task": summary["train_task"], "run": summary["run"],
            "eval_task": summary["eval_task"], "n_prompts": summary["n_prompts"],
            "greedy": summary.get("greedy_accuracy"),
            **{k: v for k, v in summary.items() if k.startswith("pass@")},
            "mean@n": summary[f"mean@{n}"], "maj@n": summary[f"maj@{n}"],
            "boxed_rate": summary["boxed_rate"], "entropy": summary["entropy"], "path": path,
        })
    return pd.DataFrame(rows)


def base_passk(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """Stage: the base table (csv / md / tex) and its Pass@k-vs-k figure (figure / figure_pdf)."""
    frame = eval_frame(list(input["evals"]))
    passk = [c for c in PASSK_COLUMNS if c in frame]
    columns = ["model", "eval_task", "n_prompts", "greedy", "mean@n", "maj@n", *passk, "boxed_rate", "entropy"]
    table = frame[columns].rename(columns={"eval_task": "task"}).sort_values(["model", "task"])
    write_table(table, output, "Base model: greedy accuracy, mean@n, Maj@n and Pass@k per task",
                shown=format_floats(table))
    long = frame.melt(id_vars=["model", "eval_task"], value_vars=passk, var_name="k", value_name="pass_at_k")
    long["k"] = long["k"].str.removeprefix("pass@").astype(int)
    import seaborn as sns  # the default matplotlib style here, not the paper figures' theme

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    try:
        sns.lineplot(data=long, x="k", y="pass_at_k", hue="eval_task", style="model", marker="o", ax=ax)
        log2_k_axis(ax, sorted(set(long["k"])))
        ax.set_ylabel("Pass@k")
        ax.set_title("Base model coverage")
        sns.move_legend(ax, "center left", bbox_to_anchor=(1.0, 0.5), frameon=False)  # not over the curves
        save_figure(fig, output["figure"], output["figure_pdf"])
    finally:
        plt.close(fig)
