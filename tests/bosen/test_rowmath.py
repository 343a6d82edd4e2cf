"""Row kernels: the finiteness check, scatter-adds (and the slice add for runs) into buffer and cache,
take-and-clear."""

import numpy as np
import pytest

from bosen import rowmath


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_finite_finds_every_non_finite_value(dtype):
    x = np.ones((64, 33), dtype=dtype)
    assert rowmath.all_finite(x)
    for bad in (np.nan, np.inf, -np.inf):
        for pos in (0, 1000, x.size - 1):
            y = x.copy()
            y.reshape(-1)[pos] = bad
            assert not rowmath.all_finite(y), (bad, pos)
    edge = x.copy()
    edge[0, :4] = [np.finfo(dtype).max, -np.finfo(dtype).max, np.finfo(dtype).tiny / 4, -0.0]  # subnormal too
    assert rowmath.all_finite(edge)
    y = x.copy()
    y[3, 1] = np.nan
    assert not rowmath.all_finite(y[:, 1::2])  # non-contiguous views are checked too
    assert rowmath.all_finite(y[:, ::2])  # ... and only what they show
    assert not rowmath.all_finite(np.asfortranarray(y))


def test_all_finite_other_dtypes():
    assert not rowmath.all_finite(np.array([1.0, np.inf], dtype=np.float16))
    assert rowmath.all_finite(np.array([1.0, 2.0], dtype=np.float16))
    assert rowmath.all_finite(np.arange(5))  # integers are always finite
    assert rowmath.all_finite(np.empty((0, 3), dtype=np.float32))


def test_scatter_add_pair_adds_to_the_cache_only_where_it_holds_the_row():
    buf = np.zeros((4, 2), dtype=np.float32)
    cache = np.full((4, 2), 10.0, dtype=np.float32)
    held = np.array([3, -1, 0, -1], dtype=np.int64)
    rows = np.array([0, 1, 1, 2], dtype=np.int64)
    rowmath.scatter_add_pair(buf, cache, rows, np.ones((4, 2), dtype=np.float32), held)
    assert buf[:, 0].tolist() == [1, 2, 1, 0]  # duplicates accumulate
    assert cache[:, 0].tolist() == [11, 10, 11, 10]  # rows 1 and 3 are not cached: untouched


@pytest.mark.parametrize("rows", [[2, 3, 4], [4, 0, 4, 1], [5]])
def test_add_rows_matches_add_at_for_runs_and_scatters(rows):
    rows = np.array(rows, dtype=np.int64)
    dst = np.arange(12, dtype=np.float32).reshape(6, 2)
    src = np.arange(2 * rows.shape[0], dtype=np.float32).reshape(-1, 2) + 0.5
    want = dst.copy()
    np.add.at(want, rows, src)
    rowmath.add_rows(dst, rows, src)
    assert np.array_equal(dst, want)


def test_take_and_clear_returns_the_rows_counts_non_zeros_and_zeroes_them():
    src = np.arange(12, dtype=np.float64).reshape(6, 2)
    out, nnz = rowmath.take_and_clear(src, np.array([0, 2, 5]))
    assert nnz == 5  # src[0, 0] is 0
    assert out.tolist() == [[0, 1], [4, 5], [10, 11]]
    assert not src[[0, 2, 5]].any() and src[1].tolist() == [2, 3]
    assert not np.shares_memory(out, src)


def test_rows_index_is_a_slice_only_for_runs():
    assert rowmath.rows_index(np.arange(5, 9)) == slice(5, 9)
    assert rowmath.rows_index(np.array([7])) == slice(7, 8)
    for not_a_run in ([1, 3], [2, 1], [4, 4], [0, 1, 3]):
        idx = rowmath.rows_index(np.array(not_a_run))
        assert isinstance(idx, np.ndarray) and idx.tolist() == not_a_run
    assert isinstance(rowmath.rows_index(np.zeros(0, np.int64)), np.ndarray)


@pytest.mark.parametrize("rows, want", [([7], (7, 7, slice(7, 8))), ([3, 4, 5, 6], (3, 6, slice(3, 7))),
                                        ([5, 4, 3], (3, 5, None)), ([2, 2, 3], (2, 3, None)),
                                        ([9, 0, 4], (0, 9, None))])
def test_span_gives_min_max_and_the_index_in_one_pass(rows, want):
    a = np.array(rows, dtype=np.int64)
    lo, hi, index = rowmath.span(a)
    assert (lo, hi) == want[:2]
    assert index == want[2] if want[2] is not None else index is a


