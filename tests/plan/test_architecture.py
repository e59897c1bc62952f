"""The architectures the plan sizes jobs by (esgrpo.plan.architecture): shipped parameter counts against the
published totals and the instantiated models, the KV cache, and each kind of model source."""

from __future__ import annotations

import json

import pytest

from esgrpo.plan import (
    PlanError,
    architecture_for,
    from_config_json,
    shipped,
)
from esgrpo.plan.architecture import shipped_architectures
from esgrpo.plan.memory import GIB
from tests.plan.helpers import load

# --------------------------------------------------------------------------- architectures


@pytest.mark.parametrize("source", sorted(shipped_architectures()))
def test_shipped_architecture_counts_match_the_published_totals(source):
    arch = shipped(source)
    published = arch.source["published_parameters"]["value"]
    # Published totals are rounded to 3 significant digits (1.54B, 4.02B, 135M).
    assert abs(arch.parameters / published - 1) < 0.005, (source, arch.parameters, published)
    assert arch.source["config"].startswith("https://huggingface.co/")


@pytest.mark.parametrize("model_type, extra", [
    ("llama", {"tie_word_embeddings": True}),
    ("qwen2", {"tie_word_embeddings": False}),
    ("qwen3", {"tie_word_embeddings": True, "head_dim": 24}),
])
def test_count_equals_the_instantiated_model(tmp_path, model_type, extra):
    """The count from config.json is what transformers builds: biases, q/k norms and tying included."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=311, hidden_size=48, intermediate_size=100,
                                  num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                                  max_position_embeddings=128, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path)
    arch = from_config_json(tmp_path)
    assert arch.parameters == sum(p.numel() for p in model.parameters())
    assert arch.model_type == model_type


def test_qwen3_4b_kv_cache_per_token_and_full_context():
    """The issue's arithmetic: 36 x 8 x 128 x 2 x 2 bytes = 144 KiB a token, ~36 GiB at 262,144 tokens."""
    arch = shipped("Qwen/Qwen3-4B-Instruct-2507")
    assert arch.kv_bytes_per_token("bfloat16") == 36 * 8 * 128 * 2 * 2 == 144 * 1024
    assert arch.max_position_embeddings * arch.kv_bytes_per_token() / GIB == pytest.approx(36.0)


def test_architecture_for_each_kind_of_source(tmp_path):
    config = load("config.yaml")
    default = architecture_for(config, "tiny", tmp_path)
    block = config["default_model"]
    assert (default.hidden_size, default.vocab_size) == (block["architecture"]["hidden_size"], block["vocab_size"])
    # A built default model's own config.json wins over the block.
    built = tmp_path / "tiny" / "base" / "model"
    built.mkdir(parents=True)
    (built / "config.json").write_text(json.dumps({**default.to_dict(), "vocab_size": 300, "model_type": "llama"}))
    assert architecture_for(config, "tiny", tmp_path).vocab_size == 300
    assert architecture_for(load("configs/smollm2.yaml"), "smollm2_135m", tmp_path).num_hidden_layers == 30
    unknown = {"models": {"mystery": {"source": "someone/unknown-model-7b", "tasks": ["gsm8k"]}}}
    with pytest.raises(PlanError, match="models.mystery: no architecture for source 'someone/unknown-model-7b'"):
        architecture_for(unknown, "mystery", tmp_path)


def test_a_relative_source_that_is_neither_folder_nor_cached_names_both_readings(tmp_path, monkeypatch):
    """`models/smollm2` reads as a folder under the working directory and as a Hub id: the line names both."""
    monkeypatch.chdir(tmp_path)
    config = {"models": {"smol": {"source": "models/smollm2", "tasks": ["gsm8k"]}}}
    with pytest.raises(PlanError) as err:
        architecture_for(config, "smol", tmp_path)
    message = str(err.value)
    assert f"as a folder, {tmp_path / 'models' / 'smollm2'} does not exist" in message, message
    assert "as a Hub id, it is not in the Hugging Face cache" in message and "hf download models/smollm2" in message
    (tmp_path / "models" / "smollm2").mkdir(parents=True)
    with pytest.raises(PlanError, match=f"as a folder, {tmp_path / 'models' / 'smollm2'} has no config.json"):
        architecture_for(config, "smol", tmp_path)
