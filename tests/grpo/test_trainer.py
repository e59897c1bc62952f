"""Tests of the TRL-based GRPO trainer (esgrpo.grpo.trainer) on a tiny model built in the test's tmp folder.

The model is a 1-layer Llama taught in a few supervised steps to answer "Is a+b=c?" with
`\\boxed{yes}` or `\\boxed{no}` at random: it uses the project's format, so the project's
verifier gives it about half the reward and GRPO's advantages (hence its updates) are not zero.
A random model would score 0 everywhere and every GRPO step would be a no-op.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from esgrpo.files import read_json, read_jsonl
from esgrpo.grpo.launch import accelerate_config, launch_command, launch_grpo
from esgrpo.grpo.settings import GRPOSettings
from esgrpo.grpo.trainer import (
    CHECKPOINT_PREFIX,
    _check_vllm_dtype,
    _last_complete_checkpoint,
    _vllm_max_model_len,
    grpo_config_kwargs,
    make_reward_function,
    prompt_order,
    rows_to_dataset,
    train_grpo,
)
from esgrpo.progress import LOCK_NAME, ProgressFolder, ProgressFolderLocked
from esgrpo.run_record import STEP_FIELDS, RunSummary
from esgrpo.tasks.base import make_row
from esgrpo.tasks.rewards import reward
from tests.conftest import REPO
from tests.grpo.helpers import yesno_rows

torch.set_num_threads(1)
SRC = REPO / "src"


# --------------------------------------------------------------------------- fixtures


def small_settings(**overrides) -> GRPOSettings:
    base = dict(num_generations=4, prompts_per_step=4, steps=4, max_new_tokens=8, learning_rate=5e-3,
                save_every=2, seed=0)
    base.update(overrides)
    return GRPOSettings(**base)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


# --------------------------------------------------------------------------- reward and data


def test_reward_function_is_the_project_verifier():
    fn = make_reward_function("countdown")
    assert fn.__name__ == "countdown_reward"  # TRL logs rewards/<name>/mean
    meta = {"numbers": [6, 4, 8], "target": 8}
    prompt = "Use 6 4 8 to make 8. For example \\boxed{4*(8-6)}"  # the right answer sits in the prompt
    completions = ["\\boxed{4*(8-6)}", "\\boxed{8+6-4}", "I do not know", "4*(8-6)", "\\boxed{(8-6)*4} done"]
    as_messages = [[{"role": "assistant", "content": c}] for c in completions]
    expected = [reward("countdown", c, "4*(8-6)", meta) for c in completions]
    assert expected == [1.0, 0.0, 0.0, 0.0, 1.0]
    kwargs = dict(answer=["4*(8-6)"] * 5, prompts=[prompt] * 5, completion_ids=[[1]] * 5)
    # meta as the JSON text rows_to_dataset stores and as a dict; completions as text and as messages
    assert fn(completions, meta=[json.dumps(meta)] * 5, **kwargs) == expected
    assert fn(as_messages, meta=[meta] * 5, **kwargs) == expected
    # Graded on the completion only: prompt + an unboxed completion would have scored 1.
    assert reward("countdown", prompt + completions[2], "4*(8-6)", meta) == 1.0

    partial = make_reward_function("yesno", scheme="boxed_partial", format_bonus=0.25)
    texts = ["\\boxed{yes}", "\\boxed{no}", "the answer is yes", ""]
    got = partial(texts, answer=["yes"] * 4, meta=["{}"] * 4)
    assert got == [reward("yesno", t, "yes", {}, "boxed_partial", 0.25) for t in texts] == [1.25, 0.35, 0.0, 0.0]


def test_reward_function_rejects_unknown_names():
    with pytest.raises(ValueError, match="verifier"):
        make_reward_function("nope")
    with pytest.raises(ValueError, match="scheme"):
        make_reward_function("yesno", scheme="nope")


def test_rows_to_dataset_keeps_messages_and_meta():
    rows = [make_row("a", "Use 1 2 3 to make 6.", "1+2+3", {"numbers": [1, 2, 3], "target": 6}),
            make_row("b", "Is 1+1=2?", "yes", {"solution": "1+1=2"})]  # meta of another shape
    ds = rows_to_dataset(rows)
    assert set(ds.column_names) == {"id", "prompt", "answer", "meta"}
    assert ds[0]["prompt"] == [{"role": "user", "content": "Use 1 2 3 to make 6."}]
    assert [json.loads(m) for m in ds["meta"]] == [r["meta"] for r in rows]
    assert ds["id"] == ["a", "b"]


def test_prompt_order_batches_are_distinct_and_seeded():
    order = prompt_order(10, steps=7, prompts_per_step=3, seed=1)
    assert len(order) == 21
    batches = [order[i:i + 3] for i in range(0, 21, 3)]
    assert all(len(set(b)) == 3 for b in batches)
    assert len(set(order[:9])) == 9  # one pass: 3 full batches of distinct rows, the 10th row dropped
    assert order == prompt_order(10, steps=7, prompts_per_step=3, seed=1)
    assert order != prompt_order(10, steps=7, prompts_per_step=3, seed=2)
    with pytest.raises(ValueError, match="prompts_per_step"):
        prompt_order(3, steps=1, prompts_per_step=4, seed=0)


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("field, value", [
    ("num_generations", 1), ("steps", 0), ("learning_rate", 0.0), ("learning_rate", -1e-3),
    ("loss_type", "ppo"), ("scale_rewards", "yes"), ("lr_scheduler_type", "triangle"),
    ("warmup_ratio", 1.0), ("top_p", 0.0), ("temperature", 0.0), ("reward_scheme", "dense"),
    ("steps", True), ("prompts_per_step", 2.5), ("use_vllm", "no"), ("gradient_accumulation_steps", 3),
    ("sharding", "ddp"), ("sharding", "zero3"), ("num_processes", 0), ("vllm_gpu_memory_utilization", 1.5),
    ("vllm_max_model_length", 0), ("vllm_max_model_length", 20), ("max_prompt_tokens", 0),
    ("activation_checkpointing", "yes"), ("bf16", 1),
])
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"GRPOSettings\.{field}\b"):
        GRPOSettings(**{field: value})


def test_loss_type_error_lists_the_allowed_values():
    with pytest.raises(ValueError, match=r"loss_type.*\['dapo', 'grpo', 'dr_grpo', 'bnpo'\]"):
        GRPOSettings(loss_type="ppo")


def test_from_dict_rejects_unknown_keys_by_name():
    with pytest.raises(ValueError, match=r"unknown GRPO setting\(s\) \['group_size'\]"):
        GRPOSettings.from_dict({"group_size": 8, "steps": 3})
    assert GRPOSettings.from_dict({"steps": 3}).to_dict() == GRPOSettings(steps=3).to_dict()


def test_torn_checkpoints_are_skipped_and_removed(tmp_path):
    whole = tmp_path / "checkpoint-2"
    whole.mkdir()
    (whole / "optimizer.pt").write_bytes(b"x")
    (whole / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    torn = tmp_path / "checkpoint-4"  # killed mid-save: the model is there, the trainer state is not
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"x")
    assert _last_complete_checkpoint(ProgressFolder(tmp_path, CHECKPOINT_PREFIX), log=lambda m: None) == (2, whole)
    assert not torn.exists()


def test_sharded_checkpoints_count_as_whole(tmp_path):
    """DeepSpeed keeps the optimiser state in global_step<N>/, FSDP in optimizer_0/: whole checkpoints too."""
    for step, state in ((2, "global_step2"), (4, "optimizer_0")):
        folder = tmp_path / f"checkpoint-{step}"
        (folder / state).mkdir(parents=True)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    assert _last_complete_checkpoint(ProgressFolder(tmp_path, CHECKPOINT_PREFIX), log=lambda m: None) == (
        4, tmp_path / "checkpoint-4")


def test_trl_config_takes_the_memory_settings():
    """CPU defaults stay as they were (fp32, no checkpointing, the whole step in one backward pass); a GPU
    run gets bf16, checkpointing under the name this transformers has, micro-batches that keep the step's
    completions in one generation batch, and the colocated vLLM engine's share and context."""
    import dataclasses

    from trl import GRPOConfig

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    cpu = grpo_config_kwargs(GRPOSettings(), Path("unused"), cuda=False)
    assert (cpu["bf16"], cpu[checkpointing], cpu["use_cpu"]) == (False, False, True)
    assert (cpu["per_device_train_batch_size"], cpu["gradient_accumulation_steps"]) == (128, 1)
    assert not any(k.startswith("vllm") for k in cpu) and "use_vllm" not in cpu
    assert GRPOConfig(**cpu).generation_batch_size == 128

    paper = GRPOSettings(prompts_per_step=64, num_generations=8, max_new_tokens=2048, gradient_accumulation_steps=16,
                         use_vllm=True, vllm_gpu_memory_utilization=0.45)
    gpu = grpo_config_kwargs(paper, Path("unused"), cuda=True, max_model_len=2560)
    assert (gpu["bf16"], gpu[checkpointing], gpu["use_cpu"]) == (True, True, False)
    assert (gpu["per_device_train_batch_size"], gpu["gradient_accumulation_steps"]) == (32, 16)
    assert (gpu["vllm_mode"], gpu["vllm_gpu_memory_utilization"], gpu["vllm_max_model_length"]) == (
        "colocate", 0.45, 2560)
    # TRL takes them as this project means them (bf16 itself needs a GPU): 512 completions, 16 passes of 32.
    config = GRPOConfig(**{**gpu, "bf16": False, "use_cpu": True})
    assert (config.generation_batch_size, config.steps_per_generation, config.vllm_max_model_length) == (512, 16, 2560)
    assert grpo_config_kwargs(GRPOSettings(activation_checkpointing=False, bf16=False), Path("u"), True)[
        checkpointing] is False
    # FSDP checkpoints through its own wrapper (accelerate config), never both
    fsdp = GRPOSettings(num_processes=2, sharding="fsdp", gradient_accumulation_steps=2)
    assert grpo_config_kwargs(fsdp, Path("u"), cuda=True)[checkpointing] is False
    assert accelerate_config(fsdp)["fsdp_config"]["fsdp_activation_checkpointing"] is True
    assert fsdp.micro_batch == 32


