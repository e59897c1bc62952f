# Thin entry point: all logic lives in esgrpo.pipeline.analysis.base_samples_stage.
from esgrpo.pipeline.analysis import base_samples_stage
from esgrpo.workflow import run_stage

run_stage(snakemake, base_samples_stage)  # noqa: F821
