# Thin entry point: all logic lives in esgrpo.pipeline.evaluation.evaluate_checkpoint.
from esgrpo.workflow import run_stage

if __name__ == "__main__":  # vLLM's worker processes re-import this file (spawn): only run here
    run_stage(snakemake, "esgrpo.pipeline.evaluation:evaluate_checkpoint")  # noqa: F821
