"""profiles/slurm on a real Slurm (scripts/slurm_local.sh runs a one-node one on localhost; CI starts it in
.ci/run): a small grid through sbatch to completion with each job's memory, time limit and CPUs checked on
the Slurm side; kill -9 of the driver during training, then the documented recovery (docs/cluster.md, "When
the driver dies") to the weights of an uninterrupted local run; scancel of a training job, retried and
resumed from its checkpoint; a second driver refused while the first one or its jobs run; a retry's
memory within what the node holds.

Skips without `sbatch` or an answering controller; fails instead where ESGRPO_REQUIRE_SLURM=1 (CI).
Each Slurm job starts its own Python (no job server) and the plugin polls every few seconds, so a job
of a few seconds' work costs 15-40 s here: the grid is tests/data/slurm_local.yaml, one task, one model.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from esgrpo.files import read_jsonl
from tests.conftest import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PROFILE = REPO / "profiles" / "slurm"
CONFIG = REPO / "tests" / "data" / "slurm_local.yaml"
GRID_RUN, KILL_RUN, CANCEL_RUN = "es-n4-s0", "es-n8-s1", "es-n8-s2"
ITERATIONS = 40  # tests/data/slurm_local.yaml
GRID = "results/slurm_local"  # its results_dir
LOCAL_CLUSTER = "esgrpo"  # scripts/slurm_local.sh's ClusterName


def model_dir(workdir: Path, run: str) -> Path:
    return workdir / GRID / "tiny" / "sum_yesno" / run / "model"


def slurm_missing() -> str | None:
    """Why no real Slurm can be used here, or None."""
    if not shutil.which("sbatch"):
        return "no sbatch on PATH"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"scontrol ping: {err}"
    if "UP" not in ping.stdout:
        return f"no Slurm controller answers (scontrol ping: {(ping.stdout + ping.stderr).strip()})"
    # These tests submit jobs, suspend one (root) and expect partitions cpu and gpu: only on the cluster
    # scripts/slurm_local.sh sets up, never on a site's cluster a login node happens to see.
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    name = re.search(r"^ClusterName\s*=\s*(\S+)", config, re.M)
    if not name or name.group(1) != LOCAL_CLUSTER:
        return f"the Slurm controller is cluster {name and name.group(1)}, not scripts/slurm_local.sh's {LOCAL_CLUSTER}"
    return None


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    """The environment of a driver: this user's default account unless ESGRPO_SLURM_ACCOUNT names one."""
    missing = slurm_missing()
    if missing and os.environ.get("ESGRPO_REQUIRE_SLURM") == "1":
        pytest.fail(f"{missing}, and ESGRPO_REQUIRE_SLURM=1 (scripts/slurm_local.sh start runs one)")
    if missing:
        pytest.skip(f"{missing} (scripts/slurm_local.sh start runs one on localhost)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    if not env.get("ESGRPO_SLURM_ACCOUNT"):
        out = subprocess.run(["sacctmgr", "-n", "-P", "show", "user", getpass.getuser(), "format=defaultaccount"],
                             capture_output=True, text=True, timeout=60)
        env["ESGRPO_SLURM_ACCOUNT"] = out.stdout.strip()
        assert env["ESGRPO_SLURM_ACCOUNT"], f"no default SLURM account for {getpass.getuser()}: {out.stderr}"
    return env


class Driver:
    """One `snakemake --workflow-profile profiles/slurm` process in `workdir`, its output in a log file."""

    def __init__(self, workdir: Path, env: dict[str, str], targets: list[str], name: str, *extra: str,
                 config: Path = CONFIG):
        self.log_path = workdir / f"{name}.out"
        workdir.mkdir(parents=True, exist_ok=True)
        # The plugin's first status check after 2 s instead of 40 (it then polls 10 s slower each time no
        # job finished, up to 180 s); squeue stays the status command (MinJobAge 300 >= 3 x 2 s).
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--workflow-profile",
               str(PROFILE), "--directory", str(workdir), f"--configfile={config}",
               "--slurm-init-seconds-before-status-checks", "2", *extra, *targets]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"driver still running after {timeout:.0f} s:\n{self.tail()}")

    @property
    def output(self) -> str:
        return self.log_path.read_text()

    def tail(self, chars: int = 6000) -> str:
        return self.output[-chars:]

    def submitted(self) -> dict[str, dict]:
        """SLURM job ID -> the rule, threads and resources Snakemake printed for the job it submitted as it."""
        blocks, current = {}, {}
        for line in self.output.splitlines():
            if m := re.match(r"(?:local)?rule (\w+):$", line):
                current = {"rule": m.group(1), "threads": 1}
            elif m := re.match(r"\s+jobid: (\d+)$", line):
                blocks[m.group(1)] = current
            elif m := re.match(r"\s+threads: (\d+)$", line):
                current["threads"] = int(m.group(1))
            elif m := re.match(r"\s+resources: (.*)$", line):
                current["resources"] = dict(item.split("=", 1) for item in m.group(1).split(", "))
        return {m.group(2): blocks[m.group(1)]
                for m in re.finditer(r"^Job (\d+) has been submitted with SLURM jobid (\d+)", self.output, re.M)}


