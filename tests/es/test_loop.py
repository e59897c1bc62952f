"""Tests of the seeds-only ES trainer (esgrpo.es.loop) over its transformers backend (esgrpo.es.hf_backend), on tiny
random Llamas and synthetic fitness: the update, checkpoints and resume, and the update norms theory predicts.

The synthetic evaluators compute fitness from the member weights they are handed (a real
objective, not a stand-in for ES logic), so the tests see exactly what ES does to theta.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from esgrpo.es.backend import FitnessResult
from esgrpo.es.hf_backend import HFESBackend, theta_from_model, trainable_names
from esgrpo.es.loop import snapshot_dir
from esgrpo.es.ops import (
    member_seeds,
)
from esgrpo.es.settings import ESConfig
from esgrpo.files import read_jsonl
from esgrpo.noise import tensor_noise
from esgrpo.progress import LOCK_NAME, ProgressFolder
from tests.conftest import REPO
from tests.es.helpers import ROWS, quadratic_evaluator, random_evaluator, run_es, saved_weights, tiny_llama

torch.set_num_threads(1)


# --------------------------------------------------------------------------- population and update


def test_sequential_evaluator_that_loads_members_leaves_model_restored(tmp_path):
    model = tiny_llama()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())

    def load_members_then_tie(population, rows, cfg, generator=None):
        count = 0
        for member in population:  # a sequential evaluator writes each member into the model
            with torch.no_grad():
                for k, v in member.items():
                    params[k].copy_(v)
            count += 1
        return FitnessResult(fitness=np.ones(count))  # all equal: no update may happen

    cfg = ESConfig(population_size=4, sigma=0.05, iterations=2, checkpoint_every=0)
    summary = run_es(model, None, ROWS, cfg, load_members_then_tie, tmp_path / "out", tmp_path / "prog",
                       log=lambda s: None, population="sequential")
    assert summary["updates"] == 0 and summary["skipped"] == 2
    for k, v in model.state_dict().items():
        assert torch.equal(v, init[k]), k
    saved = saved_weights(tmp_path / "out")
    for k, v in saved.items():
        assert torch.equal(v, init[k]), k


@pytest.mark.parametrize("antithetic, normalization, unit_rms", [
    (False, "zscore", False), (True, "zscore", False), (False, "rank", False), (False, "rank", True),
    (False, "none", True)])
def test_update_matches_closed_form(tmp_path, antithetic, normalization, unit_rms):
    model = tiny_llama(layers=2)
    names = trainable_names(model, ["*"])
    theta0 = {k: v.double() for k, v in theta_from_model(model, names).items()}
    target = {k: v.float() + 0.05 for k, v in theta0.items()}
    seen: list[np.ndarray] = []
    cfg = ESConfig(population_size=6, sigma=0.02, alpha=0.01, iterations=1, antithetic=antithetic,
                   normalization=normalization, unit_rms_weights=unit_rms, seed=11)
    summary = run_es(model, None, ROWS, cfg, quadratic_evaluator(target, seen), tmp_path / "o", tmp_path / "p",
                       log=lambda s: None)
    # independently: w from the recorded fitness, then theta0 + alpha/N sum_n w_n sign_n eps_n in float64
    f = seen[0]
    if normalization == "zscore":
        w = (f - f.mean()) / (np.sqrt(((f - f.mean()) ** 2).mean()) + 1e-8)
    elif normalization == "rank":
        w = (np.argsort(np.argsort(f)) / (len(f) - 1)) - 0.5  # no ties in continuous fitness
    else:
        w = f.copy()
    if unit_rms and normalization != "zscore":
        w = w / np.sqrt((w ** 2).mean())  # sum w^2 = N
    step_sq = 0.0
    final = saved_weights(tmp_path / "o")
    for name in names:
        acc = torch.zeros_like(theta0[name])
        for (seed, sign), wn in zip(member_seeds(11, 0, 6, antithetic), w, strict=True):
            acc += float(wn) * sign * tensor_noise(seed, name, theta0[name].shape).double()
        step = cfg.alpha / cfg.population_size * acc
        step_sq += float(step.pow(2).sum())
        torch.testing.assert_close(final[name].double(), theta0[name] + step, rtol=0, atol=2e-7)
    row = read_jsonl(tmp_path / "o" / "metrics.jsonl")[0]
    assert row["update_norm"] == pytest.approx(math.sqrt(step_sq), rel=1e-5)
    assert row["distance_from_init"] == pytest.approx(math.sqrt(step_sq), rel=1e-4)
    assert summary["updates"] == 1 and not row["skipped"]


def test_all_equal_fitness_skips_and_logs(tmp_path):
    model = tiny_llama()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    messages: list[str] = []
    cfg = ESConfig(population_size=4, sigma=0.05, iterations=3, checkpoint_every=1)
    summary = run_es(model, None, ROWS, cfg,
                       lambda pop, rows, cfg, generator=None: FitnessResult(fitness=np.full(4, 0.25)),
                       tmp_path / "o", tmp_path / "p", log=messages.append)
    rows = read_jsonl(tmp_path / "o" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert all(r["skipped"] and r["update_norm"] == 0 and r["distance_from_init"] == 0 for r in rows)
    assert summary["skipped"] == 3 and summary["updates"] == 0
    assert sum("SKIPPED" in m for m in messages) == 3
    for k, v in saved_weights(tmp_path / "o").items():
        assert torch.equal(v, init[k])


def test_zero_iterations_saves_the_starting_model(tmp_path):
    model = tiny_llama()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    summary = run_es(model, None, ROWS, ESConfig(iterations=0, population_size=4), random_evaluator,
                       tmp_path / "o", tmp_path / "p", log=lambda s: None)
    assert summary["updates"] == 0 and read_jsonl(tmp_path / "o" / "metrics.jsonl") == []
    assert all(torch.equal(v, init[k]) for k, v in saved_weights(tmp_path / "o").items())


def test_bf16_model_keeps_small_updates_in_fp32_master(tmp_path):
    model = tiny_llama(hidden=32).to(torch.bfloat16)
    names = trainable_names(model, ["*"])
    theta0 = theta_from_model(model, names)
    cfg = ESConfig(population_size=4, sigma=1e-2, alpha=1e-5, iterations=3, checkpoint_every=1)
    summary = run_es(model, None, ROWS, cfg, random_evaluator, tmp_path / "o", tmp_path / "p",
                       log=lambda s: None)
    # steps of ~1e-5 per coordinate are far below bf16 resolution, yet the master moved as theory says
    d = sum(v.numel() for v in theta0.values())
    assert summary["distance_from_init"] == pytest.approx(1e-5 * math.sqrt(3 * d / 4), rel=0.05)
    theta = load_file(str(tmp_path / "p" / "step-00000003" / "theta.safetensors"))
    assert all(v.dtype == torch.float32 for v in theta.values())
    saved = saved_weights(tmp_path / "o")
    for name in names:
        assert saved[name].dtype == torch.bfloat16 and torch.equal(saved[name], theta[name].to(torch.bfloat16))


def test_a_bf16_model_takes_its_master_from_the_fp32_checkpoint(tmp_path):
    """A stage starting from an fp32 export with the model loaded in bf16: master_from gives theta0 the
    saved fp32 tensors bit for bit (the bf16 model's would be rounded), and the model runs theta cast."""
    from transformers import AutoModelForCausalLM

    start = tiny_llama(hidden=32)
    with torch.no_grad():
        for p in start.parameters():
            p.add_(torch.randn_like(p) * 1e-4)  # bits below bf16's resolution, as an ES update leaves them
    start.save_pretrained(tmp_path / "stage1")
    saved = {k: v.detach().clone() for k, v in start.named_parameters()}
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "stage1", dtype=torch.bfloat16)
    cfg = ESConfig(population_size=4, sigma=1e-2, alpha=1e-5, iterations=0)
    backend = HFESBackend(model, None, random_evaluator, master_from=str(tmp_path / "stage1"))
    backend.start(cfg)
    assert set(backend.theta0) == set(saved) and all(torch.equal(backend.theta0[n], saved[n]) for n in saved)
    assert all(torch.equal(p, saved[n].to(torch.bfloat16)) for n, p in model.named_parameters())
    rounded = HFESBackend(model, None, random_evaluator)
    rounded.start(cfg)
    assert not all(torch.equal(rounded.theta0[n], saved[n]) for n in saved)  # what the model alone gives


