"""The tables and figures of papers A and B, the base table and the claims table.

Modules, in the order a stage uses them: ``planning`` (what each table and figure reads; imported
by the Snakemake DAG parse, so it imports neither pandas nor torch), ``loading`` (tidy files ->
frames), ``frames`` (per-run frames several tables share), ``stats`` (CIs, pairing, budget
matching), ``writing`` (the one table writer), ``paper_a`` / ``paper_b`` / ``claims`` / ``figures``
/ ``base_table`` (the stages) and ``stages`` (the registry the workflow script dispatches through).
This file imports nothing, so that importing ``esgrpo.report.planning`` stays light.
"""
