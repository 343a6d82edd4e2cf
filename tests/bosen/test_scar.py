"""bosen.scar: row distances, the rows each policy saves, and the running checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from bosen import scar


def test_l2_distance_per_row() -> None:
    saved = np.zeros((3, 2), np.float32)
    cur = np.array([[3, 4], [0, 0], [1, 0]], np.float32)
    assert scar.row_distance(cur, saved, "l2").tolist() == [5.0, 0.0, 1.0]


def test_tv_distance_is_scaled_by_document_length() -> None:
    saved = np.array([[2, 0], [20, 0], [0, 0]], np.int32)
    cur = np.array([[1, 1], [10, 10], [0, 0]], np.int32)
    d = scar.row_distance(cur, saved, "tv")
    # both rows moved their distribution by TV 0.5; the long document weighs ten times more
    assert d.tolist() == [1.0, 10.0, 0.0]
    assert scar.row_distance(cur, saved, "tv", lengths=np.ones(3)).tolist() == [0.5, 0.5, 0.0]


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="metric"):
        scar.row_distance(np.zeros((2, 2)), np.zeros((2, 2)), "l1")
    with pytest.raises(ValueError, match="shape"):
        scar.row_distance(np.zeros((2, 2)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="fraction"):
        scar.choose("round_robin", 10, 0.0)
    with pytest.raises(ValueError, match="policy"):
        scar.choose("oldest", 10, 0.5)
    with pytest.raises(ValueError, match="distance"):
        scar.choose("priority", 10, 0.5)


def test_priority_chooses_the_true_top_fraction() -> None:
    rng = np.random.default_rng(0)
    d = rng.random(1000)
    rows = scar.choose("priority", 1000, 0.125, distance=d)
    assert rows.shape == (125,)
    assert set(rows.tolist()) == set(np.argsort(-d)[:125].tolist())
    # ties go to the lower rows
    assert scar.choose("priority", 6, 0.5, distance=np.array([1, 2, 2, 2, 2, 0.0])).tolist() == [1, 2, 3]


def test_round_robin_and_random_cover_every_row() -> None:
    ck = scar.RunningCheckpoint(np.zeros((10, 1)), seed=3)
    seen: list[int] = []
    for _ in range(4):
        seen += ck.step("round_robin", np.ones((10, 1)), 0.3).tolist()  # 3 rows a time, wrapping round
    assert seen == [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 9]  # a wrapped block comes back sorted
    r = scar.choose("random", 100, 0.5, rng=np.random.default_rng(1))
    assert r.shape == (50,) and len(set(r.tolist())) == 50 and r.max() < 100


def test_running_checkpoint_starts_at_w0_and_saves_rows() -> None:
    w0 = np.arange(8, dtype=np.float32).reshape(4, 2)
    ck = scar.RunningCheckpoint(w0)
    w0[:] = -1  # the checkpoint holds its own copy
    assert ck.values[0].tolist() == [0.0, 1.0]
    live = np.zeros((4, 2), np.float32)
    live[2] = 100.0
    rows = ck.step("priority", live, 0.25, clock=5)  # row 2 moved farthest
    assert rows.tolist() == [2]
    assert ck.values[2].tolist() == [100.0, 100.0] and ck.saved_clock.tolist() == [0, 0, 5, 0]
    assert ck.rows_saved == 1
    # partial recovery puts back only the lost rows
    live2 = np.full((4, 2), 7.0, np.float32)
    out = ck.recover(live2, np.array([0, 2]))
    assert out.tolist() == [[0, 1], [7, 7], [100, 100], [7, 7]]
    assert live2[0, 0] == 7.0


def test_priority_keeps_the_running_checkpoint_closer_than_round_robin() -> None:
    """With the same bytes saved, the largest remaining row distance is smaller under priority when a
    few rows change much more than the rest (the case SCAR's heuristic is for)."""
    rng = np.random.default_rng(2)
    n = 200
    speed = np.where(rng.random(n) < 0.1, 5.0, 0.1)[:, None]
    cks = {p: scar.RunningCheckpoint(np.zeros((n, 4)), seed=0) for p in scar.POLICIES}
    w = np.zeros((n, 4))
    for clock in range(1, 33):
        w = w + speed * rng.standard_normal((n, 4))
        for p, ck in cks.items():
            ck.step(p, w, 1 / 8, clock)
    dist = {p: float(np.linalg.norm(ck.values - w)) for p, ck in cks.items()}
    assert dist["priority"] < dist["round_robin"] and dist["priority"] < dist["random"]


@pytest.mark.parametrize("policy", scar.POLICIES)
def test_a_running_checkpoint_grows_with_a_sparse_shard(policy: str) -> None:
    """Empty at first (a sparse shard stores nothing yet): a save takes no row. Rows that join are
    saved as the initial values given, new rows are chosen among all, and bad shapes are named."""
    run = scar.RunningCheckpoint(np.empty((0, 2)), "l2")
    assert run.step(policy, np.empty((0, 2)), 0.5).shape == (0,)
    run.extend(np.ones((3, 2)), clock=4)
    np.testing.assert_array_equal(run.values, np.ones((3, 2)))
    assert run.saved_clock.tolist() == [4, 4, 4] and run.n_rows == 3
    live = np.array([[1.0, 1.0], [5.0, 1.0], [1.0, 2.0]])
    rows = run.step(policy, live, 0.4, clock=5)
    assert rows.shape == (1,)
    if policy == "priority":
        assert rows.tolist() == [1]
    np.testing.assert_array_equal(run.values[rows], live[rows])
    with pytest.raises(ValueError, match=r"rows of shape \(3,\), the checkpoint holds \(2,\)"):
        run.extend(np.ones((1, 3)))