# --------------------------------------------------------------------------- checkpoints and resume


def _kill_resume_job(out_dir: str, progress_dir: str, iterations: int, sleep_s: float, noise: str = "full") -> dict:
    """The run the kill test repeats: the same model, data and evaluator in every process."""
    torch.set_num_threads(1)
    model = tiny_llama(layers=2, seed=3)
    target = {k: v.detach().float() + 0.1 for k, v in model.named_parameters()}
    quadratic = quadratic_evaluator(target)

    def slow(population, rows, cfg, generator=None):
        time.sleep(sleep_s)  # leaves the killer time to strike between checkpoints
        result = quadratic(population, rows, cfg)
        noise = torch.rand(len(result.fitness), generator=generator, dtype=torch.float64).numpy()
        return FitnessResult(fitness=result.fitness + noise, generated_tokens=result.generated_tokens)

    cfg = ESConfig(population_size=6, sigma=0.02, alpha=0.01, iterations=iterations, checkpoint_every=2,
                   prompts_per_iteration=3, resample_prompts=True, seed=5, noise=noise, rank=2)
    return run_es(model, None, ROWS, cfg, slow, out_dir, progress_dir, log=lambda s: None)


@pytest.mark.parametrize("noise", ["full", "lowrank"])
def test_sigkill_then_resume_gives_identical_weights(tmp_path, noise):
    # the uninterrupted reference, in this process
    _kill_resume_job(str(tmp_path / "ref"), str(tmp_path / "ref_prog"), 6, 0.0, noise)
    out, prog = tmp_path / "run", tmp_path / "run_prog"
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.es.test_loop import _kill_resume_job; "
            f"_kill_resume_job({str(out)!r}, {str(prog)!r}, 6, 0.4, {noise!r})")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    deadline, appended = time.time() + 120, 0
    while time.time() < deadline and child.poll() is None:
        # struck while the newest checkpoint is at 2 and metrics.jsonl has a row past it (appended every
        # iteration; a file written only at checkpoints would hold 2 rows until the checkpoint at 4)
        steps = [int(p.name.split("-")[1]) for p in prog.glob("step-*")]
        if steps and max(steps) == 2 and (out / "metrics.jsonl").exists():
            appended = len(read_jsonl(out / "metrics.jsonl"))
            if appended >= 3:
                os.kill(child.pid, signal.SIGKILL)
                break
        time.sleep(0.01)
    child.wait()
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    assert not (out / "model").exists()  # it really died before the end (the model is exported last)
    killed_rows = read_jsonl(out / "metrics.jsonl")
    assert 3 <= len(killed_rows) < 6  # rows past the last checkpoint were on disk
    assert json.loads((prog / LOCK_NAME).read_text())["pid"] == child.pid  # its lock outlived it ...
    summary = _kill_resume_job(str(out), str(prog), 6, 0.0, noise)
    assert summary["resumed_from"] in (2, 4)
    assert summary["settings"]["noise"] == noise
    assert not (prog / LOCK_NAME).exists()  # ... was taken over (a dead pid on this host) and given back
    ref, got = saved_weights(tmp_path / "ref"), saved_weights(out)
    assert ref.keys() == got.keys()
    for k in ref:
        assert torch.equal(ref[k], got[k]), k
    rows, ref_rows = read_jsonl(out / "metrics.jsonl"), read_jsonl(tmp_path / "ref" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]  # cut back to the checkpoint, then appended
    for a, b in zip(rows, ref_rows, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], float) and k != "seconds":  # to the last bit, norms included (NaN is NaN)
                assert a[k] == pytest.approx(b[k], rel=0, abs=0, nan_ok=True), k
            elif k != "seconds":
                assert a[k] == b[k], k


