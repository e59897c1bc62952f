"""Evaluation of one model on one task: Pass@k, mean@n, Maj@n, greedy accuracy, token entropy.

n samples per prompt at a temperature plus one greedy pass. The per-prompt correctness
counts are kept (tidy rows) because confidence intervals, Pass@k curves and diversity
analyses are all computed from them later.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from esgrpo.estimators import maj_at_n, mean_at_n, pass_at_k_curve
from esgrpo.tasks.rewards import DEFAULT_RULES, check_rules, last_boxed, verifier_for


@dataclass
class EvalSettings:
    n_samples: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 24
    ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    greedy: bool = True
    seed: int = 0
    reward_rules: str = DEFAULT_RULES  # whose rules grade (esgrpo.tasks.rewards.RULES; config rewards.rules)

    def __post_init__(self) -> None:
        try:
            check_rules(self.reward_rules)
        except ValueError as err:
            raise ValueError(f"eval.reward_rules: {err}") from None
        if self.n_samples < 1:
            raise ValueError(f"eval.n_samples must be >= 1, got {self.n_samples}")
        too_big = [k for k in self.ks if k > self.n_samples or k < 1]
        if too_big:
            raise ValueError(f"eval.ks {too_big} must lie in 1..n_samples={self.n_samples}")


def answer_key(completion: str) -> str | None:
    """What a completion answered, for majority voting: its last boxed content, normalised."""
    boxed = last_boxed(completion)
    return None if boxed is None else boxed.replace(" ", "").lower()


def evaluate_rows(engine, rows: list[dict], verifier: str, settings: EvalSettings) -> tuple[dict, list[dict]]:
    """(summary, per-prompt rows) of `engine`'s model on `rows`."""
    grade = verifier_for(verifier, settings.reward_rules)
    sampled = engine.generate(rows, n=settings.n_samples, temperature=settings.temperature,
                              top_p=settings.top_p, max_new_tokens=settings.max_new_tokens,
                              seed=settings.seed)
    greedy = (engine.generate(rows, n=1, temperature=0.0, max_new_tokens=settings.max_new_tokens)
              if settings.greedy else None)
    per_prompt, votes = [], []
    for i, row in enumerate(rows):
        correct = [bool(grade(text, row["answer"], row["meta"])) for text in sampled.texts[i]]
        votes.append([(answer_key(text), ok) for text, ok in zip(sampled.texts[i], correct, strict=True)])
        entropies = [e for seq in sampled.entropies[i] for e in seq]
        record = {
            "id": row["id"], "n": settings.n_samples, "correct": sum(correct),
            "tokens": sum(len(ids) for ids in sampled.token_ids[i]),
            "entropy_sum": float(sum(entropies)), "entropy_estimator": sampled.entropy_estimator,
            "boxed": sum(answer_key(t) is not None for t in sampled.texts[i]),
        }
        if greedy is not None:
            text = greedy.texts[i][0]
            record["greedy_correct"] = bool(grade(text, row["answer"], row["meta"]))
            record["greedy_completion"] = text
        record["sample_completion"] = sampled.texts[i][0]
        per_prompt.append(record)
    counts = [r["correct"] for r in per_prompt]
    passk = pass_at_k_curve(counts, settings.n_samples, settings.ks)
    tokens = sum(r["tokens"] for r in per_prompt)
    summary = {
        "n_prompts": len(rows), "n_samples": settings.n_samples,
        **{f"pass@{k}": v for k, v in passk.items()},
        f"mean@{settings.n_samples}": mean_at_n(counts, settings.n_samples),
        f"maj@{settings.n_samples}": maj_at_n(votes),
        "boxed_rate": sum(r["boxed"] for r in per_prompt) / (len(rows) * settings.n_samples),
        "entropy": sum(r["entropy_sum"] for r in per_prompt) / max(tokens, 1),
        "entropy_estimator": sampled.entropy_estimator,  # exact, or what vLLM's log-probs give
        "mean_completion_tokens": tokens / (len(rows) * settings.n_samples),
        "settings": asdict(settings),
    }
    if greedy is not None:
        summary["greedy_accuracy"] = sum(r["greedy_correct"] for r in per_prompt) / len(rows)
    return summary, per_prompt
