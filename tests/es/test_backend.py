"""The ES backend interface (esgrpo.es.backend): fitness from rewards."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esgrpo.es.backend import FitnessResult


def test_fitness_from_rewards_is_the_mean_reward_and_success_is_a_full_reward():
    rewards = np.array([[1.0, 0.0, 0.5], [0.0, 0.0, 0.0]])
    result = FitnessResult.from_rewards(rewards, generated_tokens=12, entropy=0.25, entropy_estimator="x")
    assert result.fitness.tolist() == [0.5, 0.0] and result.rollouts == 6 and result.generated_tokens == 12
    assert result.success.tolist() == [[True, False, False], [False, False, False]]
    assert result.entropy == 0.25 and result.entropy_estimator == "x"
    with pytest.raises(ValueError, match="members, prompts"):
        FitnessResult.from_rewards(np.zeros(3), 0, math.nan)
