"""ES inside vLLM: perturb, restore and update the weights every vLLM worker holds, with seeds only.

The speed pattern of all public ES-for-LLM code (PAPERS.md): one vLLM engine per GPU, the
population spread over the engines, only seeds crossing process boundaries, and the weights
perturbed in place through ``llm.collective_rpc``. This module does that without the known traps:

- noise is `esgrpo.es.tensor_noise` of the *Hugging Face* tensor name, generated in fp32 on the
  weight's device. vLLM fuses ``q_proj|k_proj|v_proj`` into ``qkv_proj`` and ``gate_proj|up_proj``
  into ``gate_up_proj``; the noise of a fused tensor is the concatenation of its parts' noise, so
  the trajectory is the same function of (seed, HF name) as the HF-layout trainer's
  (`esgrpo.es.train_es`; the same on any device type, CPU and CUDA streams differ);
- each worker keeps an fp32 master copy theta; a member's weights are written from
  ``theta + sign * sigma * eps`` (restore = write theta back: exact), and the update
  ``theta += alpha / N * sum_n w_n sign_n eps_n`` is accumulated in fp32 and applied once;
- checkpoints are exported in HF layout (`unfuse_state_dict`), loadable by transformers.

Pieces, top to bottom: layout (pure: fused <-> HF names, tested on a CPU with a tiny
transformers Llama) -> noise and update on fused tensors (pure torch) -> `ESWorkerExtension`
(mixed into each vLLM worker with ``LLM(..., worker_extension_cls=WORKER_EXTENSION)``) ->
`VLLMESPool` (several engines, one per GPU, as Ray actors; or any local objects with the same
methods) -> `train_es_vllm` (the ES loop over a pool, checkpointed and resumable like `train_es`).

vllm and ray are imported only inside the functions that need them: this module imports anywhere.
Limits: tensor parallelism 1 per engine (a shard would need a slice of each noise tensor);
architectures whose fused tensors are qkv_proj / gate_up_proj (Llama, Qwen2, Qwen3, Mistral).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esgrpo.es import (
    _STREAM_ROLLOUT,
    ESConfig,
    FitnessResult,
    _mix,
    all_equal,
    clear_snapshots,
    member_seeds,
    normalize_fitness,
    prompt_batch,
    run_record,
    snapshot_dir,
    snapshot_record,
    snapshots_missing,
    tensor_noise,
    update_coefficients,
)
from esgrpo.io import atomic_directory, write_json, write_jsonl
from esgrpo.metrics import population_js_diversity

WORKER_EXTENSION = "esgrpo.vllm_es.ESWorkerExtension"

# fused vLLM module -> its HF modules, in the order vLLM stacks them along dim 0
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Part:
    """Rows [start, stop) (dim 0) of a fused tensor that are the HF tensor `name`."""

    name: str
    start: int
    stop: int


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def _split_sizes(kind: str, rows: int, config: Any, name: str) -> list[int]:
    if kind == "gate_up_proj":
        if rows % 2:
            raise ValueError(f"{name}: {rows} rows cannot be gate + up halves")
        return [rows // 2, rows // 2]
    heads = _get(config, "num_attention_heads")
    kv_heads = _get(config, "num_key_value_heads") or heads
    if not heads:
        raise ValueError(f"{name}: the config has no num_attention_heads")
    # head_dim from the shape: Qwen3's head_dim is not hidden_size / heads.
    if rows % (heads + 2 * kv_heads):
        raise ValueError(f"{name}: {rows} rows are not (heads + 2 kv_heads) = {heads + 2 * kv_heads} heads")
    head_dim = rows // (heads + 2 * kv_heads)
    return [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]


def parts_of(name: str, shape: Sequence[int], config: Any) -> list[Part]:
    """The HF tensors a vLLM tensor holds: its fused parts, or itself."""
    rows = int(shape[0]) if len(shape) else 0
    for kind, pieces in FUSED.items():
        token = f".{kind}."
        if token in name:
            out, start = [], 0
            for piece, size in zip(pieces, _split_sizes(kind, rows, config, name), strict=True):
                out.append(Part(name.replace(token, f".{piece}."), start, start + size))
                start += size
            return out
    return [Part(name, 0, rows)]


def is_fused(name: str) -> bool:
    return any(f".{kind}." in name for kind in FUSED)


def vocab_rows(name: str, shape: Sequence[int], config: Any) -> int | None:
    """The checkpoint's row count of a vocabulary tensor that vLLM padded, else None.

    vLLM pads embedding and lm_head rows to a multiple of 64; the rows past ``vocab_size`` are
    not part of the model (HF layout has none).
    """
    vocab = _get(config, "vocab_size")
    if vocab and name.endswith(("embed_tokens.weight", "lm_head.weight")) and len(shape) == 2 \
            and int(shape[0]) > int(vocab):
        return int(vocab)
    return None


def unfuse_state_dict(fused: Mapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """vLLM layout -> HF layout: ``qkv_proj`` -> q/k/v_proj, ``gate_up_proj`` -> gate/up_proj.

    Other tensors pass through, less the vocabulary rows vLLM padded (`vocab_rows`). With tied
    embeddings a separate ``lm_head.weight`` is dropped (HF stores the embedding once). Pieces are contiguous copies (safetensors needs that).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in fused.items():
        if not is_fused(name):
            rows = vocab_rows(name, tuple(tensor.shape), config)
            out[name] = tensor if rows is None else tensor[:rows].contiguous().clone()
            continue
        for part in parts_of(name, tuple(tensor.shape), config):
            if part.name in out:
                raise ValueError(f"{part.name} appears twice")
            out[part.name] = tensor[part.start:part.stop].contiguous().clone()
    if _get(config, "tie_word_embeddings", False) and "lm_head.weight" in out \
            and any(n.endswith("embed_tokens.weight") for n in out):
        del out["lm_head.weight"]
    return out


