"""Seeds-only Evolution Strategies for LLM post-training, in one file that reads top to bottom.

Per iteration t, with theta the fp32 master copy of every trainable tensor:

1. draw N member seeds from a generator seeded by (run seed, t) (antithetic: N/2 seeds, each
   used with +eps and -eps);
2. member n has theta_n = theta + sign_n * sigma * eps_n, eps_n regenerated in fp32 from
   (member seed, tensor name), independently per tensor; its fitness is the mean reward over
   the iteration's prompt batch;
3. normalise the fitness (z-score, centred rank, or none); if every member scored the same,
   skip the update (z-scoring would divide by ~0) and log it;
4. theta <- theta + alpha / N * sum_n w_n * sign_n * eps_n, accumulated in fp32, applied once.

Members are always built from the clean fp32 theta, never by adding then subtracting noise,
so "restore" is exact by construction, and small updates are not rounded away in bf16.
Only seeds drive the randomness: every draw of iteration t comes from (seed, t), so a run
killed at any point and resumed from its last checkpoint ends with bit-identical weights.

Sections: config -> seeds and noise -> fitness shaping -> population and update ->
evaluation -> checkpoints -> the trainer.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from esgrpo.io import write_json, write_jsonl
from esgrpo.metrics import population_js_diversity
from esgrpo.settings import FieldCheck, dataclass_from_dict

__all__ = [
    "ESConfig",
    "FitnessResult",
    "NORMALIZATIONS",
    "REWARD_SCHEMES",
    "stable_name_hash",
    "member_seeds",
    "tensor_noise",
    "normalize_fitness",
    "all_equal",
    "trainable_names",
    "theta_from_model",
    "load_theta_into_model",
    "perturbed_population",
    "iter_population",
    "es_update_direction",
    "prompt_batch",
    "make_population_evaluator",
    "train_es",
]

Row = dict[str, Any]
Theta = dict[str, torch.Tensor]
SeedSign = tuple[int, float]

# --------------------------------------------------------------------------- config

NORMALIZATIONS = ("zscore", "rank", "none")
REWARD_SCHEMES = ("binary", "boxed_partial")


@dataclass
class ESConfig:
    """Every setting of one ES run. Defaults follow Qiu et al. (N=30-32, sigma 1e-3, alpha 5e-4).

    The update is ``theta += alpha / N * sum_n w_n eps_n`` (no 1/sigma: it is folded into
    alpha, as in the papers). ``fitness_temperature`` 0 means greedy fitness rollouts.
    ``reward_scheme`` and ``format_bonus`` are read by the reward function the caller wires
    into the evaluator; they live here so one config describes the whole run.
    """

    population_size: int = 32
    sigma: float = 1e-3
    alpha: float = 5e-4
    iterations: int = 100
    prompts_per_iteration: int | None = 64  # None: every row, every iteration
    resample_prompts: bool = True  # False: the same first `prompts_per_iteration` rows each time
    normalization: str = "zscore"
    antithetic: bool = False
    fitness_temperature: float = 0.0
    fitness_top_p: float = 1.0
    max_new_tokens: int = 64
    reward_scheme: str = "binary"
    format_bonus: float = 0.0
    seed: int = 0
    trainable: list[str] = field(default_factory=lambda: ["*"])
    checkpoint_every: int = 10  # 0: only the final checkpoint
    log_every: int = 1
    # Iterations after which the model is also exported (out_dir/snapshots/it{K}/model): the run
    # after K iterations is exactly a K-iteration run, so one run gives several budgets.
    snapshots: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        check = FieldCheck(self)
        check.integer("population_size", 2)
        check.number("sigma", 0.0, low_open=True)
        check.number("alpha", 0.0, low_open=True)
        check.integer("iterations", 0)
        if self.prompts_per_iteration is not None:
            check.integer("prompts_per_iteration", 1)
        check.boolean("resample_prompts")
        check.boolean("antithetic")
        check.choice("normalization", NORMALIZATIONS)
        if self.antithetic and self.population_size % 2:
            raise check.error("population_size", "must be even when antithetic is true (members come in +/- pairs)")
        check.number("fitness_temperature", 0.0)  # 0 = greedy
        check.number("fitness_top_p", 0.0, 1.0, low_open=True)
        check.integer("max_new_tokens", 1)
        check.choice("reward_scheme", REWARD_SCHEMES)
        check.number("format_bonus")
        check.integer("seed", 0)  # non-negative: it seeds numpy SeedSequences
        if isinstance(self.trainable, str):  # a lone pattern from YAML; iterating it would glob per letter
            self.trainable = [self.trainable]
        if not isinstance(self.trainable, (list, tuple)) or not self.trainable \
                or not all(isinstance(p, str) and p for p in self.trainable):
            raise check.error("trainable", "must be a non-empty list of glob patterns over parameter names")
        self.trainable = list(self.trainable)
        check.integer("checkpoint_every", 0)
        check.integer("log_every", 1)
        if not isinstance(self.snapshots, (list, tuple)) or not all(
                isinstance(k, int) and not isinstance(k, bool) and 1 <= k < self.iterations for k in self.snapshots):
            raise check.error("snapshots", f"must be a list of iteration counts in 1..{self.iterations - 1} "
                                           "(the final model is the run itself)")
        self.snapshots = sorted(set(self.snapshots))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ESConfig:
        """Build from a plain mapping (a config section); unknown keys are an error, not ignored."""
        return dataclass_from_dict(cls, d, "ES")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- seeds and noise

# Stream tags keep the draws of one iteration apart: member seeds, prompt choice, rollouts.
_STREAM_MEMBERS, _STREAM_PROMPTS, _STREAM_ROLLOUT = 0, 1, 2
_MASK63 = (1 << 63) - 1


def stable_name_hash(name: str) -> int:
    """64-bit hash of a tensor name that is the same in every process (Python's `hash` is salted)."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")


def _mix(*values: int) -> int:
    """A 63-bit seed from several integers; a hash, so nearby inputs give unrelated seeds."""
    data = b"".join(int(v & ((1 << 64) - 1)).to_bytes(8, "little") for v in values)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & _MASK63


def _rng(run_seed: int, iteration: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(run_seed), int(iteration), stream]))


