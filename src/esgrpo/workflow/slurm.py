"""The workflow's side of a SLURM cluster (profiles/slurm; docs/cluster.md, "When the driver dies").

Two things the executor plugin (snakemake-executor-plugin-slurm 2.8.0) does not do, seen on a real
Slurm 22.05 (tests/pipeline/test_slurm_real.py):

- A driver killed with kill -9 leaves its jobs running. A new driver cannot see them (the plugin follows
  only the jobs of its own run ID) and submits the same runs again: each copy fails on the trainer's
  writer lock, uses up its retries, and Snakemake deletes the outputs of every "failed" copy while the
  old job still writes them. So each driver records itself (`register_driver`: its SLURM run ID, host,
  pid and a heartbeat, under .snakemake/ of the working directory), and a driver refuses to start while
  jobs of this working directory (the plugin submits every job with ``-D <workdir>``) whose driver is
  not alive are queued or running (`check_driver`, the workflow's onstart). Jobs of a live driver (the
  plugin names every job after its driver's run ID) belong to another grid running beside this one and
  are left alone: two grids run at once from one checkout. ``python -m esgrpo.workflow.slurm cancel``
  (or ``wait``) clears the orphans and never touches a live driver's jobs.
- Retries ask for mem_mb and runtime x attempt. Past what the largest node holds, sbatch refuses the
  job; `capped` keeps a retry's size within `cluster_limits`.

Site settings come from the environment (profiles/slurm): the account (optional: without one the jobs
go without -A, under the user's default account; a cluster that requires one is asked once, with
``sbatch --test-only``, before anything is submitted), the partitions, and the GPU type (the GRES name
and the plan's GPU, over the config's ``plan.gpu_type``).

Standard library only: the workflow imports this when it parses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from esgrpo.files import write_json

ACCOUNT_ENV = "ESGRPO_SLURM_ACCOUNT"
# The site's GPU type (a key or GRES alias of esgrpo/plan/gpus.py): the GRES name GPU jobs ask for and the
# GPU the plan sizes them for, over the config's plan.gpu_type (a science config stays the same everywhere).
GPU_TYPE_ENV = "ESGRPO_SLURM_GPU_TYPE"
# The partitions profiles/slurm reads from the environment, and what they are where unset (the names
# scripts/slurm_local.sh gives the local cluster's).
PARTITION_DEFAULTS = {"ESGRPO_SLURM_PARTITION": "cpu", "ESGRPO_SLURM_GPU_PARTITION": "gpu"}


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str
    name: str  # the plugin names each job after its driver's run ID
    comment: str  # the plugin's rule_<rule>_wildcards_<values>

    def describe(self) -> str:
        return f"{self.job_id} {self.state} {self.comment} (driver run {self.name})"


def _run(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def workdir_jobs(workdir: str | os.PathLike) -> list[SlurmJob]:
    """This user's SLURM jobs that squeue still lists (queued, running, completing) with working
    directory `workdir`; [] where there is no squeue."""
    if not shutil.which("squeue"):
        return []
    want = Path(workdir).resolve()
    jobs = []
    # the working directory last: the one field that may hold the separator
    for line in _run(["squeue", "--me", "--noheader", "--format=%i|%T|%j|%k|%Z"]).splitlines():
        parts = line.split("|", 4)
        if len(parts) == 5 and Path(parts[4].strip()).resolve() == want:
            jobs.append(SlurmJob(*(p.strip() for p in parts[:4])))
    return jobs


# --------------------------------------------------------------------------- drivers

DRIVERS = Path(".snakemake") / "esgrpo_slurm_drivers"  # under the working directory: one record per driver
HEARTBEAT = 60.0  # seconds between a driver's touches of its record
STALE = 3 * HEARTBEAT  # a record on another host untouched this long is a dead driver's


def _start_ticks(pid: int) -> str | None:
    """The process's start time since boot (/proc/<pid>/stat field 22): a pid reused by another process
    differs; None where /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _pid_alive(pid: int, ticks: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return ticks is None or _start_ticks(pid) in (None, ticks)


def _records(workdir: Path) -> list[tuple[Path, dict]]:
    out = []
    for path in sorted((workdir / DRIVERS).glob("*.json")):
        try:
            out.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue  # one being written or removed right now
    return out


def driver_alive(path: Path, record: dict) -> bool:
    """A driver on this host: its pid runs, started when the record says. On another host: its heartbeat
    touched the record within STALE seconds."""
    if record.get("host") == socket.gethostname():
        return _pid_alive(int(record["pid"]), record.get("start_ticks"))
    try:
        return time.time() - path.stat().st_mtime < STALE
    except OSError:
        return False


def live_drivers(workdir: str | os.PathLike) -> dict[str, dict]:
    """SLURM run ID -> record of every driver of `workdir` that is alive."""
    return {rec["run_id"]: rec for path, rec in _records(Path(workdir)) if driver_alive(path, rec)}


def orphan_jobs(workdir: str | os.PathLike) -> list[SlurmJob]:
    """The jobs of `workdir` that no live driver follows (a killed driver's)."""
    live = live_drivers(workdir)
    return [job for job in workdir_jobs(workdir) if job.name not in live]


_REGISTERED: list[tuple[Path, threading.Event]] = []


def register_driver(workdir: str | os.PathLike, run_id: str, results_dir: str) -> Path:
    """Record this process as the driver of SLURM run `run_id` in `workdir`, and keep its heartbeat
    until `unregister_driver`."""
    path = Path(workdir) / DRIVERS / f"{run_id}.json"
    write_json(path, {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
                      "start_ticks": _start_ticks(os.getpid()), "results_dir": results_dir,
                      "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT):
            with contextlib.suppress(OSError):  # a record removed by hand stays removed
                os.utime(path)

    threading.Thread(target=beat, name="esgrpo-slurm-heartbeat", daemon=True).start()
    _REGISTERED.append((path, stop))
    return path


def unregister_driver() -> None:
    """Remove this driver's record (onsuccess, onerror): its jobs have ended or were cancelled."""
    while _REGISTERED:
        path, stop = _REGISTERED.pop()
        stop.set()
        path.unlink(missing_ok=True)


def jobs_left_message(workdir: str | os.PathLike, jobs: list[SlurmJob]) -> str:
    grids = {rec["run_id"]: rec.get("results_dir", "?") for _, rec in _records(Path(workdir))}
    lines = "\n".join(f"  {job.describe()}" + (f", grid {grids[job.name]}" if job.name in grids else "")
                      for job in jobs)
    return (f"{len(jobs)} SLURM job(s) of a driver that no longer runs are still queued or running in {workdir}:\n"
            f"{lines}\n"
            "A new driver would submit the same runs again; their copies would fail on the trainer's writer "
            "lock, use up their retries, and have their outputs deleted while the old jobs still write them. "
            "First either cancel the old jobs (each run resumes from its last checkpoint) or wait until they "
            "end (finished runs then count as done); either leaves the jobs of a live driver (another grid "
            "running here) alone:\n"
            f"  python -m esgrpo.workflow.slurm cancel --directory {workdir}     (or: wait)\n"
            "then `snakemake ... --unlock` and start the driver again (docs/cluster.md, 'When the driver dies').")


def check_account(environ: dict | None = None) -> None:
    """Without an account: whether this cluster takes a job without one (`sbatch --test-only` on the CPU
    partition, nothing submitted); RuntimeError in one line where it does not."""
    environ = os.environ if environ is None else environ
    if environ.get(ACCOUNT_ENV) or not shutil.which("sbatch"):
        return
    partition = environ.get("ESGRPO_SLURM_PARTITION") or PARTITION_DEFAULTS["ESGRPO_SLURM_PARTITION"]
    out = subprocess.run(["sbatch", "--test-only", f"--partition={partition}", "--time=1", "--wrap", "true"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        said = " ".join(out.stderr.split()) or f"exit {out.returncode}"
        raise RuntimeError(f"profiles/slurm: this cluster refuses a job without an account ({said}; sbatch "
                           f"--test-only --partition={partition}): set {ACCOUNT_ENV} to the SLURM account the jobs "
                           "are charged to (`sacctmgr -n show assoc user=$USER format=account` lists yours), or "
                           "ESGRPO_SLURM_PARTITION where sbatch names the partition")


def site_gpu_type(config: dict, environ: dict) -> dict[str, str]:
    """{"gpu_type": the site's GPU type} where GPU_TYPE_ENV names one and the config's jobs run on GPUs
    (plan.gpu_type other than cpu, vLLM's CPU build on the host), else {} (the config's own)."""
    site = environ.get(GPU_TYPE_ENV)
    own = (config.get("plan") or {}).get("gpu_type", "h200")
    return {"gpu_type": site} if site and own != "cpu" else {}


def site_summary(environ: dict, gpu_type: str | None) -> str:
    """One line a SLURM run (dry runs too) logs at parse time: the account and GPU type it will use."""
    account = environ.get(ACCOUNT_ENV)
    said = (f"account {account}" if account else
            f"no account ({ACCOUNT_ENV} unset): jobs go without -A, under your default account; a cluster "
            "that requires one is asked (sbatch --test-only) when the driver starts")
    gpu = f"; GPU type {gpu_type}" + (f" ({GPU_TYPE_ENV})" if environ.get(GPU_TYPE_ENV) else " (plan.gpu_type)")
    return f"SLURM: {said}{gpu if gpu_type else ''}"


def check_driver(workdir: str | os.PathLike, environ: dict | None = None) -> None:
    """What a SLURM driver checks before it submits anything (the workflow's onstart): a job without an
    account is taken where none is set (check_account), and no job of a driver that no longer runs is left
    in `workdir`. RuntimeError saying what to do otherwise. Records of dead drivers with no job left go."""
    check_account(environ)
    jobs = orphan_jobs(workdir)
    if jobs:
        raise RuntimeError(jobs_left_message(workdir, jobs))
    for path, record in _records(Path(workdir)):
        if not driver_alive(path, record):
            path.unlink(missing_ok=True)


def _wait_until_gone(workdir: Path, ids: set[str] | None, timeout: float, poll: float = 2.0) -> list[SlurmJob]:
    """Poll squeue until no orphan job of `workdir` (of `ids`, if given) is left; those still left at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        left = [j for j in orphan_jobs(workdir) if ids is None or j.job_id in ids]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(poll)


def cancel(workdir: str | os.PathLike, timeout: float = 600.0) -> list[SlurmJob]:
    """scancel every job of `workdir` that no live driver follows and wait until squeue no longer lists
    them (a cancelled job gets SIGTERM, and SIGKILL KillWait seconds later); the jobs cancelled."""
    jobs = orphan_jobs(workdir)
    if jobs:
        _run(["scancel", *[job.job_id for job in jobs]])
        left = _wait_until_gone(Path(workdir), {job.job_id for job in jobs}, timeout)
        if left:
            raise RuntimeError(f"still listed {timeout:.0f} s after scancel: {[j.describe() for j in left]}")
    return jobs


def wait(workdir: str | os.PathLike, timeout: float = float("inf"), poll: float = 30.0) -> list[SlurmJob]:
    """Wait until no job of `workdir` that no live driver follows is queued or running; those there were
    at the start."""
    jobs = orphan_jobs(workdir)
    left = _wait_until_gone(Path(workdir), None, timeout, poll)
    if left:
        raise RuntimeError(f"still queued or running after {timeout:.0f} s: {[j.describe() for j in left]}")
    return jobs


# --------------------------------------------------------------------------- size limits


def _minutes(limit: str) -> int | None:
    """A SLURM time limit ([days-]hours:minutes:seconds, minutes:seconds or minutes) in minutes; None for
    unlimited."""
    if limit in ("infinite", "UNLIMITED", "n/a", ""):
        return None
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    hours, minutes, seconds = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return (int(days or 0) * 24 + hours) * 60 + minutes + (1 if seconds else 0)


@cache
def cluster_limits() -> tuple[int | None, int | None]:
    """(the largest node's memory in MB, the longest partition time limit in minutes) as sinfo reports
    them; None for what it cannot say or what is unlimited."""
    if not shutil.which("sinfo"):
        return None, None
    try:
        rows = [line.split("|") for line in _run(["sinfo", "--noheader", "--Node", "--format=%m|%l"]).splitlines()]
    except (RuntimeError, subprocess.TimeoutExpired):
        return None, None
    memory = [int(re.sub(r"\D", "", m)) for m, *_ in rows if re.sub(r"\D", "", m)]
    times = [_minutes(t.strip()) for _, t in (r for r in rows if len(r) == 2)]
    return (max(memory) if memory else None,
            None if not times or None in times else max(times))


def capped(name: str, value: int, limits: tuple[int | None, int | None]) -> int:
    """mem_mb or runtime `value`, at most what `limits` (cluster_limits) allow."""
    limit = {"mem_mb": limits[0], "runtime": limits[1]}.get(name)
    return value if limit is None else min(value, limit)


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m esgrpo.workflow.slurm", description=(
        "The SLURM jobs a driver that no longer runs left in a working directory (docs/cluster.md, 'When the "
        "driver dies'): list every job there and whose it is (jobs), cancel the orphans (each run resumes from "
        "its last checkpoint), wait until the orphans end, or check what a starting driver checks (an account "
        "where the cluster requires one, no orphans). The jobs of a live driver are never cancelled."))
    parser.add_argument("action", choices=("jobs", "cancel", "wait", "check"))
    parser.add_argument("--directory", "-d", default=".", help="the workflow's working directory (default: .)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait at most")
    args = parser.parse_args(argv)
    workdir = Path(args.directory).resolve()
    if args.action == "check":
        try:
            check_driver(workdir)
        except RuntimeError as err:
            print(err, file=sys.stderr)
            return 1
        print(f"a SLURM driver may start in {workdir}")
        return 0
    if args.action == "jobs":
        live = live_drivers(workdir)
        jobs = workdir_jobs(workdir)
        print(f"{len(jobs)} SLURM job(s) of {workdir} queued or running" + "".join(
            f"\n  {j.describe()}: " + (f"live driver pid {live[j.name]['pid']} on {live[j.name]['host']}, grid "
                                       f"{live[j.name].get('results_dir')}" if j.name in live else "orphan")
            for j in jobs))
        return 0
    if args.action == "cancel":
        jobs = cancel(workdir, **({"timeout": args.timeout} if args.timeout else {}))
    else:
        jobs = wait(workdir, **({"timeout": args.timeout} if args.timeout else {}))
    done = {"cancel": "cancelled", "wait": "ended"}[args.action]
    print(f"{len(jobs)} orphan SLURM job(s) of {workdir} {done}" + "".join(f"\n  {j.describe()}" for j in jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
