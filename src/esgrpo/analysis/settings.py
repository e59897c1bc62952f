"""The `analysis:` config block: which geometry analyses run, and with what settings.

Read when the workflow parses its DAG (rules/inputs.smk), so it imports nothing heavy; the stages
themselves live in esgrpo.workflow.stages.analysis.
"""

from __future__ import annotations

from collections.abc import Mapping

ANALYSES = ("drift", "theory", "cosine", "sparsity", "kl", "interpolation")
# The cosine, sparsity and interpolation stages keep deltas in float64 up to this many parameters, float32
# above (esgrpo.workflow.stages.analysis); the job planner sizes them by the same bound.
DELTA_F64_LIMIT = 200_000_000

# The block's defaults (schemas/config.schema.yaml declares the same).
DEFAULTS: dict = {
    "analyses": list(ANALYSES),
    "sparsity_fractions": [1.0, 0.5, 0.25, 0.1, 0.05, 0.02, 0.0],
    "interpolation_steps": 11,
    "scan_multiples": [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0],
    "random_direction_seed": 0,
    "eval": {"n_samples": 8, "test_size": 64, "greedy": True},
    "interpolation_eval": {},  # overrides of `eval` for the interpolation/scan points only
    "kl": {"n_prompts": 32, "samples_per_prompt": 4, "temperature": 1.0, "top_p": 1.0,
           "max_new_tokens": None, "seed": 0, "batch_size": 16},
}


def delta_bytes_per_parameter(parameters: int) -> int:
    """Bytes per element of an analysis delta of a model of `parameters` (float64 up to DELTA_F64_LIMIT)."""
    return 8 if parameters <= DELTA_F64_LIMIT else 4


def main_run_seeds(config: Mapping, method: str) -> list[int]:
    """The seeds of `method`'s ("es" | "grpo") main runs; [] when the config trains no such run."""
    block = config.get(method)
    return list(block.get("seeds", [0])) if block else []


def next_seed(config: Mapping, method: str, seed: int) -> int | None:
    """The seed after `seed` among `method`'s main runs (the cosine analysis pairs a run with it), or None."""
    seeds = main_run_seeds(config, method)
    return seeds[seeds.index(seed) + 1] if seed in seeds and seeds.index(seed) + 1 < len(seeds) else None


def analysis_config(config: Mapping) -> dict:
    """The config's `analysis:` block over DEFAULTS (nested blocks `eval`, `kl` merged key by key)."""
    given = dict(config.get("analysis") or {})
    out = {**DEFAULTS, **given}
    for block in ("eval", "kl"):
        out[block] = {**DEFAULTS[block], **(given.get(block) or {})}
    unknown = set(out["analyses"]) - set(ANALYSES)
    if unknown:
        raise ValueError(f"analysis.analyses: unknown {sorted(unknown)}; allowed: {list(ANALYSES)}")
    return out


def analysis_eval_settings(model_eval: Mapping, analysis_eval: Mapping) -> dict:
    """The eval block an analysis evaluates with: the model's eval settings, overridden by
    `analysis.eval` (fewer samples and prompts by default), ks = {1, n_samples}."""
    cfg = {**model_eval, **analysis_eval}
    if cfg.get("backend") != "population":  # analyses move weights in a transformers model: not vLLM
        cfg.pop("backend", None)
    cfg.pop("engine", None)
    n = int(cfg.get("n_samples", 8))
    cfg["ks"] = sorted({1, n})
    return cfg
