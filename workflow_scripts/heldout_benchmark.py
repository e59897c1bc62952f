# Thin entry point: all logic lives in esgrpo.evaluation.heldout.evaluate_heldout.
from esgrpo.workflow.bridge import run_stage

if __name__ == "__main__":  # vLLM's worker processes re-import this file (spawn): only run here
    run_stage(snakemake, "esgrpo.evaluation.heldout:evaluate_heldout")  # noqa: F821