def sacct(job_ids: list[str]) -> dict[str, dict[str, str]]:
    fields = ["JobID", "State", "ReqMem", "Timelimit", "ReqCPUS", "Partition", "Account", "Comment"]
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), f"--format={','.join(fields)}"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return {row["JobID"]: row for row in (dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines())}


def squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or "gone"


def minutes(limit: str) -> int:
    days, _, clock = limit.rpartition("-")
    h, m, s = (int(p) for p in clock.split(":"))
    return int(days or 0) * 1440 + h * 60 + m + (s > 0)


def wait_for_checkpoint(workdir: Path, run: str, driver: Driver, step: int = 2, timeout: float = 240) -> None:
    """Until the run's progress folder holds a checkpoint at `step` or later (training runs under Slurm)."""
    progress = workdir / GRID / "progress" / "tiny" / "sum_yesno" / run
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [int(p.name.split("-")[1]) for p in progress.glob("step-*")] if progress.exists() else []
        if steps and max(steps) >= step:
            return
        assert driver.proc.poll() is None, f"driver ended before training reached step {step}:\n{driver.tail()}"
        time.sleep(0.2)
    pytest.fail(f"no checkpoint at step {step} in {progress} after {timeout:.0f} s:\n{driver.tail()}")


def training_job(driver: Driver) -> str:
    ids = [job for job, what in driver.submitted().items() if what["rule"] == "train_run"]
    assert ids, driver.tail()
    return ids[-1]


def same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    different = [name for name in wa if not (wa[name].dtype == wb[name].dtype and wa[name].equal(wb[name]))]
    assert not different, different


def same_metrics(a: Path, b: Path) -> None:
    """metrics.jsonl beside two models: equal row for row to the last bit, but for the wall time."""
    rows_a, rows_b = (read_jsonl(m.parent / "metrics.jsonl") for m in (a, b))
    assert len(rows_a) == len(rows_b) == ITERATIONS
    for x, y in zip(rows_a, rows_b, strict=True):
        x.pop("seconds"), y.pop("seconds")
        assert json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)  # repr: every bit; NaN == NaN


def attempts_in_log(workdir: Path, run: str) -> str:
    return (workdir / GRID / "logs" / "tiny" / "sum_yesno" / run / "train.log").read_text()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("slurm_real")


def test_grid_runs_to_completion_with_each_jobs_sizes_on_slurm(slurm_env, workdir):
    targets = [str(model_dir(Path("."), GRID_RUN)), f"{GRID}/tiny/base/eval.json"]
    driver = Driver(workdir, slurm_env, targets, "grid")
    assert driver.wait(480) == 0, driver.tail()
    jobs = driver.submitted()
    assert sorted(j["rule"] for j in jobs.values()) == ["build_default_model", "eval_base", "prepare_task",
                                                          "train_run"], driver.tail()
    accounting = sacct(list(jobs))
    for job_id, job in jobs.items():
        slurm, res = accounting[job_id], job["resources"]
        assert slurm["State"] == "COMPLETED", slurm
        assert slurm["ReqMem"] == f"{res['mem_mb']}M", (job, slurm)
        assert minutes(slurm["Timelimit"]) == int(res["runtime"]), (job, slurm)
        # A CPU job asks for the one core its one torch thread uses (set-threads 8 once kept such jobs
        # PENDING (PartitionConfig) for ever on a 2-core node).
        assert int(slurm["ReqCPUS"]) == job["threads"] == 1, (job, slurm)
        assert slurm["Partition"] == res["slurm_partition"] == ("gpu" if job["rule"] in ("train_run", "eval_base")
                                                                else "cpu")
        assert slurm["Account"] == slurm_env["ESGRPO_SLURM_ACCOUNT"]
        assert slurm["Comment"].startswith(f"rule_{job['rule']}_")
    assert (model_dir(workdir, GRID_RUN) / "model.safetensors").exists()


