"""Row choice per policy: vectorized, and in the order the thesis describes."""

import numpy as np
import pytest

from bosen import priority


def test_relative_picks_largest_relative_change_first():
    rows = 6
    base = np.array([[1.0], [100.0], [0.5], [0.0], [10.0], [2.0]])
    known = np.zeros(rows, dtype=np.int64)
    deltas = np.array([[1.0], [50.0], [1.0], [0.3], [1.0], [0.1]])
    imp = np.zeros(rows)
    priority.accumulate_dense(imp, np.arange(rows), deltas, base, known, True)
    # |δ/x|: 1, 0.5, 2, 0.3 (x = 0 falls back to |δ|), 0.1, 0.05
    np.testing.assert_allclose(imp, [1.0, 0.5, 2.0, 0.3, 0.1, 0.05])
    pol = priority.make("relative")
    assert list(pol.choose(np.arange(rows), imp, 3)) == [2, 0, 1]


def test_absolute_differs_from_relative_on_the_same_updates():
    base = np.array([[1.0], [100.0], [0.5]])
    deltas = np.array([[1.0], [50.0], [1.0]])
    imp = np.zeros(3)
    priority.accumulate_dense(imp, np.arange(3), deltas, base, np.zeros(3, dtype=np.int64), False)
    assert list(priority.make("absolute").choose(np.arange(3), imp, 1)) == [1]


def test_relative_uses_absolute_for_rows_not_cached():
    base = np.array([[4.0], [4.0]])
    known = np.array([0, -1])  # row 1 never received
    imp = np.zeros(2)
    priority.accumulate_dense(imp, np.arange(2), np.array([[2.0], [2.0]]), base, known, True)
    np.testing.assert_allclose(imp, [0.5, 2.0])


def test_importance_accumulates_per_row_until_sent_and_sums_columns():
    imp = np.zeros(3)
    base = np.ones((3, 2))
    known = np.zeros(3, dtype=np.int64)
    priority.accumulate_coo(imp, np.array([0, 0, 2]), np.array([0, 1, 1]), np.array([1.0, -2.0, 0.5]), base,
                            known, True)
    priority.accumulate_coo(imp, np.array([0]), np.array([0]), np.array([1.0]), base, known, True)
    np.testing.assert_allclose(imp, [4.0, 0.0, 0.5])


def test_round_robin_covers_every_row_before_repeating():
    pol = priority.make("round_robin")
    cand = np.arange(10)
    seen = []
    for _ in range(4):  # 4 sends of 3 rows: 12 picks over 10 always-dirty rows
        seen.extend(pol.choose(cand, None, 3).tolist())
    assert sorted(seen[:10]) == list(range(10))
    assert seen[10:] == [0, 1]


def test_round_robin_resumes_after_last_sent_row_when_candidates_change():
    pol = priority.make("round_robin")
    assert list(pol.choose(np.array([1, 5, 9]), None, 2)) == [1, 5]
    assert list(pol.choose(np.array([2, 3, 7, 9]), None, 2)) == [7, 9]
    assert list(pol.choose(np.array([2, 3, 7, 9]), None, 2)) == [2, 3]


def test_random_picks_distinct_candidates():
    pol = priority.make("random", seed=3)
    cand = np.arange(100, 200)
    picked = pol.choose(cand, None, 30)
    assert len(set(picked.tolist())) == 30 and set(picked.tolist()) <= set(cand.tolist())


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="unknown priority policy"):
        priority.make("loudest")