def test_vllm_engine_context_and_dtype_checks(model_dir):
    """The colocated engine's max_model_len is the longest chat-formatted prompt + max_new_tokens (or the
    plan's, checked); a vLLM engine left in fp32 beside bf16 training is an error."""
    import types

    from esgrpo.engines.vllm_engine import prompt_token_ids
    from esgrpo.models.loading import load_model

    _, tokenizer = load_model(model_dir)
    rows = yesno_rows(8)
    longest = max(len(ids) for ids in prompt_token_ids(tokenizer, rows))
    assert _vllm_max_model_len(small_settings(use_vllm=False), tokenizer, rows) == longest + 8
    assert _vllm_max_model_len(small_settings(vllm_max_model_length=longest + 20), tokenizer, rows) == longest + 20
    with pytest.raises(ValueError, match="max_model_len"):
        _vllm_max_model_len(small_settings(vllm_max_model_length=longest + 7), tokenizer, rows)

    def trainer(dtype):
        config = types.SimpleNamespace(dtype=dtype)
        llm = types.SimpleNamespace(llm_engine=types.SimpleNamespace(model_config=config))
        return types.SimpleNamespace(vllm_generation=types.SimpleNamespace(llm=llm))

    _check_vllm_dtype(trainer(torch.bfloat16), small_settings())
    with pytest.raises(RuntimeError, match="float32"):
        _check_vllm_dtype(trainer(torch.float32), small_settings())
    _check_vllm_dtype(trainer(torch.float32), small_settings(bf16=False))  # fp32 training may keep fp32 vLLM


