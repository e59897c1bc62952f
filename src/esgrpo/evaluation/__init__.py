"""Evaluation of checkpoints: ``evaluate`` (one model on one task: Pass@k, mean@n, Maj@n, greedy
accuracy, token entropy, from n samples per prompt) and ``heldout`` (MMLU, IFEval and other benchmarks
through lm-evaluation-harness). The estimators themselves (unbiased Pass@k, bootstrap CIs) are
``esgrpo.estimators``, shared with ES (JS diversity), the base fingerprint and the report.
"""