@pytest.mark.parametrize("n, k", [(1, 0), (10, 30), (5000, 12_000), (100_000, 300), (100_000, 0)])
def test_unique_kept_is_np_unique_filtered(n, k):
    """rowmath.unique_kept: the sorted distinct rows whose keep flag is set, both ways (a scan of the
    scratch where the rows are dense in it, a sort where they are few); the scratch is left clear."""
    rng = np.random.default_rng(n + k)
    rows = rng.integers(0, n, k).astype(np.int64)
    keep = rng.random(n) < 0.7
    mark = np.zeros(n, dtype=bool)
    got = rowmath.unique_kept(rows, keep, mark)
    want = np.unique(rows)
    assert got.dtype == np.int64 and got.tolist() == want[keep[want]].tolist()
    assert not mark.any()


def test_push_view_is_inc_rows_of_the_changes_in_one_pass():
    """rowmath.push_view against what inc_rows does (priority.accumulate_dense, then the scatter into
    buffer and cache): equal importance, buffer and cache; rows without a change left out; a row
    another writer moved (stamp not the view's) keeps the view's values and is copied anew later."""
    from bosen import priority
    from bosen.rowmath import push_view

    rng = np.random.default_rng(3)
    cache = rng.standard_normal((10, 3)).astype(np.float32)
    held = np.array([0, 0, 0, -1, 0, 0, 0, 0, 0, 0])
    stamp = np.arange(10, dtype=np.int64)
    rows = np.array([1, 3, 4, 7])
    base = cache[rows].copy()
    seen = stamp[rows].copy()
    seen[2] = -5  # row 4 was written by someone else since the view's copy
    values = base + rng.standard_normal(base.shape).astype(np.float32)
    values[3] = base[3]  # row 7 unchanged
    want_delta = np.zeros_like(cache)
    want_cache = cache.copy()
    want_imp = np.zeros(10)
    d = values - base
    priority.accumulate_dense(want_imp, rows, d, cache, held, True)
    for i, r in enumerate(rows):
        want_delta[r] += d[i]
        if held[r] >= 0:
            want_cache[r] += d[i]
    delta, dirty, ops, imp = np.zeros_like(cache), np.zeros(10, bool), np.zeros(10, np.int32), np.zeros(10)
    user = values.copy()
    n = push_view(delta, dirty, ops, imp, True, cache, stamp, held, True, rows, np.arange(4), True, values, base, seen)
    assert n == 3
    np.testing.assert_array_equal(delta, want_delta)
    np.testing.assert_array_equal(cache, want_cache)
    np.testing.assert_allclose(imp, want_imp, rtol=1e-12)
    assert dirty.tolist() == [r in (1, 3, 4) for r in range(10)] and ops.tolist() == dirty.astype(int).tolist()
    assert stamp[[1, 3, 4, 7]].tolist() == [2, 3, 5, 7]  # held rows written: bumped
    assert seen.tolist() == [2, -1, -5, 7]  # row 1 took the new stamp; 3 (not held) is copied anew
    np.testing.assert_array_equal(values[0], cache[1])  # the cache's value, not the user's (rounding)
    np.testing.assert_array_equal(base, values)
    np.testing.assert_array_equal(values[1:], user[1:])
    values[0, 0] = np.nan
    assert push_view(delta, dirty, ops, imp, True, cache, stamp, held, True, rows, np.arange(4), True, values, base,
                     seen) == -1
    np.testing.assert_array_equal(delta, want_delta)  # nothing changed
    # positions: only the rows asked for (row 7 at position 3), NaN elsewhere ignored
    values[3, 1] += 1
    want = values[3, 1] - base[3, 1]
    assert push_view(delta, dirty, ops, imp, True, cache, stamp, held, True, rows, np.array([3]), False, values, base,
                     seen) == 1
    assert delta[7, 1] == want and np.isnan(values[0, 0]) and seen[3] == 8


@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64, np.float16])
def test_to_csr_matches_numpys_nonzeros_whatever_the_dtype_and_a_wrong_count(dtype):
    rng = np.random.default_rng(3)
    block = (rng.random((50, 30)) < 0.1) * rng.integers(-5, 6, (50, 30))
    block = block.astype(dtype)
    block[7] = 0  # an empty row
    r, c = np.nonzero(block)
    want_ptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=50))])
    for nnz in (None, int(np.count_nonzero(block)), 3):  # 3: a wrong count falls back, never overruns
        indptr, cols, vals = rowmath.to_csr(block, nnz)
        assert np.array_equal(indptr, want_ptr) and np.array_equal(cols, c) and np.array_equal(vals, block[r, c])
        assert cols.dtype == np.int32 and vals.dtype == block.dtype
    strided = block[:, ::2]  # not C-contiguous: the numpy path
    r2, c2 = np.nonzero(strided)
    assert np.array_equal(rowmath.to_csr(strided)[1], c2)
