"""Seeds-only Evolution Strategies for LLM post-training: the one ES loop, over any backend.

Per iteration t (the maths is `esgrpo.es.ops`; the weights live in an `esgrpo.es.backend.ESBackend`):

1. draw the member seeds and the prompt batch from (run seed, t);
2. the backend builds the N members ``theta + sign_n * sigma * eps_n`` from the clean fp32
   theta and scores each on the batch: fitness = mean reward;
3. if every member scored the same, skip the update (z-scoring would divide by ~0) and log it;
   else normalise the fitness into weights and the backend applies
   ``theta += alpha / N * sum_n w_n sign_n eps_n``, accumulated in fp32, once;
4. append the metrics row (`esgrpo.run_record.StepRow`) to `metrics.jsonl` (and the live curves, `esgrpo.live`); export snapshots
   (`ESConfig.snapshots`); checkpoint theta every `checkpoint_every` iterations.

Only seeds drive the randomness: every draw of iteration t comes from (seed, t), so a run killed
at any point and resumed from its last checkpoint ends with bit-identical weights. The trainer
never imports transformers' generation or vLLM: the backend does (`esgrpo.es.hf_backend`, `esgrpo.es.vllm_backend`).

Sections: snapshots and the run record -> resume -> the trainer.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from esgrpo.es.backend import BackendStart, ESBackend, FitnessResult
from esgrpo.es.ops import (
    all_equal,
    js_rollout_seed,
    member_seeds,
    normalize_fitness,
    prompt_batch,
    rollout_seed,
)
from esgrpo.es.settings import ESConfig
from esgrpo.estimators import population_js_diversity
from esgrpo.files import append_jsonl, read_json, write_json, write_jsonl
from esgrpo.live import Eta, LiveLog, LiveSettings
from esgrpo.progress import ProgressFolder, fingerprint
from esgrpo.run_record import RunSummary, StepRow

__all__ = ["SNAPSHOT_DIR", "run_record", "snapshot_dir", "snapshot_record", "train_es"]

Row = dict[str, Any]
Log = Callable[[str], Any]

STEP_PREFIX = "step-"  # progress_dir/step-00000004/{theta.safetensors, state.json}: one whole checkpoint

# --------------------------------------------------------------------------- snapshots and the run record

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
                    distance: float, run_id: str) -> dict[str, Any]:
    """What a snapshot's summary says: the run's state after `iteration` iterations (and which run)."""
    return {"iteration": int(iteration), "fingerprint": run_id, **run_record(cfg, totals, parameters, distance)}


def snapshots_missing(out_dir: Path, snapshots: Sequence[int], done: int, run_id: str) -> list[int]:
    """The snapshots at or before iteration `done` that this run has not exported.

    A run resumed past such a K would never export it (e.g. es.snapshots gained K after the run
    checkpointed beyond it): the trainer then starts afresh instead.
    """
    missing = []
    for k in snapshots:
        record = snapshot_dir(out_dir, k) / "snapshot.json"
        if k <= done and (not record.exists() or read_json(record).get("fingerprint") != run_id):
            missing.append(int(k))
    return missing


# --------------------------------------------------------------------------- resume


@dataclass
class _Run:
    """One run's progress: its fingerprint, the metrics rows so far and the cumulative totals."""

    run_id: str
    start: BackendStart
    done: int = 0
    resumed_from: int | None = None
    metrics: list[Row] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=lambda: {
        "rollouts": 0, "generated_tokens": 0, "seconds": 0.0, "updates": 0, "skipped": 0})

    def state(self, cfg: ESConfig) -> dict[str, Any]:
        # No RNG state is carried across iterations: iteration t draws everything from (seed, t).
        return {"format": 2, "iterations_done": len(self.metrics), "metrics": self.metrics,
                "totals": self.totals, "config": cfg.to_dict()}


