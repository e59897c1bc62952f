"""Tasks: the row shape and verifier binding (base), their sources (offline generators, the Hub) and
the one registry of task names (registry)."""
