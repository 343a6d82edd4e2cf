"""Update encoding: buffered increments taken out of a table's update buffer as INC messages.

Everything here runs on the communication thread under the table's lock. Rows are taken out of the
buffer where it keeps them (rows, or slots: client/slots.py) and go on the wire as row ids. A message carries at most
``UpdateBuffer.chunk_rows`` rows (``CHUNK_BYTES`` of values): the server applies one while the next
is on the way, memory peaks stay small, and the lock is held only while a chunk is taken. A chunk is
taken into an array that nothing writes again (a staged piece as it is), so the message carries it
without a copy, and the in-flight log (read-my-writes) keeps that same array.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bosen import rowmath, wire
from bosen.client.oplog import UpdateBuffer
from bosen.client.state import TableState
from bosen.partition import Partition
from bosen.wire import Msg, UpdateBatch

F16_MAX = float(np.finfo(np.float16).max)
BF16_MAX = 3.3895313892515355e38  # the largest finite bfloat16


# One INC message's content: the batch; an array that goes on the wire without a copy (nothing
# writes it again), or None; the ZeroMQ message that array lives in (a staged piece), or None.
# A plain tuple: one is made per update message.
Update = tuple[UpdateBatch, np.ndarray | None, Any]


def inc_header(st: TableState, batch: UpdateBatch) -> dict[str, Any]:
    h = {"t": Msg.INC, "tb": st.index, "n": int(batch.rows.shape[0]), "dt": wire.DTYPE_NAMES[batch.values.dtype],
         "sp": batch.sparse}
    if batch.rel_rows is not None:  # versioned
        h["v"] = True
        h["nr"] = int(batch.rel_rows.shape[0])
    if batch.weights is not None:  # freshness probes: inc operations per row
        h["w"] = True
    return h


def take_chunk(st: TableState, rows: np.ndarray, k: int, server: int, seq: int) -> tuple[Update | None, int]:
    """The next message's updates from ``rows[k:]`` (sorted, all of ``server``), taken out of the
    buffer, and where the rest begins; None if none of those rows is still buffered. ``seq``: the
    number the message will have (read-my-writes logs it as in flight under that number)."""
    oplog = st.oplog
    index: slice | np.ndarray
    piece = oplog.take_piece(rows, k)
    if piece is not None:  # the common case of bulk increments, in O(1)
        rj, index, block, nnz = piece
        k += rj.shape[0]
    else:
        rj, k = next_chunk(oplog, rows, k)
        if rj.shape[0] == 0:
            return None, k
        index = rowmath.rows_index(rj)
        block, nnz = oplog.take_counted(rj, index)
    wire_block, applied = quantize(st, rj, block)
    if st.read_my_writes:
        log_inflight(st, server, seq, rj, index, applied)
    if st.importance is not None:
        st.importance[index] = 0
    st.send_count[index] += 1
    if wire_block is not block:
        nnz = None  # float16 rounding may have zeroed some values
    batch = update_batch(st.row_ids(rj), wire_block, nnz)
    batch.weights = oplog.take_ops(index)
    if batch.sparse:
        return (batch, None, None), k
    if wire_block is block and (frame := oplog.frame_of(block)) is not None:
        return (batch, block, frame), k
    return (batch, wire_block, None), k


def next_chunk(oplog: UpdateBuffer, rows: np.ndarray, k: int) -> tuple[np.ndarray, int]:
    """The next message's rows from ``rows[k:]`` and where the rest begins: only rows still
    buffered (a budgeted send, or a flush that queued them too, may have sent some since), up to
    a chunk of them so that messages stay full, and a staged piece on its own."""
    n, per = rows.shape[0], oplog.chunk_rows
    end = min(k + per, n)
    rj = rows[k:end]
    index = rowmath.rows_index(rj)
    if not oplog.dirty[index].all():
        rj = rj[oplog.dirty[rj]]
        while rj.shape[0] < per and end < n:
            more = rows[end:end + per - rj.shape[0]]
            end += more.shape[0]
            rj = np.concatenate([rj, more[oplog.dirty[more]]])
        if rj.shape[0] == 0:
            return rj, end
        index = rowmath.rows_index(rj)
    cut = oplog.chunk_end(rj, index)
    if cut < rj.shape[0]:
        end = k + int(np.searchsorted(rows[k:end], rj[cut]))
        rj = rj[:cut]
    return rj, end


def log_inflight(st: TableState, server: int, seq: int, rows: np.ndarray, index: slice | np.ndarray,
                 deltas: np.ndarray) -> None:
    """Remember what message ``seq`` to ``server`` adds, for read-my-writes. Without direct reads,
    only for rows the cache holds or has asked for: any later read of another row reaches the server
    after this message (one FIFO socket), so the value it gets back already contains these updates.
    A direct read travels on another socket and may overtake it, so then every update is logged.
    So it is where the cache is bounded (``cache_rows``): an evicted row stays subscribed, so a push
    the server sent before this message may reach the row made again (by an increment) as unknown;
    logged, the update goes back on top, and the row is not evicted until it is acknowledged.
    ``index``: ``rows`` as an index (a slice for a run). ``deltas`` is never written again: the log
    may keep it as it is."""
    if st.direct_reads or st.slot_limit is not None:
        st.inflight[server].add(seq, rows, deltas)
        return
    known = st.cache.known(rows)
    if known == rows.shape[0]:
        st.inflight[server].add(seq, rows, deltas)
    elif known:
        seen = (st.cache.clock[index] >= 0) | st.cache.requested[index]
        st.inflight[server].add(seq, rows[seen], deltas[seen])


def take_versioned(st: TableState, rows: np.ndarray, partition: Partition) -> list[tuple[int, UpdateBatch]]:
    """Versioned table: per server the INCs of the retired updates first (end-of-version), then
    ``rows`` taken from the buffer (tagged with their cached versions), then the releases, which ride
    with the last message to each server. Under ``st.lock``."""
    vlog = st.vlog
    assert vlog is not None
    batches = []
    rr, rt, rv, rw, lr, lt = vlog.take(st.cols, st.dtype)
    cur = st.oplog.take(rows) if rows.shape[0] else np.empty((0, st.cols), dtype=st.dtype)
    cw = st.oplog.take_ops(rows)
    weights = None if cw is None else np.concatenate([rw, cw])
    if rows.shape[0]:
        if st.importance is not None:
            st.importance[rows] = 0
        st.send_count[rows] += 1
    all_rows = np.concatenate([rr, rows])
    tags = np.concatenate([rt, vlog.version[rows]])
    eov = np.zeros(all_rows.shape[0], dtype=wire.EOV_DTYPE)
    eov[:rr.shape[0]] = 1
    block = np.concatenate([rv, cur]) if rr.shape[0] else cur
    rel_parts = partition.split(lr)
    per = st.oplog.chunk_rows
    for j, pos in enumerate(partition.split(all_rows)):
        rpos = rel_parts[j]
        for k in range(0, max(pos.shape[0], 1), per):
            p = pos[k:k + per]
            last = k + per >= pos.shape[0]
            if p.shape[0] == 0 and (rpos.shape[0] == 0 or not last):
                continue
            rj = all_rows[p]
            wire_block, _ = quantize(st, rj, block[p], keep_residual=eov[p] == 0)
            batch = update_batch(st.row_ids(rj), wire_block)
            batch.tags, batch.eov = tags[p], eov[p]
            batch.weights = None if weights is None else weights[p]
            batch.rel_rows, batch.rel_tags = (st.row_ids(lr[rpos]), lt[rpos]) if last else (lr[:0], lt[:0])
            batches.append((j, batch))
    return batches


def quantize(st: TableState, rows: np.ndarray, block: np.ndarray,
             keep_residual: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(what goes on the wire, what the server will add). With a float16 or bfloat16 wire the rounding
    residual goes back into the buffer, so it is sent later rather than lost (except where
    ``keep_residual`` is False: retired updates of a version being released)."""
    if st.wire_dtype == st.dtype:
        return block, block
    if st.wire_dtype == wire.BFLOAT16:
        q = wire.to_bfloat16(np.clip(block, -BF16_MAX, BF16_MAX))
        applied = wire.from_bfloat16(q).astype(st.dtype, copy=False)
    else:
        q = np.clip(block, -F16_MAX, F16_MAX).astype(st.wire_dtype)
        applied = q.astype(st.dtype)
    resid = block - applied
    keep_rows = (resid != 0).any(axis=1)
    if keep_residual is not None:
        keep_rows &= keep_residual
    keep = np.flatnonzero(keep_rows)
    if keep.shape[0]:
        st.oplog.add_dense(rows[keep], resid[keep], count=False)
    return q, applied


def update_batch(rows: np.ndarray, block: np.ndarray, nnz: int | None = None) -> UpdateBatch:
    """Dense rows, or CSR when that is smaller (sparse updates such as topic-count changes)."""
    if nnz is None:
        nnz = int(np.count_nonzero(block))
    if 8 * (rows.shape[0] + 1) + nnz * (4 + block.itemsize) < block.nbytes // 2:
        indptr, cols, vals = rowmath.to_csr(block, nnz)
        return UpdateBatch(rows, vals, indptr, cols)
    return UpdateBatch(rows, block)
