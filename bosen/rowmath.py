"""Row kernels shared by server and client: scatter-adds, gathers and deterministic init.

numba loops instead of ``np.add.at``: they handle duplicate row ids correctly, run without the GIL,
and avoid the temporaries that fancy indexing creates. All kernels are generic over the value dtype.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def scatter_add(dst, rows, src):  # pragma: no cover - compiled
    """dst[rows[i], :] += src[i, :] for every i (duplicates accumulate)."""
    ncols = dst.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(ncols):
            dst[r, j] += src[i, j]


def add_rows(dst: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
    """``scatter_add``, but a run of rows (the usual bulk update) is one vectorized numpy add on a
    slice: about a third faster than the row loop, and it releases the GIL too."""
    lo = run_start(rows)
    if lo >= 0:
        view = dst[lo:lo + rows.shape[0]]
        np.add(view, src, out=view)
    else:
        scatter_add(dst, rows, src)


@njit(nogil=True, cache=True)
def scatter_add_pair(dst1, dst2, rows, src, held):  # pragma: no cover - compiled
    """scatter_add into ``dst1`` and, for rows with ``held[r] >= 0``, into ``dst2``, in one pass over
    ``src`` (update buffer and cache: a row the cache does not hold gets its value, with these
    updates re-applied, when it arrives, so adding to it now would be wasted memory traffic)."""
    ncols = dst1.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        if held[r] >= 0:
            for j in range(ncols):
                v = src[i, j]
                dst1[r, j] += v
                dst2[r, j] += v
        else:
            for j in range(ncols):
                dst1[r, j] += src[i, j]


_EXP_BITS = {4: (np.uint32, np.uint32(0x7F800000)), 8: (np.uint64, np.uint64(0x7FF0000000000000))}


@njit(nogil=True, cache=True)
def _exponents_not_all_set(bits, mask):  # pragma: no cover - compiled
    # A float is NaN or infinite exactly when all its exponent bits are set. A min-reduction over
    # the raw bits vectorizes (about 10x np.isfinite in a loop); no early exit, which would stop that.
    m = mask
    for i in range(bits.shape[0]):
        m = min(m, ~bits[i] & mask)
    return m != 0


def all_finite(values: np.ndarray) -> bool:
    """No NaN or infinity: one vectorized read, no temporary array."""
    if values.dtype.kind != "f":
        return True
    bits = _EXP_BITS.get(values.dtype.itemsize)
    if bits is None:  # float16 (the float16 wire): numba has no float16, numpy is fine for it
        return bool(np.isfinite(values).all())
    return bool(_exponents_not_all_set(np.ascontiguousarray(values).reshape(-1).view(bits[0]), bits[1]))


@njit(nogil=True, cache=True)
def run_start(rows):  # pragma: no cover - compiled
    """``rows[0]`` if ``rows`` is a run ``r, r+1, r+2, ...`` (reads of a range usually are: slices then
    replace fancy indexing, a plain memcpy instead of a gather), else -1."""
    n = rows.shape[0]
    if n == 0:
        return -1
    lo = rows[0]
    for i in range(1, n):
        if rows[i] != lo + i:
            return -1
    return lo


@njit(nogil=True, cache=True)
def stride_start(rows, step):  # pragma: no cover - compiled
    """``rows[0]`` if ``rows`` is ``r, r+step, r+2*step, ...`` (one server's rows of a run), else -1."""
    n = rows.shape[0]
    if n == 0:
        return -1
    lo = rows[0]
    for i in range(1, n):
        if rows[i] != lo + i * step:
            return -1
    return lo


@njit(nogil=True, cache=True)
def _span(a):  # pragma: no cover - compiled
    """(min, max, whether ``a`` is a run ``a[0], a[0]+1, ...``) in one pass."""
    first = lo = hi = a[0]
    run = True
    for i in range(1, a.shape[0]):
        v = a[i]
        if v < lo:
            lo = v
        elif v > hi:
            hi = v
        if v != first + i:
            run = False
    return lo, hi, run


def min_max(a: np.ndarray) -> tuple[int, int]:
    """(min, max) of a non-empty 1-D integer array in one pass (range checks on every message: two
    numpy reductions cost several microseconds each at these sizes)."""
    lo, hi, _ = _span(a)
    return int(lo), int(hi)


def span(rows: np.ndarray) -> tuple[int, int, slice | np.ndarray]:
    """(min, max, ``rows_index(rows)``) of a non-empty 1-D integer array in one pass: what a read
    checks its rows with and then indexes with."""
    lo, hi, run = _span(rows)
    return int(lo), int(hi), slice(int(lo), int(hi) + 1) if run else rows


def rows_index(rows: np.ndarray) -> slice | np.ndarray:
    """``rows`` as an index: a slice when they form a run, else the array itself."""
    lo = run_start(rows)
    return slice(lo, lo + rows.shape[0]) if lo >= 0 else rows


@njit(nogil=True, cache=True)
def unique_kept(rows, keep, mark):  # pragma: no cover - compiled
    """The distinct ``rows`` with ``keep[r]`` set, sorted: ``np.unique(rows)`` filtered by ``keep``
    in one pass (numpy 2's hash-based ``np.unique`` took ~0.5 ms for 5,000 rows, a server's whole
    end-of-clock push of an MF table). ``mark``: a scratch of ``keep``'s length, all False, left so.
    Sorted by a scan of ``mark`` where the rows are dense in it, else by sorting the few."""
    out = np.empty(rows.shape[0], np.int64)
    m = 0
    for j in range(rows.shape[0]):
        r = rows[j]
        if keep[r] and not mark[r]:
            mark[r] = True
            out[m] = r
            m += 1
    if m and m * 16 >= mark.shape[0]:  # dense: the scan is cheaper than a sort
        k = 0
        lo, hi, _ = _span(out[:m])
        for r in range(lo, hi + 1):
            if mark[r]:
                mark[r] = False
                out[k] = r
                k += 1
        return out[:m]
    res = np.sort(out[:m])
    for j in range(m):
        mark[res[j]] = False
    return res


def mask_runs(mask: np.ndarray, most: int) -> list[tuple[int, int]] | None:
    """The runs of True in a boolean ``mask`` as (start, stop) pairs, or None if there are more than
    ``most`` (a caller that can use a few runs of a shared array falls back to a gather)."""
    edges = np.diff(mask.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts = np.flatnonzero(edges == 1)
    if starts.shape[0] > most:
        return None
    return list(zip(starts.tolist(), np.flatnonzero(edges == -1).tolist(), strict=True))


@njit(nogil=True, cache=True)
def scatter_add_csr(dst, rows, indptr, cols, vals):  # pragma: no cover - compiled
    """dst[rows[i], cols[k]] += vals[k] for k in indptr[i]:indptr[i+1]."""
    for i in range(rows.shape[0]):
        r = rows[i]
        for k in range(indptr[i], indptr[i + 1]):
            dst[r, cols[k]] += vals[k]


@njit(nogil=True, cache=True)
def scatter_add_coo(dst, rows, cols, vals):  # pragma: no cover - compiled
    for k in range(rows.shape[0]):
        dst[rows[k], cols[k]] += vals[k]


@njit(nogil=True, cache=True)
def add_rows_from(dst, src, rows):  # pragma: no cover - compiled
    """dst[rows[i]] += src[rows[i]]: re-apply buffered local updates on top of fresh rows."""
    ncols = dst.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(ncols):
            dst[r, j] += src[r, j]


@njit(nogil=True, cache=True)
def take_and_clear(src, rows):  # pragma: no cover - compiled
    """Return (src[rows], its non-zero count) and zero those rows of src, in one pass (flushing an
    update buffer; the count decides dense vs sparse on the wire without another pass). The result
    is a new array: a message can carry it without a copy."""
    ncols = src.shape[1]
    out = np.empty((rows.shape[0], ncols), dtype=src.dtype)
    nnz = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(ncols):
            v = src[r, j]
            out[i, j] = v
            if v != 0:
                nnz += 1
            src[r, j] = 0
    return out, nnz


@njit(nogil=True, cache=True)
def copy_counted(src, dst):  # pragma: no cover - compiled
    """dst[:] = src (2-D, same shape) and the number of non-zeros, or -1 if a value is NaN or
    infinite, in one pass (staging a bulk increment: the check and the count, which later decides
    dense vs sparse on the wire, cost no extra read). For integers ``v - v`` is always 0."""
    nnz = 0
    bad = False
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            v = src[i, j]
            dst[i, j] = v
            nnz += v != 0
            bad |= (v - v) != 0
    return -1 if bad else nnz


@njit(nogil=True, cache=True)
def copy_counted_mirror(src, dst, mirror, held, first, step):  # pragma: no cover - compiled
    """``copy_counted`` (values already checked finite) that also adds row ``i`` of ``src`` to
    ``mirror[first + i * step]`` where ``held`` of that row is >= 0 (read-my-writes: the cache)."""
    nnz = 0
    for i in range(src.shape[0]):
        r = first + i * step
        if held[r] >= 0:
            for j in range(src.shape[1]):
                v = src[i, j]
                dst[i, j] = v
                mirror[r, j] += v
                nnz += v != 0
        else:
            for j in range(src.shape[1]):
                v = src[i, j]
                dst[i, j] = v
                nnz += v != 0
    return nnz


@njit(nogil=True, cache=True)
def add_where_held(dst, lo, src, held):  # pragma: no cover - compiled
    """dst[lo + i] += src[i] for each i where held[lo + i] >= 0."""
    for i in range(src.shape[0]):
        r = lo + i
        if held[r] >= 0:
            for j in range(src.shape[1]):
                dst[r, j] += src[i, j]


@njit(nogil=True, cache=True)
def push_view(delta, dirty, ops, importance, relative, cache, stamp, held, mirror, rows, pos, whole, values,
              base, seen):  # pragma: no cover - compiled
    """A view's push in one pass (client/view.py), of its rows at positions ``pos`` (``whole``: all of
    them, in order): for each such row ``i`` whose ``values[i]`` differ
    from ``base[i]``, add the difference to the update buffer ``delta[rows[i]]`` (marking it
    ``dirty``, counting one inc operation in ``ops`` where counted), its importance Σ|δ| (Σ|δ/x|
    where ``relative``, x the cached value before it) to ``importance`` where scored, and, where
    ``mirror`` (read-my-writes) and the cache holds the row (``held[r] >= 0``), to ``cache[r]``,
    bumping ``stamp[r]``; then ``base[i] = values[i]``. A row nobody else wrote since the view's copy
    (``stamp[r] == seen[i]``) takes the cache's new value into ``values[i]`` and ``base[i]`` and its
    new stamp, so the view stays exactly the cache (no rounding drift) and the next refresh copies
    nothing; any other row gets ``seen[i] = -1`` or keeps its old stamp, so the refresh copies it.
    Returns the number of rows added, or -1 if a difference is NaN or infinite (nothing changed)."""
    cols = values.shape[1]
    if whole:
        if not _differences_finite(values, base):
            return -1
        todo = pos
    else:
        todo = _changed_finite(values, base, pos)
        if todo.shape[0] and todo[0] < 0:
            return -1
    counting = ops.shape[0] > 0
    scoring = importance.shape[0] > 0
    pushed = 0
    for j in range(todo.shape[0]):
        i = todo[j]
        if whole and _same_row(values, base, i, cols):
            continue
        r = rows[i]
        if scoring:
            importance[r] += _row_importance(values, base, cache, i, r, cols, relative and held[r] >= 0)
        into_cache = mirror and held[r] >= 0
        if into_cache and stamp[r] == seen[i]:  # nobody else wrote it: the view takes the cache's value
            _add_take(delta, cache, values, base, i, r, cols)
            stamp[r] += 1
            seen[i] = stamp[r]
        elif into_cache:  # copied anew at the next refresh (its stamp is not the view's)
            _add_mirror(delta, cache, values, base, i, r, cols)
            stamp[r] += 1
        else:
            _add_only(delta, values, base, i, r, cols)
            seen[i] = -1  # the cache lacks this update (no read-my-writes, or not held): copy it anew
        dirty[r] = True
        if counting:
            ops[r] += 1
        pushed += 1
    return pushed


@njit(nogil=True, cache=True)
def _differences_finite(values, base):  # pragma: no cover - compiled
    """No NaN or infinity in ``values - base`` (C-contiguous; for integers ``d - d`` is always 0): one
    flat loop with an integer OR and no early exit, which vectorizes (a 2-D loop with a boolean
    flag took 4x as long)."""
    v = values.reshape(-1)
    b = base.reshape(-1)
    bad = np.uint32(0)
    for j in range(v.shape[0]):
        d = v[j] - b[j]
        bad |= np.uint32((d - d) != 0)
    return bad == 0


@njit(nogil=True, cache=True)
def _changed_finite(values, base, pos):  # pragma: no cover - compiled
    """The positions of ``pos`` whose row of ``values`` differs from ``base``, in one pass that also
    checks ``values - base`` for NaN and infinity (then ``[-1]``)."""
    out = np.empty(pos.shape[0], np.int64)
    m = 0
    bad = np.uint32(0)
    for j in range(pos.shape[0]):
        i = pos[j]
        diff = np.uint32(0)
        for k in range(values.shape[1]):
            d = values[i, k] - base[i, k]
            bad |= np.uint32((d - d) != 0)
            diff |= np.uint32(d != 0)
        out[m] = i
        m += diff
    if bad:
        out[0] = -1
        return out[:1]
    return out[:m]


@njit(nogil=True, cache=True, inline="always")
def _same_row(values, base, i, cols):  # pragma: no cover - compiled
    for k in range(cols):
        if values[i, k] != base[i, k]:
            return False
    return True


@njit(nogil=True, cache=True, inline="always")
def _row_importance(values, base, cache, i, r, cols, rel):  # pragma: no cover - compiled
    """Σ|δ| of row ``i`` (Σ|δ/x| where ``rel``, x = the cached value before the update, |δ| where x = 0),
    as ``priority.accumulate_dense`` counts it."""
    s = 0.0
    for k in range(cols):
        a = abs(float(values[i, k] - base[i, k]))
        if rel:
            x = abs(float(cache[r, k]))
            if x > 0.0:
                a = a / x
        s += a
    return s


@njit(nogil=True, cache=True, inline="always")
def _add_take(delta, cache, values, base, i, r, cols):  # pragma: no cover - compiled
    for k in range(cols):
        d = values[i, k] - base[i, k]
        delta[r, k] += d
        v = cache[r, k] + d
        cache[r, k] = v
        values[i, k] = v
        base[i, k] = v


@njit(nogil=True, cache=True, inline="always")
def _add_mirror(delta, cache, values, base, i, r, cols):  # pragma: no cover - compiled
    for k in range(cols):
        v = values[i, k]
        d = v - base[i, k]
        delta[r, k] += d
        cache[r, k] += d
        base[i, k] = v


@njit(nogil=True, cache=True, inline="always")
def _add_only(delta, values, base, i, r, cols):  # pragma: no cover - compiled
    for k in range(cols):
        v = values[i, k]
        delta[r, k] += v - base[i, k]
        base[i, k] = v


def to_csr(block: np.ndarray, nnz: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Non-zeros of a dense block as (indptr, cols, vals), ``nnz`` of them if known. One compiled
    pass for C-contiguous blocks (an LDA flush: ~400k int32 counts a tick, where ``np.nonzero`` and
    its gathers took a third of the communication thread's flush); numpy for the rest, float16
    blocks (the float16 wire) included, which numba cannot compile."""
    if block.ndim == 2 and block.dtype != np.float16 and block.flags.c_contiguous:
        if nnz is None:
            nnz = int(np.count_nonzero(block))
        indptr = np.empty(block.shape[0] + 1, dtype=np.int64)
        cols = np.empty(nnz, dtype=np.int32)
        vals = np.empty(nnz, dtype=block.dtype)
        if _fill_csr(block, indptr, cols, vals) == nnz:
            return indptr, cols, vals
        # a wrong ``nnz`` (never from count_nonzero of this block): the numpy path below
    r, c = np.nonzero(block)
    indptr = np.zeros(block.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=block.shape[0]), out=indptr[1:])
    return indptr, c.astype(np.int32), block[r, c]


@njit(nogil=True, cache=True)
def _fill_csr(block, indptr, cols, vals):  # pragma: no cover - compiled
    """``to_csr``'s pass into ``cols``/``vals`` sized for the block's non-zeros (counted before):
    returns how many it found, past their size included (then the output is not to be used)."""
    n = 0
    cap = cols.shape[0]
    indptr[0] = 0
    for i in range(block.shape[0]):
        for j in range(block.shape[1]):
            v = block[i, j]
            if v != 0:
                if n < cap:
                    cols[n] = j
                    vals[n] = v
                n += 1
        indptr[i + 1] = n
    return n


@njit(nogil=True, cache=True)
def _mix(x):  # pragma: no cover - compiled
    # splitmix64 finaliser: a counter-based hash, so any server can produce any row on its own
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(nogil=True, cache=True)
def _fill_random(out, global_rows, ncols_total, seed, normal, a, b):  # pragma: no cover - compiled
    two53 = 9007199254740992.0
    base = _mix(np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(1))
    for i in range(global_rows.shape[0]):
        for j in range(out.shape[1]):
            key = np.uint64(global_rows[i]) * np.uint64(ncols_total) + np.uint64(j)
            h1 = _mix(base ^ (key * np.uint64(2) + np.uint64(1)))
            u1 = ((h1 >> np.uint64(11)) + 0.5) / two53
            if normal:
                h2 = _mix(base ^ (key * np.uint64(2) + np.uint64(2)))
                u2 = ((h2 >> np.uint64(11)) + 0.5) / two53
                out[i, j] = a * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
            else:
                out[i, j] = a + (b - a) * u1


def init_rows(init, global_rows: np.ndarray, shape: tuple[int, int], dtype: np.dtype, table_seed: int) -> np.ndarray:
    """Initial values of the given global rows. Deterministic per (seed, row, col), so the result
    does not depend on how many servers share the table."""
    ncols = shape[1]
    out = np.zeros((global_rows.shape[0], ncols), dtype=dtype)
    kind = init.kind
    if kind == "constant":
        out[:] = init.constant
    elif kind == "normal" and init.normal > 0:
        _fill_random(out, global_rows.astype(np.int64), ncols, init.seed * 1000003 + table_seed, True,
                     init.normal, 0.0)
    elif kind == "uniform":
        lo, hi = init.uniform
        _fill_random(out, global_rows.astype(np.int64), ncols, init.seed * 1000003 + table_seed, False, lo, hi)
    elif kind == "file":
        out[:] = _rows_of_file(init.file, global_rows, shape, out.dtype)
    return out


def _rows_of_file(path: str, global_rows: np.ndarray, shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """Rows of a ``.npy`` file holding the whole table; ValueError naming the file if it does not fit."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ValueError(f"init.file: cannot read {path}: {e}") from None
    if arr.shape != tuple(shape):
        raise ValueError(f"init.file: {path} holds an array of shape {arr.shape}; the table is {tuple(shape)}")
    if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
        raise ValueError(f"init.file: {path} holds {arr.dtype} values; the table is {dtype}")
    return np.asarray(arr[global_rows], dtype=dtype)


def grown(a: np.ndarray, n: int, fill: int | float | bool = 0, axis: int = 0) -> np.ndarray:
    """``a`` with ``n`` entries along ``axis`` (0 or 1), the first ones copied, the rest ``fill``: a
    per-row array grown to more rows (a sparse shard's, a client's slots)."""
    shape = list(a.shape)
    old, shape[axis] = shape[axis], n
    out = np.empty(shape, dtype=a.dtype)
    if axis == 0:
        out[:old] = a
        out[old:] = fill
    else:
        out[:, :old] = a
        out[:, old:] = fill
    return out


@njit(nogil=True, cache=True)
def _copy_rows(dst, dst_rows, src, src_rows):  # pragma: no cover - compiled
    for i in range(dst_rows.shape[0]):
        d, s = dst_rows[i], src_rows[i]
        for k in range(dst.shape[1]):
            dst[d, k] = src[s, k]


def copy_rows(dst: np.ndarray, dst_rows: np.ndarray, src: np.ndarray, src_rows: np.ndarray) -> None:
    """``dst[dst_rows[i]] = src[src_rows[i]]`` for every i, in one pass with no temporary (a numpy
    gather then scatter of a moved partition's rows took three times as long): 2-D arrays of one
    dtype, or 1-D ones (then viewed as one column)."""
    if dst.ndim == 1:
        dst, src = dst.reshape(-1, 1), src.reshape(-1, 1)
    _copy_rows(dst, dst_rows, src, src_rows)
