"""Stages: the geometry analyses of trained checkpoints (paper A's geometry findings, paper B's 6-7).

Each stage reads checkpoints in HF layout and writes one tidy CSV (plus a JSON where a
summary needs one) under ``{results_dir}/analysis/{model}/``; the pure maths lives in
``esgrpo.analysis`` and is only called from here.

| stage                  | output (under {results_dir}/analysis/{model}/) | one row per                          |
|------------------------|------------------------------------------------|--------------------------------------|
| ``drift_stage``        | ``drift/{task}/{run}.csv``                     | parameter tensor                     |
| ``theory_stage`` (*)   | ``theory/{task}/{run}.csv`` + ``.json``        | logged ES iteration                  |
| ``cosine_stage``       | ``cosine/{task}/{pair}.csv``                   | (pair, scope, key)                   |
| ``sparsity_stage``     | ``sparsity/{task}/{run}.csv``                  | sparsified model                     |
| ``base_samples_stage`` | ``base_samples/{evaltask}.jsonl``              | prompt (its fixed base continuations)|
| ``kl_stage``           | ``kl/{task}/{run}.csv``                        | eval task                            |
| ``interpolation_stage``| ``interpolation/{task}/{pair}.csv``+json       | (path, point, eval task)             |

(*) in ``esgrpo.workflow.stages.theory``: it reads only metrics, so its jobs skip the torch import.
Which analyses run, and their settings (the ``analysis:`` block): ``esgrpo.analysis.settings``.

Conventions
- theta0 is always the model's BASE checkpoint, also for sequential runs (es-then-grpo,
  continual stages) whose training started elsewhere: drift answers "how far is this model
  from the pretrained one". The drift table adds ``init_l2``, the distance from the run's
  own start checkpoint (equal to ``l2`` for runs started from the base).
- The exception: a run of a paper's arithmetic trains the base's bf16 copy in place, and its
  sparsity, cosine and interpolation deltas are from that copy (``run_start``), so that the
  rounding of the fp32 base to bf16 does not count as update. Its drift is from the base.
- ``{pair}``: ``s{seed}`` (the seed's main ES and GRPO runs) or ``arith_paper_a-s{seed}`` (that
  seed's run of a paper's arithmetic and main GRPO run): esgrpo.runs.pair_name.
- Parameters are ``model.named_parameters()``: tied weights (lm_head = embed_tokens) appear
  once, under the embedding's name (see ``esgrpo.analysis.drift``). Non-parameter buffers
  (rotary frequencies) are not compared.
- Deltas are kept in float64 for models up to ``DELTA_F64_LIMIT`` (esgrpo.analysis.settings) parameters (so interpolation
  endpoints reproduce the two models bit for bit) and in float32 above (memory).
- Models evaluated at many weight-space points (sparsity, interpolation) are ONE model
  object whose weights are replaced with ``load_state_dict`` per point; nothing is saved.
  Identical points (the base, the two endpoints, ``dir-es`` at multiples 0.5 and 1 which are
  ``base-es`` points) are evaluated once. Every point is evaluated with the same sampling
  seed (common random numbers), so differences between points are not sampling noise.
  The HF engine is used even when the config's eval backend is vLLM: vLLM cannot take new
  weights in place cheaply.

Columns (the first ones are those the tables read; trailing ones identify the file's rows)
- drift: model, task, run, method, name, module_type, layer (empty outside decoder layers),
  numel, l2 = ||theta - theta0||, base_l2 = ||theta0||, init_l2 = ||theta - theta_init||,
  relative_l2 = l2 / base_l2 (per tensor; combine with esgrpo.analysis.drift.drift_by).
- theory (ES runs): iteration, updates (applied, non-skipped), distance (logged
  distance_from_init: from the run's own start), sq_distance, theory_sq = alpha^2 updates d / N.
  The JSON holds fit_sq_norm_vs_t (slope, intercept, r2, slope_ratio_to_theory), theory_slope,
  alpha, population_size, d, normalization (the theory assumes z-scores), final_ratio
  (final distance / theory distance). Reads metrics.jsonl and summary.json only.
- cosine: scope (global | layer | module_type), key (all | layer index or "none" for tensors
  outside the layers | module type), cosine, pair (es-grpo; es-es and grpo-grpo compare seed
  with the next configured seed), model, task, seed, seed_b, norm_a, norm_b, numel.
- sparsity: kind (top_fraction | reset_module), keep_fraction (NaN for reset_module),
  module_type (empty for top_fraction), n_kept (changed coordinates still moved), n_changed,
  eval_task, greedy, mean@n, pass@1, pass@kmax (k = n_samples), n_samples, n_prompts, model, task,
  run, method. Evaluated on the tasks that measure the run's training (its own task, or e.g.
  MATH-500 for DeepScaleR: esgrpo.config.judged_on).
- kl: eval_task, token_mean, prompt_mean, sequence_mean, n_tokens, n_sequences, n_prompts,
  model, task, run, method. KL(base || run) per completion token, full vocabulary, on
  continuations sampled once from the base (``base_samples``), under the raw (untempered)
  next-token distributions of both models.
- interpolation: path, lam, step, eval_task, greedy, mean@n, pass@1, pass@kmax, n_samples,
  n_prompts, model, task, seed. For es-grpo / base-es / base-grpo lam is the interpolation
  coefficient; for dir-es / dir-grpo / dir-random it is the distance in units of ||dES||
  (``scan_multiples``). ``step`` is always the L2 distance from theta0 (signed for scans).
  The JSON beside it: norm_es, norm_grpo, cosine and ``barriers`` = records path, eval_task,
  metric (greedy | mean@n), barrier_height (esgrpo.estimators.barrier_height),
  start, end, min, for the three lam paths (a barrier is not defined for the scans).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import pandas as pd
import torch

from esgrpo.analysis.cosine import cosine, cosine_rows
from esgrpo.analysis.drift import delta, drift_table, l2
from esgrpo.analysis.interpolation import PathStates, interpolation_points
from esgrpo.analysis.kl import kl_on_samples
from esgrpo.analysis.settings import DELTA_F64_LIMIT
from esgrpo.analysis.sparsity import sparsity_points
from esgrpo.engines.local import local_engine
from esgrpo.engines.rollout import HFEngine, prompt_texts
from esgrpo.estimators import barrier_height
from esgrpo.evaluation.evaluate import EvalSettings, evaluate_rows
from esgrpo.files import atomic_write_text, read_json, read_jsonl, write_json, write_jsonl
from esgrpo.live import Eta
from esgrpo.models.loading import load_model
from esgrpo.runs import pair_seed
from esgrpo.workflow.stages.data import load_rows

DRIFT_COLUMNS = ["model", "task", "run", "method", "name", "module_type", "layer", "numel", "l2", "base_l2",
                 "init_l2", "relative_l2"]
COSINE_COLUMNS = ["scope", "key", "cosine", "pair", "model", "task", "seed", "seed_b", "norm_a", "norm_b", "numel"]
METRIC_COLUMNS = ["greedy", "mean@n", "pass@1", "pass@kmax", "n_samples", "n_prompts"]
SPARSITY_COLUMNS = ["kind", "keep_fraction", "module_type", "n_kept", "n_changed", "eval_task", *METRIC_COLUMNS,
                    "model", "task", "run", "method"]
KL_COLUMNS = ["eval_task", "token_mean", "prompt_mean", "sequence_mean", "n_tokens", "n_sequences", "n_prompts",
              "model", "task", "run", "method"]
INTERPOLATION_COLUMNS = ["path", "lam", "step", "eval_task", "greedy", "mean@n", "pass@1", "pass@kmax",
                         "n_samples", "n_prompts", "model", "task", "seed"]


# --------------------------------------------------------------------------- loading


def _log(message: str) -> None:
    print(message, flush=True)


def load_params(ref: str, dtype: str = "float32") -> dict[str, torch.Tensor]:
    """Every parameter of the checkpoint at `ref` (tied weights once), on CPU."""
    model, _ = load_model(ref, dtype=dtype, device="cpu")
    return {name: p.detach() for name, p in model.named_parameters()}


def run_start(theta0: Mapping[str, torch.Tensor], dtype: str = "float32") -> dict[str, torch.Tensor]:
    """A run's start, from the base's parameters: the base itself, or, for a run of a paper's arithmetic (in
    place in `dtype`: esgrpo.runs.IN_PLACE_DTYPE), the base rounded to `dtype` as the training job rounded it
    on loading. Its update is measured from there: from the fp32 base, the rounding would count as update."""
    if dtype == "float32":
        return dict(theta0)
    return {name: t.to(getattr(torch, dtype)).to(t.dtype) for name, t in theta0.items()}


def _delta_dtype(theta: Mapping[str, torch.Tensor]) -> torch.dtype:
    return torch.float64 if sum(t.numel() for t in theta.values()) <= DELTA_F64_LIMIT else torch.float32


def load_into(model, state: Mapping[str, torch.Tensor]) -> None:
    """Replace `model`'s parameters by `state` (names as in named_parameters) in place."""
    params = dict(model.named_parameters())
    missing = set(params) - set(state)
    if missing:
        raise KeyError(f"state lacks parameters {sorted(missing)[:5]}")
    result = model.load_state_dict(dict(state), strict=False)
    if result.unexpected_keys:
        raise KeyError(f"state has keys the model does not: {result.unexpected_keys[:5]}")