def _resume_or_start(progress: ProgressFolder, backend: ESBackend, cfg: ESConfig, run: _Run, out_dir: Path,
                     log: Log) -> None:
    """Load the newest checkpoint of this very run into the backend, or clear the folders for a fresh start."""
    found = progress.checkpoints()
    reason = None
    if found and not progress.holds(run.run_id):
        reason = f"{progress.path} holds a run with other settings or another starting model"
    elif found and found[-1][0] > cfg.iterations:
        reason = f"checkpoint at iteration {found[-1][0]} is past iterations={cfg.iterations}"
    elif found and (missing := snapshots_missing(out_dir, cfg.snapshots, found[-1][0], run.run_id)):
        reason = (f"snapshots {missing} lie before the checkpoint at iteration {found[-1][0]} and were never "
                  f"exported by this run")
    if found and reason is None:
        run.done, path = found[-1]
        state = progress.read_state(path)
        run.metrics, run.totals, run.resumed_from = state["metrics"], state["totals"], run.done
        backend.load_state(path)
        # metrics.jsonl is appended every iteration: cut it back to the checkpoint's rows, so a resumed
        # run's file is an uninterrupted one's
        write_jsonl(out_dir / "metrics.jsonl", run.metrics)
        log(f"es: resuming after iteration {run.done} of {cfg.iterations} from {progress.path}")
        return
    if reason is not None:
        log(f"es: {reason}; starting afresh")
    progress.start_fresh(run.run_id)
    shutil.rmtree(out_dir / SNAPSHOT_DIR, ignore_errors=True)  # an earlier run's snapshots
    (out_dir / "metrics.jsonl").unlink(missing_ok=True)  # and its rows
    log(f"es ({backend.name}): fresh run, {run.start.parameters:,} trainable parameters in {run.start.tensors} "
        f"tensors, N={cfg.population_size}, {cfg.iterations} iterations")


# --------------------------------------------------------------------------- the trainer


def train_es(backend: ESBackend, rows: Sequence[Row], cfg: ESConfig, out_dir: str | os.PathLike,
             progress_dir: str | os.PathLike, log: Log = print, live: LiveSettings | None = None) -> RunSummary:
    """Run ES on `backend`'s weights and write `out_dir`/{model/, metrics.jsonl}; returns the run's summary
    (the training stage writes it).

    Checkpoints go to `progress_dir` every `cfg.checkpoint_every` iterations; a checkpoint of the
    same run (settings, rows, start weights) is resumed, anything else is cleared. The folder takes
    one writer at a time (`esgrpo.progress.WriterLock`). `live`: where the live curves go
    (`esgrpo.live`; None: nowhere).
    """
    if not rows:
        raise ValueError("no training rows")
    rows = list(rows)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with ProgressFolder(progress_dir, STEP_PREFIX) as progress:
        start = backend.start(cfg)
        run = _Run(fingerprint({"settings": cfg.trajectory_settings(), "rows": rows, **start.identity},
                               start.start_weights), start)
        _resume_or_start(progress, backend, cfg, run, out_dir, log)
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.iterations, initial=run.done, desc=f"es ({backend.name})", disable=None,
                   file=sys.stderr, dynamic_ncols=True)
        eta = Eta(cfg.iterations, run.done)
        with LiveLog(live, run.done, log) as curves:
            for t in range(run.done, cfg.iterations):
                row = _iteration(backend, rows, cfg, t, run.totals)
                run.metrics.append(row)
                run.done = t + 1
                append_jsonl(out_dir / "metrics.jsonl", row)
                curves.row(row)
                _after_iteration(backend, progress, cfg, run, out_dir, log, eta(run.done))
                bar.set_postfix(fitness=f"{row['fitness_mean']:.3f}", skipped=run.totals["skipped"], refresh=False)
                bar.update(1)
        bar.close()
        return _finish(backend, cfg, run, out_dir)


def _iteration(backend: ESBackend, rows: list[Row], cfg: ESConfig, t: int, totals: dict[str, Any]) -> Row:
    """Iteration t: evaluate the population, update theta (unless all members tied); its metrics row."""
    began = time.perf_counter()
    n = cfg.population_size
    seeds_signs = member_seeds(cfg.seed, t, n, cfg.antithetic)
    batch = prompt_batch(rows, cfg, t)
    result = backend.evaluate(seeds_signs, batch, cfg, rollout_seed(cfg.seed, t))
    fitness = np.asarray(result.fitness, dtype=np.float64).ravel()
    if fitness.size != n or not np.all(np.isfinite(fitness)):
        raise ValueError(f"iteration {t}: the backend returned fitness {fitness} for N={n} members")
    js_diversity = _js_diversity(backend, seeds_signs, batch, cfg, t, result)
    skipped = all_equal(fitness)
    update_norm, agreement = 0.0, None
    if not skipped:
        weights = normalize_fitness(fitness, cfg.normalization, cfg.unit_rms_weights)
        update_norm = backend.apply_update(seeds_signs, weights, cfg.alpha)
        agreement = backend.step_agreement()
        totals["updates"] += 1
    else:
        totals["skipped"] += 1
    totals["rollouts"] += int(result.rollouts if result.rollouts is not None else n * len(batch))
    totals["generated_tokens"] += int(result.generated_tokens)
    totals["seconds"] += time.perf_counter() - began
    return StepRow(
        method="es", iteration=t + 1,  # iterations done: distance_from_init ~ alpha*sqrt(updates*d/N)
        fitness_mean=float(fitness.mean()), fitness_std=float(fitness.std(ddof=0)),
        update_norm=update_norm, distance_from_init=backend.distance_from_init(), updates=totals["updates"],
        rollouts=totals["rollouts"], generated_tokens=totals["generated_tokens"], seconds=totals["seconds"],
        entropy=float(result.entropy), prompts=len(batch),
        extra={"fitness_max": float(fitness.max()), "fitness_min": float(fitness.min()),
               "entropy_estimator": result.entropy_estimator,  # exact, or the vLLM backend's estimate / bound
               "js_diversity": js_diversity, "skipped": skipped, **(agreement or {})}).to_dict()


