# Thin entry point: all logic lives in esgrpo.pipeline.training.export_snapshot.
from esgrpo.pipeline.training import export_snapshot
from esgrpo.workflow import run_stage

run_stage(snakemake, export_snapshot)  # noqa: F821
