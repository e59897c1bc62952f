# Thin entry point: all logic lives in esgrpo.pipeline.data.prepare_task.
from esgrpo.pipeline.data import prepare_task
from esgrpo.workflow import run_stage

run_stage(snakemake, prepare_task)  # noqa: F821
