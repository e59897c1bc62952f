# Thin entry point: all logic lives in esgrpo.pipeline.analysis.sparsity_stage.
from esgrpo.pipeline.analysis import sparsity_stage
from esgrpo.workflow import run_stage

run_stage(snakemake, sparsity_stage)  # noqa: F821
