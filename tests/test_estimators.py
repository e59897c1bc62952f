"""Unit tests of esgrpo.estimators against brute force and closed forms."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from esgrpo.estimators import (
    bernoulli_js_divergence,
    bootstrap_ci,
    bootstrap_ci_grouped,
    maj_at_n,
    majority_vote,
    mean_at_n,
    pass_at_k,
    pass_at_k_curve,
    population_js_diversity,
)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (the first c correct) containing a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_special_cases_and_large_n():
    assert pass_at_k(32, 0, 16) == 0.0
    assert pass_at_k(32, 17, 16) == 1.0  # n - c < k
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # large n where C(n, k) overflows floats: compare with exact integer arithmetic
    n, c, k = 2000, 7, 500
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("args", [(4, 1, 5), (4, 5, 2), (-1, 0, 1), (4, -1, 1), (4, 1, 0), (4, 1, -2)])
def test_pass_at_k_rejects_bad_input(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)


def test_pass_at_k_curve_and_mean_at_n():
    counts = [0, 2, 4]
    curve = pass_at_k_curve(counts, 4, [1, 2, 4])
    assert curve[1] == pytest.approx(np.mean([0, 0.5, 1.0]))
    assert curve[1] == pytest.approx(mean_at_n(counts, 4))
    assert curve[2] == pytest.approx(np.mean([0, brute_pass_at_k(4, 2, 2), 1.0]))
    assert curve[4] == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        mean_at_n([5], 4)


def test_majority_vote():
    assert majority_vote(["a", "b", "b", "a", "c"]) == "a"  # tie: first occurrence wins
    assert majority_vote(["b", "a", "a", "b"]) == "b"
    assert majority_vote([None, None, "x"]) == "x"
    assert majority_vote([None, "y", None, "x", "x"]) == "x"
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def test_maj_at_n():
    prompts = [
        [("4", True), ("5", False), ("4", True)],  # majority correct
        [("1", False), ("1", False), ("2", True)],  # majority wrong although one sample right
        [(None, False), (None, False)],  # nothing extracted
        [(None, False), ("7", True), (None, False)],  # None ignored in the vote
    ]
    assert maj_at_n(prompts) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        maj_at_n([])


def test_bernoulli_js_divergence():
    assert bernoulli_js_divergence([0.3, 0.3, 0.3]) == pytest.approx(0.0, abs=1e-15)
    assert bernoulli_js_divergence([0.0, 1.0]) == pytest.approx(math.log(2))
    assert bernoulli_js_divergence([0.0, 0.0, 1.0, 1.0]) == pytest.approx(math.log(2))
    assert bernoulli_js_divergence([0.5]) == 0.0
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = rng.uniform(size=rng.integers(1, 10))
        js = bernoulli_js_divergence(p)
        assert 0.0 <= js <= math.log(2) + 1e-12

    # closed form for two members: H((a+b)/2) - (H(a)+H(b))/2
    def h(x):
        return -(x * math.log(x) + (1 - x) * math.log(1 - x))

    assert bernoulli_js_divergence([0.2, 0.6]) == pytest.approx(h(0.4) - (h(0.2) + h(0.6)) / 2)
    with pytest.raises(ValueError):
        bernoulli_js_divergence([1.2])


def test_population_js_diversity():
    success = np.array([[0.0, 0.5, 0.2], [1.0, 0.5, 0.2]])  # [members, prompts]
    expected = np.mean([math.log(2), 0.0, 0.0])
    assert population_js_diversity(success) == pytest.approx(expected)
    with pytest.raises(ValueError):
        population_js_diversity(np.array([0.1, 0.2]))


def test_bootstrap_ci_constant_and_single():
    assert bootstrap_ci([0.1] * 50) == (0.1, 0.1, 0.1)
    assert bootstrap_ci([3.0]) == (3.0, 3.0, 3.0)
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_bootstrap_ci_covers_mean_and_is_reproducible():
    x = np.random.default_rng(1).normal(size=200)
    m, lo, hi = bootstrap_ci(x, n_boot=1000, seed=3)
    assert m == pytest.approx(x.mean())
    assert lo < m < hi
    # width close to the normal approximation 2 * 1.96 * sd / sqrt(n)
    assert (hi - lo) == pytest.approx(2 * 1.96 * x.std() / math.sqrt(x.size), rel=0.2)
    assert bootstrap_ci(x, n_boot=1000, seed=3) == (m, lo, hi)
    assert bootstrap_ci(x, n_boot=1000, seed=4) != (m, lo, hi)


def test_bootstrap_ci_grouped():
    rng = np.random.default_rng(2)
    rows = [
        {"seed": s, "prompt": p, "sample": j, "correct": float(rng.uniform() < 0.3 + 0.1 * s)}
        for s in range(3)
        for p in range(40)
        for j in range(2)
    ]
    df = pd.DataFrame(rows)
    cells = df.groupby(["seed", "prompt"])["correct"].mean()
    m, lo, hi = bootstrap_ci_grouped(df, "correct", n_boot=500)
    assert m == pytest.approx(cells.mean())
    assert lo < m < hi
    # resampling seeds adds between-seed variance: wider than the flat bootstrap over cells
    _, flo, fhi = bootstrap_ci(cells.to_numpy(), n_boot=500)
    assert hi - lo > fhi - flo
    # one level = plain bootstrap over cells
    assert bootstrap_ci_grouped(df, "correct", groups=["prompt"], n_boot=300)[0] == pytest.approx(
        df.groupby("prompt")["correct"].mean().mean()
    )
    const = df.assign(correct=1.0)
    assert bootstrap_ci_grouped(const, "correct") == (1.0, 1.0, 1.0)
    # a single seed reduces to the prompt bootstrap
    one = df[df.seed == 0]
    m1, lo1, hi1 = bootstrap_ci_grouped(one, "correct", n_boot=500)
    assert lo1 <= m1 <= hi1
    with pytest.raises(KeyError):
        bootstrap_ci_grouped(df, "missing")