def fuse_state_dict(hf: Mapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """HF layout -> vLLM layout (the inverse of `unfuse_state_dict`, tied lm_head left out)."""
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for name, tensor in hf.items():
        if name in used:
            continue
        for kind, pieces in FUSED.items():
            token = f".{pieces[0]}."
            if token in name:
                names = [name.replace(token, f".{p}.") for p in pieces]
                missing = [n for n in names if n not in hf]
                if missing:
                    raise KeyError(f"{name}: the fused {kind} also needs {missing}")
                out[name.replace(token, f".{kind}.")] = torch.cat([hf[n] for n in names], dim=0)
                used.update(names)
                break
        else:
            if not any(f".{p}." in name for pieces in FUSED.values() for p in pieces[1:]):
                out[name] = tensor
    return out


# --------------------------------------------------------------------------- noise and update


def fused_noise(member_seed: int, name: str, shape: Sequence[int], config: Any,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """`tensor_noise` of the HF tensors a (possibly fused or vocabulary-padded) tensor holds, laid out as in vLLM."""
    parts = parts_of(name, shape, config)
    if len(parts) == 1 and parts[0].name == name:
        rows = vocab_rows(name, shape, config)
        if rows is None:
            return tensor_noise(member_seed, name, shape, device)
        # the checkpoint's rows get the HF-layout noise; vLLM's padding rows stay put
        noise = torch.zeros(tuple(shape), dtype=torch.float32, device=device)
        noise[:rows] = tensor_noise(member_seed, name, (rows, *shape[1:]), device)
        return noise
    rest = tuple(shape[1:])
    return torch.cat([tensor_noise(member_seed, p.name, (p.stop - p.start, *rest), device) for p in parts], dim=0)


@torch.no_grad()
def fused_direction(name: str, shape: Sequence[int], coefficients: Mapping[int, float], config: Any,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """One tensor of sum_n w_n sign_n eps_n, in fp32."""
    total = torch.zeros(tuple(shape), dtype=torch.float32, device=device)
    for seed, c in coefficients.items():
        if c != 0.0:
            total.add_(fused_noise(seed, name, shape, config, device), alpha=c)
    return total


# --------------------------------------------------------------------------- the worker extension


class ESWorkerExtension:
    """ES operations on one vLLM worker's weights, called with ``llm.collective_rpc("es_...", args=...)``.

    vLLM mixes this class into its GPU worker (``worker_extension_cls``), where
    ``self.model_runner.model`` is the live `torch.nn.Module`. Any object with a `model_runner`
    holding `.model` (and `.model_config.hf_config`, or an `es_config` set here) works too,
    which is how the CPU tests drive it. Seeds and scalars go in; scalars come out.
    """

    # -- access
    def _es_model(self) -> torch.nn.Module:
        return self.model_runner.model

    def _es_hf_config(self) -> Any:
        if getattr(self, "_es_config_override", None) is not None:
            return self._es_config_override
        for owner in (getattr(self, "vllm_config", None), self.model_runner):
            model_config = getattr(owner, "model_config", None)
            if model_config is not None and getattr(model_config, "hf_config", None) is not None:
                return model_config.hf_config
        raise AttributeError("no model_config.hf_config on this worker; pass hf_config to es_init")

    def _es_model_ref(self) -> str:
        for owner in (getattr(self, "vllm_config", None), self.model_runner, self):
            model_config = getattr(owner, "model_config", None)
            if getattr(model_config, "model", None):
                return str(model_config.model)
        raise AttributeError("no model_config.model on this worker: cannot find the checkpoint")

    def _es_params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self._es_model().named_parameters())

    def _es_unpack_cpu_linears(self) -> list[str]:
        """Make vLLM's CPU backend compute its linear layers from the live `weight` Parameters.

        On CPU, vLLM hands each linear layer's weight to a oneDNN / packed kernel
        (``layer.cpu_linear``) and replaces ``layer.weight`` with an empty tensor, so in-place
        writes would change nothing. Here the dropped weights are read back from the checkpoint
        (fused as vLLM fuses them) and every such layer computes ``F.linear(x, layer.weight, b)``:
        slower than the packed kernel, but perturbations take effect. No module has
        ``cpu_linear`` on GPU, where this does nothing.
        """
        model = self._es_model()
        packed = {name: m for name, m in model.named_modules() if hasattr(m, "cpu_linear")}
        if not packed:
            return []
        # The emptied Parameter is a float32 torch.empty(0) whatever the model's dtype: take the
        # dtype from a weight vLLM kept (the embedding always stays).
        dtype = next(p.dtype for p in model.parameters() if p.numel() and p.is_floating_point())
        dropped = [name for name, m in packed.items() if m.weight.numel() == 0]
        if dropped:
            state = fuse_state_dict(checkpoint_state_dict(self._es_model_ref()), self._es_hf_config())
            for name in dropped:
                key, layer = f"{name}.weight", packed[name]
                if key not in state:
                    raise KeyError(f"{key}: vLLM's CPU backend dropped it and the checkpoint does not hold it")
                layer.weight = torch.nn.Parameter(state[key].to(device=layer.weight.device, dtype=dtype),
                                                  requires_grad=False)
        for layer in packed.values():
            layer.cpu_linear = torch.nn.functional.linear
            bias = getattr(layer, "bias", None)
            if isinstance(bias, torch.Tensor) and bias.dtype != dtype:  # some packed kernels keep an fp32 bias
                bias.data = bias.data.to(dtype)
        return sorted(packed)

    # -- state
    def es_init(self, trainable: Sequence[str] = ("*",), theta0_device: str = "cpu",
                hf_config: Any = None) -> dict[str, Any]:
        """Take the fp32 master copy of the trainable tensors (and theta0, for distances)."""
        self._es_config_override = hf_config
        self._es_unpack_cpu_linears()
        params = self._es_params()
        names = [n for n in params if any(fnmatch.fnmatchcase(n, p) for p in trainable)]
        if not names:
            raise ValueError(f"trainable {list(trainable)} matches no parameter; names look like {list(params)[:5]}")
        self._es_names = names
        self._es_theta = {n: params[n].detach().to(torch.float32).clone() for n in names}
        self._es_theta0 = {n: t.to(theta0_device, copy=True) for n, t in self._es_theta.items()}
        return {"tensors": len(names), "parameters": self.es_parameter_count(),
                "fused": sorted(n for n in names if is_fused(n))}

    @torch.no_grad()
    def es_perturb(self, seed: int, sigma: float, sign: float = 1.0) -> None:
        """Weights <- theta + sign * sigma * eps(seed), computed in fp32 from the clean master."""
        params, config = self._es_params(), self._es_hf_config()
        for name in self._es_names:
            theta = self._es_theta[name]
            noise = fused_noise(int(seed), name, theta.shape, config, theta.device)
            params[name].data.copy_(torch.add(theta, noise, alpha=float(sign) * float(sigma)))  # cast on write

    @torch.no_grad()
    def es_restore(self) -> None:
        """Weights <- theta exactly (no subtraction of noise)."""
        params = self._es_params()
        for name in self._es_names:
            params[name].data.copy_(self._es_theta[name])

    @torch.no_grad()
    def es_apply_update(self, seeds_signs: Sequence[Sequence[float]], weights: Sequence[float],
                        alpha: float) -> float:
        """theta += alpha / N * sum_n w_n sign_n eps_n (fp32), then weights <- theta. Returns ||step||."""
        config = self._es_hf_config()
        pairs = [(int(s), float(g)) for s, g in seeds_signs]
        coefficients = update_coefficients(pairs, weights)
        scale, sq = float(alpha) / len(pairs), 0.0
        for name in self._es_names:
            theta = self._es_theta[name]
            step = fused_direction(name, theta.shape, coefficients, config, theta.device).mul_(scale)
            theta.add_(step)
            sq += float(step.double().pow(2).sum())
        self.es_restore()
        return math.sqrt(sq)

    def es_distance_from_init(self) -> float:
        return math.sqrt(sum(float((t.double() - self._es_theta0[n].to(t.device).double()).pow(2).sum())
                             for n, t in self._es_theta.items()))

    def es_parameter_count(self) -> int:
        """d of the norm theory: the checkpoint's trainable parameters (vLLM's vocabulary padding left out)."""
        config, total = self._es_hf_config(), 0
        for name, t in self._es_theta.items():
            rows = vocab_rows(name, tuple(t.shape), config)
            total += t.numel() if rows is None else rows * (t.numel() // t.shape[0])
        return int(total)

    def es_shapes(self) -> dict[str, list[int]]:
        """The trainable tensors' shapes as this engine holds them (fused, vocabulary padded)."""
        return {n: list(t.shape) for n, t in self._es_theta.items()}

    def es_checksum(self) -> float:
        """A fingerprint of theta: engines that drifted apart give different values."""
        return float(sum(float(t.double().sum()) + float(t.double().abs().sum()) * 1e-3
                         for t in self._es_theta.values()))

    def es_save_theta(self, path: str) -> None:
        """theta in vLLM layout, fp32 (a resumable checkpoint)."""
        from safetensors.torch import save_file

        save_file({n: t.detach().cpu().contiguous() for n, t in self._es_theta.items()}, str(path))

    @torch.no_grad()
    def es_load_theta(self, path: str) -> None:
        from safetensors.torch import load_file

        loaded = load_file(str(path))
        if set(loaded) != set(self._es_names):
            raise ValueError(f"{path}: tensors differ from this engine's trainable set")
        for name, value in loaded.items():
            self._es_theta[name].copy_(value)
        self.es_restore()

    @torch.no_grad()
    def es_export_hf(self, path: str, dtype: str = "float32") -> list[str]:
        """Every weight of the model (theta where trainable) in HF layout, one safetensors file."""
        from safetensors.torch import save_file

        cast = getattr(torch, dtype)
        state = {n: (self._es_theta[n] if n in self._es_theta else p.detach()).to("cpu", cast)
                 for n, p in self._es_params().items()}
        hf = unfuse_state_dict(state, self._es_hf_config())
        save_file({n: t.contiguous() for n, t in hf.items()}, str(path), metadata={"format": "pt"})
        return sorted(hf)


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
                 trainable: Sequence[str] = ("*",), llm_kwargs: Mapping[str, Any] | None = None, llm: Any = None):
        if llm is None:
            from vllm import LLM

            # Prefix caching would hand member n+1 the prompt KV computed under member n's weights:
            # off by default (perturbing weights in place invalidates every cached block).
            kwargs = {"gpu_memory_utilization": 0.6, "enable_prefix_caching": False, **dict(llm_kwargs or {})}
            llm = LLM(model=str(model_ref), dtype=dtype, seed=int(seed), tensor_parallel_size=1,
                      worker_extension_cls=WORKER_EXTENSION, **kwargs)
        self.llm = llm
        self.info = self.rpc("es_init", list(trainable))

    def rpc(self, method: str, *args: Any) -> Any:
        return self.llm.collective_rpc(method, args=tuple(args))[0]

    def evaluate_member(self, seed: int, sign: float, sigma: float, prompt_ids: Sequence[Sequence[int]],
                        sampling: Mapping[str, Any], sampling_seed: int | None) -> list[tuple[str, int]]:
        """(text, generated tokens) per prompt for member theta + sign * sigma * eps(seed)."""
        from vllm import SamplingParams

        self.rpc("es_perturb", int(seed), float(sigma), float(sign))
        try:
            params = [SamplingParams(**sampling, seed=None if sampling_seed is None else sampling_seed + i)
                      for i in range(len(prompt_ids))]
            outputs = self.llm.generate([{"prompt_token_ids": list(ids)} for ids in prompt_ids], params,
                                        use_tqdm=False)
        finally:
            self.rpc("es_restore")
        return [(o.outputs[0].text, len(o.outputs[0].token_ids)) for o in outputs]


class VLLMESPool:
    """A population spread over engines; every engine holds the same theta (checked by checksum).

    `engines` are Ray actor handles of `VLLMESEngine` (`launch`) or plain objects with the methods
    ``rpc(method, *args)`` and ``evaluate_member(seed, sign, sigma, prompt_ids, sampling, seed0)``.
    """

    def __init__(self, engines: Sequence[Any]):
        if not engines:
            raise ValueError("a pool needs at least one engine")
        self.engines = list(engines)

    @classmethod
    def launch(cls, model_ref: str, num_engines: int | None = None, dtype: str = "bfloat16", seed: int = 0,
               trainable: Sequence[str] = ("*",), **llm_kwargs: Any) -> VLLMESPool:
        """One engine per GPU as Ray actors (``num_engines`` defaults to the GPUs Ray sees).

        ``num_engines=1`` builds the one engine in this process instead: no Ray needed (one GPU, or
        vLLM's CPU build).
        """
        if num_engines == 1:
            return cls([VLLMESEngine(model_ref, dtype, seed, list(trainable), llm_kwargs)])
        import ray

        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, include_dashboard=False)
        count = int(num_engines or ray.available_resources().get("GPU", 0))
        if count < 1:
            raise RuntimeError("no GPU visible to Ray: the vLLM ES pool needs at least one")
        actor = ray.remote(num_gpus=1)(VLLMESEngine)
        return cls([actor.remote(model_ref, dtype, seed, list(trainable), llm_kwargs) for _ in range(count)])

    def rpc_all(self, method: str, *args: Any) -> list[Any]:
        return _wait([_call(e, "rpc", method, *args) for e in self.engines])

    def rpc_one(self, method: str, *args: Any) -> Any:
        return _wait([_call(self.engines[0], "rpc", method, *args)])[0]

    def generate_population(self, seeds_signs: Sequence[tuple[int, float]], sigma: float,
                            prompt_ids: Sequence[Sequence[int]], sampling: Mapping[str, Any],
                            sampling_seed: int | None) -> list[list[tuple[str, int]]]:
        """Per member, per prompt (text, tokens); member n runs on engine n mod E (E at a time)."""
        futures = [_call(self.engines[n % len(self.engines)], "evaluate_member", int(seed), float(sign),
                         float(sigma), prompt_ids, dict(sampling),
                         None if sampling_seed is None else int(sampling_seed))
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


def population_fitness(texts: Sequence[Sequence[tuple[str, int]]], rows: Sequence[dict],
                       reward_fn: Callable[[str, dict], float]) -> FitnessResult:
    """Fitness (mean reward per member), success flags and token counts from a population's completions."""
    rewards = np.zeros((len(texts), len(rows)))
    tokens = 0
    for n, member in enumerate(texts):
        if len(member) != len(rows):
            raise ValueError(f"member {n}: {len(member)} completions for {len(rows)} prompts")
        for b, ((text, count), row) in enumerate(zip(member, rows, strict=True)):
            rewards[n, b] = float(reward_fn(text, row))
            tokens += int(count)
    return FitnessResult(fitness=rewards.mean(axis=1), success=rewards >= 1.0, generated_tokens=tokens,
                         entropy=math.nan, rollouts=int(rewards.size))


# --------------------------------------------------------------------------- HF checkpoint

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json", ".msgpack", ".h5")


def _local_model_dir(model_ref: str, patterns: Sequence[str]) -> Path:
    """`model_ref` if it is a folder, else the Hub snapshot holding `patterns` (cached, offline-friendly)."""
    source = Path(str(model_ref))
    if source.is_dir():
        return source
    if source.is_absolute() or str(model_ref).startswith(".") or str(model_ref).count("/") > 1:
        raise FileNotFoundError(f"{model_ref}: no such model folder (and not a Hub id)")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(model_ref), allow_patterns=list(patterns)))