def _write_csv(path: str, df: pd.DataFrame) -> None:
    atomic_write_text(path, df.to_csv(index=False))


def _tasks_data(eval_tasks: Sequence[str], tests: Sequence[str], infos: Sequence[str],
                limit: int | None) -> list[tuple[str, list[dict], str]]:
    return [(task, load_rows(test, limit), read_json(info)["verifier"])
            for task, test, info in zip(eval_tasks, tests, infos, strict=True)]


class PointEvaluator:
    """One model object and one HF engine; evaluates weight-space points on tasks, with a cache."""

    def __init__(self, base_ref: str, eval_cfg: Mapping):
        cfg = dict(eval_cfg)
        self.limit = cfg.pop("test_size", None)
        engine_cfg = {k: cfg.pop(k) for k in ("backend", "batch_size", "dtype", "device") if k in cfg}
        self.settings = EvalSettings(**cfg)
        model, tokenizer = load_model(base_ref, dtype=engine_cfg.get("dtype", "float32"),
                                      device=engine_cfg.get("device", "cpu"))
        self.engine = local_engine(model, tokenizer, engine_cfg.get("backend", "hf"),
                                   batch_size=int(engine_cfg.get("batch_size", 256)))
        self.cache: dict = {}
        self.evaluations = 0

    @property
    def model(self):
        return self.engine.model

    def metrics(self, key, state: Mapping[str, torch.Tensor] | None, tasks) -> dict[str, dict]:
        """{task: metrics} of the point `key` (state loaded only if the key is new)."""
        if key in self.cache:
            return self.cache[key]
        load_into(self.model, state)
        out = {}
        n = self.settings.n_samples
        for task, rows, verifier in tasks:
            summary, _ = evaluate_rows(self.engine, rows, verifier, self.settings)
            out[task] = {"greedy": summary.get("greedy_accuracy", math.nan), "mean@n": summary[f"mean@{n}"],
                         "pass@1": summary["pass@1"], "pass@kmax": summary[f"pass@{n}"], "n_samples": n,
                         "n_prompts": summary["n_prompts"]}
            self.evaluations += 1
        self.cache[key] = out
        return out


