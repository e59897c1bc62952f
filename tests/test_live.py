"""Live curves (esgrpo.live): ES and GRPO runs write the same TensorBoard tags, read back with
TensorBoard's own EventAccumulator; a resumed run's curves are an uninterrupted run's; logging changes
no weight and no metrics row."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from esgrpo.files import write_json, write_jsonl
from esgrpo.live import ENV, SHARED, Eta, LiveLog, LiveSettings, format_seconds, live_settings
from tests.grpo.helpers import yesno_rows

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] of every event file in `logdir`, as TensorBoard reads them."""
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def row(method: str, step: int, reward: float, **extra) -> dict:
    return {"method": method, "iteration": step, "fitness_mean": reward, "entropy": 0.5, "update_norm": 0.1,
            "distance_from_init": 0.1 * step, "generated_tokens": 100 * step, "rollouts": 16 * step,
            "seconds": 1.5 * step, "updates": step, "prompts": 4, **extra}


def test_es_and_grpo_rows_give_the_same_tags(tmp_path):
    root = tmp_path / "tensorboard"
    for method, extra in (("es", {"fitness_std": 0.2, "fitness_max": 0.9, "js_diversity": math.nan, "skipped": False}),
                          ("grpo", {"loss": 0.01, "fitness_std": 0.3, "kl": math.nan})):
        settings = LiveSettings(("tensorboard",), str(root / "tiny" / "task" / method), f"tiny/task/{method}")
        with LiveLog(settings, log=lambda m: None) as live:
            for step in (1, 2, 3):
                live.row(row(method, step, 0.1 * step, **extra))
    es, grpo = scalars(root / "tiny" / "task" / "es"), scalars(root / "tiny" / "task" / "grpo")
    assert set(SHARED) <= set(es) and set(SHARED) <= set(grpo)
    assert es["train/reward"] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (3, pytest.approx(0.3))]
    assert grpo["train/reward_by_rollouts"][-1] == (48, pytest.approx(0.3))  # the budget on the step axis
    assert es["train/reward_std"][0] == (1, pytest.approx(0.2)) and grpo["train/reward_std"][0] == (1, pytest.approx(0.3))
    assert "es/fitness_max" in es and "grpo/loss" in grpo and "es/fitness_std" not in es  # shared, not twice
    assert "es/js_diversity" not in es and "grpo/kl" not in grpo  # NaN: not a point
    assert not {"train/iteration", "es/iteration", "es/updates"} & set(es)  # counters, not curves


def test_a_resume_replaces_the_interrupted_runs_points(tmp_path):
    settings = LiveSettings(("tensorboard",), str(tmp_path / "run"), "run")
    with LiveLog(settings, log=lambda m: None) as live:  # the killed run got to step 3
        for step in (1, 2, 3):
            live.row(row("es", step, 1.0))
    with LiveLog(settings, resumed_after=1, log=lambda m: None) as live:  # resumed from the checkpoint at 1
        for step in (2, 3, 4):
            live.row(row("es", step, 2.0))
    assert scalars(tmp_path / "run")["train/reward"] == [(1, 1.0), (2, 2.0), (3, 2.0), (4, 2.0)]
    with LiveLog(settings, log=lambda m: None) as live:  # a fresh start: nothing of the old runs
        live.row(row("es", 1, 3.0))
    assert scalars(tmp_path / "run")["train/reward"] == [(1, 3.0)]


def test_settings_from_the_environment_and_bad_backends():
    env = {ENV: json.dumps({"report_to": ["tensorboard"], "project": "p", "root": "results/tensorboard"})}
    s = live_settings("tiny", "countdown3", "es-n4-s0", {"sigma": 0.01}, env=env)
    assert s.logdir == "results/tensorboard/tiny/countdown3/es-n4-s0" and s.run_name == "tiny/countdown3/es-n4-s0"
    assert s.project == "p" and s.config == {"sigma": 0.01}
    assert live_settings("m", "t", "r", env={}) == LiveSettings()  # outside Snakemake: no live curves
    assert LiveSettings.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="unknown backend"):
        LiveSettings(("mlflow",))


