"""Every checkable finding of papers A and B as a :class:`~esgrpo.analysis.claims.Claim`.

The claims table (``results/tables/claims.*``) judges each of these from the numbers this
pipeline measured: the estimate and its 95% bootstrap CI come from
:mod:`esgrpo.pipeline.paper`, the verdict from :func:`esgrpo.analysis.claims.verdict`. Nothing
here is a result; it is the list of questions and the tolerance each one is asked with.

``{k}``, ``{k1}`` and ``{k2}`` in a statement or metric are filled with the Pass@k values the
evaluation actually has (paper B uses 16 and 32; a CI config with n = 8 uses 4 and 8).
Margins are tolerances at toy scale, chosen before looking at results:

- equivalence (``~=0``) claims: ``margin`` is the largest difference still called "the same";
- non-inferiority (``>=``) claims: ``margin`` is the largest shortfall still called "not worse".
"""

from __future__ import annotations

from esgrpo.analysis.claims import Claim

__all__ = ["CLAIMS", "claim_by_id"]

CLAIMS: tuple[Claim, ...] = (
    # ------------------------------------------------------------------ paper A
    Claim("a_es_improves", "A", "ES improves test accuracy over the base model",
          "ES - base test greedy accuracy (on-task, pooled over tasks)", ">", 0.0),
    Claim("a_es_matches_grpo", "A", "ES matches GRPO test accuracy",
          "ES - GRPO test greedy accuracy (on-task, pooled over tasks)", "~=0", 0.0, 0.05),
    Claim("a_norm_ratio_continual", "A", "ES moves farther than GRPO over the continual sequence (~90x)",
          "||theta_K - theta_0|| ES / GRPO after the last continual stage", ">", 1.0),
    Claim("a_norm_theory", "A", "ES norm matches alpha*sqrt(T d/N)",
          "slope of ||theta_t - theta_0||^2 vs updates / slope of alpha^2 t d/N", "~=0", 1.0, 0.1),
    Claim("a_no_barrier", "A", "No accuracy barrier on the linear path between the ES and GRPO solutions",
          "barrier height (greedy accuracy) along theta0 + (1-l) dES + l dGRPO, on-task", "~=0", 0.0, 0.05),
    Claim("a_orthogonal", "A", "ES and GRPO updates are nearly orthogonal",
          "|cos(dES, dGRPO)| over all parameters", "~=0", 0.0, 0.1),
    Claim("a_kl_off_task", "A", "ES induces broader off-task KL drift than GRPO",
          "off-task token-mean KL(base || model): ES - GRPO", ">", 0.0),
    Claim("a_heldout_es", "A", "Continual ES keeps held-out accuracy (no catastrophic forgetting)",
          "after - before the continual sequence, greedy accuracy on held-out tasks (ES)", ">=", 0.0, 0.05),
    Claim("a_heldout_grpo", "A", "Continual GRPO keeps held-out accuracy",
          "after - before the continual sequence, greedy accuracy on held-out tasks (GRPO)", ">=", 0.0, 0.05),
    # ------------------------------------------------------------------ paper B
    Claim("b_grpo_below_base_k1", "B", "GRPO falls below base at Pass@{k1} (paper: Pass@16)",
          "GRPO - base Pass@{k1} (on-task, pooled over models and tasks)", "<", 0.0),
    Claim("b_grpo_below_base_k2", "B", "GRPO falls below base at Pass@{k2} (paper: Pass@32)",
          "GRPO - base Pass@{k2} (on-task, pooled over models and tasks)", "<", 0.0),
    Claim("b_es_not_below_base", "B", "ES does not fall below base at Pass@{k2}",
          "ES - base Pass@{k2} (on-task, pooled)", ">=", 0.0, 0.01),
    Claim("b_es_passk_ge_grpo", "B", "ES Pass@K >= GRPO Pass@K (K = {k2})",
          "ES - GRPO Pass@{k2} (on-task, pooled)", ">=", 0.0, 0.01),
    Claim("b_grpo_pass1_ge_es", "B", "GRPO Pass@1 >= ES Pass@1",
          "GRPO - ES Pass@1 (on-task, pooled)", ">=", 0.0, 0.01),
    Claim("b_entropy_es_stable", "B", "ES keeps its entropy over training",
          "ES entropy last / first 10% of training - 1", "~=0", 0.0, 0.1),
    Claim("b_entropy_grpo_collapses", "B", "GRPO's entropy collapses over training",
          "GRPO entropy last / first 10% of training - 1", "<", 0.0, 0.1),
    Claim("b_js_diversity", "B", "Population JS diversity goes with ES's Pass@K gain",
          "Pearson r across ES runs: mean JS diversity vs Pass@{k2} - base Pass@{k2}", ">", 0.0),
    Claim("b_es_then_grpo", "B", "ES->GRPO reaches at least GRPO's Pass@K (K = {k2})",
          "ES->GRPO - GRPO Pass@{k2} (sequential task)", ">=", 0.0, 0.01),
    Claim("b_grpo_then_es", "B", "GRPO->ES raises Pass@K over GRPO (K = {k2})",
          "GRPO->ES - GRPO Pass@{k2} (sequential task)", ">", 0.0),
    Claim("b_drift_ratio", "B", "ES moves farther than GRPO (whole-model relative L2)",
          "relative L2 ES / GRPO, single-task runs", ">", 1.0),
    Claim("b_sparsity", "B", "Functional sparsity: the top 10% of changed coordinates keep most of ES's gain",
          "(mean@n at keep ~0.1 - base) / (full ES - base)", ">", 0.5),
    Claim("b_zscore_vs_none", "B", "z-score normalisation is essential (vs raw fitness)",
          "zscore - none test mean@n (ablation task)", ">", 0.0),
    Claim("b_zscore_vs_rank", "B", "z-score normalisation is essential (vs rank)",
          "zscore - rank test mean@n (ablation task)", ">", 0.0),
    Claim("b_antithetic", "B", "Two-point (antithetic) estimation gives no advantage",
          "antithetic - one-sided test mean@n (ablation task)", "~=0", 0.0, 0.02),
    Claim("b_population", "B", "A smaller population suffices (main N within 0.01 of the largest N's reward)",
          "final train reward (last 10% of iterations): main N - largest N of the sweep", ">=", 0.0, 0.01),
    Claim("b_heldout", "B", "Single-task ES causes no catastrophic forgetting on the other tasks",
          "ES - base greedy accuracy on tasks it was not trained on", ">=", 0.0, 0.05),
)


def claim_by_id(claim_id: str) -> Claim:
    for claim in CLAIMS:
        if claim.id == claim_id:
            return claim
    raise KeyError(f"no claim {claim_id!r}; known: {[c.id for c in CLAIMS]}")
