"""The figures of papers A and B (seaborn; PNG and PDF). A figure whose inputs the config does
not produce is a placeholder that says so."""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from esgrpo.report.frames import drift_norms, js_gain_frame, theory_ratios
from esgrpo.report.loading import StageInputs, cached_pass_at_k, run_labels
from esgrpo.report.paper_a import build_a_sequential
from esgrpo.report.planning import METHOD_ORDER, ZSCORE_ONE_SIDED
from esgrpo.report.stats import pearson_ci
from esgrpo.report.writing import fmt_ci


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


def pyplot():
    """matplotlib.pyplot on a file-only backend (no display on CI or cluster nodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def seaborn():
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return sns


def draw_figure(output: dict, draw: Callable, nrows: int = 1, ncols: int = 1, size=(4.5, 3.4), **kwargs) -> None:
    """A grid of `nrows` x `ncols` panels drawn by ``draw(fig, axes)``, saved to output png / pdf."""
    plt = pyplot()
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, **kwargs)
    try:
        draw(fig, axes)
        fig.tight_layout()
        save_figure(fig, output["png"], output["pdf"])
    finally:
        plt.close(fig)


def placeholder(output: dict, title: str, reason: str) -> None:
    def draw(fig, axes):
        ax = axes[0, 0]
        ax.axis("off")
        ax.text(0.5, 0.5, f"{title}\n\nnot run: {reason}", ha="center", va="center", wrap=True)

    draw_figure(output, draw)


def figure_passk_curves(data: StageInputs, output: dict) -> None:
    test = data.on_task({"base", "es", "grpo", "es->grpo", "grpo->es"})
    if test.empty:
        return placeholder(output, "Pass@k curves", "no evaluations")
    rows = []
    for (model, task, method), g in test.groupby(["model", "task", "method"]):
        n = int(g["n"].max())
        for k in range(1, n + 1):
            vals = [cached_pass_at_k(int(nn), int(c), k) for nn, c in zip(g["n"], g["correct"], strict=True)]
            rows.append({"model": model, "task": task, "method": method, "k": k, "pass@k": float(np.nanmean(vals))})
    df = pd.DataFrame(rows)
    sns = seaborn()
    panels = sorted(set(zip(df["model"], df["task"], strict=True)))

    def draw(fig, axes):
        for ax, (model, task) in zip(axes.ravel(), panels, strict=False):
            d = df[(df["model"] == model) & (df["task"] == task)]
            sns.lineplot(data=d, x="k", y="pass@k", hue="method", marker="o", ax=ax,
                         hue_order=[m for m in METHOD_ORDER if m in set(d["method"])])
            ax.set_xscale("log", base=2)
            ax.set_title(f"{model} / {task}")
        for ax in axes.ravel()[len(panels):]:
            ax.axis("off")

    draw_figure(output, draw, 1, max(1, len(panels)))


def _curve_figure(output: dict, metrics: pd.DataFrame, y: str, xs: Sequence[str], hue: str = "method") -> None:
    """`y` against each of `xs` (rows) per (model, task) (columns), one line per `hue`."""
    sns = seaborn()
    panels = sorted(set(zip(metrics["model"], metrics["task"], strict=True)))

    def draw(fig, axes):
        for row, x in enumerate(xs):
            for col, (model, task) in enumerate(panels):
                ax = axes[row, col]
                d = metrics[(metrics["model"] == model) & (metrics["task"] == task)].dropna(subset=[y, x])
                if d.empty:
                    ax.axis("off")
                    continue
                sns.lineplot(data=d, x=x, y=y, hue=hue, ax=ax, errorbar=("se", 1.96))
                ax.set_title(f"{model} / {task}: {y} vs {x}")

    draw_figure(output, draw, len(xs), max(1, len(panels)))


def figure_entropy_curves(data: StageInputs, output: dict) -> None:
    curves = data.metrics.dropna(subset=["entropy"]) if not data.metrics.empty else data.metrics
    if curves.empty:
        return placeholder(output, "Entropy over training", "no ES / GRPO training curves with entropy")
    _curve_figure(output, curves, "entropy", ["iteration", "rollouts"])


def figure_fitness_curves(data: StageInputs, output: dict) -> None:
    if data.metrics.empty:
        return placeholder(output, "Train reward", "no ES / GRPO training curves")
    _curve_figure(output, data.metrics, "fitness_mean", ["iteration", "rollouts"])


def figure_population_curves(data: StageInputs, output: dict) -> None:
    curves = data.metrics
    if curves.empty or curves["variant"].nunique() < 2:
        return placeholder(output, "Population sweep", "no population sweep in this config")
    curves = curves.assign(N=curves["run"].map(lambda r: run_labels(r)["population"]).astype(int).astype(str))
    _curve_figure(output, curves, "fitness_mean", ["iteration", "rollouts"], hue="N")


def figure_js_diversity_vs_passk_gain(data: StageInputs, output: dict) -> None:
    js = js_gain_frame(data)
    if js.empty:
        return placeholder(output, "JS diversity vs Pass@K gain", "no ES runs with JS diversity")
    sns = seaborn()
    k = int(js["k"].iloc[0])

    def draw(fig, axes):
        ax = axes[0, 0]
        sns.scatterplot(data=js, x="js_diversity", y="gain", hue="task", style="variant", ax=ax, s=60)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("mean population JS diversity over training (nats)")
        ax.set_ylabel(f"Pass@{k} - base Pass@{k}")
        r = pearson_ci(js["js_diversity"], js["gain"])
        ax.set_title(f"ES runs (Pearson r = {fmt_ci(*r, digits=2)})")

    draw_figure(output, draw, size=(5.5, 4))


def figure_es_norm_theory(data: StageInputs, output: dict) -> None:
    theory = data.analysis("theory")
    if theory.empty:
        return placeholder(output, "ES norm vs theory", "no norm-theory analyses")
    sns = seaborn()
    x = "updates" if "updates" in theory else "iteration"
    fits = theory_ratios(theory)
    ratio = {(m, t, r): v for m, t, r, v in zip(fits["model"], fits["task"], fits["run"], fits["ratio"], strict=True)}
    applies = fits.loc[fits["applies"].astype(bool), "ratio"]
    labelled = theory.assign(label=[f"{t}/{r} (x{ratio.get((m, t, r), math.nan):.2f})" + (
        "" if k in ZSCORE_ONE_SIDED else ", theory n/a") for m, t, r, k in
        zip(theory["model"], theory["task"], theory["run"], theory["run_kind"], strict=True)])

    def draw(fig, axes):
        ax = axes[0, 0]
        sns.scatterplot(data=labelled, x=x, y="sq_distance", hue="label", ax=ax, s=25)
        for _label, g in labelled[labelled["run_kind"].isin(ZSCORE_ONE_SIDED)].groupby("label"):
            ax.plot(g[x], g["theory_sq"], ls="--", lw=1, color="black")
        ax.set_ylabel("||theta_t - theta_0||^2")
        ax.set_xlabel("ES updates T")
        summary = f"median slope ratio {applies.median():.2f}" if len(applies) else "no z-scored runs"
        ax.set_title(f"dashed: alpha^2 T d / N (z-scored runs); {summary}")
        ax.legend(title="run (slope / theory)", bbox_to_anchor=(1.02, 1), loc="upper left", fontsize=7)

    draw_figure(output, draw, size=(6.5, 4))


def figure_drift_by_module(data: StageInputs, output: dict) -> None:
    drift = data.analysis("drift")
    if drift.empty:
        return placeholder(output, "Drift by module type", "no drift analyses")
    norms = drift_norms(drift[drift["run_kind"].isin(["es", "grpo"])], ["module_type"])
    sns = seaborn()
    tasks = sorted(set(zip(norms["model"], norms["task"], strict=True)))

    def draw(fig, axes):
        for ax, (model, task) in zip(axes.ravel(), tasks, strict=False):
            d = norms[(norms["model"] == model) & (norms["task"] == task)]
            sns.barplot(data=d, x="module_type", y="relative_l2", hue="method", ax=ax, errorbar=None)
            ax.set_yscale("log")
            ax.set_title(f"{model} / {task}")
            ax.tick_params(axis="x", rotation=30)

    draw_figure(output, draw, 1, max(1, len(tasks)))


def figure_sparsity_curves(data: StageInputs, output: dict) -> None:
    sparsity = data.analysis("sparsity")
    if sparsity.empty or not (sparsity["kind"] == "top_fraction").any():
        return placeholder(output, "Functional sparsity", "no sparsity analyses")
    top = sparsity[sparsity["kind"] == "top_fraction"]
    if "eval_task" not in top:
        top = top.assign(eval_task=top["task"])
    sns = seaborn()
    tasks = sorted(set(zip(top["model"], top["task"], top["eval_task"], strict=True)))
    base = data.base_prompts()

    def draw(fig, axes):
        for ax, (model, task, eval_task) in zip(axes.ravel(), tasks, strict=False):
            d = top[(top["model"] == model) & (top["task"] == task) & (top["eval_task"] == eval_task)]
            long = d.melt(id_vars=["keep_fraction", "method"], value_vars=[c for c in ("greedy", "mean@n") if c in d],
                          var_name="metric", value_name="accuracy")
            sns.lineplot(data=long, x="keep_fraction", y="accuracy", hue="method", style="metric", marker="o", ax=ax)
            b = base[(base["model"] == model) & (base["eval_task"] == eval_task)] if not base.empty else base
            if not b.empty:
                ax.axhline(b["mean@n"].mean(), color="grey", ls=":", lw=1, label="base mean@n")
            ax.set_xscale("symlog", linthresh=0.01)
            ax.set_title(f"{model} / {task}" + (f" -> {eval_task}" if eval_task != task else ""))

    draw_figure(output, draw, 1, max(1, len(tasks)))


def figure_interpolation(data: StageInputs, output: dict) -> None:
    interp = data.analysis("interpolation")
    if interp.empty:
        return placeholder(output, "Interpolation", "no interpolation analyses (needs ES and GRPO)")
    sns = seaborn()
    tasks = sorted(set(zip(interp["model"], interp["task"], strict=True)))

    def draw(fig, axes):
        for col, (model, task) in enumerate(tasks):
            d = interp[(interp["model"] == model) & (interp["task"] == task)]
            paths = d[~d["path"].str.startswith("dir-")]
            dirs = d[d["path"].str.startswith("dir-")]
            for row, (sub, xlabel) in enumerate(((paths, "lambda"), (dirs, "distance from theta0 / ||dES||"))):
                ax = axes[row, col]
                if sub.empty:
                    ax.axis("off")
                    continue
                sns.lineplot(data=sub, x="lam", y="greedy", hue="path", style="eval_task", ax=ax, marker="o",
                             errorbar=None)
                ax.set_xlabel(xlabel)
                ax.set_title(f"{model} / trained on {task}")

    draw_figure(output, draw, 2, max(1, len(tasks)))


def _heatmaps(output: dict, frame: pd.DataFrame, panel: tuple[str, str], index: str, value: str, title: str,
              ylabel: str, sort_rows: bool, **heatmap) -> None:
    """One heatmap of `value` (rows `index`, sorted or in order of appearance; columns eval_task)
    per pair of `panel` values."""
    sns = seaborn()
    panels = sorted(set(zip(frame[panel[0]], frame[panel[1]], strict=True)))

    def draw(fig, axes):
        for ax, (first, second) in zip(axes.ravel(), panels, strict=False):
            d = frame[(frame[panel[0]] == first) & (frame[panel[1]] == second)]
            mat = d.pivot_table(index=index, columns="eval_task", values=value, aggfunc="mean", sort=sort_rows)
            sns.heatmap(mat, annot=True, ax=ax, **heatmap)
            ax.set_title(f"{first} / {second}: {title}")
            ax.set_ylabel(ylabel)
            ax.set_xlabel("evaluated on")

    draw_figure(output, draw, 1, max(1, len(panels)), size=(4.8, 4))


def figure_kl_heatmap(data: StageInputs, output: dict) -> None:
    kl = data.analysis("kl")
    if kl.empty:
        return placeholder(output, "KL heatmap", "no KL analyses")
    _heatmaps(output, kl, ("model", "method"), "task", "token_mean", "KL(base || model)", "trained on",
              sort_rows=True, fmt=".3f", cmap="viridis", vmin=0, vmax=float(kl["token_mean"].max()))


def figure_sequential_matrix(data: StageInputs, output: dict) -> None:
    long = build_a_sequential(data)
    if long.empty:
        return placeholder(output, "Continual sequence", "no continual sequence in this config")
    accuracy = long[long["row"] == "accuracy"]
    accuracy = accuracy.assign(stage_label=accuracy["stage"].astype(str) + ": " + accuracy["stage_task"])
    _heatmaps(output, accuracy, ("model", "method"), "stage_label", "value", "greedy accuracy", "after stage",
              sort_rows=False, fmt=".2f", cmap="magma", vmin=0, vmax=1)
