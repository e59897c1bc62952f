# Thin entry point: all logic lives in esgrpo.pipeline.tables.base_passk.
from esgrpo.pipeline.tables import base_passk
from esgrpo.workflow import run_stage

run_stage(snakemake, base_passk)  # noqa: F821
