"""The figures of papers A and B (seaborn; PNG and PDF). A figure whose inputs the config does
not produce is a placeholder that says so.

Layout, as the papers draw them: one panel per task (or per path), titles naming the panel only,
axis labels on the outer panels, and one legend for the whole figure outside the axes
(`shared_legend`), so that no legend covers a curve and every panel uses the same colours.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from esgrpo.report.frames import (
    drift_norms,
    entropy_labels,
    exact_pairs,
    js_gain_frame,
    kl_sequence_label,
    theory_ratios,
)
from esgrpo.report.loading import StageInputs, cached_pass_at_k, run_labels, variant_of
from esgrpo.report.paper_a import build_a_sequential
from esgrpo.report.planning import METHOD_ORDER, ZSCORE_ONE_SIDED, stage_one_aliases
from esgrpo.report.stats import pearson_ci
from esgrpo.report.writing import fmt_ci
from esgrpo.runs import parse_run_name


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

    # "notebook" type sizes (paper's are 0.8x): legible when the report scales a figure to its page width
    sns.set_theme(style="whitegrid", context="notebook")
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


def panel_grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    """(rows, columns) of `n` panels: one row up to `max_cols`, else a near-square grid of at most
    `max_cols` columns. The report shows a figure scaled to its page's width and centred in its height (a
    figure taller than the window loses its top), so figures stay at most ~13 in wide and wider than tall:
    their text then stays legible there."""
    n = max(n, 1)
    cols = n if n <= max_cols else min(max_cols, math.ceil(math.sqrt(n)))
    return math.ceil(n / cols), cols


def log2_k_axis(ax, ks: Sequence[int]) -> None:
    """A log2 x axis for k, ticked at powers of two as plain numbers (1, 2, 4, ... rather than 2^0, 2^1)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks([k for k in ks if k & (k - 1) == 0])
    ax.get_xaxis().set_major_formatter(pyplot().FuncFormatter(lambda v, _pos: f"{v:g}"))


def hide_unused(axes, used: int) -> None:
    """Turn off the panels of a wrapped grid past the `used` first ones."""
    for ax in np.ravel(axes)[used:]:
        ax.axis("off")


def shared_legend(fig, axes, title: str | None = None, extra: Sequence[tuple[Any, str]] = (),
                  where: str = "right") -> None:
    """One legend for the figure, outside the axes, from every panel's entries (each label once);
    the panels' own legends are removed. `extra`: (handle, label) pairs drawn by hand (reference lines)."""
    handles: dict[str, Any] = {}
    for ax in np.ravel(axes):
        legend = ax.get_legend()
        drawn = [] if legend is None else list(zip(legend.legend_handles, [t.get_text() for t in legend.get_texts()],
                                                   strict=True))
        for handle, label in [*drawn, *zip(*ax.get_legend_handles_labels(), strict=True)]:  # + labelled lines
            handles.setdefault(label, handle)
        if legend is not None:
            legend.remove()
    for handle, label in extra:
        handles.setdefault(label, handle)
    if not handles:
        return
    if where == "bottom":
        fig.legend(handles.values(), handles.keys(), title=title, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                   ncol=min(len(handles), 6), frameon=False)
    else:
        fig.legend(handles.values(), handles.keys(), title=title, loc="center left", bbox_to_anchor=(1.0, 0.5),
                   frameon=False)


def label_left(axes, ylabel: str) -> None:
    """The y label on the left column only (panels in a row share what they measure)."""
    for (_row, col), ax in np.ndenumerate(axes):
        ax.set_ylabel(ylabel if col == 0 else "")


def palette_for(sns, levels: Sequence[str]) -> dict[str, Any]:
    """One colour per level, the same in every panel of a figure; past the default palette's 10 colours,
    evenly spaced hues (the default would repeat its colours)."""
    n = max(len(levels), 1)
    return dict(zip(levels, sns.color_palette(None if n <= 10 else "husl", n_colors=n), strict=False))