def test_accelerate_configs_and_the_launch_command(tmp_path):
    """One config per sharding, readable by accelerate itself; the command runs this package's entry point
    in num_processes processes on the given port."""
    import yaml
    from accelerate.commands.config.config_args import load_config_from_file

    expected = {"none": ("MULTI_GPU", None), "zero3": ("DEEPSPEED", "deepspeed_config"),
                "fsdp": ("FSDP", "fsdp_config")}
    for sharding, (kind, block) in expected.items():
        settings = GRPOSettings(num_processes=4, sharding=sharding)
        config = accelerate_config(settings)
        assert (config["distributed_type"], config["num_processes"], config["mixed_precision"]) == (kind, 4, "bf16")
        path = tmp_path / f"{sharding}.yaml"
        path.write_text(yaml.safe_dump(config))
        loaded = load_config_from_file(str(path))
        assert (str(loaded.distributed_type).rsplit(".", 1)[-1], loaded.num_processes) == (kind, 4)
        if block:
            assert getattr(loaded, block) == config[block]
    zero3 = accelerate_config(GRPOSettings(num_processes=2, sharding="zero3"))["deepspeed_config"]
    assert zero3["zero_stage"] == 3 and zero3["zero3_init_flag"] is False
    fsdp = accelerate_config(GRPOSettings(num_processes=2, sharding="fsdp"))["fsdp_config"]
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    assert accelerate_config(GRPOSettings(num_processes=2), cuda=False)["mixed_precision"] == "no"
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:  # said before any process starts
        with pytest.raises(ImportError, match="DeepSpeed"):
            launch_grpo("m", yesno_rows(8), "yesno", GRPOSettings(num_processes=2, sharding="zero3"), tmp_path / "o",
                        tmp_path / "p")
    command = launch_command(tmp_path / "a.yaml", tmp_path / "job.json", 4, 29517)
    assert command == [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(tmp_path / "a.yaml"),
                       "--num_processes", "4", "--main_process_port", "29517", "-m", "esgrpo.grpo.launch",
                       str(tmp_path / "job.json")]


