"""The registry of paper stages: every table and figure of papers A and B and the claims tables, each
with its paper, what it reads, its caption and the function that makes it.

The rules (rules/targets.smk, rules/paper.smk) make one rule per entry, the planner (esgrpo.report.planning)
reads each entry's inputs from `needs`, and the report runs it by `entry` (`esgrpo.report.loading.run_paper_stage`, through
workflow_scripts/paper_stage.py). It imports nothing heavy: the DAG parse reads it; the stage's module
(pandas, seaborn) is imported when the stage runs.

`needs`: input key -> the run kinds it reads (esgrpo.report.planning.run_kind; "base" = the base evaluation,
"all" = every file of that analysis), and "where": "ablation" / "sequential" for runs and analyses on that task
only.
`caption`: the table's caption in its Markdown and LaTeX files (the CSV carries the numbers only), with
`{fields}` filled from the stage's setup; a figure's caption is its report page, report/<name>.rst.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

PAPERS = ("Paper A", "Paper B", "Claims")


@dataclass(frozen=True)
class PaperStage:
    """One table or figure."""

    name: str
    paper: str  # PAPERS: the report's category
    kind: str  # "table" | "figure"
    entry: str  # "module:function", called as function(StageInputs, output)
    needs: dict = field(default_factory=dict)
    caption: str | None = None  # tables only


# What each table / figure reads (`needs`), grouped as the tables use them.
_TEST_ES_GRPO = {"base", "es", "grpo"}
_ALL_SINGLE = {"base", "es", "grpo", "es->grpo", "grpo->es"}
_CONTINUAL = {"base", "cl_es", "cl_grpo"}
ES_KINDS = {"es", "es_pop", "es_norm", "es_anti", "es_rank"}

_PAPER_STAGES = [
    PaperStage("a_accuracy", "Paper A", "table", "esgrpo.report.paper_a:table_a_accuracy",
               {"prompts": _TEST_ES_GRPO | {"es_snap"}, "metrics": {"es", "grpo"}},
               ("Paper A: test greedy accuracy on each task's own test set, base vs ES vs GRPO (mean [95% "
                'CI] over seeds and prompts). budget=iterations: final checkpoints after the configured ES '
                'iterations / GRPO steps (ES (K it): the main ES run after K iterations, es.snapshots); '
                'train reward rows (metrics.jsonl fitness_mean; ES: mean over the population): the mean '
                'over a window of logged steps (the last 10%, at least 3, at most half the run; each cell '
                "names its steps in brackets, the CSV's window column lists them; 95% CI over seeds and "
                "the window's steps) ending at the final step (budget=iterations) or, budget=rollouts / "
                "generated_tokens, at the last step within the smaller of the two methods' totals.")),
    PaperStage("a_sequential", "Paper A", "table", "esgrpo.report.paper_a:table_a_sequential",
               {"prompts": _CONTINUAL},
               ('Paper A: continual sequence {sequence}. Test greedy accuracy (mean [95% CI], seeds x '
                'prompts) on every task (columns) after each stage k (rows; stage 0 = base), per method; '
                'forgetting = best earlier stage (1..K-1) - final stage, paired per prompt.')),
    PaperStage("a_update_norms", "Paper A", "table", "esgrpo.report.paper_a:table_a_update_norms",
               {"drift": {"cl_es", "cl_grpo", "es", "grpo", "es_arith"}, "theory": {"cl_es", "es", "es_arith"}},
               ('Paper A: update norm ||theta - theta0||_2 (theta0 = the base model; sqrt of the sum of '
                'the per-tensor squared L2 of the drift analysis) after each continual stage, per method, '
                'and the ES/GRPO ratio (per shared seed, 95% CI over seeds). Single-task rows: the main '
                'runs of each task. ES theory: alpha*sqrt(T d/N) from the base (norm-theory analysis; a '
                "continual stage sums the stages' squares). ES (paper A / B arithmetic): the runs of that "
                "paper's in-place bf16 arithmetic (es.ablations.arithmetic) on the ablation task, a method "
                'each, with their own ratio to GRPO.')),
    PaperStage("a_heldout", "Paper A", "table", "esgrpo.report.paper_a:table_a_heldout",
               {"prompts": _CONTINUAL, "heldout": _CONTINUAL},
               ('Paper A: held-out scores before (base) -> after the continual sequence (final stage), per '
                'method, greedy accuracy and mean@n with 95% CIs (seeds x prompts; the change paired per '
                'prompt). held_out = the task is not in the sequence (paper A: MMLU, IFEval). lm-eval '
                "rows: the benchmark's headline metric through lm-evaluation-harness, one value per prompt "
                '(MMLU acc; IFEval prompt-level strict accuracy; <grid folder>/*/heldout/*.json has every '
                'metric). At toy scale, when every task is in the sequence, no task is held out and each '
                'row reports a trained task before and after the whole sequence.')),
    PaperStage("a_geometry", "Paper A", "table", "esgrpo.report.paper_a:table_a_geometry",
               {"cosine": "all", "interpolation": "all", "kl": {"es", "grpo", "cl_es", "cl_grpo"}},
               ('Paper A: update geometry. cosine(dES, dGRPO) over all parameters (and mean |cos| per '
                'layer / module type); barrier height of the linear path theta0 + (1-l) dES + l dGRPO (max '
                'over interior l of the straight line between the end points minus the accuracy, >= 0; '
                "computed from the interpolation curves); token-mean KL(base || model) on the base model's "
                'own continuations, on the training task and averaged over the other tasks. The pair '
                'column names what a pairwise value compares; the same-method pairs (two seeds of one '
                "method) are the reference for 'orthogonal'; ES / GRPO columns hold each method's own KL. "
                '95% CIs over seeds (and tasks for off-task means).')),
    PaperStage("b_passk", "Paper B", "table", "esgrpo.report.paper_b:table_b_passk",
               {"prompts": _ALL_SINGLE, "metrics": {"es", "grpo"}},
               ("Paper B: Pass@1 and Pass@k at the two largest evaluated k (paper: 16, 32) on each task's "
                'test set, unbiased estimator per prompt, mean [95% CI] over seeds and prompts, for base, '
                'ES, GRPO, ES->GRPO and GRPO->ES (sequential runs on the sequential task only); task = '
                "average: a model judged on several benchmarks (paper B's hard setting), each weighing the "
                'same, per seed, 95% CI over seeds. budget=iterations: final checkpoints; train reward '
                'rows (metrics.jsonl): the mean over a window of logged steps (the last 10%, at least 3, '
                "at most half the run; each cell names its steps in brackets, the CSV's window column "
                "lists them; 95% CI over seeds and the window's steps) ending at the final step or, "
                'budget=rollouts / generated_tokens, at the matched budget.')),
    PaperStage("b_easy_setting", "Paper B", "table", "esgrpo.report.paper_b:table_b_easy_setting",
               {"prompts": _TEST_ES_GRPO},
               ('Paper B (easy setting): number of (model, task) cells where the trained model falls below '
                'the base at Pass@k for the two largest evaluated k (paper: 16 and 32; GRPO below base in '
                '15 of 18). n_below counts point estimates (trained - base < 0, paired per prompt); '
                'n_significant counts cells whose 95% CI lies below 0. A cell whose base and trained '
                'Pass@k are both saturated (1.000 [1.000, 1.000]: every prompt solved in every seed) '
                'cannot fall below the base: it is marked saturated and left out of n_cells, n_below and '
                'n_significant (n_saturated counts them).')),
    PaperStage("b_sequential", "Paper B", "table", "esgrpo.report.paper_b:table_b_sequential",
               {"prompts": _ALL_SINGLE, "where": "sequential"},
               ('Paper B: sequential training on one task. ES->GRPO (GRPO started from the ES run) and '
                'GRPO->ES: Pass@1 vs Pass@K (K = largest evaluated k) against their single-method starts '
                'and the base; differences paired per (seed, prompt). 95% CIs over seeds and prompts.')),
    PaperStage("b_drift", "Paper B", "table", "esgrpo.report.paper_b:table_b_drift",
               {"drift": {"es", "grpo", "es_arith"}},
               ('Paper B: parameter drift of the single-task runs. Relative L2 ||theta - theta0|| / '
                '||theta0|| (theta0 = base) of the whole model (module_type = all) and by module type, '
                "each method's share of its squared update by module type, and the ES/GRPO ratio (per "
                "shared seed; 95% CI over seeds). Paper B: ES moves up to 44x farther; ES's largest "
                'changes in norms and attention. ES (paper A / B arithmetic): the runs of that paper\'s '
                'in-place bf16 arithmetic (es.ablations.arithmetic), a method each, with their own ratio.')),
    PaperStage("b_sparsity", "Paper B", "table", "esgrpo.report.paper_b:table_b_sparsity",
               {"sparsity": "all", "prompts": {"base"}},
               ('Paper B: functional sparsity. Keeping only the largest-|delta| fraction of the changed '
                'coordinates (kind = top_fraction): accuracy and retained gain = (acc - base) / (full '
                'update - base) with base = keep fraction 0 (or the base evaluation) and full = keep '
                'fraction 1. Resetting one module type to the base (kind = reset_module): accuracy and '
                'share of the gain lost. 95% CIs over runs (seeds).')),
    PaperStage("b_ablations", "Paper B", "table", "esgrpo.report.paper_b:table_b_ablations",
               {"prompts": {"es", "es_norm", "es_anti", "es_rank"}, "metrics": {"es", "es_norm", "es_anti", "es_rank"},
                    "where": "ablation"},
               ('Paper B: ES ablations on {ablation_task} at N = {main_n}: fitness normalisation (z-score '
                'vs rank vs none), one-sided vs antithetic (two-point) members, and low-rank noise '
                "(low-rank r=<r>: each 2-D weight's perturbation A B^T / sqrt(r), as EGGROLL, arXiv "
                "2511.16652; es.ablations.ranks) against the main runs' noise at the same N, alpha and "
                'sigma. Test greedy / mean@n (= Pass@1) / Pass@K with 95% CIs over seeds and prompts; '
                'final train reward = mean fitness over the last 10% of iterations, at least 3 (CI over '
                'seeds and iterations). Contrast rows are paired differences (per prompt; per iteration '
                'for the train reward). All settings share N, iterations and prompts per iteration, hence '
                'rollouts: iterations and rollouts budgets coincide. They also share alpha: unless '
                'es.settings.unit_rms_weights is true, rank weights are centred ranks in [-0.5, 0.5] (sum '
                "w^2 = N(N+1)/(12(N-1)) vs the z-score's N: steps ~3.3x smaller at N = 16, ~3.4x at large "
                'N) and none is the raw, uncentred fitness (step size set by the fitness level), so '
                'normalisation and step size differ together; with it, rank / raw weights are scaled to '
                "sum w^2 = N and only the direction differs. Paper B's public code defines only the "
                'z-score.')),
    PaperStage("b_population", "Paper B", "table", "esgrpo.report.paper_b:table_b_population",
               {"prompts": {"es", "es_pop"}, "metrics": {"es", "es_pop"}, "where": "ablation"},
               ('Paper B: population sweep on {ablation_task}. Final train reward (mean fitness over the '
                'last 10% of iterations, at least 3, 95% CI over seeds and iterations) per N at equal '
                'iterations; smallest_sufficient marks the smallest N whose reward is at least the largest '
                "N's minus 0.01 (paper: N = 16 within 0.01 of N = 64). budget=rollouts rows: each N's "
                'reward at the smallest total rollouts of the sweep (mean over the window of steps ending '
                'there).')),
    PaperStage("b_entropy", "Paper B", "table", "esgrpo.report.paper_b:table_b_entropy",
               {"prompts": _TEST_ES_GRPO, "metrics": {"es", "grpo"}},
               ('Paper B: entropy over training (mean token entropy of the training rollouts, '
                'metrics.jsonl): first vs last 10% of steps (at least 3, at most half the run) and the '
                'relative change per run (95% CI over seeds and steps / runs); budget=rollouts / '
                'generated_tokens: entropy at matched budgets (mean over the window of steps ending '
                'there); and the test-time sampling entropy per token of the final checkpoints vs base (CI '
                'over seeds and prompts). Exact entropy unless the method is labelled with its estimator '
                '(vLLM: sampled-token NLL at T=1, else a top-k lumped lower bound; '
                'esgrpo.engines.vllm_engine.entropy_estimator). Paper B: GRPO collapses, ES stays stable.')),
    PaperStage("sequential_matrix", "Paper A", "figure", "esgrpo.report.figures:figure_sequential_matrix",
               {"prompts": _CONTINUAL}),
    PaperStage("es_norm_theory", "Paper A", "figure", "esgrpo.report.figures:figure_es_norm_theory",
               {"theory": "all"}),
    PaperStage("interpolation", "Paper A", "figure", "esgrpo.report.figures:figure_interpolation",
               {"interpolation": "all"}),
    PaperStage("kl_heatmap", "Paper A", "figure", "esgrpo.report.figures:figure_kl_heatmap",
               {"kl": {"es", "grpo", "cl_es", "cl_grpo"}}),
    PaperStage("fitness_curves", "Paper A", "figure", "esgrpo.report.figures:figure_fitness_curves",
               {"metrics": {"es", "grpo"}}),
    PaperStage("passk_curves", "Paper B", "figure", "esgrpo.report.figures:figure_passk_curves",
               {"prompts": _ALL_SINGLE}),
    PaperStage("entropy_curves", "Paper B", "figure", "esgrpo.report.figures:figure_entropy_curves",
               {"metrics": {"es", "grpo"}}),
    PaperStage("population_curves", "Paper B", "figure", "esgrpo.report.figures:figure_population_curves",
               {"metrics": {"es", "es_pop"}, "where": "ablation"}),
    PaperStage("js_diversity_vs_passk_gain", "Paper B", "figure", "esgrpo.report.figures:figure_js_diversity_vs_passk_gain",
               {"prompts": ES_KINDS | {"base"}, "metrics": ES_KINDS}),
    PaperStage("drift_by_module", "Paper B", "figure", "esgrpo.report.figures:figure_drift_by_module",
               {"drift": {"es", "grpo"}}),
    PaperStage("sparsity_curves", "Paper B", "figure", "esgrpo.report.figures:figure_sparsity_curves",
               {"sparsity": "all", "prompts": {"base"}}),
]


def merge_needs(stages: Iterable[PaperStage]) -> dict:
    """The union of what `stages` read (where-restrictions dropped)."""
    out: dict = {}
    for stage in stages:
        for key, kinds in stage.needs.items():
            if key == "where":
                continue
            if kinds == "all" or out.get(key) == "all":
                out[key] = "all"
            else:
                out[key] = set(out.get(key, set())) | set(kinds)
    return out


# The claims judge what the tables and two figures measure; verdict stability reads the same.
_CLAIMS_NEEDS = merge_needs([s for s in _PAPER_STAGES if s.kind == "table"]
                            + [s for s in _PAPER_STAGES if s.name in ("js_diversity_vs_passk_gain", "es_norm_theory")])
_CLAIMS = [
    PaperStage("claims", "Claims", "table", "esgrpo.report.claim_estimates:table_claims", _CLAIMS_NEEDS,
               ('Claims of papers A and B, each judged from its measured analogue: estimate and 95% '
                'bootstrap CI [lo, hi]; verdict by esgrpo.report.claims.verdict (holds / does not hold / '
                "inconclusive when the CI straddles the bound); 'not run' where the config does not train "
                "what the claim needs, 'not measured' where it trains it but not what the paper measures "
                "it on (no held-out task, no N=64 run). A one-seed norm ratio's CI is over parameter "
                "tensors. Magnitude claims: verdict on the direction, the paper's figure beside ours "
                '(docs/references.md).')),
    PaperStage("claims_stability", "Claims", "table", "esgrpo.report.claims_stability:table_claims_stability",
               _CLAIMS_NEEDS,
               ('Verdict stability across training seeds: each claim of the claims table judged on all '
                "seeds pooled (the claims table's 95% CI: a test metric's resamples seeds, then prompts "
                "within each seed) and on each seed alone (the same estimate on that seed's runs; the base "
                "model's rows in every subset). A claim is reported as holding only when the pooled CI "
                "says so; 'seeds agreeing' counts the seeds whose own verdict is the pooled one. 'not "
                "measured': the seed alone cannot judge the claim (not run, or one unit and no interval). "
                'With few seeds the pooled interval is narrow: with 3 it covers about 75% where seeds '
                'dominate the variance (tests/test_hierarchical_bootstrap.py). Seeds: {seeds}.')),
]

# The papers' ES arithmetic beside the exact one (esgrpo.report.arithmetic): what the claims' geometry rests on.
_CLAIMS.append(
    PaperStage("es_arithmetic", "Claims", "table", "esgrpo.report.arithmetic:table_es_arithmetic",
               {"prompts": {"es", "es_arith"}, "metrics": {"es", "es_arith"}, "theory": {"es", "es_arith"},
                "drift": {"es", "es_arith", "grpo"}, "sparsity": {"es", "es_arith", "grpo"}, "cosine": "all",
                "interpolation": "all", "where": "ablation"},
               ("ES arithmetic on {ablation_task}: the exact one (fp32 master, exact restore) beside each "
                "paper's (bf16 in place, no master; es.ablations.arithmetic), at the same population and "
                "seeds. Test greedy accuracy (95% CI over seeds and prompts); ||theta_T - theta_0|| over "
                "alpha*sqrt(T d/N) at the final update; per update, the cosine of the step the weights took "
                "(restores included) with the fp32 sum of coefficients times noise, and the share of "
                "coordinates that changed (means over updates, 95% CI over seeds; empty where the backend "
                "does not measure them). Drift (the drift analysis, from the base model): ES/GRPO ratio of "
                "relative L2 per shared seed against the main GRPO runs (paper B: 44.1x), and the norm "
                "layers' share of ES's squared update; on an fp32 model the papers' runs start from its bf16 "
                "copy, so their drift includes that rounding. The cosine of ES's update with the main GRPO "
                "run's of the same seed (an in-place run's update from its bf16 start). The notes judge "
                "the norm-theory, orthogonality, barrier, drift and sparsity claims with each arithmetic's "
                "runs in the main ES runs' place (the claims table's "
                "estimators, on these seeds and this task) and say whether each survives the exact "
                "arithmetic.")))

STAGES: dict[str, PaperStage] = {s.name: s for s in [*_PAPER_STAGES, *_CLAIMS]}


def stage_names(paper: str | None = None, kind: str | None = None) -> list[str]:
    """The stages of `paper` ("Paper A", "Paper B", "Claims"; None: all) of `kind` ("table", "figure"; None:
    both), in the registry's order."""
    return [s.name for s in STAGES.values() if paper in (None, s.paper) and kind in (None, s.kind)]


def table_caption(name: str, **fields) -> str:
    """Table `name`'s caption, its {fields} filled."""
    text = STAGES[name].caption
    if text is None:
        raise KeyError(f"paper stage {name!r} has no table caption")
    return text.format(**fields) if fields else text


def stage_function(name: str) -> Callable:
    """The function that makes stage `name` (its module imported now)."""
    if name not in STAGES:
        raise KeyError(f"unknown paper stage {name!r}; known: {sorted(STAGES)}")
    module, function = STAGES[name].entry.split(":")
    return getattr(importlib.import_module(module), function)
