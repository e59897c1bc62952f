"""The ES weight math, one place for every backend: seeds, fitness shaping, the update
(the noise itself is `esgrpo.noise`, which the engines use too).

Pure torch and numpy: no transformers generation, no vLLM. The transformers backend
(`esgrpo.es.hf_backend`) and the vLLM workers (`esgrpo.es.vllm_backend`) both call these, so a member's weights
and the update are the same functions of (run seed, iteration, tensor name) on either backend.

Per iteration t, with theta the fp32 master copy of every trainable tensor:

1. draw N member seeds from a generator seeded by (run seed, t) (antithetic: N/2 seeds, each
   used with +eps and -eps);
2. member n has theta_n = theta + sign_n * sigma * eps_n, eps_n regenerated in fp32 from
   (member seed, tensor name), independently per tensor: full-rank, or low-rank A B^T / sqrt(r) for
   2-D tensors (`ESConfig.noise`, `esgrpo.noise.Noise`);
3. normalise the fitness (z-score, centred rank, or none; rank / none optionally scaled to the
   z-score's sum w^2 = N) into weights w_n;
4. theta <- theta + alpha / N * sum_n w_n * sign_n * eps_n, accumulated in fp32, applied once.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from esgrpo.distance import NORM_CHUNK_ELEMENTS, StepAgreement, squared_norm
from esgrpo.noise import FULL, MASK63, Noise, Population, mix_seeds

if TYPE_CHECKING:
    from esgrpo.es.settings import ESConfig

__all__ = [
    "SeedSign",
    "all_equal",
    "apply_update",
    "iter_population",
    "js_rollout_seed",
    "member_seeds",
    "member_weights",
    "normalize_fitness",
    "perturbed_population",
    "epoch_batch",
    "prompt_batch",
    "rollout_seed",
    "select_trainable",
    "StepOf",
    "update_coefficients",
]

SeedSign = tuple[int, float]

# --------------------------------------------------------------------------- seeds

# Stream tags keep the draws of one iteration apart: member seeds, prompt choice, rollouts, the JS
# diversity's extra rollouts.
_STREAM_MEMBERS, _STREAM_PROMPTS, _STREAM_ROLLOUT, _STREAM_JS = 0, 1, 2, 3


def _rng(run_seed: int, iteration: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(run_seed), int(iteration), stream]))


def member_seeds(run_seed: int, iteration: int, n: int, antithetic: bool) -> list[SeedSign]:
    """The population of iteration `iteration`: n pairs (member seed, sign), a function of its inputs only.

    Antithetic: n/2 seeds, each as (s, +1) then (s, -1), so paired members share their noise.
    """
    if n < 1 or (antithetic and n % 2):
        raise ValueError(f"n must be >= 1 (and even when antithetic), got {n}")
    count = n // 2 if antithetic else n
    draws = _rng(run_seed, iteration, _STREAM_MEMBERS).integers(0, MASK63, size=count, dtype=np.int64,
                                                                   endpoint=True)
    seeds = [int(s) for s in draws]
    if antithetic:
        return [pair for s in seeds for pair in ((s, 1.0), (s, -1.0))]
    return [(s, 1.0) for s in seeds]


def rollout_seed(run_seed: int, iteration: int) -> int:
    """The seed of iteration `iteration`'s sampled fitness rollouts (a resumed run draws them again)."""
    return mix_seeds(run_seed, iteration, _STREAM_ROLLOUT)


def js_rollout_seed(run_seed: int, iteration: int) -> int:
    """The seed of iteration `iteration`'s extra sampled rollouts for the JS diversity (`ESConfig.js_samples`)."""
    return mix_seeds(run_seed, iteration, _STREAM_JS)


def epoch_batch(n_rows: int, batch_size: int, seed: int, iteration: int) -> list[int]:
    """Row indices of iteration `iteration` (0-based) under paper B's schedule (its data.py
    `build_training_schedule`, 240d878): one `numpy.random.default_rng(seed)` shuffles `arange(n_rows)`
    afresh for each epoch, in turn; an epoch is that permutation cut into batches of `batch_size`, the
    last one shorter. Past the epochs paper B runs, the same stream goes on."""
    per_epoch = math.ceil(n_rows / batch_size)
    epoch, step = divmod(iteration, per_epoch)
    rng = np.random.default_rng(seed)
    for _ in range(epoch + 1):  # the permutations before this epoch's advance the stream
        order = np.arange(n_rows)
        rng.shuffle(order)
    return [int(i) for i in order[step * batch_size:(step + 1) * batch_size]]


