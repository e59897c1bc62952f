"""Tasks: a task is a dataset plus its verifier. ``base`` (the row shape {id, prompt, answer, meta} and
the verifier binding), ``offline`` (reasoning-gym generators for the embedded default), ``hub`` and
``records`` (the papers' datasets from the Hub or a local copy, read so that they fail well),
``registry`` (every task name bound to its loader and verifier; open it first), ``rewards`` (the
verifiers: pure functions that grade a completion, under the config's rewards.rules),
``math_verify_runner`` (math-verify's verdict bounded in time in any thread, a helper process outside the
main thread) and ``paper_a_rewards`` (paper A's graders, rule for rule; docs/rewards.md).
"""
