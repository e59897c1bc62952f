"""Parameter-space and output-space analyses of trained checkpoints (pure functions on state dicts)."""