def test_a_second_trainer_on_a_held_progress_folder_stops_and_names_the_holder(tmp_path):
    """Two writers would interleave checkpoints: a trainer (here a subprocess) refuses a folder another
    process holds, with the folder and the holder in its message, and writes nothing."""
    out, prog = tmp_path / "out", tmp_path / "prog"
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.es.test_loop import _kill_resume_job; "
            f"_kill_resume_job({str(out)!r}, {str(prog)!r}, 2, 0.0)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    with ProgressFolder(prog, "step-"):  # this process writes the folder
        second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode != 0
    message = second.stderr.strip().splitlines()[-1]
    assert message.startswith("esgrpo.progress.ProgressFolderLocked"), second.stderr[-2000:]
    assert str(prog) in message and f"pid {os.getpid()} on host" in message
    assert not list(prog.glob("step-*")) and not (out / "model").exists()
    # the holder gave it back: now a trainer runs
    assert _kill_resume_job(str(out), str(prog), 2, 0.0)["resumed_from"] is None
    assert not (prog / LOCK_NAME).exists()


def test_checkpoint_schedule_and_extending_a_finished_run(tmp_path):
    target = {k: v.detach().float() + 0.1 for k, v in tiny_llama(seed=1).named_parameters()}
    evaluate = quadratic_evaluator(target)
    base = {"population_size": 4, "sigma": 0.02, "alpha": 0.01, "checkpoint_every": 2, "seed": 2}
    run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=5, **base), evaluate,
             tmp_path / "five", tmp_path / "five_p", log=lambda s: None)
    assert [p.name for p in (tmp_path / "five_p").glob("step-*")] == ["step-00000005"]  # only the newest
    assert (tmp_path / "five_p" / "run.json").exists()  # whose checkpoints these are
    assert not list((tmp_path / "five_p").glob(".tmp-*"))
    assert not (tmp_path / "five_p" / LOCK_NAME).exists()  # the writer lock goes with the run
    # a run of 3 iterations extended to 5 (same progress folder) equals a run of 5
    run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=3, **base), evaluate,
             tmp_path / "ext", tmp_path / "ext_p", log=lambda s: None)
    messages: list[str] = []
    summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=5, **base), evaluate,
                       tmp_path / "ext", tmp_path / "ext_p", log=messages.append)
    assert summary["resumed_from"] == 3 and any("resuming" in m for m in messages)
    five, ext = saved_weights(tmp_path / "five"), saved_weights(tmp_path / "ext")
    assert all(torch.equal(five[k], ext[k]) for k in five)
    assert [r["iteration"] for r in read_jsonl(tmp_path / "ext" / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    # other settings with the same progress folder: not resumed, started afresh
    messages.clear()
    summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=2, **{**base, "sigma": 0.03}), evaluate,
                       tmp_path / "ext", tmp_path / "ext_p", log=messages.append)
    assert summary["resumed_from"] is None and any("afresh" in m for m in messages)
    assert [r["iteration"] for r in read_jsonl(tmp_path / "ext" / "metrics.jsonl")] == [1, 2]


