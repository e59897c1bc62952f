# The config as the rules see it: checked, the grid's folder, the environment every job inherits (live
# curves, progress storage, PYTHONPATH, the software env) and the wildcards' constraints. The rule-helper
# files are included in this order (Snakefile): config, inputs, resources, targets, lifecycle; the rules
# live in the stage files (data, models, train, eval, analysis, tables, paper, plan, heldout).
import json
import os
import re
from pathlib import Path

from snakemake.logging import logger

from esgrpo.config import check_config, software_env
from esgrpo.grids import check_grid_folder, config_source
from esgrpo.live import ENV as LIVE_ENV
from esgrpo.runs import PAIR_PATTERN, RUN_PATTERN, SNAPSHOT_RUN_PATTERN, TRAINED_RUN_PATTERN
from esgrpo.tasks.registry import get_task
from esgrpo.tasks.rewards import own_graders_under
from esgrpo.workflow import progress_store

check_config(config)
# Whose rules grade this grid's training and evaluation (docs/rewards.md): said once, dry runs included,
# with the verifiers of this config's tasks that those rules have no grader of (the project's grade them).
_OWN_GRADERS = own_graders_under(config["rewards"]["rules"], [get_task(t).verifier for t in config["tasks"]])
logger.info(
    f"Reward rules: {config['rewards']['rules']} (rewards.rules; docs/rewards.md)"
    + (
        f"; the project's graders for verifier(s) {_OWN_GRADERS}, which those rules do not grade"
        if _OWN_GRADERS
        else ""
    )
)

# The grid's folder (config `results_dir`, set by the Snakefile): every output lives under it. A folder
# that holds another config's grid with other settings stops the parse here, before any job runs
# (esgrpo.grids); the record is written when jobs start (onstart: write_grid_folder_record).
RESULTS = config["results_dir"]
# This workflow's own folder: workflow.basedir is the deploying workflow's when this one is a module
# (snakedeploy, `module ... use rule * from`); the folder of this file is always this workflow's.
WORKFLOW_DIR = Path(workflow.current_basedir.get_path_or_uri(secret_free=True)).parent
GRID_SOURCE = config_source(
    workflow.overwrite_configfiles, workflow.config_settings.config_args, WORKFLOW_DIR / "config.yaml"
)
GRID_RECORD_DUE = check_grid_folder(RESULTS, config, GRID_SOURCE)
MODELS = list(config["models"])
TASKS = list(config["tasks"])

# Live training curves (esgrpo.live): the logging block reaches the training jobs through the
# environment, not as a rule parameter, so that changing where the curves go retrains nothing.
os.environ[LIVE_ENV] = json.dumps({**config["logging"], "root": f"{RESULTS}/tensorboard"})
# Under a default storage provider (no shared filesystem: Kubernetes, cloud batch) the training jobs keep their
# progress folders in that storage too, so that a killed job resumes on another node (esgrpo.workflow.progress_store).
_PROGRESS_STORE = progress_store.store_setting(
    workflow.storage_settings.default_storage_provider, workflow.storage_settings.default_storage_prefix
)
if _PROGRESS_STORE:
    os.environ[progress_store.ENV] = _PROGRESS_STORE

# Every job's software under `--software-deployment-method conda`: the pinned CPU or GPU env.
SOFTWARE_ENV = f"../envs/{software_env(config)}.yaml"
# Jobs import esgrpo from this checkout, also inside a conda env built from envs/*.yaml (an env
# file cannot pip-install the checkout itself). A module read from a URL has no checkout: there the
# installed package serves (README, "Usage").
_SRC = str(WORKFLOW_DIR / "src")
if Path(_SRC).is_dir() and _SRC not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ.update(PYTHONPATH=os.pathsep.join(filter(None, [_SRC, os.environ.get("PYTHONPATH")])))


def _alternatives(names):
    return "|".join(re.escape(n) for n in names)


wildcard_constraints:
    model=_alternatives(MODELS),
    task=_alternatives(TASKS),
    evaltask=_alternatives(TASKS),
    run=RUN_PATTERN,
