"""The ES settings (esgrpo.es.settings): errors that name the field, fingerprints, the prompt schedule, and
settings modules light enough to import without the trainer's heavy dependencies."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from esgrpo.es.settings import ESConfig
from esgrpo.noise import Noise
from tests.conftest import REPO


@pytest.mark.parametrize("changes, field", [
    ({"population_size": 1}, "population_size"),
    ({"population_size": 7, "antithetic": True}, "population_size"),
    ({"sigma": 0.0}, "sigma"),
    ({"sigma": True}, "sigma"),
    ({"population_size": 8.0}, "population_size"),
    ({"sigma": -1e-3}, "sigma"),
    ({"alpha": 0}, "alpha"),
    ({"iterations": -1}, "iterations"),
    ({"normalization": "minmax"}, "normalization"),
    ({"unit_rms_weights": "yes"}, "unit_rms_weights"),
    ({"fitness_top_p": 0.0}, "fitness_top_p"),
    ({"fitness_temperature": -0.5}, "fitness_temperature"),
    ({"reward_scheme": "dense"}, "reward_scheme"),
    ({"trainable": []}, "trainable"),
    ({"seed": -3}, "seed"),
    ({"prompts_per_iteration": 0}, "prompts_per_iteration"),
    ({"noise": "sparse"}, "noise"),
    ({"noise": "lowrank", "rank": 0}, "rank"),
    ({"rank": 2.5}, "rank"),
])
def test_bad_settings_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        ESConfig(**changes)
    with pytest.raises(ValueError, match=field):
        ESConfig.from_dict(changes)


def test_full_rank_runs_keep_their_fingerprint_and_low_rank_ones_differ_by_rank():
    full = ESConfig().trajectory_settings()
    assert "noise" not in full and "rank" not in full  # as before low-rank noise existed: checkpoints resume
    assert ESConfig(rank=4).trajectory_settings() == full  # the rank of full-rank noise is moot
    low = ESConfig(noise="lowrank", rank=4).trajectory_settings()
    assert low["noise"] == "lowrank" and low["rank"] == 4
    assert ESConfig(noise="lowrank", rank=4).noise_spec == Noise("lowrank", 4)
    assert ESConfig(rank=4).noise_spec == Noise()


def test_unknown_normalization_lists_allowed_values_and_unknown_keys_are_named():
    with pytest.raises(ValueError, match="zscore.*rank.*none"):
        ESConfig(normalization="centered")
    with pytest.raises(ValueError, match="populaton_size"):
        ESConfig.from_dict({"populaton_size": 8, "sigma": 0.01})
    cfg = ESConfig.from_dict({"population_size": 8, "antithetic": True, "trainable": "*norm*"})
    assert cfg.trainable == ["*norm*"] and ESConfig.from_dict(cfg.to_dict()) == cfg


def test_settings_are_light_documented_dataclasses_and_the_trainer_imports_no_generation():
    """check_config builds the settings without the trainers; the ES loop and its maths import no
    transformers and no vLLM (the backends do)."""
    import dataclasses

    from esgrpo.grpo.settings import GRPOSettings

    code = ("import sys, esgrpo.es.settings, esgrpo.grpo.settings; "
            "heavy = [m for m in ('torch', 'transformers', 'trl', 'vllm') if m in sys.modules]; "
            "import esgrpo.es.loop, esgrpo.es.ops; "
            "print(heavy, [m for m in ('transformers', 'vllm', 'esgrpo.engines.population', 'esgrpo.es.hf_backend') "
            "if m in sys.modules])")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[0] == "[] []"
    for cls in (ESConfig, GRPOSettings):
        undocumented = [f.name for f in dataclasses.fields(cls) if len(f.metadata.get("help", "")) < 10]
        assert not undocumented, (cls.__name__, undocumented)


def test_the_prompt_schedule_is_checked_and_keeps_the_fingerprints_of_resampling_runs():
    with pytest.raises(ValueError, match="prompt_schedule"):
        ESConfig(prompt_schedule="shuffle")
    with pytest.raises(ValueError, match="prompt_schedule.*resample_prompts"):
        ESConfig(prompt_schedule="epochs", resample_prompts=False)
    with pytest.raises(ValueError, match="prompt_seed"):
        ESConfig(prompt_schedule="epochs", prompt_seed=-1)
    assert "prompt_schedule" not in ESConfig().trajectory_settings()  # runs before the setting resume
    epochs = ESConfig(prompt_schedule="epochs", prompt_seed=42).trajectory_settings()
    assert (epochs["prompt_schedule"], epochs["prompt_seed"]) == ("epochs", 42)