def prompt_batch(rows: Sequence[dict], cfg: ESConfig, iteration: int) -> list[dict]:
    """The prompts of one iteration: a fixed head of `rows`, a fresh draw seeded by (seed, iteration), or
    paper B's epochs (`prompt_schedule: epochs`, epoch_batch)."""
    k = len(rows) if cfg.prompts_per_iteration is None else min(cfg.prompts_per_iteration, len(rows))
    if cfg.prompt_schedule == "epochs":
        seed = cfg.seed if cfg.prompt_seed is None else cfg.prompt_seed
        return [rows[i] for i in epoch_batch(len(rows), k, seed, iteration)]
    if not cfg.resample_prompts:
        return list(rows[:k])
    chosen = _rng(cfg.seed, iteration, _STREAM_PROMPTS).choice(len(rows), size=k, replace=False)
    return [rows[int(i)] for i in chosen]


def select_trainable(names: Sequence[str], patterns: Sequence[str]) -> list[str]:
    """The tensor names matching any glob of `ESConfig.trainable`, in their order (an error if none does)."""
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not chosen:
        raise ValueError(f"ESConfig.trainable {list(patterns)} matches no parameter; names look like {list(names)[:5]}")
    return chosen


# --------------------------------------------------------------------------- noise


def member_weights(base: torch.Tensor, eps: torch.Tensor, sign: float, sigma: float) -> torch.Tensor:
    """One member's tensor ``theta + sign * sigma * eps`` in fp32, always from the clean master theta
    (never by adding then subtracting noise: restoring is then exact by construction)."""
    return base.add(eps, alpha=sign * sigma)


def perturbed_population(theta: Mapping[str, torch.Tensor], seeds_signs: Sequence[SeedSign], sigma: float,
                         dtypes: Mapping[str, torch.dtype] | None = None, noise: Noise = FULL) -> dict[str, torch.Tensor]:
    """Stacked member weights ``theta + sign_n * sigma * eps_n``: one [N, *shape] tensor per name.

    The `esgrpo.noise.Population` materialised: N x d numbers (cast to `dtypes[name]` if given,
    e.g. the model's bf16). The population engine takes the lazy `Population` instead.
    """
    population = Population(theta, seeds_signs, sigma, noise, dtypes)
    return {name: population[name] for name in theta}


def iter_population(theta: Mapping[str, torch.Tensor], seeds_signs: Sequence[SeedSign], sigma: float,
                    dtypes: Mapping[str, torch.dtype] | None = None, noise: Noise = FULL) -> Iterator[dict[str, torch.Tensor]]:
    """One member's weights at a time (for a sequential evaluator): d numbers in memory, not N x d."""
    return Population(theta, seeds_signs, sigma, noise, dtypes).members()


# --------------------------------------------------------------------------- fitness shaping


def all_equal(f: np.ndarray | Sequence[float]) -> bool:
    """True when every member scored exactly the same: no signal, so the update is skipped
    (z-scoring would divide by ~0)."""
    f = np.asarray(f, dtype=np.float64).ravel()
    return bool(f.size == 0 or np.all(f == f[0]))


def normalize_fitness(f: np.ndarray | Sequence[float], method: str = "zscore", unit_rms: bool = False) -> np.ndarray:
    """Fitness shaping: the weights w_n of the update.

    zscore: (f - mean) / (std + 1e-8) with the population std (ddof=0), so sum w^2 ~= N: paper B's
    public code, whose only shaping it is (docs/references.md);
    rank: centred ranks rank/(N-1) - 0.5 in [-0.5, 0.5], ties share their average rank, so
    (without ties) sum w^2 = N(N+1) / (12(N-1)) and at the same alpha the step is sqrt(12(N-1)/(N+1)) (~3.3 at N=16,
    -> sqrt(12) ~ 3.46) times smaller than z-score's;
    none: f unchanged (uncentred: the step's size follows the fitness level, its direction includes
    the sum of the noise).

    unit_rms: rank and none weights scaled to the z-score's second moment, sum w^2 = N, so at the same
    alpha the three shapings take steps of the same expected size and differ only in direction
    (z-scores are returned as they are; all-zero weights stay zero).
    """
    f = np.asarray(f, dtype=np.float64).ravel()
    if f.size == 0 or not np.all(np.isfinite(f)):
        raise ValueError(f"fitness must be a non-empty array of finite values, got {f}")
    if method == "zscore":
        return (f - f.mean()) / (f.std(ddof=0) + 1e-8)
    if method == "rank":
        weights = _centred_ranks(f)
    elif method == "none":
        weights = f.copy()
    else:
        raise ValueError(f"normalization must be one of ['zscore', 'rank', 'none'], got {method!r}")
    return _to_unit_rms(weights) if unit_rms else weights


