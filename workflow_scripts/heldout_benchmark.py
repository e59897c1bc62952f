# Thin entry point: all logic lives in esgrpo.heldout_bench.evaluate_heldout.
from esgrpo.workflow import run_stage

if __name__ == "__main__":  # vLLM's worker processes re-import this file (spawn): only run here
    run_stage(snakemake, "esgrpo.heldout_bench:evaluate_heldout")  # noqa: F821