def member_seeds(run_seed: int, iteration: int, n: int, antithetic: bool) -> list[SeedSign]:
    """The population of iteration `iteration`: n pairs (member seed, sign), a function of its inputs only.

    Antithetic: n/2 seeds, each as (s, +1) then (s, -1), so paired members share their noise.
    """
    if n < 1 or (antithetic and n % 2):
        raise ValueError(f"n must be >= 1 (and even when antithetic), got {n}")
    count = n // 2 if antithetic else n
    draws = _rng(run_seed, iteration, _STREAM_MEMBERS).integers(0, _MASK63, size=count, dtype=np.int64,
                                                                   endpoint=True)
    seeds = [int(s) for s in draws]
    if antithetic:
        return [pair for s in seeds for pair in ((s, 1.0), (s, -1.0))]
    return [(s, 1.0) for s in seeds]


def tensor_noise(member_seed: int, name: str, shape: Sequence[int] | torch.Size,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Standard normal fp32 noise of one member for one tensor.

    Seeded by a mix of the member seed and the tensor's name, so same-shaped tensors get
    independent noise (the public-code trap: one seed for every tensor) and the same call
    always regenerates the same values. CPU and CUDA generators give different streams.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(_mix(int(member_seed), stable_name_hash(name)))
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32, device=device)


# --------------------------------------------------------------------------- fitness shaping


def all_equal(f: np.ndarray | Sequence[float]) -> bool:
    """True when every member scored exactly the same: no signal, so the update is skipped."""
    f = np.asarray(f, dtype=np.float64).ravel()
    return bool(f.size == 0 or np.all(f == f[0]))


