# What runs when the workflow starts and ends (onstart, onsuccess, onerror in the Snakefile): the grid
# folder's record, the local job server and the SLURM driver's checks and registration.
import os

from snakemake.logging import logger

from esgrpo.config import software_env
from esgrpo.grids import write_grid_record
from esgrpo.workflow import slurm

# --- the local job server ----------------------------------------------------------------------
# A local CPU run forks its jobs from one interpreter that has torch, transformers and TRL imported
# (esgrpo.workflow.job_server: ~4-5 s of imports saved per job, results unchanged). SLURM jobs, GPU configs
# and conda-deployed jobs run their stage in their own process, as does every job with
# ESGRPO_NO_JOB_SERVER=1.

JOB_SERVERS = []


def write_grid_folder_record():
    """The grid record of RESULTS, when this config's run is the folder's first or changed its settings."""
    if GRID_RECORD_DUE:
        write_grid_record(RESULTS, config, GRID_SOURCE)


def start_job_server():
    from esgrpo.workflow import job_server

    if workflow.local_exec and software_env(config) == "cpu" and job_server.enabled():
        JOB_SERVERS.append(job_server.start(f"{RESULTS}/logs/job_server.log"))


def stop_job_server():
    while JOB_SERVERS:
        JOB_SERVERS.pop().stop()


# --- SLURM ----------------------------------------------------------------------------------------
# profiles/slurm reads its site settings from the environment: the partitions (ESGRPO_SLURM_PARTITION,
# ..._GPU_PARTITION; unset, the local cluster's names) and the account (ESGRPO_SLURM_ACCOUNT; unset, an
# empty one: jobs go without -A). Set here, at parse time: Snakemake expands the profile's $VARS when it
# evaluates each job's resources (dry runs included), and the jobs inherit them (sbatch --export=ALL).
for _name, _default in {**slurm.PARTITION_DEFAULTS, slurm.ACCOUNT_ENV: ""}.items():
    os.environ.setdefault(_name, _default)
# The profile is known at parse time by its default resources; the executor only when jobs start.
SLURM_PROFILE = any(
    str(arg).startswith("slurm_")
    for arg in getattr(workflow.resource_settings.default_resources, "args", None) or []
)
if SLURM_PROFILE:
    logger.info(slurm.site_summary(os.environ, PLANNER.settings.gpu_type if PLAN_SIZES_JOBS else None))


def check_slurm_driver():
    """onstart of a SLURM driver: a job without an account is taken where none is set, no job of a driver
    that no longer runs is left in this working directory, and this driver recorded as alive so that a
    driver of another grid leaves its jobs alone (esgrpo.workflow.slurm; docs/cluster.md, "When the
    driver dies")."""
    if workflow.executor_plugin is not None and workflow.executor_plugin.name == "slurm":
        slurm.check_driver(os.getcwd())
        # The plugin names every job after this run ID (snakemake-executor-plugin-slurm 2.8.0, run_uuid).
        slurm.register_driver(os.getcwd(), workflow.scheduler._executor.run_uuid, RESULTS)