def _centred_ranks(f: np.ndarray) -> np.ndarray:
    """rank/(N-1) - 0.5 in [-0.5, 0.5], tied values sharing their average rank; 0 for a lone member."""
    if f.size == 1:
        return np.zeros(1)
    order = np.argsort(f, kind="stable")
    ranks = np.empty(f.size)
    ranks[order] = np.arange(f.size, dtype=np.float64)
    for value in np.unique(f):  # average the ranks of tied values
        tied = f == value
        ranks[tied] = ranks[tied].mean()
    return ranks / (f.size - 1) - 0.5


def _to_unit_rms(weights: np.ndarray) -> np.ndarray:
    """weights * sqrt(N / sum w^2): sum w^2 = N, the z-score's second moment (zeros stay zeros)."""
    squares = float(np.sum(weights ** 2))
    return weights * math.sqrt(weights.size / squares) if squares > 0 else weights


# --------------------------------------------------------------------------- the update


def update_coefficients(seeds_signs: Sequence[SeedSign], weights: Sequence[float] | np.ndarray) -> dict[int, float]:
    """sum_n w_n sign_n eps_n as {seed: coefficient}: antithetic partners share one noise draw."""
    weights = np.asarray(weights, dtype=np.float64).ravel()
    if weights.size != len(seeds_signs):
        raise ValueError(f"{weights.size} weights for {len(seeds_signs)} members")
    coefficient: dict[int, float] = {}
    for (seed, sign), w in zip(seeds_signs, weights, strict=True):
        coefficient[int(seed)] = coefficient.get(int(seed), 0.0) + float(w) * float(sign)
    return coefficient


# step_of(coefficients, name, shape, device) -> sum_seed c_seed * eps_seed of one tensor in fp32:
# `Noise.weighted_sum`, or the vLLM layout's of a fused tensor (`esgrpo.engines.vllm_layout.fused_weighted_sum`)
StepOf = Callable[[Mapping[int, float], str, Sequence[int], torch.device], torch.Tensor]


@torch.no_grad()
def apply_update(theta: Mapping[str, torch.Tensor], seeds_signs: Sequence[SeedSign],
                 weights: Sequence[float] | np.ndarray, alpha: float, noise: Noise = FULL,
                 step_of: StepOf | None = None, agreement: StepAgreement | None = None) -> float:
    """``theta += alpha / N * sum_n w_n sign_n eps_n`` in place, one fp32 tensor at a time; returns ||step||.

    The noise is regenerated from the seeds (antithetic partners share one draw), summed in fp32
    (low rank: one matmul of the stacked weighted factors per tensor, `esgrpo.noise.Noise.weighted_sum`)
    and applied once, so small updates are not rounded away. Beside theta it holds one tensor's fp32
    step and one noise draw (`step_of`'s own temporaries included), then the norm's float64 chunk
    (`esgrpo.distance.squared_norm`): what `esgrpo.plan.memory.es_update_bytes` counts. `agreement`, where
    given, also counts what theta takes of the step (``(theta + step) - theta`` a norm chunk at a time).
    """
    coefficients = update_coefficients(seeds_signs, weights)
    scale = float(alpha) / len(seeds_signs)
    step_of = step_of or noise.weighted_sum
    squares = 0.0
    for name, value in theta.items():
        step = step_of(coefficients, name, value.shape, value.device)
        step.mul_(scale)  # the step itself, so the returned norm is exactly what was applied
        if agreement is not None:
            flat_value, flat_step = value.reshape(-1), step.reshape(-1)
            for start in range(0, flat_value.numel(), NORM_CHUNK_ELEMENTS):
                v, s = flat_value[start:start + NORM_CHUNK_ELEMENTS], flat_step[start:start + NORM_CHUNK_ELEMENTS]
                agreement.add(v.add(s).sub_(v), s, name)
        value.add_(step)
        squares += squared_norm(step)
    return math.sqrt(squares)
