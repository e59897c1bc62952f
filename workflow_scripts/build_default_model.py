# Thin entry point: all logic lives in esgrpo.pipeline.models.build_default_model.
from esgrpo.pipeline.models import build_default_model
from esgrpo.workflow import run_stage

run_stage(snakemake, build_default_model)  # noqa: F821
