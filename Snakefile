# esgrpo: Evolution Strategies vs GRPO post-training, from one configuration to every table.
# Usage: README.md. The default config runs the whole grid in miniature on a CPU, offline.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


validate(config, schema="schemas/config.schema.yaml")


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/models.smk"
include: "rules/eval.smk"
include: "rules/tables.smk"


rule all:
    input:
        all_targets(),
    default_target: True