def checkpoint_state_dict(model_ref: str) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors checkpoint (folder or Hub id), in HF names."""
    from safetensors.torch import load_file

    files = sorted(_local_model_dir(model_ref, ["*.safetensors"]).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_ref}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(load_file(str(path)))
    return state


def copy_model_metadata(model_ref: str, out_dir: str | os.PathLike, dtype: str = "float32") -> None:
    """config, generation config, tokenizer and chat template of `model_ref` (folder or Hub id), no weights.

    The config's dtype is set to the exported one, so `from_pretrained(dtype="auto")` keeps fp32.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    source = _local_model_dir(model_ref, ["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken", "*.py"])
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
        pool.rpc_one("es_export_hf", str(tmp / "model.safetensors"), dtype)


# --------------------------------------------------------------------------- the trainer


def _latest_checkpoint(progress_dir: Path) -> tuple[int, Path] | None:
    found = []
    for path in progress_dir.glob("step-*"):
        if (path / "state.json").exists() and (path / "theta.safetensors").exists():
            try:
                found.append((int(path.name[5:]), path))
            except ValueError:
                continue
    return max(found) if found else None


def train_es_vllm(pool: VLLMESPool, model_ref: str, prompt_ids: Mapping[str, Sequence[int]],
                  rows: Sequence[dict], cfg: ESConfig, reward_fn: Callable[[str, dict], float],
                  out_dir: str | os.PathLike, progress_dir: str | os.PathLike,
                  log: Callable[[str], Any] = print, export_dtype: str = "float32") -> dict[str, Any]:
    """ES over a pool of vLLM engines; writes out_dir/{model/, metrics.jsonl, summary.json} like `train_es`.

    prompt_ids: row id -> chat-formatted prompt token ids (`esgrpo.vllm_engine.prompt_token_ids`).
    The pool's engines must have run ``es_init`` on the starting weights. Every draw of iteration t
    comes from (cfg.seed, t): a run killed at any point resumes from its last checkpoint
    (progress_dir/step-XXXXXXXX/theta.safetensors, vLLM layout, fp32) and continues identically.
    """
    from esgrpo.vllm_engine import sampling_kwargs

    out_dir, progress_dir = Path(out_dir), Path(progress_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress_dir.mkdir(parents=True, exist_ok=True)
    N = cfg.population_size
    sampled = cfg.fitness_temperature > 0
    sampling = sampling_kwargs(1, cfg.fitness_temperature, cfg.fitness_top_p, cfg.max_new_tokens, logprobs=0)
    sampling.pop("logprobs")
    fingerprint = json.dumps({"config": {k: v for k, v in cfg.to_dict().items()
                                         if k not in ("iterations", "checkpoint_every", "log_every", "snapshots")},
                              "model": str(model_ref), "rows": [r["id"] for r in rows]}, sort_keys=True)
    run_id = hashlib.blake2b(fingerprint.encode("utf-8"), digest_size=16).hexdigest()  # names the run in snapshots
    start, metrics = 0, []
    totals = {"rollouts": 0, "generated_tokens": 0, "seconds": 0.0, "updates": 0, "skipped": 0}
    latest = _latest_checkpoint(progress_dir)
    if latest is not None:
        state = json.loads((latest[1] / "state.json").read_text())
        missing = snapshots_missing(out_dir, cfg.snapshots, latest[0], run_id)
        if missing:
            log(f"es-vllm: snapshots {missing} lie before the checkpoint at iteration {latest[0]} and were never "
                f"exported by this run; starting afresh")
        elif state.get("fingerprint") == fingerprint and latest[0] <= cfg.iterations:
            pool.rpc_all("es_load_theta", str(latest[1] / "theta.safetensors"))
            start, metrics, totals = latest[0], state["metrics"], state["totals"]
            log(f"es-vllm: resuming after iteration {start} of {cfg.iterations}")
    if start == 0:
        clear_snapshots(out_dir)
    for t in range(start, cfg.iterations):
        began = time.perf_counter()
        seeds_signs = member_seeds(cfg.seed, t, N, cfg.antithetic)
        batch = prompt_batch(list(rows), cfg, t)
        rollout_seed = _mix(cfg.seed, t, _STREAM_ROLLOUT) if sampled else None
        texts = pool.generate_population(seeds_signs, cfg.sigma, [prompt_ids[r["id"]] for r in batch],
                                         sampling, rollout_seed)
        result = population_fitness(texts, batch, reward_fn)
        fitness = np.asarray(result.fitness, dtype=np.float64)
        skipped = all_equal(fitness)
        update_norm = 0.0
        if not skipped:
            update_norm = pool.apply_update(seeds_signs, normalize_fitness(fitness, cfg.normalization), cfg.alpha)
            totals["updates"] += 1
        else:
            totals["skipped"] += 1
        totals["rollouts"] += int(result.rollouts)
        totals["generated_tokens"] += int(result.generated_tokens)
        totals["seconds"] += time.perf_counter() - began
        metrics.append({
            "method": "es", "iteration": t + 1, "fitness_mean": float(fitness.mean()),
            "fitness_std": float(fitness.std(ddof=0)), "fitness_max": float(fitness.max()),
            "fitness_min": float(fitness.min()), "update_norm": update_norm,
            "distance_from_init": float(pool.rpc_one("es_distance_from_init")), "updates": totals["updates"],
            "rollouts": totals["rollouts"], "generated_tokens": totals["generated_tokens"],
            "seconds": totals["seconds"], "entropy": math.nan,
            "js_diversity": population_js_diversity(result.success), "skipped": skipped, "prompts": len(batch),
        })
        done = t + 1
        if done in cfg.snapshots:  # before the checkpoint: a run resumed past K has its snapshot
            pool.check_in_sync()  # engine 0 exports for all
            export_hf_checkpoint(pool, model_ref, snapshot_dir(out_dir, done) / "model", export_dtype)
            write_json(snapshot_dir(out_dir, done) / "snapshot.json",
                       snapshot_record(cfg, done, totals, int(pool.rpc_one("es_parameter_count")),
                                       metrics[-1]["distance_from_init"], run_id))
        if (cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or done == cfg.iterations:
            pool.check_in_sync()
            tmp = Path(tempfile.mkdtemp(dir=progress_dir, prefix=".tmp-"))
            pool.rpc_one("es_save_theta", str(tmp / "theta.safetensors"))
            write_json(tmp / "state.json", {"fingerprint": fingerprint, "metrics": metrics, "totals": totals})
            os.replace(tmp, progress_dir / f"step-{done:08d}")
            for old in progress_dir.glob("step-*"):
                if old.name != f"step-{done:08d}":
                    shutil.rmtree(old, ignore_errors=True)
            write_jsonl(out_dir / "metrics.jsonl", metrics)
        if done % cfg.log_every == 0 or done == cfg.iterations:
            row = metrics[-1]
            log(f"es-vllm it {done}/{cfg.iterations} fitness {row['fitness_mean']:.4f}±{row['fitness_std']:.4f} "
                f"|step| {update_norm:.3e} dist {row['distance_from_init']:.3e} {row['seconds']:.1f}s"
                + (" SKIPPED (all equal)" if skipped else ""))
    export_hf_checkpoint(pool, model_ref, out_dir / "model", export_dtype)
    write_jsonl(out_dir / "metrics.jsonl", metrics)
    d = int(pool.rpc_one("es_parameter_count"))
    summary = {
        "method": "es", "backend": "vllm", "engines": len(pool.engines), "iterations": cfg.iterations,
        **run_record(cfg, totals, d, float(pool.rpc_one("es_distance_from_init"))),
        "final_fitness_mean": metrics[-1]["fitness_mean"] if metrics else math.nan,
        "best_fitness_mean": max((m["fitness_mean"] for m in metrics), default=math.nan),
        "resumed_from": start or None, "config": cfg.to_dict(),
    }
    write_json(out_dir / "summary.json", summary)
    return summary
