"""From a Snakemake job to a stage: ``bridge.run_stage`` (what every ``workflow_scripts/`` file calls:
logs, threads, plain arguments), ``job_server`` (local jobs forked from a warm interpreter),
``gpu_slots`` (CUDA_VISIBLE_DEVICES per GPU job on a workstation) and ``stages/`` (one function per
rule: read inputs, call the room that does the work, write outputs atomically). Open ``bridge`` first.
This file imports nothing: the Snakefile's parse stays light.
"""