# --------------------------------------------------------------------------- training


def test_a_held_progress_folder_stops_a_second_trainer_before_it_loads_anything(tmp_path):
    """Another process (a live pid) writes the folder: train_grpo stops at once, naming the folder and
    the holder, and leaves the folder as it was."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from esgrpo.progress import ProgressFolder\n"
                               "with ProgressFolder(sys.argv[1], 'checkpoint-'):\n"
                               "    print('held', flush=True); time.sleep(120)", str(tmp_path / "progress")],
        env=dict(os.environ, PYTHONPATH=str(SRC)), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ProgressFolderLocked) as error:
            train_grpo(tmp_path / "no-model-needed", yesno_rows(), "yesno", small_settings(), tmp_path / "out",
                       tmp_path / "progress", log=lambda m: None)
        assert str(tmp_path / "progress") in str(error.value) and f"pid {holder.pid} on host" in str(error.value)
        assert sorted(p.name for p in (tmp_path / "progress").iterdir()) == [LOCK_NAME]
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()



def es_row_keys(tmp_path: Path) -> set[str]:
    """The keys of a real ES metrics row (one iteration of esgrpo.es.loop on a tiny model)."""
    import numpy as np
    from transformers import LlamaConfig, LlamaForCausalLM

    from esgrpo.es.backend import FitnessResult
    from esgrpo.es.hf_backend import HFESBackend
    from esgrpo.es.loop import train_es
    from esgrpo.es.settings import ESConfig

    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
    model = LlamaForCausalLM(config)

    def evaluate(population, prompt_rows, cfg, generator=None):
        return FitnessResult(fitness=np.arange(cfg.population_size, dtype=float))

    train_es(HFESBackend(model, None, evaluate), [{"id": "x"}],
             ESConfig(population_size=2, iterations=1, prompts_per_iteration=1), tmp_path / "es",
             tmp_path / "es_progress", log=lambda m: None)
    return set(read_jsonl(tmp_path / "es" / "metrics.jsonl")[0])


def test_train_writes_es_schema_metrics_and_a_reloadable_model(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    settings = small_settings(steps=4, save_every=2)
    out, progress = tmp_path / "out", tmp_path / "progress"
    summary = train_grpo(model_dir, yesno_rows(), "yesno", settings, out, progress, log=lambda m: None)

    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert set(STEP_FIELDS) <= es_row_keys(tmp_path)  # one record: ES's rows have the same fields
    for r in rows:
        assert set(STEP_FIELDS) <= set(r)
        assert r["method"] == "grpo" and "kl" not in r  # beta = 0: TRL computes no KL
        assert 0.0 <= r["fitness_mean"] <= 1.0 and r["update_norm"] > 0
    assert [r["rollouts"] for r in rows] == [16, 32, 48, 64]
    assert all(b["generated_tokens"] > a["generated_tokens"] for a, b in zip(rows, rows[1:], strict=False))
    assert all(b["seconds"] > a["seconds"] for a, b in zip(rows, rows[1:], strict=False))
    assert rows[0]["update_norm"] == pytest.approx(rows[0]["distance_from_init"])
    assert any(r["fitness_std"] > 0 for r in rows)  # the fixture model gives GRPO a signal

    # The saved model reloads with transformers and holds the trained weights: those of the
    # final TRL checkpoint, at the distance from the start that the metrics logged.
    reloaded = AutoModelForCausalLM.from_pretrained(out / "model")
    assert reloaded.config.use_cache == AutoModelForCausalLM.from_pretrained(model_dir).config.use_cache
    state = {k: v for k, v in reloaded.state_dict().items()}
    final_checkpoint = weights(progress / "checkpoint-4")
    assert set(final_checkpoint) <= set(state)
    for name, value in final_checkpoint.items():
        assert torch.equal(state[name], value), name
    start = {k: v for k, v in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()}
    moved = sum(float((p.detach() - start[k].detach()).double().pow(2).sum()) for k, p in reloaded.named_parameters())
    assert moved ** 0.5 == pytest.approx(summary.distance_from_init, rel=1e-6)
    assert summary.distance_from_init == pytest.approx(rows[-1]["distance_from_init"], rel=1e-9)
    assert summary.rollouts == 64 and summary.iterations == summary.updates == 4
    assert summary.settings == settings.to_dict() and summary.trainable_parameters == sum(p.numel() for p in start.values())
    assert not (out / "summary.json").exists()  # the training stage writes it


def test_kl_is_logged_when_beta_is_set(model_dir, tmp_path):
    settings = small_settings(steps=1, save_every=0, beta=0.05)
    train_grpo(model_dir, yesno_rows(), "yesno", settings, tmp_path / "o", tmp_path / "p", log=lambda m: None)
    (row,) = read_jsonl(tmp_path / "o" / "metrics.jsonl")
    assert row["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy is the reference before its first update


def test_micro_batches_keep_the_step_and_its_update(model_dir, tmp_path):
    """Gradient accumulation over micro-batches of 4 (GRPOSettings.micro_batch) samples the same 16
    completions per step as one pass of 16 and takes the same first update (up to float sums)."""
    quiet = {"log": lambda m: None}
    whole = small_settings(steps=2, save_every=0)
    micro = small_settings(steps=2, save_every=0, gradient_accumulation_steps=4)
    assert (whole.micro_batch, micro.micro_batch) == (16, 4)
    train_grpo(model_dir, yesno_rows(), "yesno", whole, tmp_path / "whole", tmp_path / "pw", **quiet)
    train_grpo(model_dir, yesno_rows(), "yesno", micro, tmp_path / "micro", tmp_path / "pm", **quiet)
    a, b = read_jsonl(tmp_path / "whole" / "metrics.jsonl"), read_jsonl(tmp_path / "micro" / "metrics.jsonl")
    assert [r["rollouts"] for r in a] == [r["rollouts"] for r in b] == [16, 32]
    assert (a[0]["fitness_mean"], a[0]["generated_tokens"]) == (b[0]["fitness_mean"], b[0]["generated_tokens"])
    assert b[0]["update_norm"] > 0 and b[0]["update_norm"] == pytest.approx(a[0]["update_norm"], rel=1e-4)


def test_use_vllm_needs_a_gpu_or_vllms_cpu_build(tmp_path, monkeypatch):
    from esgrpo.grpo import trainer

    monkeypatch.setattr(trainer.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(trainer, "on_vllm_cpu", lambda: False)
    with pytest.raises(ValueError, match="use_vllm needs a CUDA GPU or vLLM's CPU build"):
        train_grpo("unused", [{"id": "a"}], "math", small_settings(use_vllm=True), tmp_path / "o", tmp_path / "p")
    with pytest.raises(ValueError, match="bf16 needs a CUDA GPU"):
        train_grpo("unused", [{"id": "a"}], "math", small_settings(bf16=True), tmp_path / "o", tmp_path / "p")


def test_a_single_process_refuses_a_multi_process_setting(tmp_path):
    with pytest.raises(ValueError, match="num_processes is 2 but 1 process"):
        train_grpo(tmp_path / "no-model-needed", yesno_rows(), "yesno", small_settings(num_processes=2),
                   tmp_path / "out", tmp_path / "progress", log=lambda m: None)
    assert not (tmp_path / "progress").exists()


def test_train_run_launches_several_processes_through_accelerate(tmp_path, monkeypatch):
    """num_processes > 1: the workflow's train stage hands the run to esgrpo.grpo.launch (one process per GPU)."""
    from esgrpo.files import write_json, write_jsonl
    from esgrpo.grpo import launch as grpo_launch
    from esgrpo.workflow.stages.training import train_run

    write_jsonl(tmp_path / "train.jsonl", yesno_rows(8))
    write_json(tmp_path / "info.json", {"verifier": "yesno"})
    calls = []

    def launch(model, rows, verifier, settings, out_dir, progress_dir, live):
        calls.append((model, len(rows), verifier, settings.num_processes, settings.sharding, str(progress_dir),
                      live.run_name, live.logdir))
        return RunSummary(method="grpo", iterations=settings.steps, updates=settings.steps, trainable_parameters=10,
                          distance_from_init=0.5, final_fitness_mean=0.25, best_fitness_mean=0.5, rollouts=16,
                          generated_tokens=40, seconds=1.0, resumed_from=None, settings=settings.to_dict())

    monkeypatch.setattr(grpo_launch, "launch_grpo", launch)
    monkeypatch.setenv("ESGRPO_LIVE", json.dumps({"report_to": ["tensorboard"], "root": "tb"}))  # rules/config.smk
    settings = {**small_settings().to_dict(), "num_processes": 2, "sharding": "fsdp"}
    train_run({"train": str(tmp_path / "train.jsonl"), "info": str(tmp_path / "info.json")},
              {"summary": str(tmp_path / "run" / "summary.json")},
              {"method": "grpo", "settings": settings, "init_model": "m", "progress_dir": str(tmp_path / "p")},
              {"task": "sum_yesno", "run": "grpo-g4-s0", "model": "tiny"}, 1)
    assert calls == [("m", 8, "yesno", 2, "fsdp", str(tmp_path / "p"), "tiny/sum_yesno/grpo-g4-s0",
                      "tb/tiny/sum_yesno/grpo-g4-s0")]  # the live-curve settings reach the launch
    written = read_json(tmp_path / "run" / "summary.json")
    assert written["init_model"] == "m" and written["iterations"] == written["updates"] == settings["steps"]
    assert written["settings"]["num_processes"] == 2 and written["provenance"]["config"]["settings"] == settings