def normalize_fitness(f: np.ndarray | Sequence[float], method: str = "zscore") -> np.ndarray:
    """Fitness shaping: the weights w_n of the update.

    zscore: (f - mean) / (std + 1e-8) with the population std (ddof=0), so sum w^2 ~= N;
    rank: centred ranks rank/(N-1) - 0.5 in [-0.5, 0.5], ties share their average rank;
    none: f unchanged.
    """
    f = np.asarray(f, dtype=np.float64).ravel()
    if f.size == 0 or not np.all(np.isfinite(f)):
        raise ValueError(f"fitness must be a non-empty array of finite values, got {f}")
    if method == "zscore":
        return (f - f.mean()) / (f.std(ddof=0) + 1e-8)
    if method == "rank":
        if f.size == 1:
            return np.zeros(1)
        order = np.argsort(f, kind="stable")
        ranks = np.empty(f.size)
        ranks[order] = np.arange(f.size, dtype=np.float64)
        for value in np.unique(f):  # average the ranks of tied values
            tied = f == value
            ranks[tied] = ranks[tied].mean()
        return ranks / (f.size - 1) - 0.5
    if method == "none":
        return f.copy()
    raise ValueError(f"normalization must be one of {list(NORMALIZATIONS)}, got {method!r}")


# --------------------------------------------------------------------------- population and update


def trainable_names(model: torch.nn.Module, patterns: Sequence[str]) -> list[str]:
    """Parameter names (as `named_parameters` gives them: tied weights once) matching any glob."""
    names = [name for name, _ in model.named_parameters()]
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not chosen:
        raise ValueError(f"ESConfig.trainable {list(patterns)} matches no parameter; names look like {names[:5]}")
    return chosen


def theta_from_model(model: torch.nn.Module, names: Sequence[str]) -> Theta:
    """The fp32 master copy of the trainable tensors (a clone, on the parameters' device)."""
    params = dict(model.named_parameters())
    return {n: params[n].detach().to(torch.float32).clone() for n in names}


@torch.no_grad()
def load_theta_into_model(model: torch.nn.Module, theta: Mapping[str, torch.Tensor]) -> None:
    """Write fp32 tensors into the model's parameters, cast to each parameter's own dtype."""
    params = dict(model.named_parameters())
    for name, value in theta.items():
        params[name].copy_(value)


def _seed_groups(seeds_signs: Sequence[SeedSign]) -> dict[int, list[int]]:
    """Member indices by seed: antithetic partners share one noise draw instead of regenerating it."""
    groups: dict[int, list[int]] = {}
    for index, (seed, _) in enumerate(seeds_signs):
        groups.setdefault(int(seed), []).append(index)
    return groups


@torch.no_grad()
def perturbed_population(theta: Mapping[str, torch.Tensor], seeds_signs: Sequence[SeedSign], sigma: float,
                         dtypes: Mapping[str, torch.dtype] | None = None) -> dict[str, torch.Tensor]:
    """Stacked member weights ``theta + sign_n * sigma * eps_n``: one [N, *shape] tensor per name.

    For a population-batched evaluator; it costs N x d numbers (cast to `dtypes[name]` if
    given, e.g. the model's bf16). theta is only read, so nothing needs restoring.
    """
    groups = _seed_groups(seeds_signs)
    out: dict[str, torch.Tensor] = {}
    for name, base in theta.items():
        dtype = (dtypes or {}).get(name, torch.float32)
        stacked = torch.empty((len(seeds_signs), *base.shape), dtype=dtype, device=base.device)
        for seed, members in groups.items():
            eps = tensor_noise(seed, name, base.shape, base.device)
            for n in members:
                stacked[n] = base.add(eps, alpha=seeds_signs[n][1] * sigma)  # fp32, cast on write
        out[name] = stacked
    return out


