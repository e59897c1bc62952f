"""GRPO through TRL's ``GRPOTrainer``, logged and checkpointed like the ES trainer.

Open ``trainer`` first (``train_grpo``: the TRL config built from our settings, rewards, resume).
``settings`` is ``GRPOSettings`` (every setting, the loss type and KL ``beta`` among them, documented
where declared); ``launch`` runs the trainer in one process per GPU through ``accelerate launch``;
``distributed`` holds what each of those processes needs (gathered weights, the one writer);
``callbacks`` writes the per-step rows of metrics.jsonl in the ES trainer's schema (the TRL callback).
"""