@pytest.mark.slow
def test_two_processes_through_accelerate_on_cpu(model_dir, tmp_path):
    """A real 2-process launch (accelerate -> torchrun, gloo on CPU, DDP): every step still samples the
    step's 16 completions (8 per process), rank 0 alone writes the rows, the model and the summary, its
    distance is the saved model's, and a rerun resumes from the last checkpoint."""
    from transformers import AutoModelForCausalLM

    settings = small_settings(steps=2, save_every=1, num_processes=2)
    summary = launch_grpo(model_dir, yesno_rows(), "yesno", settings, tmp_path / "out", tmp_path / "progress",
                          log=lambda m: None)
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2] and [r["rollouts"] for r in rows] == [16, 32]
    assert summary.rollouts == 32 and summary.resumed_from is None and rows[0]["update_norm"] > 0
    trained = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "model").named_parameters())
    start = dict(AutoModelForCausalLM.from_pretrained(model_dir).named_parameters())
    moved = sum(float((trained[k].detach() - start[k].detach()).double().pow(2).sum()) for k in start) ** 0.5
    assert moved == pytest.approx(summary.distance_from_init, rel=1e-6)
    assert not (tmp_path / "progress" / LOCK_NAME).exists() and (tmp_path / "progress" / "checkpoint-2").is_dir()
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version("5.18"):
        return  # 5.17 loads a multi-process run's optimiser state to args.device, "cpu:0", which torch.load refuses
    again = launch_grpo(model_dir, yesno_rows(), "yesno", settings, tmp_path / "out", tmp_path / "progress",
                        log=lambda m: None)
    assert again.resumed_from == 2 and again.distance_from_init == pytest.approx(summary.distance_from_init)