class Reference:
    """The kill and cancel runs trained uninterrupted by a local driver (one core, beside the Slurm jobs),
    from a copy of the grid's data and base model."""

    def __init__(self, workdir: Path, ref: Path):
        self.workdir = ref
        for part in (f"{GRID}/data", f"{GRID}/tiny/base", ".snakemake/metadata"):
            shutil.copytree(workdir / part, ref / part)
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", "1",
               "--directory", str(ref), f"--configfile={CONFIG}",
               *[str(model_dir(Path("."), run)) for run in (KILL_RUN, CANCEL_RUN)]]
        self.log_path = ref.parent / "reference.out"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=ref, stdout=log, stderr=subprocess.STDOUT)

    def model(self, run: str) -> Path:
        assert self.proc.wait(600) == 0, self.log_path.read_text()[-4000:]
        return model_dir(self.workdir, run)


@pytest.fixture(scope="module")
def reference(workdir, tmp_path_factory) -> Reference:
    return Reference(workdir, tmp_path_factory.mktemp("slurm_reference") / "wd")


def test_kill9_of_the_driver_then_the_documented_recovery(slurm_env, workdir, reference):
    target = [str(model_dir(Path("."), KILL_RUN))]
    first = Driver(workdir, slurm_env, target, "kill_first")
    wait_for_checkpoint(workdir, KILL_RUN, first)
    job = training_job(first)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    assert squeue_state(job) == "RUNNING"  # the job outlives its driver
    # Frozen where it is (SIGSTOP through slurmd), so that the checks below cannot race its end.
    subprocess.run(["scontrol", "suspend", job], check=True, timeout=60)

    # Snakemake's lock, left by the killed driver, refuses the next driver ("Directory cannot be locked",
    # test_scancel_... sees it); after `--unlock`, which its message suggests, the check for an earlier
    # driver's jobs refuses it, naming the job and the recovery, before it submits anything.
    assert Driver(workdir, slurm_env, target, "kill_unlock", "--unlock").wait(180) == 0
    second = Driver(workdir, slurm_env, target, "kill_second")
    assert second.wait(180) != 0
    assert "still queued or running" in second.output and f"{job} SUSPENDED" in second.output, second.tail()
    assert "esgrpo.workflow.slurm cancel" in second.output
    assert not second.submitted(), second.tail()
    assert squeue_state(job) == "SUSPENDED", "the refused driver left the old job alone"

    # docs/cluster.md: cancel the dead driver's jobs, unlock, start again.
    cancel = subprocess.run([sys.executable, "-m", "esgrpo.workflow.slurm", "cancel", "--directory", str(workdir)],
                            capture_output=True, text=True, env=slurm_env, timeout=300)
    assert cancel.returncode == 0 and job in cancel.stdout, cancel.stdout + cancel.stderr
    assert squeue_state(job) == "gone"
    # (--unlock is the documented next step; the lock was released when the refused driver stopped)
    rerun = Driver(workdir, slurm_env, target, "kill_rerun")
    assert rerun.wait(300) == 0, rerun.tail()

    # One new job, done at its first attempt (no retry burnt on the writer lock), resumed from the
    # killed job's checkpoint, below the killed job's lines in the same log; the weights of an
    # uninterrupted run.
    assert len(rerun.submitted()) == 1 and "Error in rule" not in rerun.output, rerun.tail()
    log = attempts_in_log(workdir, KILL_RUN)
    assert len(re.findall(r"^===== .* =====$", log, re.M)) == 2 and f"SLURM job {job}" in log, log[:2000]
    resumed = re.search(rf"es: resuming after iteration (\d+) of {ITERATIONS}", log)
    assert resumed and int(resumed.group(1)) >= 2, log[-3000:]
    same_weights(model_dir(workdir, KILL_RUN), reference.model(KILL_RUN))
    same_metrics(model_dir(workdir, KILL_RUN), reference.model(KILL_RUN))


