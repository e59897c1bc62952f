"""ES inside vLLM: perturb, restore and update the weights every vLLM worker holds, with seeds only.

The speed pattern of all public ES-for-LLM code (docs/references.md, "ES at scale"): one vLLM engine
per GPU, the population spread over the engines, only seeds crossing process boundaries, and the
weights perturbed in place through ``llm.collective_rpc``. This module does that without the known
traps:

- noise is `esgrpo.noise.tensor_noise` of the *Hugging Face* tensor name, generated in fp32 on the
  weight's device; a tensor vLLM fuses gets its parts' noise concatenated (`esgrpo.engines.vllm_layout`), so
  the trajectory is the same function of (seed, HF name) as on the transformers backend
  (`esgrpo.es.hf_backend`; the same on any device type, CPU and CUDA streams differ);
- each worker keeps an fp32 master copy theta, read from the checkpoint the engine loaded (never
  from vLLM's bf16 weights: a stage that starts from an earlier stage's fp32 export keeps its small
  updates); a member's weights are written from ``theta + sign * sigma * eps`` (restore = write theta
  back: exact), and the update ``theta += alpha / N * sum_n w_n sign_n eps_n`` is
  `esgrpo.es.ops.apply_update`, in fp32, once;
- host memory: only engine 0 keeps theta0 (for distances), on the host; checkpoints and exports are
  streamed tensor by tensor into safetensors shards (`esgrpo.models.tensor_files`), so no engine ever holds a
  second full copy of the model on the host;
- exports are in HF layout (`unfuse_items`), loadable by transformers.

The papers' arithmetic (`ESConfig.noise_seeding` / `arithmetic`, `esgrpo.es.arithmetic`) is a setting the
backend passes to every worker (`es_arithmetic`): their seedings draw noise for vLLM's own (fused) tensor
names and shapes, vocabulary padding included, as the papers' workers did; in-place arithmetic drops the
master, perturbs and restores the live weights by adding and subtracting, and adds the update into them.
It runs on one engine (the papers' cross-engine broadcast / resynchronisation is not reproduced).

Pieces, top to bottom: `esgrpo.es.vllm_worker.ESWorkerExtension` (mixed into each vLLM worker with
``LLM(..., worker_extension_cls=WORKER_EXTENSION)``) -> `VLLMESPool` (several engines, one per GPU,
as Ray actors; or any local objects with the same methods) -> the HF checkpoint export ->
`VLLMESBackend`, the pool as an `esgrpo.es.backend.ESBackend` that `esgrpo.es.loop.train_es` drives.

vllm and ray are imported only inside the functions that need them: this module imports anywhere.
Limits: tensor parallelism 1 per engine (a shard would need a slice of each noise tensor);
architectures whose fused tensors are qkv_proj / gate_up_proj (Llama, Qwen2, Qwen3, Mistral).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esgrpo.engines.vllm_engine import (
    NO_ENTROPY,
    entropy_estimator,
    logprobs_to_request,
    on_vllm_cpu,
    sampling_kwargs,
    size_cpu_kv_cache,
    token_logprobs_and_entropies,
)
from esgrpo.es.backend import BackendStart, ESBackend, FitnessResult
from esgrpo.es.settings import LOWRANK_ON_VLLM, ESConfig
from esgrpo.es.vllm_worker import WORKER_EXTENSION
from esgrpo.files import atomic_directory
from esgrpo.models.tensor_files import local_model_dir

Completion = tuple[str, int, float]  # a completion as it leaves an engine: (text, tokens, entropy sum)

# --------------------------------------------------------------------------- engines and the pool


def _is_ray_ref(value: Any) -> bool:
    return type(value).__name__ == "ObjectRef"


def _call(engine: Any, method: str, *args: Any) -> Any:
    """Call `method` on an engine: a Ray actor handle (returns a future) or a plain object."""
    fn = getattr(engine, method)
    return fn.remote(*args) if hasattr(fn, "remote") else fn(*args)


def _wait(results: list[Any]) -> list[Any]:
    if any(_is_ray_ref(r) for r in results):
        import ray

        return ray.get(results)
    return results


class VLLMESEngine:
    """One vLLM engine with the ES extension; run as a Ray actor (one GPU) by `VLLMESPool.launch`.

    ``llm`` may be an existing `vllm.LLM` built with ``worker_extension_cls=WORKER_EXTENSION`` and
    prefix caching off (a local engine, e.g. on vLLM's CPU build); otherwise one is built.
    """

    def __init__(self, model_ref: str, dtype: str = "bfloat16", seed: int = 0,
                 trainable: Sequence[str] = ("*",), llm_kwargs: Mapping[str, Any] | None = None, llm: Any = None,
                 keep_theta0: bool = True):
        if llm is None:
            from vllm import LLM

            # Prefix caching would hand member n+1 the prompt KV computed under member n's weights:
            # off by default (perturbing weights in place invalidates every cached block).
            kwargs = {"gpu_memory_utilization": 0.6, "enable_prefix_caching": False, **dict(llm_kwargs or {})}
            if on_vllm_cpu():
                # es_init swaps each layer's packed oneDNN `cpu_linear` for F.linear on the live weights
                # (_es_unpack_cpu_linears) after vLLM has compiled the model around the packed one: the
                # compiled forward then fails its own guard at the first generation ("'builtin_function_or_method'
                # object has no attribute '__closure__'", the rehearsal grid, vllm-cpu 0.31.0). Eager there.
                kwargs.setdefault("enforce_eager", True)
            size_cpu_kv_cache()
            llm = LLM(model=str(model_ref), dtype=dtype, seed=int(seed), tensor_parallel_size=1,
                      worker_extension_cls=WORKER_EXTENSION, **kwargs)
        self.llm = llm
        self.info = self.rpc("es_init", list(trainable), bool(keep_theta0))

    def rpc(self, method: str, *args: Any) -> Any:
        return self.llm.collective_rpc(method, args=tuple(args))[0]

    def evaluate_member(self, seed: int, sign: float, sigma: float, prompt_ids: Sequence[Sequence[int]],
                        sampling: Mapping[str, Any], sampling_seed: int | None,
                        estimator: str = NO_ENTROPY) -> list[Completion]:
        """(text, generated tokens, entropy sum) per prompt for member theta + sign * sigma * eps(seed).

        The entropy sum adds the completion's per-token values under `estimator`
        (`esgrpo.engines.vllm_engine.entropy_estimator`; the top-k is ``sampling["logprobs"]``): only three
        numbers per completion leave the engine, never its log-probs.
        """
        from vllm import SamplingParams

        self.rpc("es_perturb", int(seed), float(sigma), float(sign))
        try:
            params = [SamplingParams(**sampling, seed=None if sampling_seed is None else sampling_seed + i)
                      for i in range(len(prompt_ids))]
            outputs = self.llm.generate([{"prompt_token_ids": list(ids)} for ids in prompt_ids], params,
                                        use_tqdm=False)
        finally:
            self.rpc("es_restore")
        topk = int(sampling.get("logprobs") or 0)
        completions = [o.outputs[0] for o in outputs]
        return [(c.text, len(c.token_ids),
                 float(sum(token_logprobs_and_entropies(list(c.token_ids), c.logprobs, estimator, topk)[1])))
                for c in completions]


# The thread-count variables of the linear-algebra libraries, all of which Snakemake sets to a job's
# threads (snakemake/shell.py, `Shell.__new__`: OMP, GOTO, OPENBLAS, MKL, VECLIB, NUMEXPR).
THREAD_COUNT_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                          "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def cpu_engine_options(index: int, count: int) -> dict[str, Any]:
    """Ray actor options of engine `index` of `count` on vLLM's CPU build: a block of this job's cores.

    The job's cores are its CPU affinity (what SLURM or taskset gave it), split into `count` equal
    consecutive blocks; each engine's OpenMP threads are pinned to its block with vLLM's own
    VLLM_CPU_OMP_THREADS_BIND (its "auto" would pin every engine to the same cores), and every thread-count
    variable (`THREAD_COUNT_VARIABLES`) says as many threads as its block holds. An engine inherits the job's
    values (all its cores), and any thread count above its block's cores (OpenMP's or MKL's alike) makes
    those threads spin on one pinned core (docs/rehearsal.md, fix 9, measured it).
    """
    cores = sorted(os.sched_getaffinity(0))
    if count > len(cores):
        raise RuntimeError(f"{count} vLLM ES engines on vLLM's CPU build need a core each; this job has {len(cores)}")
    per = len(cores) // count
    block = cores[index * per:(index + 1) * per]
    env = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, block)), **{name: str(per) for name in THREAD_COUNT_VARIABLES}}
    return {"num_cpus": per, "runtime_env": {"env_vars": env}}


class VLLMESPool:
    """A population spread over engines; every engine holds the same theta (checked by checksum).

    `engines` are Ray actor handles of `VLLMESEngine` (`launch`) or plain objects with the methods
    ``rpc(method, *args)`` and ``evaluate_member(seed, sign, sigma, prompt_ids, sampling, seed0, estimator)``.
    """

    def __init__(self, engines: Sequence[Any]):
        if not engines:
            raise ValueError("a pool needs at least one engine")
        self.engines = list(engines)

    @classmethod
    def launch(cls, model_ref: str, num_engines: int | None = None, dtype: str = "bfloat16", seed: int = 0,
               trainable: Sequence[str] = ("*",), **llm_kwargs: Any) -> VLLMESPool:
        """One engine per GPU as Ray actors (``num_engines`` defaults to the GPUs Ray sees); on vLLM's
        CPU build, ``num_engines`` engines on shares of this job's cores (`cpu_engine_options`).

        ``num_engines=1`` builds the one engine in this process instead: no Ray needed (one GPU, or
        vLLM's CPU build). Only engine 0 keeps theta0 (the distances' reference): one host copy per job.
        """
        if num_engines == 1:
            return cls([VLLMESEngine(model_ref, dtype, seed, list(trainable), llm_kwargs)])
        import ray

        if not ray.is_initialized():
            # A Ray cluster of this job's own, over the GPUs it was given (CUDA_VISIBLE_DEVICES): never one
            # named by an inherited RAY_ADDRESS or a `ray start` on the node (SLURM passes the environment on).
            ray.init(address="local", ignore_reinit_error=True, include_dashboard=False)
        on_cpu = on_vllm_cpu()
        count = int(num_engines or (0 if on_cpu else ray.available_resources().get("GPU", 0)))
        if count < 1:
            raise RuntimeError("no GPU visible to Ray (on vLLM's CPU build: es.engine.num_engines not set): "
                               "the vLLM ES pool needs at least one engine")
        options = [cpu_engine_options(i, count) if on_cpu else {"num_gpus": 1} for i in range(count)]
        resource, each = ("CPU", "num_cpus") if on_cpu else ("GPU", "num_gpus")
        # Ray queues an actor it cannot place and waits forever, silently (seen with num_gpus=1 actors on
        # vLLM's CPU build): ask for no more than the job's Ray cluster holds.
        held = ray.cluster_resources().get(resource, 0)
        if sum(o[each] for o in options) > held:
            raise RuntimeError(f"{count} vLLM ES engines need {sum(o[each] for o in options)} {resource}s; "
                               f"this job's Ray cluster has {held:g}")
        return cls([ray.remote(**o)(VLLMESEngine).remote(model_ref, dtype, seed, list(trainable), llm_kwargs,
                                                          None, i == 0) for i, o in enumerate(options)])

    def rpc_all(self, method: str, *args: Any) -> list[Any]:
        return _wait([_call(e, "rpc", method, *args) for e in self.engines])

    def rpc_one(self, method: str, *args: Any) -> Any:
        return _wait([_call(self.engines[0], "rpc", method, *args)])[0]

    def generate_population(self, seeds_signs: Sequence[tuple[int, float]], sigma: float,
                            prompt_ids: Sequence[Sequence[int]], sampling: Mapping[str, Any],
                            sampling_seed: int | None, estimator: str = NO_ENTROPY) -> list[list[Completion]]:
        """Per member, per prompt (text, tokens, entropy sum); member n runs on engine n mod E (E at a time)."""
        futures = [_call(self.engines[n % len(self.engines)], "evaluate_member", int(seed), float(sign),
                         float(sigma), prompt_ids, dict(sampling),
                         None if sampling_seed is None else int(sampling_seed), estimator)
                   for n, (seed, sign) in enumerate(seeds_signs)]
        return _wait(futures)

    def apply_update(self, seeds_signs: Sequence[tuple[int, float]], weights: Sequence[float],
                     alpha: float) -> float:
        pairs = [[int(s), float(g)] for s, g in seeds_signs]
        norms = self.rpc_all("es_apply_update", pairs, [float(w) for w in weights], float(alpha))
        return float(norms[0])

    def check_in_sync(self) -> float:
        sums = self.rpc_all("es_checksum")
        if any(not math.isclose(s, sums[0], rel_tol=0, abs_tol=0) for s in sums):
            raise RuntimeError(f"ES engines disagree on theta (checksums {sums})")
        return float(sums[0])


def population_fitness(completions: Sequence[Sequence[Completion]], rows: Sequence[dict],
                       reward_fn: Callable[[str, dict], float], estimator: str = NO_ENTROPY) -> FitnessResult:
    """Fitness (mean reward per member), success flags, token counts and the token-weighted mean entropy
    (under `estimator`, as the transformers backend weights its exact one) from a population's completions."""
    rewards = np.zeros((len(completions), len(rows)))
    tokens, entropy_sum = 0, 0.0
    for n, member in enumerate(completions):
        if len(member) != len(rows):
            raise ValueError(f"member {n}: {len(member)} completions for {len(rows)} prompts")
        for b, ((text, count, entropy), row) in enumerate(zip(member, rows, strict=True)):
            rewards[n, b] = float(reward_fn(text, row))
            tokens += int(count)
            entropy_sum += float(entropy)
    return FitnessResult.from_rewards(rewards, tokens, entropy_sum / tokens if tokens else math.nan, estimator)


# --------------------------------------------------------------------------- HF checkpoint

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json", ".msgpack", ".h5")


def copy_model_metadata(model_ref: str, out_dir: str | os.PathLike, dtype: str = "float32") -> None:
    """config, generation config, tokenizer and chat template of `model_ref` (folder or Hub id), no weights.

    The config's dtype is set to the exported one, so `from_pretrained(dtype="auto")` keeps fp32.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    source = local_model_dir(model_ref, ["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken", "*.py"])
    for path in source.iterdir():
        if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(path, out_dir / path.name)
    config_path = out_dir / "config.json"
    if config_path.exists():
        config = json.loads(config_path.read_text())
        config.pop("quantization_config", None)
        for key in ("torch_dtype", "dtype"):
            if key in config:
                config[key] = dtype
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True))


def export_hf_checkpoint(pool: VLLMESPool, model_ref: str, out_dir: str | os.PathLike,
                         dtype: str = "float32") -> None:
    """The pool's theta as a transformers-loadable folder (written whole under a temporary name)."""
    with atomic_directory(out_dir) as tmp:
        copy_model_metadata(model_ref, tmp, dtype)
        pool.rpc_one("es_export_hf", str(tmp), dtype)


# --------------------------------------------------------------------------- the backend


class VLLMESBackend(ESBackend):
    """The pool as the ES trainer's backend (`es.backend: vllm`).

    prompt_ids: row id -> chat-formatted prompt token ids (`esgrpo.engines.vllm_engine.prompt_token_ids`);
    reward_fn(completion_text, row) -> float. The pool's engines must have run ``es_init`` on the
    starting weights (`VLLMESPool.launch` does); checkpoints hold theta in vLLM layout, fp32; exports
    are HF layout in `export_dtype`. The metrics' entropy is not the transformers backend's exact one
    but what the fitness rollouts' log-probs give (`esgrpo.engines.vllm_engine.entropy_estimator`: a
    Monte-Carlo estimate when fitness samples at temperature 1, else the lumped top-`entropy_topk`
    lower bound), named in each metrics row's ``entropy_estimator``.
    """

    name = "vllm"

    def __init__(self, pool: VLLMESPool, model_ref: str, prompt_ids: Mapping[str, Sequence[int]],
                 reward_fn: Callable[[str, dict], float], export_dtype: str = "float32", entropy_topk: int = 20):
        self.pool, self.model_ref, self.prompt_ids = pool, str(model_ref), prompt_ids
        self.reward_fn, self.export_dtype, self.entropy_topk = reward_fn, export_dtype, int(entropy_topk)

    def start(self, cfg: ESConfig) -> BackendStart:
        if cfg.noise != "full":
            raise ValueError(LOWRANK_ON_VLLM)
        if cfg.arithmetic != "exact" and len(self.pool.engines) > 1:
            raise ValueError(f"ESConfig.arithmetic {cfg.arithmetic!r} runs on one vLLM engine: with no master, "
                             f"{len(self.pool.engines)} engines' inexact restores would drift apart")
        if (cfg.noise_seeding, cfg.arithmetic) != ("per_tensor", "exact"):
            self.pool.rpc_all("es_arithmetic", cfg.noise_seeding, cfg.arithmetic)
        # The engines loaded the start model themselves: its reference names the start.
        return BackendStart(parameters=int(self.pool.rpc_one("es_parameter_count")),
                            tensors=len(self.pool.rpc_one("es_shapes")), identity={"model": self.model_ref})

    def evaluate(self, seeds_signs: Sequence[tuple[int, float]], batch: Sequence[dict], cfg: ESConfig,
                 rollout_seed: int) -> FitnessResult:
        estimator = entropy_estimator(cfg.fitness_temperature, cfg.fitness_top_p, self.entropy_topk)
        sampling = sampling_kwargs(1, cfg.fitness_temperature, cfg.fitness_top_p, cfg.max_new_tokens,
                                   logprobs=logprobs_to_request(estimator, self.entropy_topk))
        completions = self.pool.generate_population(
            seeds_signs, cfg.sigma, [self.prompt_ids[r["id"]] for r in batch], sampling,
            rollout_seed if cfg.fitness_temperature > 0 else None, estimator)
        return population_fitness(completions, batch, self.reward_fn, estimator)

    def apply_update(self, seeds_signs: Sequence[tuple[int, float]], weights: np.ndarray, alpha: float) -> float:
        return self.pool.apply_update(seeds_signs, weights, alpha)

    def distance_from_init(self) -> float:
        return float(self.pool.rpc_one("es_distance_from_init"))

    def step_agreement(self) -> dict[str, Any] | None:
        return self.pool.rpc_one("es_step_agreement")  # engine 0's: every engine applies the same update

    def save_state(self, folder: Path) -> None:
        self.pool.check_in_sync()  # engine 0 saves for all
        self.pool.rpc_one("es_save_theta", str(folder))

    def load_state(self, folder: Path) -> None:
        self.pool.rpc_all("es_load_theta", str(folder))

    def export(self, model_dir: Path) -> None:
        self.pool.check_in_sync()  # engine 0 exports for all
        export_hf_checkpoint(self.pool, self.model_ref, model_dir, self.export_dtype)

    def summary(self) -> dict[str, Any]:
        return {"engines": len(self.pool.engines)}
