"""The Criteo-shaped generator: deterministic by seed and by sample index (shards need no
coordination), the shapes and dtypes DLRM takes, Zipf-skewed ids, and a teacher whose AUC is known."""

from __future__ import annotations

import numpy as np
import pytest

from bosen.apps.pytorch.examples import criteo as C

SPEC = C.CriteoSpec(max_rows=5000, seed=3)


def test_same_seed_same_samples_whoever_generates_them():
    a = C.generate(SPEC, 0, 3000)
    b = C.generate(SPEC, 0, 3000)
    for x, y in zip((a.dense, a.ids, a.labels, a.prob), (b.dense, b.ids, b.labels, b.prob), strict=True):
        np.testing.assert_array_equal(x, y)
    # three workers' shards, each made alone, are the whole set in order
    parts = [C.shard(SPEC, r, 3, 3000) for r in range(3)]
    assert [len(p) for p in parts] == [1000, 1000, 1000]
    np.testing.assert_array_equal(np.concatenate([p.ids for p in parts]), a.ids)
    np.testing.assert_array_equal(np.concatenate([p.labels for p in parts]), a.labels)
    # a range across a chunk boundary equals the same samples out of a larger range
    mid = C.generate(SPEC, C.CHUNK - 5, C.CHUNK + 5)
    big = C.generate(SPEC, C.CHUNK - 100, C.CHUNK + 100)
    np.testing.assert_array_equal(mid.ids, big.ids[95:105])
    np.testing.assert_array_equal(mid.dense, big.dense[95:105])
    # another seed, or the held-out stream, is other data
    assert not np.array_equal(C.generate(C.CriteoSpec(max_rows=5000, seed=4), 0, 3000).ids, a.ids)
    assert not np.array_equal(C.generate(SPEC, 0, 3000, C.HELDOUT).ids, a.ids)


def test_shapes_dtypes_and_ranges():
    s = C.generate(SPEC, 0, 2000)
    assert s.dense.shape == (2000, 13) and s.dense.dtype == np.float32
    assert s.ids.shape == (2000, 26) and s.ids.dtype == np.int64
    assert s.labels.shape == (2000,) and s.labels.dtype == np.float32 and set(np.unique(s.labels)) <= {0.0, 1.0}
    assert SPEC.cardinalities == tuple(min(r, 5000) for r in C.KAGGLE_ROWS)
    assert (s.ids >= 0).all() and (s.ids < np.array(SPEC.cardinalities)).all()
    assert np.isfinite(s.dense).all() and abs(float(s.dense.mean())) < 0.5 and 0.5 < float(s.dense.std()) < 1.5
    assert 0.2 < float(s.labels.mean()) < 0.3  # ctr 0.25
    assert len(C.generate(SPEC, 5, 5)) == 0


def test_ids_follow_a_zipf_law():
    spec = C.CriteoSpec(max_rows=100_000, zipf=1.1)
    ids = C.generate(spec, 0, 100_000).ids[:, 2]  # C3: 10M ids in Criteo, capped at 100k
    counts = np.sort(np.bincount(ids, minlength=100_000))[::-1]
    assert counts[0] > 0.05 * ids.size  # the hottest id alone has > 5% of the samples
    # count(rank) ~ rank^-1.1: the slope of log count against log rank over ranks 1..100
    slope = np.polyfit(np.log(np.arange(1, 101)), np.log(counts[:100]), 1)[0]
    assert -1.3 < slope < -0.9, slope
    assert np.count_nonzero(counts) > 10_000  # and a long tail of rare ids
    flat = C.generate(C.CriteoSpec(max_rows=100_000, zipf=0.3), 0, 100_000).ids[:, 2]
    assert np.bincount(flat).max() < 0.01 * flat.size


def test_teacher_auc_is_well_above_chance_and_below_one():
    t = C.teacher_auc(SPEC, 50_000)
    assert 0.75 < t < 0.9, t
    s = C.generate(SPEC, 0, 50_000, C.HELDOUT)
    assert C.auc(s.prob, s.labels) == pytest.approx(t)
    assert C.auc(-s.prob, s.labels) == pytest.approx(1 - t)
    assert abs(C.auc(np.random.default_rng(0).random(len(s)), s.labels) - 0.5) < 0.02
    # sharper teacher, higher ceiling
    assert C.teacher_auc(C.CriteoSpec(max_rows=5000, seed=3, teacher_scale=8.0), 50_000) > t + 0.03


def test_auc_counts_ties_as_one_half_and_bad_arguments_are_named():
    assert C.auc(np.array([1.0, 1.0, 0.0, 2.0]), np.array([1, 0, 0, 1])) == pytest.approx(0.875)
    assert np.isnan(C.auc(np.array([0.1, 0.2]), np.array([1, 1])))
    with pytest.raises(ValueError, match="zipf"):
        C.CriteoSpec(zipf=0)
    with pytest.raises(ValueError, match="rows: expected 26"):
        C.CriteoSpec(rows=(10, 20))
    with pytest.raises(ValueError, match="rank 2 of 2"):
        C.shard(SPEC, 2, 2, 100)