def test_scancel_of_a_training_job_is_retried_and_resumes(slurm_env, workdir, reference):
    target = [str(model_dir(Path("."), CANCEL_RUN))]
    driver = Driver(workdir, slurm_env, target, "cancel")
    wait_for_checkpoint(workdir, CANCEL_RUN, driver)
    job = training_job(driver)
    subprocess.run(["scancel", job], check=True, timeout=60)

    # A second driver while the first one runs: refused (Snakemake's lock on the working directory
    # while the first driver lives; the check for an earlier driver's jobs when a job of it is listed).
    second = Driver(workdir, slurm_env, target, "cancel_second")
    assert second.wait(180) != 0
    assert ("Directory cannot be locked" in second.output or "still queued or running" in second.output), \
        second.tail()
    assert not second.submitted()

    # squeue reports CANCELLED (sacct's "CANCELLED by 0" once kept the driver waiting for ever): retried
    # with attempt 2, which resumes from the cancelled job's checkpoint.
    assert driver.wait(300) == 0, driver.tail()
    assert "SLURM status is: 'CANCELLED'" in driver.output, driver.tail()
    jobs = [j for j, what in driver.submitted().items() if what["rule"] == "train_run"]
    assert len(jobs) == 2 and jobs[0] == job, driver.tail()
    states = sacct(jobs)
    assert states[job]["State"].startswith("CANCELLED") and states[jobs[1]]["State"] == "COMPLETED", states
    log = attempts_in_log(workdir, CANCEL_RUN)
    assert f"SLURM job {job}" in log and f"SLURM job {jobs[1]}" in log, log[:2000]
    resumed = re.search(rf"es: resuming after iteration (\d+) of {ITERATIONS}", log)
    assert resumed and int(resumed.group(1)) >= 2, log[-3000:]
    same_weights(model_dir(workdir, CANCEL_RUN), reference.model(CANCEL_RUN))
    same_metrics(model_dir(workdir, CANCEL_RUN), reference.model(CANCEL_RUN))


def test_a_retrys_size_stays_within_what_a_node_holds(slurm_env):
    """prepare_task's third attempt (16,000 MB x 3) is more than this node has: sbatch refuses that size,
    and takes the one the rules give it (esgrpo.workflow.slurm.capped)."""
    from esgrpo.workflow.slurm import capped, cluster_limits

    limits = cluster_limits()
    node = subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True, timeout=60).stdout
    assert limits[0] == max(int(m) for m in re.findall(r"RealMemory=(\d+)", node))
    wanted = 16000 * 3
    assert wanted > limits[0]

    def test_only(mem_mb: int) -> subprocess.CompletedProcess:
        return subprocess.run(["sbatch", "--test-only", "--mem", str(mem_mb), "-t", "60", "--wrap", "true"],
                              capture_output=True, text=True, env=slurm_env, timeout=60)

    refused = test_only(wanted)
    assert refused.returncode != 0 and "not available" in refused.stderr, refused.stderr
    assert test_only(capped("mem_mb", wanted, limits)).returncode == 0


# --------------------------------------------------------------------------- two grids, one checkout


def wait_until(what: str, check, driver: Driver, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        assert driver.proc.poll() is None, f"driver ended before {what}:\n{driver.tail()}"
        time.sleep(0.5)
    pytest.fail(f"no {what} after {timeout:.0f} s:\n{driver.tail()}")


def slurm_cli(action: str, workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "esgrpo.workflow.slurm", action, "--directory", str(workdir)],
                          capture_output=True, text=True, env=env, timeout=300)


