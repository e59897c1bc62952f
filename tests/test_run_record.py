"""esgrpo.run_record: one metrics row and one summary for ES and GRPO."""

import math

import pytest

from esgrpo.run_record import STEP_FIELDS, RunSummary, StepRow


def _row(method: str, **extra) -> StepRow:
    return StepRow(method=method, iteration=2, fitness_mean=0.5, fitness_std=0.1, update_norm=0.01,
                   distance_from_init=0.02, updates=2, rollouts=32, generated_tokens=400, seconds=1.5,
                   entropy=0.7, prompts=4, extra=extra)


def test_both_methods_write_the_shared_fields_then_their_own():
    es, grpo = _row("es", skipped=False).to_dict(), _row("grpo", loss=0.3).to_dict()
    assert list(es)[:len(STEP_FIELDS)] == list(grpo)[:len(STEP_FIELDS)] == list(STEP_FIELDS)
    assert es["skipped"] is False and grpo["loss"] == 0.3 and "loss" not in es
    with pytest.raises(ValueError, match="repeats shared fields"):
        _row("es", fitness_mean=1.0).to_dict()


def test_summary_round_trips_and_names_what_a_record_lacks():
    rows = [{"fitness_mean": 0.2}, {"fitness_mean": 0.6}, {"fitness_mean": 0.4}]
    summary = RunSummary(method="es", iterations=3, updates=3, trainable_parameters=100, distance_from_init=0.1,
                         **RunSummary.fitness(rows), rollouts=12, generated_tokens=90, seconds=2.0,
                         resumed_from=None, settings={"sigma": 0.01}, extra={"skipped": 0})
    record = summary.to_dict()
    assert record["final_fitness_mean"] == 0.4 and record["best_fitness_mean"] == 0.6 and record["skipped"] == 0
    assert RunSummary.from_dict(record) == summary
    assert all(math.isnan(v) for v in RunSummary.fitness([]).values())
    old_grpo = {k: v for k, v in record.items() if k not in ("iterations", "trainable_parameters")}
    with pytest.raises(KeyError, match="iterations"):
        RunSummary.from_dict(old_grpo)