@pytest.mark.parametrize("backend", ["wandb", "trackio"])
def test_a_named_backend_that_is_missing_stops_with_the_fix(backend, tmp_path):
    import importlib.util

    if importlib.util.find_spec(backend) is not None:
        pytest.skip(f"{backend} is installed here")
    with pytest.raises(ImportError, match=f"pip install {backend}.*logging.report_to"):
        LiveLog(LiveSettings((backend,), str(tmp_path)))


def test_eta():
    assert [format_seconds(s) for s in (0, 42.4, 185, 3720)] == ["0s", "42s", "3m05s", "1h02m"]
    eta = Eta(total=10, done=4)
    assert eta(4) == "eta ?"  # nothing done in this process yet
    eta.began -= 6.0  # 6 s for 2 iterations -> 3 s each, 4 left
    assert eta(6) == "eta 12s"


# --------------------------------------------------------------------------- through the training stage


def train(tmp_path: Path, model: Path, method: str, run: str, settings: dict) -> Path:
    """`esgrpo.workflow.stages.training.train_run`, as the train_run rule calls it, on the tiny yes/no task."""
    from esgrpo.workflow.stages.training import train_run

    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", yesno_rows())
    write_json(data / "info.json", {"verifier": "yesno"})
    out = tmp_path / "results" / "tiny" / "yesno" / run
    train_run({"train": str(data / "train.jsonl"), "info": str(data / "info.json")},
              {"summary": str(out / "summary.json")},
              {"method": method, "settings": settings, "init_model": str(model), "labels": {},
               "progress_dir": str(tmp_path / "results" / "progress" / "tiny" / "yesno" / run)},
              {"model": "tiny", "task": "yesno", "run": run}, 1)
    return out


ES = {"population_size": 4, "iterations": 2, "prompts_per_iteration": 4, "max_new_tokens": 8, "sigma": 0.05,
      "alpha": 0.01, "checkpoint_every": 1, "seed": 0}
GRPO = {"num_generations": 4, "prompts_per_step": 4, "steps": 2, "max_new_tokens": 8, "learning_rate": 5e-3,
        "save_every": 1, "seed": 0}


def test_es_and_grpo_stages_write_the_same_tags_and_the_same_results(model_dir, tmp_path, monkeypatch):
    root = tmp_path / "on" / "results" / "tensorboard"
    monkeypatch.setenv(ENV, json.dumps({"report_to": ["tensorboard"], "project": "esgrpo", "root": str(root)}))
    on = {m: train(tmp_path / "on", model_dir, m, run, s) for m, run, s in
          (("es", "es-n4-s0", ES), ("grpo", "grpo-g4-s0", GRPO))}
    curves = {m: scalars(root / "tiny" / "yesno" / run) for m, run in (("es", "es-n4-s0"), ("grpo", "grpo-g4-s0"))}
    for method, tags in curves.items():
        assert set(SHARED) <= set(tags), method
        assert [step for step, _ in tags["train/reward"]] == [1, 2], method
    metrics = {m: [json.loads(line) for line in (on[m] / "metrics.jsonl").read_text().splitlines()] for m in on}
    for method in on:  # the event file holds the metrics rows' numbers
        assert [v for _, v in curves[method]["train/reward"]] == pytest.approx(
            [r["fitness_mean"] for r in metrics[method]], rel=1e-6)
    monkeypatch.setenv(ENV, json.dumps({"report_to": [], "root": str(tmp_path / "off" / "results" / "tensorboard")}))
    off = {m: train(tmp_path / "off", model_dir, m, run, s) for m, run, s in
           (("es", "es-n4-s0", ES), ("grpo", "grpo-g4-s0", GRPO))}
    assert not (tmp_path / "off" / "results" / "tensorboard").exists()
    for method in on:  # logging on or off: the same weights, byte for byte
        assert (on[method] / "model" / "model.safetensors").read_bytes() == \
            (off[method] / "model" / "model.safetensors").read_bytes(), method