# --------------------------------------------------------------------------- drift


def drift_stage(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """Per-parameter distance of a run from the base (l2, base_l2) and from its own start (init_l2)."""
    started = time.time()
    theta0 = load_params(params["base_model"])
    theta = load_params(params["model"])
    table = drift_table(theta, theta0).rename(columns={"l2_base": "base_l2"})
    if params.get("init_model") and params["init_model"] != params["base_model"]:
        init = load_params(params["init_model"])
        init_l2 = drift_table(theta, init).set_index("name")["l2"]
        table["init_l2"] = table["name"].map(init_l2)
    else:
        table["init_l2"] = table["l2"]
    for key in ("model", "task", "run"):
        table[key] = wildcards[key]
    table["method"] = params["method"]
    _write_csv(output["csv"], table[DRIFT_COLUMNS])
    total = math.sqrt(float((table["l2"] ** 2).sum()))
    _log(f"drift {wildcards['task']}/{wildcards['run']}: ||theta-theta0|| = {total:.6g} over {len(table)} "
         f"tensors ({time.time() - started:.1f}s)")


# --------------------------------------------------------------------------- cosine


def cosine_stage(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """Cosine of updates (from the base): ES vs GRPO of one seed, and across seeds when configured.

    params["pairs"]: list of {pair, a, b, seed_b}; a and b are checkpoint refs.
    """
    started = time.time()
    theta0 = load_params(params["base_model"])
    dtype = _delta_dtype(theta0)
    deltas: dict[str, dict] = {}

    def delta_of(ref: str, start_dtype: str = "float32") -> dict:
        if ref not in deltas:
            deltas[ref] = delta(load_params(ref), run_start(theta0, start_dtype), dtype=dtype)
        return deltas[ref]

    rows = []
    for spec in params["pairs"]:
        a = delta_of(spec["a"], spec.get("a_start_dtype", "float32"))
        for r in cosine_rows(a, delta_of(spec["b"]), spec["pair"]):
            rows.append({**r, "model": wildcards["model"], "task": wildcards["task"],
                         "seed": pair_seed(wildcards["pair"]), "seed_b": int(spec["seed_b"])})
    df = pd.DataFrame(rows, columns=COSINE_COLUMNS)
    _write_csv(output["csv"], df)
    glob = df[df["scope"] == "global"]
    _log("cosine: " + ", ".join(f"{p} {c:.4f}" for p, c in zip(glob["pair"], glob["cosine"], strict=True))
         + f" ({time.time() - started:.1f}s)")


# --------------------------------------------------------------------------- sparsity


def sparsity_stage(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """Eval of the run with only its largest-|delta| coordinates kept, or one module type's update removed,
    on the tasks that measure its training (`params["eval_tasks"]`: the training task, or e.g. MATH-500
    for DeepScaleR). The delta is from the run's start (`run_start`): keep fraction 0 is that start."""
    started = time.time()
    evaluator = PointEvaluator(params["base_model"], params["eval"])
    theta0 = run_start(load_params(params["base_model"]), params.get("start_dtype", "float32"))
    theta = load_params(params["model"])
    tasks = _tasks_data(params["eval_tasks"], input["test"], input["info"], evaluator.limit)
    rows = []
    points = list(sparsity_points(theta0, theta, params["fractions"], _delta_dtype(theta0)))
    eta = Eta(len(points))
    for i, point in enumerate(points, 1):
        fields, key = point.fields(), point.key()
        state = None if key in evaluator.cache else point.state(theta0, theta)
        for eval_task, m in evaluator.metrics(key, state, tasks).items():
            rows.append({**fields, "eval_task": eval_task, **m, "model": wildcards["model"], "task": wildcards["task"],
                         "run": wildcards["run"], "method": params["method"]})
            _log(f"sparsity {fields['kind']} {fields['keep_fraction']} {fields['module_type']} on {eval_task}: kept "
                 f"{fields['n_kept']}/{fields['n_changed']} greedy {m['greedy']:.3f} mean@n {m['mean@n']:.3f} "
                 f"[point {i}/{len(points)}, {eta(i)}]")
    _write_csv(output["csv"], pd.DataFrame(rows, columns=SPARSITY_COLUMNS))
    _log(f"sparsity: {evaluator.evaluations} evaluations in {time.time() - started:.1f}s")


# --------------------------------------------------------------------------- off-task KL


def base_samples_stage(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """Fixed continuations of the base model on one task's test prompts (sampled once, reused by every KL job)."""
    kl = params["kl"]
    model, tokenizer = load_model(params["base_model"], dtype=params.get("dtype", "float32"),
                                  device=params.get("device", "cpu"))
    rows = load_rows(input["test"], int(kl["n_prompts"]))
    engine = HFEngine(model, tokenizer, batch_size=int(params.get("batch_size", 256)))
    out = engine.generate(rows, n=int(kl["samples_per_prompt"]), temperature=float(kl["temperature"]),
                          top_p=float(kl["top_p"]), max_new_tokens=int(kl["max_new_tokens"]), seed=int(kl["seed"]))
    prompts = tokenizer(prompt_texts(tokenizer, rows), add_special_tokens=False)["input_ids"]
    write_jsonl(output["samples"], [{"id": r["id"], "prompt_ids": list(p), "completion_ids": c}
                                    for r, p, c in zip(rows, prompts, out.token_ids, strict=True)])
    _log(f"base samples {wildcards['evaltask']}: {len(rows)} prompts x {kl['samples_per_prompt']}, "
         f"{out.num_tokens} tokens")


def kl_stage(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """Off-task KL drift: KL(base || run) on the base's own continuations, for every task of the model."""
    started = time.time()
    dtype, device = params.get("dtype", "float32"), params.get("device", "cpu")
    base, tokenizer = load_model(params["base_model"], dtype=dtype, device=device)
    trained, _ = load_model(params["model"], dtype=dtype, device=device)
    rows = []
    for task, path in zip(params["eval_tasks"], input["samples"], strict=True):
        stats = kl_on_samples(base, trained, read_jsonl(path), tokenizer.pad_token_id,
                              int(params["kl"].get("batch_size", 16)))
        rows.append({"eval_task": task, **stats, "model": wildcards["model"], "task": wildcards["task"],
                     "run": wildcards["run"], "method": params["method"]})
        _log(f"kl {wildcards['run']} on {task}: token mean {stats['token_mean']:.4g} over {stats['n_tokens']} tokens")
    _write_csv(output["csv"], pd.DataFrame(rows, columns=KL_COLUMNS))
    _log(f"kl: {time.time() - started:.1f}s")


# --------------------------------------------------------------------------- interpolation


def interpolation_stage(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """Accuracy along ES<->GRPO interpolation, base->update paths and normalised direction scans, on every task."""
    started = time.time()
    evaluator = PointEvaluator(params["base_model"], params["eval"])
    theta0 = load_params(params["base_model"])
    dtype = _delta_dtype(theta0)
    # ES's update from its own start (a paper's arithmetic: the base's bf16 copy), applied to the base
    d_es = delta(load_params(params["es_model"]), run_start(theta0, params.get("es_start_dtype", "float32")),
                 dtype=dtype)
    d_grpo = delta(load_params(params["grpo_model"]), theta0, dtype=dtype)
    tasks = _tasks_data(params["eval_tasks"], input["test"], input["info"], evaluator.limit)
    rows = []
    states = PathStates(theta0, d_es, d_grpo, int(params["random_seed"]))
    if states.norm_es == 0:
        _log("interpolation: the ES update is zero; no direction scans")
    points = list(interpolation_points(states, int(params["steps"]), params["multiples"]))
    eta = Eta(len(points))
    for i, point in enumerate(points, 1):
        key = point.key
        metrics = evaluator.metrics(key, None if key in evaluator.cache else states.state(point), tasks)
        for task, m in metrics.items():
            rows.append({"path": point.path, "lam": point.lam, "step": point.step, "eval_task": task, **m,
                         "model": wildcards["model"], "task": wildcards["task"], "seed": pair_seed(wildcards["pair"])})
        _log(f"{point.path} lam {point.lam:.3f} step {point.step:.4g}: " + ", ".join(
            f"{t} {m['greedy']:.3f}/{m['mean@n']:.3f}" for t, m in metrics.items())
             + f" [point {i}/{len(points)}, {eta(i)}]")
    df = pd.DataFrame(rows, columns=INTERPOLATION_COLUMNS)
    _write_csv(output["csv"], df)
    barriers = []
    for (path, task), g in df[df["path"].isin(["es-grpo", "base-es", "base-grpo"])].groupby(
            ["path", "eval_task"], sort=False):
        for metric in ("greedy", "mean@n"):
            barriers.append({"path": path, "eval_task": task, "metric": metric,
                             "barrier_height": barrier_height(g["lam"], g[metric]),
                             "start": float(g[metric].iloc[0]), "end": float(g[metric].iloc[-1]),
                             "min": float(g[metric].min())})
    write_json(output["json"], {"model": wildcards["model"], "task": wildcards["task"],
                                "seed": pair_seed(wildcards["pair"]), "norm_es": l2(d_es), "norm_grpo": l2(d_grpo),
                                "cosine": cosine(d_es, d_grpo), "barriers": barriers})
    _log(f"interpolation: {len(evaluator.cache)} distinct points, {evaluator.evaluations} evaluations "
         f"in {time.time() - started:.1f}s")
