# Thin entry point: all logic lives in esgrpo.pipeline.data.prepare_task.
from esgrpo.workflow import run_stage
from esgrpo.pipeline.data import prepare_task

run_stage(snakemake, prepare_task)  # noqa: F821
