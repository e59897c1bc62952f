# esgrpo: Evolution Strategies vs GRPO post-training, from one configuration to every table.
# Usage: README.md. The default config runs the whole grid in miniature on a CPU, offline.
from jsonschema import ValidationError
from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from esgrpo.analysis.settings import analysis_config
from esgrpo.config import ConfigError, schema_error
from esgrpo.grids import results_folder

# The Snakemake every environment pins and the test suite runs (envs/*.yaml; tests/pipeline/test_catalog.py).
min_version("9.27")


# `--configfile X` REPLACES the embedded default instead of being merged into it (Snakemake
# merges nested keys, which would silently mix two grids).
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


# Used as a module (snakedeploy, `module ... use rule * from`), the config is the deploying workflow's: none
# at all stops here with one line, not with the schema's first missing key.
if not config:
    raise ConfigError(
        "the config is empty or missing: give a config file (config/config.yaml of a deployed workflow, "
        "or --configfile=configs/ci.yaml); config.yaml of the workflow is the embedded default"
    )

# Defaults filled from the schema. Snakemake's own message would print the failing part of the schema
# and of the config (all of both for a top-level key): one line naming the key instead.
try:
    validate(config, schema="schemas/config.schema.yaml")
except WorkflowError as err:
    if not isinstance(err.__context__, ValidationError):
        raise
    raise ConfigError(schema_error(err.__context__)) from None
# The analysis block's defaults are stated in esgrpo.analysis.settings (the schema checks types only).
config["analysis"] = analysis_config(config)

# The grid's folder: every rule writes under it (rules/config.smk RESULTS; esgrpo.grids).
config["results_dir"] = results_folder(config.get("results_dir"), workflow.overwrite_configfiles)


# The report's front page (`snakemake --report`; README, "The report").
report: "report/workflow.rst"


include: "rules/config.smk"
include: "rules/inputs.smk"
include: "rules/resources.smk"
include: "rules/targets.smk"
include: "rules/lifecycle.smk"
include: "rules/data.smk"
include: "rules/models.smk"
include: "rules/train.smk"
include: "rules/eval.smk"
include: "rules/analysis.smk"
include: "rules/tables.smk"
include: "rules/paper.smk"
include: "rules/plan.smk"
include: "rules/heldout.smk"


onstart:
    check_slurm_driver()
    write_grid_folder_record()
    start_job_server()


onsuccess:
    stop_job_server()
    slurm.unregister_driver()


onerror:
    stop_job_server()
    slurm.unregister_driver()


rule all:
    default_target: True
    input:
        all_targets(),
