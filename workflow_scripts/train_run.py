# Thin entry point: all logic lives in esgrpo.pipeline.training.train_run.
from esgrpo.pipeline.training import train_run
from esgrpo.workflow import run_stage

run_stage(snakemake, train_run)  # noqa: F821