def test_two_grids_at_once_then_a_killed_drivers_orphans(slurm_env, tmp_path_factory):
    """Two grids of one working directory under SLURM at once, grid B without an account: neither driver
    takes the other's jobs for orphans, and the orphan commands leave a live driver's jobs alone. Then grid
    A's driver is killed: a new driver of A is refused, naming A's job only, `cancel` cancels it only, and
    both grids complete. Every job waits behind a job outside the working directory that holds the node's
    memory, so that each step sees the jobs queued (one prepare_task per grid: 16,000 MB each)."""
    workdir = tmp_path_factory.mktemp("two_grids")
    grid_b = workdir / "grid_b.yaml"
    grid_b.write_text(CONFIG.read_text().replace(f"results_dir: {GRID}", "results_dir: results/grid_b"))
    no_account = {k: v for k, v in slurm_env.items() if k != "ESGRPO_SLURM_ACCOUNT"}
    target = {"a": f"{GRID}/data/sum_yesno/train.jsonl", "b": "results/grid_b/data/sum_yesno/train.jsonl"}
    records = workdir / ".snakemake" / "esgrpo_slurm_drivers"

    from esgrpo.workflow.slurm import cluster_limits

    blocker = subprocess.run(["sbatch", "--parsable", "-D", str(tmp_path_factory.mktemp("blocker")), "-p", "cpu",
                              "--mem", str(cluster_limits()[0]), "-t", "30", "--wrap", "sleep 1200"],
                             capture_output=True, text=True, env=slurm_env, timeout=60, check=True).stdout.strip()
    drivers = []
    try:
        a = Driver(workdir, slurm_env, [target["a"]], "grid_a")
        drivers.append(a)
        job_a = wait_until("job of grid A", lambda: next(iter(a.submitted()), None), a)
        b = Driver(workdir, no_account, [target["b"]], "grid_b", config=grid_b)
        drivers.append(b)
        job_b = wait_until("job of grid B", lambda: next(iter(b.submitted()), None), b)
        assert "SLURM: no account (ESGRPO_SLURM_ACCOUNT unset)" in b.output
        assert {squeue_state(job_a), squeue_state(job_b)} == {"PENDING"}
        assert len(list(records.glob("*.json"))) == 2

        listed = slurm_cli("jobs", workdir, slurm_env)
        whose = dict(re.findall(r"^  (\d+) PENDING .*: (live driver pid \d+ on \S+, grid \S+|orphan)$", listed.stdout,
                                re.M))
        assert whose.keys() == {job_a, job_b} and whose[job_a].endswith(f"grid {GRID}"), listed.stdout
        assert whose[job_b].endswith("grid results/grid_b"), listed.stdout
        cancelled = slurm_cli("cancel", workdir, slurm_env)
        assert cancelled.returncode == 0 and cancelled.stdout.startswith("0 orphan SLURM job(s)"), cancelled.stdout
        assert {squeue_state(job_a), squeue_state(job_b)} == {"PENDING"}

        # Grid A's driver dies: its job is an orphan now, grid B's is not.
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        assert Driver(workdir, slurm_env, [target["a"]], "grid_a_unlock", "--unlock").wait(180) == 0
        again = Driver(workdir, slurm_env, [target["a"]], "grid_a_again")
        assert again.wait(180) != 0
        assert "1 SLURM job(s) of a driver that no longer runs" in again.output, again.tail()
        left = re.findall(r"^  (\d+) (\w+) rule_.*, grid (\S+)$", again.output, re.M)
        assert left == [(job_a, "PENDING", GRID)], again.tail()
        assert not again.submitted()
        cancelled = slurm_cli("cancel", workdir, slurm_env)
        assert cancelled.returncode == 0 and cancelled.stdout.startswith("1 orphan SLURM job(s)"), cancelled.stdout
        assert re.findall(r"^  (\d+) ", cancelled.stdout, re.M) == [job_a], cancelled.stdout
        assert squeue_state(job_a) == "gone" and squeue_state(job_b) == "PENDING"
    except BaseException:
        for driver in drivers:  # a failed check leaves no driver polling behind it
            if driver.proc.poll() is None:
                os.killpg(driver.proc.pid, signal.SIGKILL)
        raise
    finally:
        subprocess.run(["scancel", blocker], timeout=60)

    rerun = Driver(workdir, slurm_env, [target["a"]], "grid_a_rerun")
    assert rerun.wait(300) == 0, rerun.tail()
    assert b.wait(300) == 0, b.tail()
    accounting = sacct([job_b, *rerun.submitted()])
    assert {row["State"] for row in accounting.values()} == {"COMPLETED"}, accounting
    assert accounting[job_b]["Account"] == slurm_env["ESGRPO_SLURM_ACCOUNT"]  # no -A: the user's default account
    assert (workdir / target["a"]).exists() and (workdir / target["b"]).exists()
    assert not list(records.glob("*.json"))  # each finished driver removed its record, the killed one's went too


def test_a_cluster_that_requires_an_account_says_so_in_one_line(slurm_env, tmp_path):
    """A user with no SLURM association (nobody) and no ESGRPO_SLURM_ACCOUNT: the check a driver makes
    before it submits anything fails with one line naming the variable and what the cluster said."""
    import tempfile

    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python, "no system python3 for the user nobody"
    # The module is standard library only: a copy that nobody can read, outside root's private folders.
    with tempfile.TemporaryDirectory(dir="/tmp") as public:
        shutil.copytree(REPO / "src" / "esgrpo", Path(public) / "esgrpo")
        for path in [Path(public), *Path(public).rglob("*")]:
            path.chmod(0o755)
        env = {k: v for k, v in slurm_env.items() if k != "ESGRPO_SLURM_ACCOUNT"} | {"PYTHONPATH": public}
        out = subprocess.run(["runuser", "-u", "nobody", "--", python, "-m", "esgrpo.workflow.slurm", "check",
                              "--directory", public], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(
        "profiles/slurm: this cluster refuses a job without an account ("), out.stderr
    assert "Invalid account" in out.stderr and "set ESGRPO_SLURM_ACCOUNT" in out.stderr
    # The same check as this user, whose default account the cluster takes.
    ok = slurm_cli("check", tmp_path, {k: v for k, v in slurm_env.items() if k != "ESGRPO_SLURM_ACCOUNT"})
    assert ok.returncode == 0 and ok.stdout.startswith("a SLURM driver may start in"), ok.stdout + ok.stderr
