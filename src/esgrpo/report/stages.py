"""The registry of paper stages: every table and figure rule of rules/paper.smk names one here
(params.stage), and workflow_scripts/paper_stage.py runs it through :func:`run_paper_stage`.
The rules are made from planning's lists (PAPER_A_TABLES, ...), which name the same stages."""

from __future__ import annotations

from collections.abc import Callable

from esgrpo.report import claim_estimates, claims_stability, figures, paper_a, paper_b
from esgrpo.report.loading import StageInputs
from esgrpo.report.planning import NEEDS

Stage = Callable[[StageInputs, dict], None]

TABLES: dict[str, Stage] = {
    "a_accuracy": paper_a.table_a_accuracy,
    "a_sequential": paper_a.table_a_sequential,
    "a_update_norms": paper_a.table_a_update_norms,
    "a_heldout": paper_a.table_a_heldout,
    "a_geometry": paper_a.table_a_geometry,
    "b_passk": paper_b.table_b_passk,
    "b_easy_setting": paper_b.table_b_easy_setting,
    "b_sequential": paper_b.table_b_sequential,
    "b_drift": paper_b.table_b_drift,
    "b_sparsity": paper_b.table_b_sparsity,
    "b_ablations": paper_b.table_b_ablations,
    "b_population": paper_b.table_b_population,
    "b_entropy": paper_b.table_b_entropy,
    "claims": claim_estimates.table_claims,
    "claims_stability": claims_stability.table_claims_stability,
}
FIGURES: dict[str, Stage] = {
    "sequential_matrix": figures.figure_sequential_matrix,
    "es_norm_theory": figures.figure_es_norm_theory,
    "interpolation": figures.figure_interpolation,
    "kl_heatmap": figures.figure_kl_heatmap,
    "fitness_curves": figures.figure_fitness_curves,
    "passk_curves": figures.figure_passk_curves,
    "entropy_curves": figures.figure_entropy_curves,
    "population_curves": figures.figure_population_curves,
    "js_diversity_vs_passk_gain": figures.figure_js_diversity_vs_passk_gain,
    "drift_by_module": figures.figure_drift_by_module,
    "sparsity_curves": figures.figure_sparsity_curves,
}


def run_paper_stage(input, output, params, wildcards, threads) -> None:
    """Runs the table or figure params["stage"] on its inputs, reading only the run kinds it needs."""
    name = params["stage"]
    stage = TABLES.get(name) or FIGURES.get(name)
    if stage is None:
        raise KeyError(f"unknown paper stage {name!r}")
    stage(StageInputs(input, {**params["setup"], "wanted": NEEDS[name]}), output)