def iter_population(theta: Mapping[str, torch.Tensor], seeds_signs: Sequence[SeedSign], sigma: float,
                    dtypes: Mapping[str, torch.dtype] | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """One member's weights at a time (for a sequential evaluator): d numbers in memory, not N x d."""
    for seed, sign in seeds_signs:
        member = {}
        for name, base in theta.items():
            eps = tensor_noise(seed, name, base.shape, base.device)
            member[name] = base.add(eps, alpha=sign * sigma).to((dtypes or {}).get(name, torch.float32))
        yield member


@torch.no_grad()
def update_coefficients(seeds_signs: Sequence[SeedSign], weights: Sequence[float] | np.ndarray) -> dict[int, float]:
    """sum_n w_n sign_n eps_n as {seed: coefficient}: antithetic partners share one noise draw."""
    weights = np.asarray(weights, dtype=np.float64).ravel()
    if weights.size != len(seeds_signs):
        raise ValueError(f"{weights.size} weights for {len(seeds_signs)} members")
    coefficient: dict[int, float] = {}
    for (seed, sign), w in zip(seeds_signs, weights, strict=True):
        coefficient[int(seed)] = coefficient.get(int(seed), 0.0) + float(w) * float(sign)
    return coefficient


def es_update_direction(params_names_shapes: Mapping[str, Sequence[int]] | Iterable[tuple[str, Sequence[int]]],
                        seeds_signs: Sequence[SeedSign], weights: np.ndarray | Sequence[float],
                        device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """``sum_n w_n * sign_n * eps_n`` per tensor, regenerated from the seeds and accumulated in fp32.

    The caller applies ``theta += alpha / N * direction`` once.
    """
    items = params_names_shapes.items() if isinstance(params_names_shapes, Mapping) else params_names_shapes
    coefficient = update_coefficients(seeds_signs, weights)
    direction = {}
    for name, shape in items:
        total = torch.zeros(tuple(shape), dtype=torch.float32, device=device)
        for seed, c in coefficient.items():
            if c != 0.0:
                total.add_(tensor_noise(seed, name, shape, device), alpha=c)
        direction[name] = total
    return direction


def prompt_batch(rows: Sequence[Row], cfg: ESConfig, iteration: int) -> list[Row]:
    """The prompts of one iteration: a fixed head of `rows`, or a fresh draw seeded by (seed, iteration)."""
    k = len(rows) if cfg.prompts_per_iteration is None else min(cfg.prompts_per_iteration, len(rows))
    if not cfg.resample_prompts:
        return list(rows[:k])
    chosen = _rng(cfg.seed, iteration, _STREAM_PROMPTS).choice(len(rows), size=k, replace=False)
    return [rows[int(i)] for i in chosen]


# --------------------------------------------------------------------------- evaluation


@dataclass
class FitnessResult:
    """What an evaluator returns for one population on one prompt batch.

    fitness: [N] mean reward per member; success: [N, B] correct flags (reward >= 1) per member
    and prompt, for the population's JS diversity (None if unknown); generated_tokens: tokens
    generated in this evaluation; entropy: mean token entropy (NaN if unknown); rollouts:
    completions generated (None: N x B).
    """

    fitness: np.ndarray
    success: np.ndarray | None = None
    generated_tokens: int = 0
    entropy: float = math.nan
    rollouts: int | None = None


Population = dict[str, torch.Tensor] | Iterator[dict[str, torch.Tensor]]
# evaluate_population(population, prompt_rows, cfg, generator=torch.Generator) -> FitnessResult
EvaluatePopulation = Callable[..., FitnessResult]


def _prompt_text(tokenizer: Any, row: Row) -> str:
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
    """Every id that ends a turn: chat models list several in their generation config."""
    config = getattr(model, "generation_config", None)
    ids = getattr(config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("neither the model's generation config nor the tokenizer names an EOS token")
    return ids


def make_population_evaluator(model: torch.nn.Module, tokenizer: Any, verifier: Callable[[str, Row], float],
                              generate_fn: Callable[..., Any] | None = None, *,
                              prompt_chunk: int | None = None) -> EvaluatePopulation:
    """The default `evaluate_population`: population-batched generation, then the reward function.

    verifier: ``reward_fn(completion_text, row) -> float`` (the caller binds verifier name,
    reward scheme and format bonus); a completion counts as a success when its reward >= 1.
    generate_fn: ``generate_fn(model, stacked, input_ids, attention_mask, max_new_tokens,
    eos_token_ids (a list), pad_token_id, temperature, top_p, generator)`` returning ``.tokens`` [N,B,L],
    ``.lengths`` [N,B] and ``.entropies`` [N,B,L]; default `esgrpo.population.population_generate`.
    A sequential population (an iterator of member dicts) is run one member at a time as N=1.
    prompt_chunk bounds how many prompts one generation call holds (memory).
    """

    def evaluate(population: Population, prompt_rows: Sequence[Row], cfg: ESConfig,
                 generator: torch.Generator | None = None) -> FitnessResult:
        gen_fn = generate_fn
        if gen_fn is None:  # imported lazily: the population engine is optional for this module
            from esgrpo.population import population_generate as gen_fn
        texts = [_prompt_text(tokenizer, row) for row in prompt_rows]
        eos = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        device = next(model.parameters()).device
        chunk = prompt_chunk or len(texts)
        members = [population] if isinstance(population, Mapping) else (
            {name: value.unsqueeze(0) for name, value in member.items()} for member in population)
        rewards_per_group, tokens_total, entropy_sum, entropy_count = [], 0, 0.0, 0
        side = tokenizer.padding_side
        tokenizer.padding_side = "left"  # generation continues at the right edge of every row
        try:
            for stacked in members:
                group_rewards = []
                for start in range(0, len(texts), chunk):
                    rows_here = prompt_rows[start:start + chunk]
                    enc = tokenizer(texts[start:start + chunk], return_tensors="pt", padding=True,
                                    add_special_tokens=False)
                    out = gen_fn(model, stacked, enc["input_ids"].to(device), enc["attention_mask"].to(device),
                                 cfg.max_new_tokens, eos, pad, cfg.fitness_temperature, cfg.fitness_top_p,
                                 generator)
                    tokens, lengths = out.tokens.cpu(), out.lengths.cpu().long()
                    valid = torch.arange(tokens.shape[-1])[None, None, :] < lengths[..., None]
                    entropy_sum += float((out.entropies.cpu().double() * valid).sum())
                    entropy_count += int(valid.sum())
                    tokens_total += int(lengths.sum())
                    rewards = np.zeros(tuple(lengths.shape))
                    cache: dict[tuple[int, str], float] = {}  # greedy members often write the same text
                    for n in range(tokens.shape[0]):
                        for b, row in enumerate(rows_here):
                            text = tokenizer.decode(tokens[n, b, :lengths[n, b]].tolist(), skip_special_tokens=True)
                            if (b, text) not in cache:
                                cache[(b, text)] = float(verifier(text, row))
                            rewards[n, b] = cache[(b, text)]
                    group_rewards.append(rewards)
                rewards_per_group.append(np.concatenate(group_rewards, axis=1))
        finally:
            tokenizer.padding_side = side
        rewards = np.concatenate(rewards_per_group, axis=0)  # [N, B]
        return FitnessResult(
            fitness=rewards.mean(axis=1), success=rewards >= 1.0, generated_tokens=tokens_total,
            entropy=entropy_sum / entropy_count if entropy_count else math.nan, rollouts=int(rewards.size))

    return evaluate


# --------------------------------------------------------------------------- checkpoints
# progress_dir/theta0.safetensors        the starting point, written once (for distance_from_init)
# progress_dir/step-00000004/            one complete checkpoint: theta.safetensors + state.json
# A checkpoint folder is filled under a temporary name and renamed: it exists whole or not at all.

_STEP_PREFIX = "step-"
# Settings that do not change the trajectory: a run may be resumed with more iterations.
_NOT_FINGERPRINTED = ("iterations", "checkpoint_every", "log_every", "snapshots")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_tensors(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))
    _fsync(path)


def _load_tensors(path: Path, device: torch.device) -> Theta:
    from safetensors.torch import load_file

    return {k: v.to(device) for k, v in load_file(str(path)).items()}


def _fingerprint(cfg: ESConfig, names: Sequence[str], rows: Sequence[Row], population: str) -> str:
    settings = {k: v for k, v in cfg.to_dict().items() if k not in _NOT_FINGERPRINTED}
    blob = json.dumps({"settings": settings, "names": list(names), "rows": list(rows), "population": population},
                      sort_keys=True, default=str)
    return hashlib.blake2b(blob.encode("utf-8"), digest_size=16).hexdigest()


def _checkpoints(progress_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in progress_dir.glob(f"{_STEP_PREFIX}*"):
        try:
            found.append((int(path.name[len(_STEP_PREFIX):]), path))
        except ValueError:
            continue
    return sorted(found)


def _write_checkpoint(progress_dir: Path, done: int, theta: Theta, state: dict[str, Any]) -> None:
    final = progress_dir / f"{_STEP_PREFIX}{done:08d}"
    if not final.exists():  # a resumed run re-reaching a saved step would write the same bytes
        tmp = Path(tempfile.mkdtemp(dir=progress_dir, prefix=".tmp-"))
        _save_tensors(theta, tmp / "theta.safetensors")
        write_json(tmp / "state.json", state)
        _fsync(tmp)
        os.replace(tmp, final)
        _fsync(progress_dir)
    for step, path in _checkpoints(progress_dir):  # only the newest is needed
        if step < done:
            shutil.rmtree(path, ignore_errors=True)


def _start_fresh(progress_dir: Path, theta0: Theta) -> None:
    for _, path in _checkpoints(progress_dir):
        shutil.rmtree(path, ignore_errors=True)
    tmp = progress_dir / ".tmp-theta0.safetensors"
    _save_tensors(theta0, tmp)
    os.replace(tmp, progress_dir / "theta0.safetensors")
    _fsync(progress_dir)


def _resume(progress_dir: Path, fingerprint: str, theta0: Theta, iterations: int,
            log: Callable[[str], Any]) -> tuple[int, Theta, dict[str, Any]] | None:
    """(iterations done, theta, state) of the newest usable checkpoint, or None to start afresh."""
    found = _checkpoints(progress_dir)
    if not found or not (progress_dir / "theta0.safetensors").exists():
        return None
    done, path = found[-1]
    state = json.loads((path / "state.json").read_text())
    device = next(iter(theta0.values())).device
    saved0 = _load_tensors(progress_dir / "theta0.safetensors", device)
    same_start = saved0.keys() == theta0.keys() and all(torch.equal(saved0[k], theta0[k]) for k in theta0)
    if state.get("fingerprint") != fingerprint or not same_start:
        log(f"es: {progress_dir} holds a run with other settings or another starting model; starting afresh")
        return None
    if done > iterations:
        log(f"es: checkpoint at iteration {done} is past iterations={iterations}; starting afresh")
        return None
    return done, _load_tensors(path / "theta.safetensors", device), state


# --------------------------------------------------------------------------- the trainer


def _norm(tensors: Iterable[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


SNAPSHOT_DIR = "snapshots"


def snapshot_dir(out_dir: str | os.PathLike, iteration: int) -> Path:
    """Where a run exports its model after `iteration` iterations (`ESConfig.snapshots`)."""
    return Path(out_dir) / SNAPSHOT_DIR / f"it{int(iteration)}"


def run_record(cfg: ESConfig, totals: Mapping[str, Any], parameters: int, distance: float) -> dict[str, Any]:
    """The state of an ES run so far, as its summary (and a snapshot's) reports it; one place for the
    norm theory's alpha * sqrt(updates * d / N)."""
    return {"updates": int(totals["updates"]), "skipped": int(totals["skipped"]),
            "trainable_parameters": int(parameters), "distance_from_init": float(distance),
            "theory_distance": cfg.alpha * math.sqrt(totals["updates"] * parameters / cfg.population_size),
            "rollouts": int(totals["rollouts"]), "generated_tokens": int(totals["generated_tokens"]),
            "seconds": float(totals["seconds"])}


def snapshot_record(cfg: ESConfig, iteration: int, totals: Mapping[str, Any], parameters: int,
                    distance: float, fingerprint: str) -> dict[str, Any]:
    """What a snapshot's summary says: the run's state after `iteration` iterations (and which run)."""
    return {"iteration": int(iteration), "fingerprint": fingerprint, **run_record(cfg, totals, parameters, distance)}


def snapshots_missing(out_dir: str | os.PathLike, snapshots: Sequence[int], done: int, fingerprint: str) -> list[int]:
    """The snapshots at or before iteration `done` that this run (its fingerprint) has not exported.

    A run resumed past such a K would never export it (e.g. es.snapshots gained K after the run
    checkpointed beyond it): the trainers then start afresh instead.
    """
    missing = []
    for k in snapshots:
        record = snapshot_dir(out_dir, k) / "snapshot.json"
        if k <= done and (not record.exists() or json.loads(record.read_text()).get("fingerprint") != fingerprint):
            missing.append(int(k))
    return missing


def clear_snapshots(out_dir: str | os.PathLike) -> None:
    """A fresh start drops every snapshot of an earlier run in `out_dir`."""
    shutil.rmtree(Path(out_dir) / SNAPSHOT_DIR, ignore_errors=True)


@torch.no_grad()
def train_es(model: torch.nn.Module, tokenizer: Any, rows: Sequence[Row], cfg: ESConfig,
             evaluate_population: EvaluatePopulation, out_dir: str | os.PathLike,
             progress_dir: str | os.PathLike, log: Callable[[str], Any] = print, *,
             population: Literal["stacked", "sequential"] = "stacked") -> dict[str, Any]:
    """Run ES on `model` (trained in place) and write `out_dir`/{model/, metrics.jsonl, summary.json}.

    evaluate_population(pop, prompt_rows, cfg, generator=...) -> FitnessResult, where pop is
    the stacked member weights (population="stacked", dict name -> [N, *shape]) or an iterator
    of member dicts (population="sequential"); `generator` is a torch.Generator seeded by
    (seed, iteration) for sampled rollouts. Checkpoints go to `progress_dir` every
    `cfg.checkpoint_every` iterations; an existing checkpoint of the same run is resumed.
    Returns the summary.
    """
    if population not in ("stacked", "sequential"):
        raise ValueError(f"population must be 'stacked' or 'sequential', got {population!r}")
    if not rows:
        raise ValueError("no training rows")
    out_dir, progress_dir = Path(out_dir), Path(progress_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress_dir.mkdir(parents=True, exist_ok=True)
    for stale in progress_dir.glob(".tmp-*"):  # a kill mid-checkpoint leaves these behind
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    model.eval()
    names = trainable_names(model, cfg.trainable)
    params = dict(model.named_parameters())
    dtypes = {n: params[n].dtype for n in names}
    device = params[names[0]].device
    theta0 = theta_from_model(model, names)
    d = sum(t.numel() for t in theta0.values())
    N = cfg.population_size
    fingerprint = _fingerprint(cfg, names, rows, population)

    resumed = _resume(progress_dir, fingerprint, theta0, cfg.iterations, log)
    if resumed is not None and (missing := snapshots_missing(out_dir, cfg.snapshots, resumed[0], fingerprint)):
        log(f"es: snapshots {missing} lie before the checkpoint at iteration {resumed[0]} and were never "
            f"exported by this run; starting afresh")
        resumed = None
    if resumed is None:
        _start_fresh(progress_dir, theta0)
        clear_snapshots(out_dir)
        start, theta = 0, {k: v.clone() for k, v in theta0.items()}
        metrics: list[dict[str, Any]] = []
        totals = {"rollouts": 0, "generated_tokens": 0, "seconds": 0.0, "updates": 0, "skipped": 0}
        log(f"es: fresh run, {d:,} trainable parameters in {len(names)} tensors, N={N}, "
            f"{cfg.iterations} iterations")
    else:
        start, theta, state = resumed
        metrics, totals = state["metrics"], state["totals"]
        log(f"es: resuming after iteration {start} of {cfg.iterations} from {progress_dir}")
    load_theta_into_model(model, theta)

    def state_now() -> dict[str, Any]:
        # No RNG state is carried across iterations: iteration t draws everything from (seed, t).
        return {"format": 1, "fingerprint": fingerprint, "iterations_done": len(metrics), "metrics": metrics,
                "totals": totals, "config": cfg.to_dict()}

    from tqdm.auto import tqdm

    bar = tqdm(total=cfg.iterations, initial=start, desc="es", disable=None, file=sys.stderr, dynamic_ncols=True)
    for t in range(start, cfg.iterations):
        began = time.perf_counter()
        seeds_signs = member_seeds(cfg.seed, t, N, cfg.antithetic)
        batch = prompt_batch(rows, cfg, t)
        rollout_seed = _mix(cfg.seed, t, _STREAM_ROLLOUT)
        # Evaluators that sample from torch's global RNG (HF generate) also repeat on resume.
        torch.manual_seed(rollout_seed)
        generator = torch.Generator(device=device)
        generator.manual_seed(rollout_seed)
        if population == "stacked":
            pop: Population = perturbed_population(theta, seeds_signs, cfg.sigma, dtypes)
        else:
            pop = iter_population(theta, seeds_signs, cfg.sigma, dtypes)
        result = evaluate_population(pop, batch, cfg, generator=generator)
        del pop
        # Restore exactly: a sequential evaluator may have loaded members into the model.
        load_theta_into_model(model, theta)

        fitness = np.asarray(result.fitness, dtype=np.float64).ravel()
        if fitness.size != N or not np.all(np.isfinite(fitness)):
            raise ValueError(f"iteration {t}: evaluator returned fitness {fitness} for N={N} members")
        skipped = all_equal(fitness)
        update_norm = 0.0
        if not skipped:
            weights = normalize_fitness(fitness, cfg.normalization)
            shapes = {n: v.shape for n, v in theta.items()}
            direction = es_update_direction(shapes, seeds_signs, weights, device)
            scale = cfg.alpha / N
            for name, step in direction.items():
                step.mul_(scale)  # the step itself, so the logged norm is exactly what was applied
                theta[name].add_(step)
            update_norm = _norm(direction.values())
            del direction
            load_theta_into_model(model, theta)
            totals["updates"] += 1
        else:
            totals["skipped"] += 1

        totals["rollouts"] += int(result.rollouts if result.rollouts is not None else N * len(batch))
        totals["generated_tokens"] += int(result.generated_tokens)
        totals["seconds"] += time.perf_counter() - began
        row = {
            "method": "es",
            "iteration": t + 1,  # iterations done: distance_from_init ~ alpha*sqrt(updates*d/N)
            "fitness_mean": float(fitness.mean()),
            "fitness_std": float(fitness.std(ddof=0)),
            "fitness_max": float(fitness.max()),
            "fitness_min": float(fitness.min()),
            "update_norm": update_norm,
            "distance_from_init": _norm(theta[k] - theta0[k] for k in theta),
            "updates": totals["updates"],
            "rollouts": totals["rollouts"],
            "generated_tokens": totals["generated_tokens"],
            "seconds": totals["seconds"],
            "entropy": float(result.entropy),
            "js_diversity": population_js_diversity(result.success) if result.success is not None else math.nan,
            "skipped": skipped,
            "prompts": len(batch),
        }
        metrics.append(row)
        done = t + 1
        if done in cfg.snapshots:  # before the checkpoint: a run resumed past K has its snapshot
            _save_es_model(model, tokenizer, snapshot_dir(out_dir, done) / "model")
            write_json(snapshot_dir(out_dir, done) / "snapshot.json",
                       snapshot_record(cfg, done, totals, d, row["distance_from_init"], fingerprint))
        if (cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or done == cfg.iterations:
            _write_checkpoint(progress_dir, done, theta, state_now())
            write_jsonl(out_dir / "metrics.jsonl", metrics)
        if done % cfg.log_every == 0 or done == cfg.iterations:
            log(f"es it {done}/{cfg.iterations} fitness {row['fitness_mean']:.4f}±{row['fitness_std']:.4f} "
                f"max {row['fitness_max']:.4f} |step| {update_norm:.3e} dist {row['distance_from_init']:.3e} "
                f"tokens {row['generated_tokens']} {row['seconds']:.1f}s" + (" SKIPPED (all equal)" if skipped else ""))
        bar.set_postfix(fitness=f"{row['fitness_mean']:.3f}", skipped=totals["skipped"], refresh=False)
        bar.update(1)
    bar.close()

    # The final weights: the fp32 master cast to the model's dtype, saved in HF layout.
    load_theta_into_model(model, theta)
    _save_es_model(model, tokenizer, out_dir / "model")
    write_jsonl(out_dir / "metrics.jsonl", metrics)
    last = metrics[-1] if metrics else {}
    summary = {
        "method": "es",
        "iterations": cfg.iterations,
        **run_record(cfg, totals, d, _norm(theta[k] - theta0[k] for k in theta)),
        "trainable_tensors": len(names),
        "final_fitness_mean": last.get("fitness_mean", math.nan),
        "best_fitness_mean": max((r["fitness_mean"] for r in metrics), default=math.nan),
        "resumed_from": start if resumed is not None else None,
        "config": cfg.to_dict(),
    }
    write_json(out_dir / "summary.json", summary)
    return summary


def _save_es_model(model: torch.nn.Module, tokenizer: Any, path: Path) -> None:
    if tokenizer is not None:
        from esgrpo.models import save_model

        save_model(model, tokenizer, path)
    else:
        from esgrpo.io import atomic_directory

        with atomic_directory(path) as tmp:
            model.save_pretrained(tmp)
