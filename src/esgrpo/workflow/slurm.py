"""The workflow's side of a SLURM cluster (profiles/slurm; docs/cluster.md, "When the driver dies").

Two things the executor plugin (snakemake-executor-plugin-slurm 2.8.0) does not do, seen on a real
Slurm 22.05 (tests/test_slurm_real.py):

- A driver killed with kill -9 leaves its jobs running. A new driver cannot see them (the plugin follows
  only the jobs of its own run ID) and submits the same runs again: each copy fails on the trainer's
  writer lock, uses up its retries, and Snakemake deletes the outputs of every "failed" copy while the
  old job still writes them. So a driver refuses to start while jobs of this working directory (the
  plugin submits every job with ``-D <workdir>``) are queued or running (`check_driver`, the
  workflow's onstart), and ``python -m esgrpo.workflow.slurm cancel`` (or ``wait``) clears them first.
- Retries ask for mem_mb and runtime x attempt. Past what the largest node holds, sbatch refuses the
  job; `capped` keeps a retry's size within `cluster_limits`.

Standard library only: the workflow imports this when it parses.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ACCOUNT_ENV = "ESGRPO_SLURM_ACCOUNT"
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


def jobs_left_message(workdir: str | os.PathLike, jobs: list[SlurmJob]) -> str:
    lines = "\n".join(f"  {job.describe()}" for job in jobs)
    return (f"{len(jobs)} SLURM job(s) of an earlier driver are still queued or running in {workdir}:\n{lines}\n"
            "A new driver would submit the same runs again; their copies would fail on the trainer's writer "
            "lock, use up their retries, and have their outputs deleted while the old jobs still write them. "
            "First either cancel the old jobs (each run resumes from its last checkpoint) or wait until they "
            "end (finished runs then count as done):\n"
            f"  python -m esgrpo.workflow.slurm cancel --directory {workdir}     (or: wait)\n"
            "then `snakemake ... --unlock` and start the driver again (docs/cluster.md, 'When the driver dies').")


def check_driver(workdir: str | os.PathLike, environ: dict | None = None) -> None:
    """What a SLURM driver checks before it submits anything (the workflow's onstart): an account is set,
    and no job of an earlier driver is left in `workdir`. RuntimeError saying what to do otherwise."""
    environ = os.environ if environ is None else environ
    if not environ.get(ACCOUNT_ENV):
        raise RuntimeError(f"profiles/slurm: set {ACCOUNT_ENV} to the SLURM account the jobs are charged to "
                           "(`sacctmgr -n show assoc user=$USER format=account` lists yours); the SLURM plugin's "
                           "own guess of an account does not work (plugin 2.8.0 passes `| tail -1` to sacct)")
    jobs = workdir_jobs(workdir)
    if jobs:
        raise RuntimeError(jobs_left_message(workdir, jobs))


def _wait_until_gone(workdir: Path, ids: set[str] | None, timeout: float, poll: float = 2.0) -> list[SlurmJob]:
    """Poll squeue until no job of `workdir` (of `ids`, if given) is left; the jobs still left at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        left = [j for j in workdir_jobs(workdir) if ids is None or j.job_id in ids]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(poll)


def cancel(workdir: str | os.PathLike, timeout: float = 600.0) -> list[SlurmJob]:
    """scancel every job of `workdir` and wait until squeue no longer lists them (a cancelled job gets
    SIGTERM, and SIGKILL KillWait seconds later); the jobs cancelled."""
    jobs = workdir_jobs(workdir)
    if jobs:
        _run(["scancel", *[job.job_id for job in jobs]])
        left = _wait_until_gone(Path(workdir), {job.job_id for job in jobs}, timeout)
        if left:
            raise RuntimeError(f"still listed {timeout:.0f} s after scancel: {[j.describe() for j in left]}")
    return jobs


def wait(workdir: str | os.PathLike, timeout: float = float("inf"), poll: float = 30.0) -> list[SlurmJob]:
    """Wait until no job of `workdir` is queued or running; the jobs there were at the start."""
    jobs = workdir_jobs(workdir)
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
        "The SLURM jobs an earlier driver left in a working directory (docs/cluster.md, 'When the driver "
        "dies'): list them, cancel them (each run resumes from its last checkpoint), or wait until they end."))
    parser.add_argument("action", choices=("jobs", "cancel", "wait"))
    parser.add_argument("--directory", "-d", default=".", help="the workflow's working directory (default: .)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait at most")
    args = parser.parse_args(argv)
    workdir = Path(args.directory).resolve()
    if args.action == "jobs":
        jobs = workdir_jobs(workdir)
    elif args.action == "cancel":
        jobs = cancel(workdir, **({"timeout": args.timeout} if args.timeout else {}))
    else:
        jobs = wait(workdir, **({"timeout": args.timeout} if args.timeout else {}))
    done = {"jobs": "queued or running", "cancel": "cancelled", "wait": "ended"}[args.action]
    print(f"{len(jobs)} SLURM job(s) of {workdir} {done}" + "".join(f"\n  {j.describe()}" for j in jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
