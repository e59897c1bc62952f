"""The ES operations each vLLM worker runs on its own weights (`ESWorkerExtension`), called through
``llm.collective_rpc("es_...", args=...)``: vLLM mixes the class into its worker by the dotted path
`WORKER_EXTENSION` (``LLM(..., worker_extension_cls=WORKER_EXTENSION)``). What it does and why (the
fp32 master, seeds only, the papers' arithmetic as a setting) is in `esgrpo.es.vllm_backend`, which
drives it; this module imports neither vllm nor ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from esgrpo.distance import StepAgreement, distance
from esgrpo.engines.vllm_layout import (
    config_value,
    fused_noise,
    fused_weighted_sum,
    is_fused,
    read_fused,
    unfuse_items,
    vocab_rows,
)
from esgrpo.es.arithmetic import apply_update_in_place, perturbation
from esgrpo.es.ops import apply_update, member_weights, select_trainable
from esgrpo.models.tensor_files import DEFAULT_SHARD_BYTES, TensorFiles, local_model_dir, write_shards
from esgrpo.noise import Noise

WORKER_EXTENSION = "esgrpo.es.vllm_worker.ESWorkerExtension"
THETA_STEM = "theta"  # a checkpoint folder's theta*.safetensors (`es_save_theta`)


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
            files = self._es_checkpoint()
            for name in dropped:
                key, layer = f"{name}.weight", packed[name]
                try:
                    value = read_fused(key, files.get)
                except KeyError as missing:
                    raise KeyError(f"{key}: vLLM's CPU backend dropped it and the checkpoint does not hold it "
                                   f"({missing})") from None
                layer.weight = torch.nn.Parameter(value.to(device=layer.weight.device, dtype=dtype),
                                                  requires_grad=False)
        for layer in packed.values():
            layer.cpu_linear = torch.nn.functional.linear
            bias = getattr(layer, "bias", None)
            if isinstance(bias, torch.Tensor) and bias.dtype != dtype:  # some packed kernels keep an fp32 bias
                bias.data = bias.data.to(dtype)
        return sorted(packed)

    def _es_checkpoint(self) -> TensorFiles:
        """The safetensors of the checkpoint this engine loaded, read one tensor at a time."""
        if getattr(self, "_es_files", None) is None:
            self._es_files = TensorFiles(local_model_dir(self._es_model_ref(), ["*.safetensors"]))
        return self._es_files

    @torch.no_grad()
    def _es_read_master(self) -> None:
        """theta <- the checkpoint's values in fp32, fused as vLLM fuses them, one tensor at a time.

        vLLM's weights are the checkpoint cast to the engine's dtype (bf16): an fp32 checkpoint (an
        earlier stage's export) would lose its last 16 bits there. Padding rows vLLM added to the
        vocabulary keep their live values (the checkpoint has none).
        """
        files, config = self._es_checkpoint(), self._es_hf_config()

        def read(hf_name: str) -> torch.Tensor:
            tied = config_value(config, "tie_word_embeddings", False)
            if hf_name == "lm_head.weight" and hf_name not in files and tied:
                hf_name = next(n for n in files if n.endswith("embed_tokens.weight"))
            return files.get(hf_name)

        for name in self._es_names:
            theta = self._es_theta[name]
            rows = vocab_rows(name, tuple(theta.shape), config)
            target = theta if rows is None else theta[:rows]
            value = read_fused(name, read)
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"{name}: the checkpoint gives shape {tuple(value.shape)}, vLLM holds "
                                 f"{tuple(target.shape)}")
            target.copy_(value)  # to fp32, on theta's device

    # -- state
    def es_init(self, trainable: Sequence[str] = ("*",), keep_theta0: bool = True, hf_config: Any = None,
                master: str = "checkpoint") -> dict[str, Any]:
        """Take the fp32 master copy theta of the trainable tensors; theta0 (for distances) where asked.

        master: "checkpoint" reads theta from the checkpoint the engine loaded (`_es_read_master`);
        "weights" casts the live weights (exact only when the engine runs fp32: the CPU stand-ins).
        keep_theta0: hold a host copy of the starting theta; a pool asks engine 0 only (one per job).
        """
        if master not in ("checkpoint", "weights"):
            raise ValueError(f"master must be 'checkpoint' or 'weights', got {master!r}")
        self._es_config_override = hf_config
        self._es_noise, self._es_arith, self._es_perturbed = None, "exact", None  # until es_arithmetic
        self._es_agreement, self._es_iteration_start = None, None  # the last update's; in place: host copy
        self._es_unpack_cpu_linears()
        params = self._es_params()
        names = select_trainable(list(params), trainable)
        self._es_names = names
        self._es_theta = {n: params[n].detach().to(torch.float32, copy=True) for n in names}
        if master == "checkpoint":
            self._es_read_master()
            self.es_restore()  # the live weights: theta cast to the engine's dtype, as vLLM loaded them
        self._es_files = None  # close the checkpoint's memory maps
        self._es_theta0 = {n: t.to("cpu", copy=True) for n, t in self._es_theta.items()} if keep_theta0 else None
        return {"tensors": len(names), "parameters": self.es_parameter_count(),
                "fused": sorted(n for n in names if is_fused(n))}

    # -- arithmetic (esgrpo.es.arithmetic); a worker never told otherwise runs the exact one
    def es_arithmetic(self, seeding: str = "per_tensor", arithmetic: str = "exact") -> None:
        """Set the noise seeding and weight arithmetic. In place: theta becomes the live weights (the fp32
        master is dropped) and theta0, where kept, the live weights as they are now."""
        params = self._es_params()
        dtypes = {params[n].dtype for n in self._es_names}
        if seeding == "paper_a" and len(dtypes) != 1:
            raise ValueError(f"noise seeding 'paper_a' draws in the weights' dtype; these have several: {dtypes}")
        self._es_noise = Noise("full", 1, seeding, next(iter(dtypes)))
        self._es_arith = arithmetic
        if arithmetic != "exact":
            self._es_theta = {n: params[n].data for n in self._es_names}
            if self._es_theta0 is not None:
                self._es_theta0 = {n: t.detach().to("cpu", copy=True) for n, t in self._es_theta.items()}
        self._es_perturbed = None

    def _es_draw(self, seed: int, name: str, shape: Sequence[int], device: torch.device) -> torch.Tensor:
        """One member's draw for a vLLM tensor: the project's seeding names its HF parts (`fused_noise`); the
        papers' name the vLLM tensor itself."""
        noise = getattr(self, "_es_noise", None)
        if noise is None or noise.seeding == "per_tensor":
            return fused_noise(int(seed), name, shape, self._es_hf_config(), device)
        return noise.draw(int(seed), name, shape, device)

    def _es_in_place(self) -> bool:
        return getattr(self, "_es_arith", "exact") != "exact"

    @torch.no_grad()
    def es_perturb(self, seed: int, sigma: float, sign: float = 1.0) -> None:
        """Weights <- theta + sign * sigma * eps(seed), computed in fp32 from the clean master (in place: the
        step cast to the weights' dtype and added to them)."""
        params = self._es_params()
        if self._es_in_place():
            if self._es_perturbed is not None:
                raise RuntimeError("the weights are perturbed already: restore them first")
            if getattr(self, "_es_iteration_start", None) is None:  # the first member of an iteration: the
                # weights before its restores, which the step agreement counts the update from (on the host)
                self._es_iteration_start = {n: params[n].data.to("cpu", copy=True) for n in self._es_names}
            for name in self._es_names:
                p = params[name].data
                p.add_(perturbation(self._es_draw(seed, name, p.shape, p.device), sign, sigma, p.dtype))
            self._es_perturbed = (int(seed), float(sigma), float(sign))
            return
        for name in self._es_names:
            theta = self._es_theta[name]
            noise = self._es_draw(seed, name, theta.shape, theta.device)
            params[name].data.copy_(member_weights(theta, noise, float(sign), float(sigma)))  # cast on write

    @torch.no_grad()
    def es_restore(self) -> None:
        """Weights <- theta exactly (no subtraction of noise); in place: the last perturbation subtracted."""
        params = self._es_params()
        if self._es_in_place():
            if self._es_perturbed is not None:
                seed, sigma, sign = self._es_perturbed
                for name in self._es_names:
                    p = params[name].data
                    p.sub_(perturbation(self._es_draw(seed, name, p.shape, p.device), sign, sigma, p.dtype))
                self._es_perturbed = None
            return
        for name in self._es_names:
            params[name].data.copy_(self._es_theta[name])

    @torch.no_grad()
    def es_apply_update(self, seeds_signs: Sequence[Sequence[float]], weights: Sequence[float],
                        alpha: float) -> float:
        """theta += alpha / N * sum_n w_n sign_n eps_n (fp32), then weights <- theta. Returns ||step||."""
        config, pairs = self._es_hf_config(), [(int(s), float(g)) for s, g in seeds_signs]
        noise = getattr(self, "_es_noise", None)
        self._es_agreement = StepAgreement()
        if self._es_in_place():
            if self._es_perturbed is not None:
                raise RuntimeError("the update needs restored weights")
            start, self._es_iteration_start = getattr(self, "_es_iteration_start", None), None
            return apply_update_in_place(self._es_theta, pairs, weights, alpha, noise, self._es_arith,
                                         draw_of=self._es_draw, agreement=self._es_agreement, start=start)
        if noise is None or noise.seeding == "per_tensor":
            def step_of(coefficients, name, shape, device):
                return fused_weighted_sum(coefficients, name, shape, config, device)
        else:  # the papers' seedings: vLLM's own tensors
            step_of = noise.weighted_sum
        norm = apply_update(self._es_theta, pairs, weights, alpha, step_of=step_of, agreement=self._es_agreement)
        self.es_restore()
        return norm

    def es_step_agreement(self) -> dict[str, Any] | None:
        """The last update's `esgrpo.distance.StepAgreement` (vLLM's tensor names: qkv_proj counts as
        attention, gate_up_proj as MLP); None before the first update."""
        agreement = getattr(self, "_es_agreement", None)
        return None if agreement is None else agreement.to_dict()

    def es_distance_from_init(self) -> float:
        if self._es_theta0 is None:
            raise RuntimeError("this engine keeps no theta0 (es_init(keep_theta0=False)); ask engine 0")
        # theta0 lives on the host: `esgrpo.distance` moves it to theta's device one float64 chunk at a time
        return distance(self._es_theta, self._es_theta0)

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

    def es_save_theta(self, folder: str, max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        """theta in vLLM layout, fp32, as theta*.safetensors in `folder` (a resumable checkpoint), streamed."""
        write_shards(self._es_theta.items(), folder, THETA_STEM, max_shard_bytes)

    @torch.no_grad()
    def es_load_theta(self, folder: str) -> None:
        """theta <- the checkpoint `es_save_theta` wrote, one tensor at a time."""
        files = TensorFiles(folder, f"{THETA_STEM}*.safetensors")
        if set(files.keys()) != set(self._es_names):
            raise ValueError(f"{folder}: tensors differ from this engine's trainable set")
        for name in self._es_names:
            self._es_theta[name].copy_(files.get(name))
        self.es_restore()

    @torch.no_grad()
    def es_export_hf(self, folder: str, dtype: str = "float32",
                     max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[str]:
        """Every weight of the model (theta where trainable) in HF layout, as model*.safetensors in `folder`.

        One tensor reaches the host at a time, cast to `dtype`; shards are written as they fill.
        """
        cast, params = getattr(torch, dtype), self._es_params()
        live = ((n, self._es_theta[n] if n in self._es_theta else p.detach()) for n, p in params.items())
        pieces = unfuse_items(live, self._es_hf_config(), list(params))
        hf = ((name, tensor.to("cpu", cast)) for name, tensor in pieces)
        return sorted(write_shards(hf, folder, "model", max_shard_bytes, metadata={"format": "pt"}))
