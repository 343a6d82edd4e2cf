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