def ordered(values: Sequence[str], order: Sequence[str] = METHOD_ORDER) -> list[str]:
    """The distinct `values` in `order` (methods), numerically when all are numbers (population sizes),
    else alphabetically."""
    present = list(dict.fromkeys(values))
    if all(v in order for v in present):
        return [v for v in order if v in present]
    if all(str(v).isdigit() for v in present):
        return sorted(present, key=int)
    return sorted(present, key=str)


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
    methods = ordered(df["method"])
    colours = palette_for(sns, methods)

    def draw(fig, axes):
        for ax, (model, task) in zip(axes.ravel(), panels, strict=False):
            d = df[(df["model"] == model) & (df["task"] == task)]
            sns.lineplot(data=d, x="k", y="pass@k", hue="method", marker="o", markersize=4, ax=ax,
                         hue_order=[m for m in methods if m in set(d["method"])], palette=colours)
            log2_k_axis(ax, sorted(set(d["k"])))
            ax.set_title(f"{model} / {task}")
        hide_unused(axes, len(panels))
        label_left(axes, "Pass@k")
        shared_legend(fig, axes, "method")

    draw_figure(output, draw, *panel_grid(len(panels)), size=(4.2, 3.2))


def _curve_figure(output: dict, metrics: pd.DataFrame, y: str, xs: Sequence[str], hue: str = "method",
                  ylabel: str | None = None) -> None:
    """`y` against each of `xs` (rows; with more than four tasks, each x's panels wrap) per (model, task)
    (columns), one line per `hue` (the same colour in
    every panel; the band is the 95% interval over seeds where there are several)."""
    sns = seaborn()
    panels = sorted(set(zip(metrics["model"], metrics["task"], strict=True)))
    levels = ordered(metrics[hue].astype(str))
    colours = palette_for(sns, levels)
    metrics = metrics.assign(**{hue: metrics[hue].astype(str)})

    per_row = min(4, max(1, len(panels)))  # panels of one x side by side; more tasks wrap to more rows
    blocks = math.ceil(max(1, len(panels)) / per_row)

    def draw(fig, axes):
        for i, x in enumerate(xs):
            for j, (model, task) in enumerate(panels):
                ax = axes[i * blocks + j // per_row, j % per_row]
                d = metrics[(metrics["model"] == model) & (metrics["task"] == task)].dropna(subset=[y, x])
                if d.empty:
                    ax.axis("off")
                    continue
                sns.lineplot(data=d, x=x, y=y, hue=hue, ax=ax, errorbar=("se", 1.96), palette=colours,
                             hue_order=[v for v in levels if v in set(d[hue])])
                ax.set_title(f"{model} / {task}")
            for j in range(len(panels), blocks * per_row):
                axes[i * blocks + j // per_row, j % per_row].axis("off")
        label_left(axes, ylabel or y)
        shared_legend(fig, axes, hue)

    draw_figure(output, draw, len(xs) * blocks, per_row, size=(3.3, 2.7))


def figure_entropy_curves(data: StageInputs, output: dict) -> None:
    curves = data.metrics.dropna(subset=["entropy"]) if not data.metrics.empty else data.metrics
    if curves.empty:
        return placeholder(output, "Entropy over training", "no ES / GRPO training curves with entropy")
    _curve_figure(output, curves.assign(method=entropy_labels(curves)), "entropy", ["iteration", "rollouts"],
                  ylabel="mean token entropy (nats)")


def figure_fitness_curves(data: StageInputs, output: dict) -> None:
    if data.metrics.empty:
        return placeholder(output, "Train reward", "no ES / GRPO training curves")
    _curve_figure(output, data.metrics, "fitness_mean", ["iteration", "rollouts"], ylabel="train reward")


def figure_population_curves(data: StageInputs, output: dict) -> None:
    curves = data.metrics
    if curves.empty or curves["variant"].nunique() < 2:
        return placeholder(output, "Population sweep", "no population sweep in this config")
    curves = curves.assign(N=curves["run"].map(lambda r: run_labels(r)["population"]).astype(int).astype(str))
    _curve_figure(output, curves, "fitness_mean", ["iteration", "rollouts"], hue="N", ylabel="train reward")


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
        title = f"ES runs (Pearson r = {fmt_ci(*r, digits=2)})"
        n_saturated = int(js["saturated"].sum())
        if n_saturated:  # those points sit at 0 whatever the diversity: say so where the eye lands on them
            title += (f"\n{n_saturated} of {len(js)} points at 0: Pass@{k} saturated "
                      f"(run and base solve every prompt)")
        ax.set_title(title)
        shared_legend(fig, axes)

    draw_figure(output, draw, size=(5.5, 4))


def without_stage_one_copies(frame: pd.DataFrame, setup: dict) -> pd.DataFrame:
    """`frame` without the copies of a stage-1 main run under its continual name (``cl_es-s0-k1``;
    `esgrpo.report.loading.with_stage_one`): in a figure of runs, one run is one set of points."""
    copies = {(task, alias) for (task, _run), alias in stage_one_aliases(setup).items()}
    if frame.empty or not copies:
        return frame
    keep = [(t, r) not in copies for t, r in zip(frame["task"], frame["run"], strict=True)]
    return frame[keep].reset_index(drop=True)


# The norm-theory figure's marker per noise: low-rank runs (es.ablations.ranks) are their own points.
NOISE_MARKERS = {"full-rank": "o", "low-rank": "X", "paper's arithmetic": "D"}
# the norm theory's runs: z-scored one-sided ES, and the runs of a paper's in-place arithmetic, which the
# theory is tested against (esgrpo.report.arithmetic)
THEORY_LINE_KINDS = ZSCORE_ONE_SIDED | {"es_arith"}


def noise_of(run: str) -> str:
    """The key of NOISE_MARKERS for a run name: full-rank or low-rank noise, or a paper's arithmetic."""
    if parse_run_name(run).arithmetic:
        return "paper's arithmetic"
    return "full-rank" if math.isnan(run_labels(run)["noise_rank"]) else "low-rank"


def figure_es_norm_theory(data: StageInputs, output: dict) -> None:
    """||theta_t - theta_0||^2 against the updates, one panel per (model, task), one colour per setting
    (its seeds pooled; low-rank runs as crosses, runs of a paper's in-place arithmetic as diamonds), the
    theory alpha^2 T d / N dashed for the runs it is about (z-scored, one-sided, full- or low-rank noise,
    either arithmetic)."""
    theory = without_stage_one_copies(data.analysis("theory"), data.setup)
    if theory.empty:
        return placeholder(output, "ES norm vs theory", "no norm-theory analyses")
    sns = seaborn()
    x = "updates" if "updates" in theory else "iteration"
    fits = theory_ratios(theory)
    theory = theory.assign(setting=[variant_of(r) + ("" if k in THEORY_LINE_KINDS else " (theory n/a)")
                                    for r, k in zip(theory["run"], theory["run_kind"], strict=True)],
                           noise=[noise_of(r) for r in theory["run"]])
    marker = dict(zip(theory["setting"], theory["noise"].map(NOISE_MARKERS), strict=False))
    panels = sorted(set(zip(theory["model"], theory["task"], strict=True)))
    settings = ordered(theory["setting"])
    colours = palette_for(sns, settings)
    nrows, ncols = panel_grid(len(panels))

    def draw(fig, axes):
        for ax, (model, task) in zip(axes.ravel(), panels, strict=False):
            d = theory[(theory["model"] == model) & (theory["task"] == task)]
            sns.scatterplot(data=d, x=x, y="sq_distance", hue="setting", palette=colours, style="noise",
                            markers=NOISE_MARKERS, ax=ax, s=28, legend=False)
            for _run, g in d[d["run_kind"].isin(THEORY_LINE_KINDS)].groupby("run"):
                ax.plot(g[x], g["theory_sq"], ls="--", lw=0.9, color="black", alpha=0.6, zorder=1)
            f = fits[(fits["model"] == model) & (fits["task"] == task) & fits["applies"].astype(bool)]
            ratio = f"slope / theory {f['ratio'].median():.2f}" if len(f) else "no z-scored run"
            ax.set_title(f"{model} / {task}: {ratio}")
            ax.set_xlabel("ES updates T")
        for ax in axes.ravel()[len(panels):]:
            ax.axis("off")
        label_left(axes, "||theta_t - theta_0||^2")
        line = pyplot().Line2D
        entries = [(line([], [], ls="", marker=marker[v], color=colours[v]), v) for v in settings]  # in order
        shared_legend(fig, axes, "setting (seeds pooled)",
                      [*entries, (line([], [], ls="--", lw=0.9, color="black"), "theory alpha^2 T d / N")])

    draw_figure(output, draw, nrows, ncols, size=(4.2, 3.2))


def figure_drift_by_module(data: StageInputs, output: dict) -> None:
    drift = data.analysis("drift")
    if drift.empty:
        return placeholder(output, "Drift by module type", "no drift analyses")
    norms = drift_norms(drift[drift["run_kind"].isin(["es", "grpo"])], ["module_type"])
    sns = seaborn()
    tasks = sorted(set(zip(norms["model"], norms["task"], strict=True)))

    methods = ordered(norms["method"])
    colours = palette_for(sns, methods)

    def draw(fig, axes):
        for ax, (model, task) in zip(axes.ravel(), tasks, strict=False):
            d = norms[(norms["model"] == model) & (norms["task"] == task)]
            sns.barplot(data=d, x="module_type", y="relative_l2", hue="method", ax=ax, errorbar=None,
                        hue_order=[m for m in methods if m in set(d["method"])], palette=colours)
            ax.set_yscale("log")
            ax.set_title(f"{model} / trained on {task}")
            ax.set_xlabel("")
            ax.tick_params(axis="x", rotation=30)
        hide_unused(axes, len(tasks))
        label_left(axes, "||delta|| / ||theta0||\nper module type")
        shared_legend(fig, axes, "method")

    draw_figure(output, draw, *panel_grid(len(tasks)), size=(4.2, 3.4), sharey=True)


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

    methods = ordered(top["method"])
    colours = palette_for(sns, methods)

    def draw(fig, axes):
        for ax, (model, task, eval_task) in zip(axes.ravel(), tasks, strict=False):
            d = top[(top["model"] == model) & (top["task"] == task) & (top["eval_task"] == eval_task)]
            long = d.melt(id_vars=["keep_fraction", "method"], value_vars=[c for c in ("greedy", "mean@n") if c in d],
                          var_name="metric", value_name="accuracy")
            sns.lineplot(data=long, x="keep_fraction", y="accuracy", hue="method", style="metric", marker="o",
                         markersize=4, ax=ax, hue_order=[m for m in methods if m in set(long["method"])],
                         palette=colours)
            b = base[(base["model"] == model) & (base["eval_task"] == eval_task)] if not base.empty else base
            if not b.empty:
                ax.axhline(b["mean@n"].mean(), color="grey", ls=":", lw=1.2, label="base mean@n")
            ax.set_xscale("symlog", linthresh=0.01)
            ax.set_xlim(0, 1.05)  # fractions: symlog would otherwise open an empty negative decade
            ax.set_xlabel("fraction of changed weights kept")
            ax.set_title(f"{model} / {task}" + (f" -> {eval_task}" if eval_task != task else ""))
        hide_unused(axes, len(tasks))
        label_left(axes, "accuracy")
        shared_legend(fig, axes)

    draw_figure(output, draw, *panel_grid(len(tasks)), size=(4.2, 3.2))


# Interpolation panels, in the order paper A reads them: the three lam paths (mode connectivity),
# then the three directions scanned over the ES update's length (esgrpo.workflow.stages.analysis).
INTERPOLATION_PANELS = {
    "base-es": ("base -> ES", "lambda (0 = base, 1 = ES)"),
    "base-grpo": ("base -> GRPO", "lambda (0 = base, 1 = GRPO)"),
    "es-grpo": ("ES -> GRPO", "lambda (0 = ES, 1 = GRPO)"),
    "dir-es": ("along dES", "distance / ||dES||"),
    "dir-grpo": ("along dGRPO", "distance / ||dES||"),
    "dir-random": ("along a random direction", "distance / ||dES||"),
}


def figure_interpolation(data: StageInputs, output: dict) -> None:
    """Greedy accuracy along each path: one row per trained task, one column per path, one colour per
    evaluation task (the row's own task drawn thick), seeds averaged; one legend below the grid."""
    interp = exact_pairs(data.analysis("interpolation"))  # the main runs' (the papers' arithmetic: es_arithmetic)
    if interp.empty:
        return placeholder(output, "Interpolation", "no interpolation analyses (needs ES and GRPO)")
    sns = seaborn()
    rows = sorted(set(zip(interp["model"], interp["task"], strict=True)))
    paths = [p for p in INTERPOLATION_PANELS if p in set(interp["path"])]
    eval_tasks = sorted(set(interp["eval_task"]))
    colours = palette_for(sns, eval_tasks)
    curves = interp.groupby(["model", "task", "path", "eval_task", "lam"], as_index=False)["greedy"].mean()

    def draw(fig, axes):
        for (r, (model, task)), (c, path) in ((rc, pc) for rc in enumerate(rows) for pc in enumerate(paths)):
            ax = axes[r, c]
            d = curves[(curves["model"] == model) & (curves["task"] == task) & (curves["path"] == path)]
            for eval_task, g in d.groupby("eval_task"):
                own = eval_task == task
                ax.plot(g["lam"], g["greedy"], color=colours[eval_task], lw=2.6 if own else 1.1,
                        alpha=1.0 if own else 0.75, marker="o", ms=3.5 if own else 2.5, zorder=3 if own else 2)
            ax.set_title(INTERPOLATION_PANELS[path][0] if r == 0 else "", fontsize="medium")
            ax.set_xlabel(INTERPOLATION_PANELS[path][1] if r == len(rows) - 1 else "", fontsize="small")
            ax.set_ylabel(f"trained on {task}\n({model}) greedy acc." if c == 0 else "", fontsize="small")
        handles = [pyplot().Line2D([], [], color=colours[t], lw=1.5, marker="o", ms=3) for t in eval_tasks]
        own = pyplot().Line2D([], [], color="black", lw=2.6)
        shared_legend(fig, axes, "evaluated on", [*zip(handles, eval_tasks, strict=True),
                                                  (own, "thick: the row's trained task")], where="bottom")

    # six paths side by side at ~2.2 in each: ~13 in wide, legible when the report scales it down
    draw_figure(output, draw, len(rows), max(1, len(paths)), size=(2.2, 1.9), sharey=True, sharex="col")


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
            ax.tick_params(axis="y", rotation=0)  # task names read across, not up the side
            ax.tick_params(axis="x", rotation=30)
            for label in ax.get_xticklabels():
                label.set_horizontalalignment("right")
        hide_unused(axes, len(panels))

    draw_figure(output, draw, *panel_grid(len(panels), max_cols=2), size=(5.4, 4.2))


def figure_kl_heatmap(data: StageInputs, output: dict) -> None:
    kl = data.analysis("kl")
    if kl.empty:
        return placeholder(output, "KL heatmap", "no KL analyses")
    # single-task runs (rows: the task trained on) and, in panels of their own, the continual stages
    # (rows: stage k and its task), as paper A's heatmap covers its sequence
    sequence = kl_sequence_label(kl)
    continual = sequence != "single task"
    kl = kl.assign(panel=kl["model"] + np.where(continual, ", continual", ""),
                   trained=np.where(continual, sequence.str.replace("continual stage ", "stage ") + ": " + kl["task"],
                                    kl["task"]))
    _heatmaps(output, kl, ("panel", "method"), "trained", "token_mean", "KL(base || model)", "trained on",
              sort_rows=True, fmt=".3f", cmap="viridis", vmin=0, vmax=float(kl["token_mean"].max()),
              cbar_kws={"label": "token-mean KL(base || model) (nats)"})


def figure_sequential_matrix(data: StageInputs, output: dict) -> None:
    long = build_a_sequential(data)
    if long.empty:
        return placeholder(output, "Continual sequence", "no continual sequence in this config")
    accuracy = long[long["row"] == "accuracy"]
    accuracy = accuracy.assign(stage_label=accuracy["stage"].astype(str) + ": " + accuracy["stage_task"])
    _heatmaps(output, accuracy, ("model", "method"), "stage_label", "value", "greedy accuracy", "after stage",
              sort_rows=False, fmt=".2f", cmap="magma", vmin=0, vmax=1, cbar_kws={"label": "test greedy accuracy"})
