# Thin entry point: all logic lives in esgrpo.pipeline.theory.theory_stage.
from esgrpo.pipeline.theory import theory_stage
from esgrpo.workflow import run_stage

run_stage(snakemake, theory_stage)  # noqa: F821