def _js_diversity(backend: ESBackend, seeds_signs: list[tuple[int, float]], batch: list[Row], cfg: ESConfig,
                  t: int, result: FitnessResult) -> float:
    """Paper B's verifier-projected JS diversity of iteration t's population (`ESConfig.js_samples`).

    Greedy fitness (or js_samples 1): from the fitness rollouts' success flags. Sampled: every
    `js_every` iterations, the backend scores the same members on the batch repeated js_samples - 1
    times, drawn from `js_rollout_seed`; member m's success rate on prompt q over its js_samples
    rollouts is its p_mq. NaN when the backend reports no success flags or on an unmeasured iteration.
    """
    if result.success is None:
        return math.nan
    success = np.asarray(result.success, dtype=np.float64)
    if cfg.fitness_temperature <= 0 or cfg.js_samples == 1:
        return population_js_diversity(success)
    if (t + 1) % cfg.js_every:
        return math.nan
    extra = backend.evaluate(seeds_signs, batch * (cfg.js_samples - 1), cfg, js_rollout_seed(cfg.seed, t))
    if extra.success is None:
        return math.nan
    n, b = success.shape
    samples = np.concatenate([success, np.asarray(extra.success, dtype=np.float64)], axis=1)  # [N, K*B], k-major
    return population_js_diversity(samples.reshape(n, cfg.js_samples, b).mean(axis=1))


def _after_iteration(backend: ESBackend, progress: ProgressFolder, cfg: ESConfig, run: _Run, out_dir: Path,
                     log: Log, eta: str) -> None:
    """A snapshot, a checkpoint and a log line where the schedule asks for them."""
    done, row = run.done, run.metrics[-1]
    if done in cfg.snapshots:  # before the checkpoint: a run resumed past K has its snapshot
        backend.export(snapshot_dir(out_dir, done) / "model")
        write_json(snapshot_dir(out_dir, done) / "snapshot.json",
                   snapshot_record(cfg, done, run.totals, run.start.parameters, row["distance_from_init"],
                                   run.run_id))
    if (cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or done == cfg.iterations:
        progress.write_checkpoint(done, backend.save_state, run.state(cfg))
    if done % cfg.log_every == 0 or done == cfg.iterations:
        log(f"es ({backend.name}) it {done}/{cfg.iterations} fitness {row['fitness_mean']:.4f}"
            f"±{row['fitness_std']:.4f} max {row['fitness_max']:.4f} |step| {row['update_norm']:.3e} "
            f"dist {row['distance_from_init']:.3e} tokens {row['generated_tokens']} {row['seconds']:.1f}s {eta}"
            + (" SKIPPED (all equal)" if row["skipped"] else ""))


def _finish(backend: ESBackend, cfg: ESConfig, run: _Run, out_dir: Path) -> RunSummary:
    """The final model (theta cast to the model's dtype, in HF layout) and every metrics row; the summary."""
    backend.export(out_dir / "model")
    write_jsonl(out_dir / "metrics.jsonl", run.metrics)
    record = run_record(cfg, run.totals, run.start.parameters, backend.distance_from_init())
    shared = {k: record.pop(k) for k in ("updates", "trainable_parameters", "distance_from_init", "rollouts",
                                          "generated_tokens", "seconds")}
    return RunSummary(method="es", iterations=cfg.iterations, **shared, **RunSummary.fitness(run.metrics),
                      resumed_from=run.resumed_from, settings=cfg.to_dict(),
                      extra={"backend": backend.name, **record, "trainable_tensors": run.start.tensors,
                             **_mean_agreement(run.metrics), **backend.summary()})


def _mean_agreement(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The updates' mean step_cosine, changed_share and changed share per module type
    (`ESBackend.step_agreement`), where measured."""
    out: dict[str, Any] = {}
    for key in ("step_cosine", "changed_share"):
        values = [r[key] for r in rows if key in r and math.isfinite(r[key])]
        if values:
            out[f"{key}_mean"] = float(np.mean(values))
    by_module = [r["changed_share_by_module"] for r in rows if "changed_share_by_module" in r]
    if by_module:
        out["changed_share_by_module_mean"] = {kind: float(np.mean([m[kind] for m in by_module if kind in m]))
                                               for kind in sorted({k for m in by_module for k in m})}
    return out