def test_snapshots_are_the_shorter_runs_and_survive_a_resume(tmp_path):
    """A 5-iteration run with snapshots at 2 and 3 exports exactly the 2- and 3-iteration runs' models, and a
    run resumed past a snapshot (killed after 3, extended to 5) still has it."""
    target = {k: v.detach().float() + 0.1 for k, v in tiny_llama(seed=1).named_parameters()}
    evaluate = quadratic_evaluator(target)
    base = {"population_size": 4, "sigma": 0.02, "alpha": 0.01, "checkpoint_every": 1, "seed": 4}
    summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=5, snapshots=[3, 2], **base), evaluate,
                       tmp_path / "long", tmp_path / "long_p", log=lambda s: None)
    assert summary["settings"]["snapshots"] == [2, 3]
    for k in (2, 3):
        short_summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=k, **base), evaluate,
                               tmp_path / f"short{k}", tmp_path / f"short{k}_p", log=lambda s: None)
        snap = load_file(str(snapshot_dir(tmp_path / "long", k) / "model" / "model.safetensors"))
        short = saved_weights(tmp_path / f"short{k}")
        assert snap.keys() == short.keys() and all(torch.equal(snap[n], short[n]) for n in snap)
        record = json.loads((snapshot_dir(tmp_path / "long", k) / "snapshot.json").read_text())
        assert record["iteration"] == k
        for key in ("updates", "distance_from_init", "theory_distance", "rollouts", "trainable_parameters"):
            assert record[key] == pytest.approx(short_summary[key], rel=1e-12), key
    # snapshots are not part of the resume fingerprint: adding one does not restart a run
    run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=3, snapshots=[2], **base), evaluate,
             tmp_path / "ext", tmp_path / "ext_p", log=lambda s: None)
    summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=5, snapshots=[2, 4], **base), evaluate,
                       tmp_path / "ext", tmp_path / "ext_p", log=lambda s: None)
    assert summary["resumed_from"] == 3
    assert sorted(p.name for p in (tmp_path / "ext" / "snapshots").iterdir()) == ["it2", "it4"]
    ext4 = load_file(str(snapshot_dir(tmp_path / "ext", 4) / "model" / "model.safetensors"))
    ext5, long5 = saved_weights(tmp_path / "ext"), saved_weights(tmp_path / "long")
    assert all(torch.equal(ext5[n], long5[n]) for n in long5)  # the resumed run ends where the long one did
    assert not all(torch.equal(ext4[n], long5[n]) for n in long5)  # and its snapshot is an earlier model


