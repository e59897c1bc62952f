"""Every task name the config may use, bound to its loader and verifier: one explicit table.

The loaders' modules know nothing of this table (no registration at import time), so importing
a loader never imports the registry and the registry imports each source once.
"""

from __future__ import annotations

import functools

from esgrpo.tasks import hub, offline
from esgrpo.tasks.base import TaskSpec

# The papers' datasets, read from the Hugging Face Hub or a local copy (esgrpo.tasks.hub).
HUB_TASKS: dict[str, TaskSpec] = {
    "gsm8k": TaskSpec("gsm8k", "math", hub.load_gsm8k, "GSM8K grade-school maths (paper B, easy setting)",
                      prompt_fields=hub.GSM8K_FIELDS, hub_ids={"train": hub.GSM8K_ID, "test": hub.GSM8K_ID}),
    "deepscaler": TaskSpec("deepscaler", "math", hub.load_deepscaler,
                           "DeepScaleR-Preview maths, train only (paper B, hard)", splits=("train",),
                           prompt_fields=hub.DEEPSCALER_FIELDS, hub_ids={"train": hub.DEEPSCALER_ID}),
    "countdown": TaskSpec("countdown", "countdown", hub.load_countdown, "Countdown 3-4 numbers (paper A, Qiu et al.)",
                          prompt_fields=hub.COUNTDOWN_FIELDS),
    "math": TaskSpec("math", "math", hub.load_math, "MATH: 40/level train, MATH-500 test (paper A)",
                     prompt_fields=hub.MATH_FIELDS, selections=hub.MATH_SELECTIONS,
                     hub_ids={"train": hub.MATH_TRAIN_ID, "test": hub.MATH_TEST_ID}),
    "boolq": TaskSpec("boolq", "yesno", hub.load_boolq, "BoolQ yes/no reading comprehension (paper A)",
                      prompt_fields=hub.BOOLQ_FIELDS),
    "chemistry": TaskSpec("chemistry", "choice", hub.load_chemistry,
                          "SciKnowEval v2 chemistry 4-choice MCQ (paper A)", prompt_fields=hub.CHEMISTRY_FIELDS),
}

# The embedded default's miniatures of paper A's four kinds, generated offline (esgrpo.tasks.offline).
OFFLINE_TASKS: dict[str, TaskSpec] = {
    "countdown3": TaskSpec("countdown3", "countdown", offline.load_countdown3,
                           "three one-digit numbers to a target (countdown in miniature)"),
    "leg_count": TaskSpec("leg_count", "math", offline.load_leg_count, "legs of a few animals (a word problem)"),
    "sum_choice": TaskSpec("sum_choice", "choice", offline.load_sum_choice,
                           "a one-digit sum with four options (multiple choice)"),
    "sum_yesno": TaskSpec("sum_yesno", "yesno", offline.load_sum_yesno, "is a claimed one-digit sum right (yes/no)"),
    # Another kind (ordering words, no arithmetic): the default's held-out task, in the warm-up, trained by no run.
    "word_order": TaskSpec("word_order", "choice", offline.load_word_order,
                           "which of three short words comes first a-z or z-a (A-C)"),
}

# Paper B's hard-setting benchmarks beside MATH-500 (esgrpo.tasks.hub.BENCHMARKS), evaluation only.
BENCHMARK_TASKS: dict[str, TaskSpec] = {
    name: TaskSpec(name, "math", functools.partial(hub.load_benchmark, name),
                   f"{bench.hub_id}: {bench.rows} maths problems, evaluation only (paper B, hard)", splits=("test",),
                   prompt_fields=hub.BENCHMARK_FIELDS, hub_ids={"test": bench.hub_id})
    for name, bench in hub.BENCHMARKS.items()
}

TASKS: dict[str, TaskSpec] = {**HUB_TASKS, **BENCHMARK_TASKS, **OFFLINE_TASKS}


def get_task(name: str) -> TaskSpec:
    """The task called `name`; a KeyError naming the known tasks otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}") from None
