# Thin entry point: all logic lives in esgrpo.pipeline.models.build_default_model.
from esgrpo.workflow import run_stage

if __name__ == "__main__":  # vLLM's worker processes re-import this file (spawn): only run here
    run_stage(snakemake, "esgrpo.pipeline.models:build_default_model")  # noqa: F821
