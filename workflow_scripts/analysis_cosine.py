# Thin entry point: all logic lives in esgrpo.pipeline.analysis.cosine_stage.
from esgrpo.pipeline.analysis import cosine_stage
from esgrpo.workflow import run_stage

run_stage(snakemake, cosine_stage)  # noqa: F821
