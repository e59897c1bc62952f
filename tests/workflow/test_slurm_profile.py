"""The SLURM profile, checked against a fake SLURM (sbatch records its arguments), and the
workstation GPU slots (esgrpo.workflow.gpu_slots)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from esgrpo.workflow.gpu_slots import SLOTS_ENV, acquire, gpu_slots, parse_slots
from tests.conftest import REPO

PROFILE = REPO / "profiles" / "slurm"
ES_RUN, GRPO_RUN = "es-n32-s0", "grpo-g8-s0"
ACCOUNT = "fake_account"


def profile() -> dict:
    return yaml.safe_load((PROFILE / "config.yaml").read_text())


# --------------------------------------------------------------------------- the profile itself


def test_profile_keys_are_real_flags():
    from snakemake_executor_plugin_slurm import ExecutorSettings

    p = profile()
    assert p["executor"] == "slurm" and p["slurm-requeue"] is True
    for key in ("slurm-requeue", "slurm-status-command", "slurm-delete-logfiles-older-than", "slurm-logdir"):
        assert key.removeprefix("slurm-").replace("-", "_") in ExecutorSettings.__dataclass_fields__, key
    # sacct's "CANCELLED by <uid>" never matches the plugin's failure states (tests/pipeline/test_slurm_real.py)
    assert p["slurm-status-command"] == "squeue"
    assert "set-threads" not in p  # CPUs per job come from the rules and the plan
    assert p["retries"] >= 1 and "cores" not in p  # no cores on a login node
    assert "resources" not in p  # a global gpu limit would throttle the cluster (docs/references.md)
    # Snakemake formats its error message for runtime / mem values with str.format: no braces there.
    for rule, values in p["set-resources"].items():
        for name in ("runtime", "mem_mb"):
            assert "{" not in str(values.get(name, "")), (rule, name)
    # every rule named in the profile exists in the workflow
    text = "\n".join(path.read_text() for path in (REPO / "rules").glob("*.smk"))
    for rule in p["set-resources"]:
        assert f"rule {rule}:" in text, rule


PLANNED_RULES = ("train_run", "eval_base", "eval_run", "analysis_drift", "analysis_cosine", "analysis_sparsity",
                 "analysis_base_samples", "analysis_kl", "analysis_interpolation", "heldout_base", "heldout_run")


def test_profile_keeps_only_site_settings():
    """Sizes come from the resource plan (rules/resources.smk): no job size or model name typed into the
    profile, so a new model is sized from its architecture (or stops the parse), never given a default."""
    p = profile()
    text = (PROFILE / "config.yaml").read_text()
    for rule in PLANNED_RULES:
        assert not {"mem_mb", "runtime", "gpu", "gpu_model"} & set(p["set-resources"].get(rule, {})), rule
    for config in ("paper_a", "paper_b"):
        for model in yaml.safe_load((REPO / "configs" / f"{config}.yaml").read_text())["models"]:
            assert model not in text, model
    assert "wildcards.model" not in text
    # the rules take every size from the plan
    rules = "\n".join(path.read_text() for path in (REPO / "rules").glob("*.smk"))
    for rule in PLANNED_RULES:
        for name in ("mem_mb", "runtime", "gpu", "gpu_model", "cpus_per_gpu"):
            assert f'{name}=planned("{rule}", "{name}"' in rules, (rule, name)
        assert f'threads: planned("{rule}", "threads"' in rules, rule
    # site settings from the environment (an unset account is empty: no -A, rules/lifecycle.smk)
    assert p["default-resources"] == {"slurm_partition": "$ESGRPO_SLURM_PARTITION",
                                      "slurm_account": "$ESGRPO_SLURM_ACCOUNT"}


def planned_resources(config_name: str, rule: str, model: str, task: str, run: str, **settings) -> dict:
    """What the plan gives a job of a shipped config, its defaults filled as the workflow fills them;
    `settings`: PlanSettings overrides (a site's gpu_type)."""
    from snakemake.utils import validate

    from esgrpo.plan import Planner, PlanSettings

    config = yaml.safe_load((REPO / "configs" / f"{config_name}.yaml").read_text())
    validate(config, str(REPO / "schemas" / "config.schema.yaml"))
    return Planner(config, PlanSettings.from_config(config, **settings)).resources(rule, model, task, run)


@pytest.mark.slow
def test_a_dry_run_without_an_account_and_with_the_sites_gpu_type(tmp_path):
    """ESGRPO_SLURM_ACCOUNT unset: the dry run says once that jobs go without -A and when a cluster that
    requires one is asked, and plans no unexpanded $VAR. ESGRPO_SLURM_GPU_TYPE=a100 (a GRES name the plan reads as a100_80): every GPU job asks
    for that GRES and gets the plan's sizes for it, over paper_b.yaml's plan.gpu_type (h200)."""
    env = {k: v for k, v in os.environ.items() if k != "ESGRPO_SLURM_ACCOUNT"} | {"ESGRPO_SLURM_GPU_TYPE": "a100"}
    out = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-n",
                          "--workflow-profile", str(PROFILE), "--directory", str(tmp_path),
                          f"--configfile={REPO / 'configs' / 'paper_b.yaml'}", "paper_b"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    said = [line for line in text.splitlines() if line.startswith("SLURM: ")]
    assert said == ["SLURM: no account (ESGRPO_SLURM_ACCOUNT unset): jobs go without -A, under your default "
                    "account; a cluster that requires one is asked (sbatch --test-only) when the driver starts; "
                    "GPU type a100 (ESGRPO_SLURM_GPU_TYPE)"], said
    assert "$ESGRPO" not in text.replace(said[0], "")
    jobs = re.findall(r"^rule (\w+):\n(?:    .*\n)*?    wildcards: (.*)\n(?:    .*\n)*?    resources: (.*)$", text, re.M)
    parsed = [(rule, dict(w.split("=", 1) for w in wildcards.split(", ")),
               dict(r.split("=", 1) for r in resources.split(", "))) for rule, wildcards, resources in jobs]
    gpu_jobs = [job for job in parsed if int(job[2].get("gpu", 0)) > 0]
    assert len(gpu_jobs) > 30, text[-3000:]
    for _, _, resources in gpu_jobs:
        assert resources["gpu_model"] == "a100" and resources["slurm_account"] == "", resources
    _, wildcards, resources = next(j for j in gpu_jobs if j[0] == "train_run" and j[1]["run"] == GRPO_RUN)
    want = planned_resources("paper_b", "train_run", wildcards["model"], wildcards["task"], GRPO_RUN,
                             gpu_type="a100")
    h200 = planned_resources("paper_b", "train_run", wildcards["model"], wildcards["task"], GRPO_RUN)
    assert (int(resources["gpu"]), int(resources["mem_mb"]), int(resources["runtime"])) == \
        (want["gpu"], want["mem_mb"], want["runtime"])
    assert (want["gpu"], want["runtime"]) != (h200["gpu"], h200["runtime"])  # another GPU: another plan


# --------------------------------------------------------------------------- a fake SLURM

SBATCH = """\
#!{python}
import json, os, sys
log = os.environ["FAKE_SLURM_LOG"]
with open(log, "a") as handle:
    handle.write(json.dumps(sys.argv[1:]) + "\\n")
with open(log) as handle:
    count = sum(1 for _ in handle)
print(f"Submitted batch job {{1000 + count}}")
"""


@pytest.fixture
def fake_slurm(tmp_path):
    """sbatch records its arguments; squeue/sacct/scancel/sinfo answer nothing; scontrol a config."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(SBATCH.format(python=sys.executable))
    for tool in ("squeue", "sacct", "scancel", "sinfo", "sacctmgr", "sshare"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "MinJobAge = 300 sec"\necho "MaxArraySize = 1001"\n')
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return bin_dir, tmp_path / "sbatch.jsonl"


def submit(fake_slurm, workdir: Path, configfile: Path, wanted: int, jobs: int, timeout: float = 240.0):
    """Run the workflow with the SLURM profile until `wanted` jobs were submitted; return {comment: args}."""
    bin_dir, log = fake_slurm
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM_LOG": str(log),
           "ESGRPO_SLURM_ACCOUNT": ACCOUNT}
    env.pop("SLURM_JOB_ID", None)
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--workflow-profile",
           str(PROFILE), "--jobs", str(jobs), "--directory", str(workdir), f"--configfile={configfile}"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and len(log.read_text().splitlines()) >= wanted:
                time.sleep(2)  # let the submission threads finish the ones in flight
                break
            time.sleep(1)
    finally:
        # The executor polls forever for jobs that never run: stop the process group we started.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0].decode(errors="replace")
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    assert len(calls) >= wanted, output[-4000:]
    return {args[args.index("--comment") + 1]: args for args in calls}


def flag(args: list[str], name: str) -> str | None:
    """Value of `--name value`, `--name=value` or the short form in an sbatch call."""
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _fake_task_data(workdir: Path, results_dir: str, tasks: list[str]) -> None:
    """Outputs of prepare_task, so the GPU jobs downstream are ready at once."""
    for task in tasks:
        folder = workdir / results_dir / "data" / task
        folder.mkdir(parents=True)
        for name in ("train.jsonl", "test.jsonl"):
            (folder / name).write_text("")
        (folder / "info.json").write_text(json.dumps({"task": task, "verifier": "math"}))


@pytest.mark.slow
def test_gpu_jobs_of_paper_b_get_gpus_memory_runtime_and_partition(fake_slurm, tmp_path):
    workdir = tmp_path / "wd"
    config = yaml.safe_load((REPO / "configs" / "paper_b.yaml").read_text())
    _fake_task_data(workdir, config["results_dir"], list(config["tasks"]))
    # ready at once: the base evaluations and every run that starts from an unpinned Hub model
    calls = submit(fake_slurm, workdir, REPO / "configs" / "paper_b.yaml", wanted=30, jobs=100)

    def one(rule: str, wildcards: str) -> list[str]:
        matches = [a for c, a in calls.items() if c.startswith(f"rule_{rule}_") and wildcards in c]
        assert matches, (rule, wildcards, sorted(calls))
        return matches[0]

    def sized_by_the_plan(args: list[str], rule: str, model: str, task: str, run: str) -> dict:
        want = planned_resources("paper_b", rule, model, task, run)
        assert flag(args, "-p") == "gpu" and flag(args, "--cpus-per-gpu") == "8" and "--requeue" in args
        assert flag(args, "-A") == ACCOUNT
        assert flag(args, "--gpus") == f"{want['gpu_model']}:{want['gpu']}", (args, want)
        assert flag(args, "--mem") == str(want["mem_mb"]) and flag(args, "-t") == str(want["runtime"])
        return want

    es = sized_by_the_plan(one("train_run", "qwen2_5_7b_gsm8k_es-n32-s0"), "train_run", "qwen2_5_7b", "gsm8k",
                           "es-n32-s0")
    assert es["gpu"] == 4 and es["gpu_model"] == "h200"  # plan.es_gpus engines; configs/paper_b.yaml's plan block
    grpo = sized_by_the_plan(one("train_run", "qwen2_5_7b_gsm8k_grpo-g8-s0"), "train_run", "qwen2_5_7b", "gsm8k",
                             "grpo-g8-s0")
    assert grpo["gpu"] == 2  # 7.6e9 x 16 B/param of training state: sharded over two H200s (FSDP)
    # (Qwen2.5-1.5B's runs wait for its pin_model job, a local rule that reads the Hub: not ready here)
    small = sized_by_the_plan(one("train_run", "llama3_2_3b_gsm8k_gsm8k_grpo-g8-s0"), "train_run",
                              "llama3_2_3b_gsm8k", "gsm8k", "grpo-g8-s0")
    assert small["gpu"] == 1 and small["mem_mb"] < grpo["mem_mb"]
    ev = sized_by_the_plan(one("eval_base", "r1_distill_1_5b"), "eval_base", "r1_distill_1_5b", "base", "base")
    assert ev["gpu"] == 1
    for args in calls.values():  # the plugin never gets both --gres and --gpus, nor a CPU count per task on GPU jobs
        assert not (flag(args, "--gres") and flag(args, "--gpus"))
        if flag(args, "--gpus"):
            assert flag(args, "--cpus-per-task") is None
            # One task per GPU job: the trainer starts its own GPU workers (vLLM engines, Ray actors).
            # Plugin 2.6.x added --ntasks-per-gpu=1 to every GPU job; 2.8.0, pinned in both envs and run
            # here (tests/pipeline/test_envs.py), adds it only when a rule sets tasks_per_gpu.
            assert flag(args, "--ntasks-per-gpu") is None and flag(args, "--ntasks") is None


def test_slurm_time_limits_and_caps():
    from esgrpo.workflow.slurm import _minutes, capped

    assert [_minutes(t) for t in ("infinite", "30", "30:00", "2:00:00", "1-00:00:00", "1-02:03:04")] == \
        [None, 30, 30, 120, 1440, 1564]
    assert capped("mem_mb", 48000, (24105, None)) == 24105 and capped("runtime", 180, (24105, None)) == 180
    assert capped("runtime", 3000, (None, 2880)) == 2880 and capped("gpu", 8, (1, 1)) == 8


# --------------------------------------------------------------------------- GPU slots on a workstation


def test_parse_slots():
    assert parse_slots("0, 1,3") == ["0", "1", "3"]
    assert parse_slots("GPU-1a2b") == ["GPU-1a2b"]
    with pytest.raises(ValueError, match="twice"):
        parse_slots("0,0")
    with pytest.raises(ValueError, match="device id"):
        parse_slots("0;1")


def test_slots_are_exclusive_and_all_or_nothing(tmp_path):
    a = acquire(1, ["0", "1", "2"], tmp_path)
    b = acquire(2, ["0", "1", "2"], tmp_path)
    assert sorted(a.devices + b.devices) == ["0", "1", "2"]
    with pytest.raises(TimeoutError):
        acquire(1, ["0", "1", "2"], tmp_path, timeout=0.2, poll=0.05)
    b.release()
    with pytest.raises(TimeoutError):  # two free, three wanted: waits without keeping a partial grab
        acquire(3, ["0", "1", "2"], tmp_path, timeout=0.2, poll=0.05)
    c = acquire(2, ["0", "1", "2"], tmp_path, timeout=1)
    assert set(c.devices) == {"0", "1", "2"} - set(a.devices)
    with pytest.raises(ValueError, match="offers 3"):
        acquire(4, ["0", "1", "2"], tmp_path)
    a.release()
    c.release()


def test_a_killed_holder_frees_its_slot(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        from esgrpo.workflow.gpu_slots import acquire
        lease = acquire(1, ["7"], {str(tmp_path)!r})
        print("held", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError):
            acquire(1, ["7"], tmp_path, timeout=0.2, poll=0.05)
    finally:
        proc.kill()
        proc.wait()
    acquire(1, ["7"], tmp_path, timeout=5, poll=0.05).release()


def test_gpu_slots_sets_and_restores_cuda_visible_devices(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "old"}
    with gpu_slots(1, env=env, lock_dir=tmp_path) as devices:  # no ESGRPO_GPU_SLOTS: nothing happens
        assert devices is None and env == {"CUDA_VISIBLE_DEVICES": "old"}
    env[SLOTS_ENV] = "2,3"
    with gpu_slots(0, env=env, lock_dir=tmp_path) as devices:  # a CPU job
        assert devices is None and env["CUDA_VISIBLE_DEVICES"] == "old"
    with gpu_slots(2, env=env, lock_dir=tmp_path) as devices:
        assert devices == ["2", "3"] and env["CUDA_VISIBLE_DEVICES"] == "2,3"
        with pytest.raises(TimeoutError):
            with gpu_slots(1, env=dict(env), lock_dir=tmp_path, timeout=0.2, poll=0.05):
                pass
    assert env["CUDA_VISIBLE_DEVICES"] == "old"
    del env["CUDA_VISIBLE_DEVICES"]
    with gpu_slots(1, env=env, lock_dir=tmp_path) as devices:
        assert env["CUDA_VISIBLE_DEVICES"] == devices[0]
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_run_stage_holds_the_jobs_gpu_slots(tmp_path, monkeypatch):
    """The stage entry of every workflow script takes `resources.gpu` slots before the stage runs."""
    from types import SimpleNamespace

    from esgrpo.workflow.bridge import run_stage

    class Named(dict):  # what Snakemake hands a script: items() and attribute access
        def __getattr__(self, key):
            return self[key]

    monkeypatch.setenv(SLOTS_ENV, "5,6")
    monkeypatch.setenv("ESGRPO_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "gpu_stage.py").write_text(
        "import os\nseen = []\n\ndef stage(input, output, params, wildcards, threads):\n"
        "    seen.append(os.environ.get('CUDA_VISIBLE_DEVICES'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import gpu_stage

    for gpu in (2, 0):
        smk = SimpleNamespace(input=Named(), output=Named(), params=Named(), wildcards=Named(), threads=1,
                              log=[str(tmp_path / f"stage{gpu}.log")], resources=Named(gpu=gpu))
        run_stage(smk, "gpu_stage:stage")
    assert gpu_stage.seen == ["5,6", None]
    assert "CUDA_VISIBLE_DEVICES=5,6" in (tmp_path / "stage2.log").read_text()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_jobs_log_keeps_the_lines_of_every_attempt(tmp_path, monkeypatch):
    """Snakemake deletes a job's log before each attempt (a retry, a requeue, the rerun after a dead
    driver); every attempt's lines stay in it, each under a header naming its SLURM job."""
    from types import SimpleNamespace

    from esgrpo.workflow import job_server
    from esgrpo.workflow.bridge import run_stage

    class Named(dict):
        def __getattr__(self, key):
            return self[key]

    monkeypatch.delenv(job_server.SERVER_ENV, raising=False)
    (tmp_path / "talking_stage.py").write_text(
        "def stage(input, output, params, wildcards, threads):\n    print('attempt', params['n'])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    log = tmp_path / "logs" / "train.log"
    for n in (1, 2):
        monkeypatch.setenv("SLURM_JOB_ID", str(4000 + n))
        log.unlink(missing_ok=True)  # what Snakemake does before each attempt
        smk = SimpleNamespace(input=Named(), output=Named(), params=Named(n=n), wildcards=Named(), threads=1,
                              log=[str(log)], resources=Named(gpu=0))
        run_stage(smk, "talking_stage:stage")
    text = log.read_text()
    assert "SLURM job 4001 =====" in text and "SLURM job 4002 =====" in text, text
    assert text.index("SLURM job 4001") < text.index("attempt 1") < text.index("SLURM job 4002") < text.index("attempt 2")


def test_run_stage_leaves_torch_unimported_for_stages_without_it(tmp_path):
    """Table, figure and theory jobs skip torch's import (seconds per job on the default grid); a later
    torch import still gets the job's thread count."""
    code = f"""
import sys
from types import SimpleNamespace
from esgrpo.workflow.bridge import run_stage

class Named(dict):  # Snakemake's namedlists: a missing name is an AttributeError
    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

smk = SimpleNamespace(input=Named(), output=Named(), params=Named(), wildcards=Named(), threads=1,
                      log=[{str(tmp_path / "stage.log")!r}], resources=Named())
run_stage(smk, "no_torch_stage:stage")
"""
    (tmp_path / "no_torch_stage.py").write_text(
        "import sys\n\ndef stage(input, output, params, wildcards, threads):\n"
        "    assert 'torch' not in sys.modules\n    import torch\n    print('threads', torch.get_num_threads())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "ESGRPO_JOB_SERVER")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(tmp_path)])
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "threads 1" in (tmp_path / "stage.log").read_text()


def test_a_driver_record_tells_a_live_driver_from_a_dead_one(tmp_path):
    """esgrpo.workflow.slurm's driver records (what keeps two grids' drivers apart): this process is alive;
    a record of a pid that has ended, or of a pid now another process (another start time), is not; on
    another host, a record is alive while its heartbeat is fresh."""
    import socket

    from esgrpo.workflow import slurm

    path = slurm.register_driver(tmp_path, "run-live", "results/a")
    try:
        ended = subprocess.Popen([sys.executable, "-c", "pass"])
        ended.wait()
        record = json.loads(path.read_text())
        assert record["pid"] == os.getpid() and record["results_dir"] == "results/a"
        records = {"run-ended": {**record, "run_id": "run-ended", "pid": ended.pid},
                   "run-reused": {**record, "run_id": "run-reused", "start_ticks": "1"},
                   "run-away": {**record, "run_id": "run-away", "host": socket.gethostname() + "-other"},
                   "run-stale": {**record, "run_id": "run-stale", "host": socket.gethostname() + "-other"}}
        for run_id, rec in records.items():
            (path.parent / f"{run_id}.json").write_text(json.dumps(rec))
        old = time.time() - slurm.STALE - 1
        os.utime(path.parent / "run-stale.json", (old, old))
        assert set(slurm.live_drivers(tmp_path)) == {"run-live", "run-away"}
    finally:
        slurm.unregister_driver()
    assert not path.exists() and set(slurm.live_drivers(tmp_path)) == {"run-away"}
