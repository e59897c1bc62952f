# Thin entry point: all logic lives in esgrpo.pipeline.analysis.base_samples_stage.
from esgrpo.workflow import run_stage

if __name__ == "__main__":  # vLLM's worker processes re-import this file (spawn): only run here
    run_stage(snakemake, "esgrpo.pipeline.analysis:base_samples_stage")  # noqa: F821