def test_a_snapshot_before_the_checkpoint_that_was_never_exported_forces_a_fresh_start(tmp_path):
    """es.snapshots gained K after the run checkpointed past K: resuming would never export K."""
    target = {k: v.detach().float() + 0.1 for k, v in tiny_llama(seed=1).named_parameters()}
    evaluate = quadratic_evaluator(target)
    base = {"population_size": 4, "sigma": 0.02, "alpha": 0.01, "checkpoint_every": 1, "seed": 4}
    (tmp_path / "run" / "snapshots" / "it9").mkdir(parents=True)  # debris of another run: cleared
    run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=3, **base), evaluate,
             tmp_path / "run", tmp_path / "run_p", log=lambda s: None)
    assert not (tmp_path / "run" / "snapshots").exists()
    messages: list[str] = []
    summary = run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=4, snapshots=[2], **base), evaluate,
                       tmp_path / "run", tmp_path / "run_p", log=messages.append)
    assert summary["resumed_from"] is None and any("never exported" in m for m in messages)
    run_es(tiny_llama(seed=1), None, ROWS, ESConfig(iterations=2, **base), evaluate,
             tmp_path / "two", tmp_path / "two_p", log=lambda s: None)
    snap = load_file(str(snapshot_dir(tmp_path / "run", 2) / "model" / "model.safetensors"))
    assert all(torch.equal(snap[k], v) for k, v in saved_weights(tmp_path / "two").items())


@pytest.mark.parametrize("snapshots", [[0], [5], [2.5], "3"])
def test_snapshots_must_lie_inside_the_run(snapshots):
    with pytest.raises(ValueError, match="snapshots"):
        ESConfig(iterations=5, snapshots=snapshots)


# --------------------------------------------------------------------------- ES behaves as theory says


def test_update_norm_follows_alpha_sqrt_t_d_over_n(tmp_path):
    model = tiny_llama(hidden=32, layers=2)
    d = sum(p.numel() for p in model.parameters())
    assert d > 20_000
    cfg = ESConfig(population_size=8, sigma=1e-3, alpha=1e-3, iterations=20, checkpoint_every=0, seed=4)
    summary = run_es(model, None, ROWS, cfg, random_evaluator, tmp_path / "o", tmp_path / "p",
                       log=lambda s: None)
    rows = read_jsonl(tmp_path / "o" / "metrics.jsonl")
    assert summary["updates"] == 20
    for r in rows:  # each step ~ alpha sqrt(d/N); the walk ~ alpha sqrt(t d/N)
        assert r["update_norm"] == pytest.approx(1e-3 * math.sqrt(d / 8), rel=0.05)
        assert r["distance_from_init"] == pytest.approx(1e-3 * math.sqrt(r["iteration"] * d / 8), rel=0.05)
    assert rows[-1]["distance_from_init"] == pytest.approx(summary["theory_distance"], rel=0.03)


@pytest.mark.parametrize("rank", [1, 4])
def test_lowrank_update_norm_follows_alpha_sqrt_t_d_over_n(tmp_path, rank):
    """E||A B^T / sqrt(r)||^2 = m n: the low-rank walk has the full-rank norm theory, over several runs."""
    model = tiny_llama(hidden=32, layers=2)
    d = sum(p.numel() for p in model.parameters())
    ratios = []
    for seed in range(3):
        cfg = ESConfig(population_size=8, sigma=1e-3, alpha=1e-3, iterations=20, checkpoint_every=0, seed=seed,
                       noise="lowrank", rank=rank)
        summary = run_es(model, None, ROWS, cfg, random_evaluator, tmp_path / f"o{seed}", tmp_path / f"p{seed}",
                         log=lambda s: None)
        assert summary["updates"] == 20
        ratios.append(summary["distance_from_init"] / summary["theory_distance"])
    assert all(abs(r - 1) < 0.05 for r in ratios), ratios
    assert summary["theory_distance"] == pytest.approx(1e-3 * math.sqrt(20 * d / 8))


def test_es_improves_a_quadratic_objective_on_chosen_tensors_only(tmp_path):
    model = tiny_llama()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = trainable_names(model, ["*norm*"])
    assert len(names) == 3
    gen = torch.Generator().manual_seed(0)
    target = {n: init[n] + 0.25 * torch.randn(init[n].shape, generator=gen) / math.sqrt(48) * 4 for n in names}
    distance = lambda w: math.sqrt(sum(float((w[n] - target[n]).pow(2).sum()) for n in names))  # noqa: E731
    start = distance(init)
    cfg = ESConfig(population_size=16, sigma=0.02, alpha=0.02, iterations=40, trainable=["*norm*"],
                   checkpoint_every=0, seed=1)
    run_es(model, None, ROWS, cfg, quadratic_evaluator(target), tmp_path / "o", tmp_path / "p",
             log=lambda s: None)
    final = saved_weights(tmp_path / "o")
    assert distance(final) < 0.5 * start
    rows = read_jsonl(tmp_path / "o" / "metrics.jsonl")
    assert np.mean([r["fitness_mean"] for r in rows[-5:]]) > np.mean([r["fitness_mean"] for r in rows[:5]])
    for k, v in init.items():  # tensors outside `trainable` are untouched
        if k not in names:
            assert torch.equal(final[k], v), k