_CHILD = textwrap.dedent("""
    import json, sys, time
    import torch
    torch.set_num_threads(1)
    import esgrpo.grpo.trainer as grpo
    from esgrpo.grpo.trainer import train_grpo
    from esgrpo.grpo.settings import GRPOSettings

    model_dir, rows_path, out, progress, settings, slow = sys.argv[1:7]
    if slow == "1":  # slow each step so the parent can kill the run between two checkpoints
        make = grpo.make_reward_function
        def slowed(*args, **kwargs):
            fn = make(*args, **kwargs)
            def wrapper(*a, **k):
                time.sleep(0.6)
                return fn(*a, **k)
            wrapper.__name__ = fn.__name__
            return wrapper
        grpo.make_reward_function = slowed
    rows = [json.loads(line) for line in open(rows_path)]
    train_grpo(model_dir, rows, "yesno", GRPOSettings(**json.loads(settings)), out, progress)
""")


def _child(model_dir: Path, rows_path: Path, out: Path, progress: Path, settings: GRPOSettings,
           slow: bool) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SRC))
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(model_dir), str(rows_path), str(out), str(progress),
                             json.dumps(settings.to_dict()), "1" if slow else "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_resume_after_kill_matches_an_uninterrupted_run(model_dir, tmp_path):
    settings = small_settings(steps=6, save_every=2)
    rows = yesno_rows()
    rows_path = tmp_path / "rows.jsonl"
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    quiet = dict(log=lambda m: None)

    # The run to kill, in a child process slowed down so that it dies between two checkpoints.
    out, progress = tmp_path / "out", tmp_path / "progress"
    run = _child(model_dir, rows_path, out, progress, settings, slow=True)
    # The reference: the same run, never interrupted (here, while the child starts up).
    train_grpo(model_dir, rows, "yesno", settings, tmp_path / "ref", tmp_path / "ref_progress", **quiet)
    deadline = time.time() + 240
    while not (progress / "checkpoint-2" / "trainer_state.json").exists():
        assert run.poll() is None, run.stdout.read()
        assert time.time() < deadline, "no checkpoint-2 appeared"
        time.sleep(0.05)
    os.kill(run.pid, signal.SIGKILL)  # in step 3 or 4: its metrics row may be written, its checkpoint not
    run.wait()
    run.stdout.close()
    assert not (out / "model").exists()  # it died before the end (the model is saved last)
    assert read_json(progress / LOCK_NAME)["pid"] == run.pid  # the dead run's lock: stale, taken over below
    killed_at = max(r["iteration"] for r in read_jsonl(progress / "metrics.jsonl"))
    assert 2 <= killed_at < 6

    messages: list[str] = []
    summary = train_grpo(model_dir, rows, "yesno", settings, out, progress, log=messages.append)
    assert any("resuming after step" in m for m in messages), messages
    assert summary.resumed_from in (2, 4) and summary.iterations == 6
    assert not (progress / LOCK_NAME).exists()

    metrics = read_jsonl(out / "metrics.jsonl")
    reference = read_jsonl(tmp_path / "ref" / "metrics.jsonl")
    assert [r["iteration"] for r in metrics] == [1, 2, 3, 4, 5, 6]  # one row per step, none duplicated
    assert [r["rollouts"] for r in metrics] == [r["rollouts"] for r in reference]
    # TRL restores model, optimiser, scheduler and RNG state, and the prompt order is fixed up
    # front, so the replayed steps are the same steps: same rewards, tokens, and weights bit for bit.
    for key in ("fitness_mean", "generated_tokens", "distance_from_init", "update_norm"):
        assert [r[key] for r in metrics] == [r[key] for r in reference], key
    final, expected = weights(out / "model"), weights(tmp_path / "ref" / "model")
    assert final.keys() == expected.keys()
    for name in expected:
        assert torch.equal(final[name], expected[name]), name

    # A finished run rerun with the same settings trains nothing more and keeps its rows ...
    assert train_grpo(model_dir, rows, "yesno", settings, out, progress, **quiet).resumed_from == 6
    assert [r["iteration"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert all(torch.equal(weights(out / "model")[k], v) for k, v in expected.items())
    # ... and other settings in the same folder start afresh instead of resuming another run.
    other = small_settings(steps=2, save_every=2, learning_rate=1e-3)
    messages.clear()
    assert train_grpo(model_dir, rows, "yesno", other, out, progress, log=messages.append).resumed_from is None
    assert any("starting afresh" in m for m in messages), messages
    assert [r["iteration"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]
