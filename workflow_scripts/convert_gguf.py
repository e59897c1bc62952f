# Thin entry point: all logic lives in esgrpo.pipeline.models.convert_gguf_model.
from esgrpo.pipeline.models import convert_gguf_model
from esgrpo.workflow import run_stage

run_stage(snakemake, convert_gguf_model)  # noqa: F821
