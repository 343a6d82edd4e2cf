"""The update buffer (oplog): increments coalesced per row until they are sent.

A dense delta matrix the size of the table, touched lazily (untouched pages stay unallocated), plus a
dirty flag per row. Coalescing is a scatter-add; taking rows out for a send zeroes them in the same
pass.

Bulk increments take a shorter way. A large increment of a run of clean rows (a layer's gradient, a
block of a matrix) is copied into *staged pieces* instead: arrays of at most one message's rows from a
pool, which later go on the wire as they are. That saves the dense buffer a write, a read and a
zeroing per byte, the bulk of a megabyte update's cost on the client. A staged piece keeps taking
increments of exactly its rows; anything else that touches a staged row (another shape of increment,
a read that re-applies buffered updates, a send of other rows) first moves every piece back into the
dense buffer, which is always correct and rare in practice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from bosen import rowmath
from bosen.bufferpool import BufferPool

CHUNK_BYTES = 1 << 20  # most value bytes in one update message, and so in one staged piece
STAGE_MIN_BYTES = 64 << 10  # smaller runs go to the dense buffer: pyzmq copies such messages anyway
_NO_SCORES = np.zeros(0)  # importance where no policy scores rows (read only)
POOL_BYTES = 64 << 20  # most memory a table's pool keeps for staged pieces (lent or not), at most the table's size


class UpdateBuffer:
    """``stride``: the number of servers. Rows go to servers round-robin, so a piece holds one
    server's rows of a run: ``first, first + stride, first + 2 * stride, ...``. ``staging``: off
    where sends pick rows one by one (budgeted sends by priority, versioned tables' flushes), which
    would move every piece back each time. ``ops`` (freshness probes on): count, per row, the inc
    operations its buffered update coalesces; they leave with it (``take_ops``) as INC weights, so
    the servers count updates in a unit that does not depend on how often the client sends."""

    def __init__(self, rows: int, cols: int, dtype: np.dtype, stride: int = 1, staging: bool = True,
                 ops: bool = False) -> None:
        self.delta = np.zeros((rows, cols), dtype=dtype)
        self.ops = np.zeros(rows if ops else 0, dtype=np.int32)  # inc operations per buffered row
        self.dirty = np.zeros(rows, dtype=bool)  # staged rows are dirty too
        self.staged = np.zeros(rows, dtype=bool)
        self.pieces: dict[int, tuple[np.ndarray, int | None]] = {}  # first row -> (deltas, non-zeros)
        self.stride = stride
        row_bytes = cols * np.dtype(dtype).itemsize
        self.chunk_rows = max(1, CHUNK_BYTES // row_bytes)
        piece_rows = min(self.chunk_rows, -(-rows // stride))
        # enough for the whole table (pieces of one run's tail per server are short), up to POOL_BYTES
        keep = -(-min(POOL_BYTES, rows * row_bytes) // (piece_rows * row_bytes)) + stride
        self._pool = BufferPool((piece_rows, cols), dtype, keep=keep)
        self._stage_min_rows = max(1, -(-STAGE_MIN_BYTES // row_bytes))
        if not staging:
            self.stop_staging()

    def stop_staging(self) -> None:
        self.unstage()
        self._stage_min_rows = 1 << 62  # no run is ever this long

    def grow(self, rows: int) -> None:
        """Room for ``rows`` rows (slots, client/slots.py); staging must be off (pieces name rows)."""
        assert not self.pieces
        self.delta = rowmath.grown(self.delta, rows, 0)
        self.dirty = rowmath.grown(self.dirty, rows, False)
        self.staged = rowmath.grown(self.staged, rows, False)
        if self.ops.shape[0]:
            self.ops = rowmath.grown(self.ops, rows, 0)

    def add_dense(self, rows: np.ndarray, deltas: np.ndarray, mirror: np.ndarray | None = None,
                  held: np.ndarray | None = None, index: slice | np.ndarray | None = None,
                  count: bool = True) -> bool:
        """Buffer ``deltas``; with ``mirror`` (the cache, for read-my-writes) add them there too, in
        the same pass over the deltas, to the rows where ``held`` (the cache's row clocks) is >= 0.
        ``index``: ``rows`` as an index (``rowmath.rows_index``), if known. ``count``: one inc
        operation per row (False for what the client puts back itself: a rounding residual).
        Returns False, having changed nothing, if float deltas contain NaN or infinity (checked in the
        same pass as the copy where there is one)."""
        if index is None:
            index = rowmath.rows_index(rows)
        added = self._add_dense(rows, deltas, mirror, held, index)
        if added and count and self.ops.shape[0]:
            self.ops[index] += 1  # a repeated row of one call: one operation
        return added

    def _add_dense(self, rows: np.ndarray, deltas: np.ndarray, mirror: np.ndarray | None,
                   held: np.ndarray | None, index: slice | np.ndarray) -> bool:
        if self.pieces and self.staged[index].any():
            if type(index) is slice:
                added = self._add_to_pieces(index.start, index.stop, deltas, mirror, held)
                if added is not None:
                    return added
            self.unstage()
        if type(index) is slice and rows.shape[0] >= self._stage_min_rows and not self.dirty[index].any():
            staged = self._stage(index.start, deltas, mirror, held)
            if staged is not None:
                return staged
        if not rowmath.all_finite(deltas):
            return False
        if (type(index) is slice and not self.dirty[index].any()
                and (mirror is None or held is None or (held[index] < 0).all())):
            # a run of clean rows (a clean row's delta is zero) and nothing to mirror: a plain copy,
            # which writes without reading first
            self.delta[index] = deltas
        elif mirror is None:
            rowmath.add_rows(self.delta, rows, deltas)
        else:
            rowmath.scatter_add_pair(self.delta, mirror, rows, deltas, held)
        self.dirty[index] = True
        return True

    def add_view(self, rows: np.ndarray, pos: np.ndarray, whole: bool, values: np.ndarray, base: np.ndarray,
                 seen: np.ndarray, cache: np.ndarray, stamp: np.ndarray, held: np.ndarray, mirror: bool,
                 importance: np.ndarray | None, relative: bool) -> int:
        """Buffer a view's changes ``values - base`` at positions ``pos`` (``whole``: all; ``rows``
        unique) and, with ``mirror``, add them
        to the ``cache`` rows it ``held``, scoring ``importance`` on the way: one compiled pass
        (``rowmath.push_view``, which says what happens to the view). Always the dense buffer: a
        view's rows are a mini-batch's, not a bulk run worth staging (staged rows are moved back
        first). Returns the rows added, or -1 (nothing changed) if a change is NaN or infinite."""
        if self.pieces and self.staged[rows if whole else rows[pos]].any():
            self.unstage()
        return int(rowmath.push_view(self.delta, self.dirty, self.ops, _NO_SCORES if importance is None else importance,
                                     relative, cache, stamp, held, mirror, rows, pos, whole, values, base, seen))

    def add_coo(self, rows: np.ndarray, cols: np.ndarray, deltas: np.ndarray) -> None:
        if self.pieces and self.staged[rows].any():
            self.unstage()
        rowmath.scatter_add_coo(self.delta, rows, cols, deltas)
        self.dirty[rows] = True
        if self.ops.shape[0]:
            self.ops[rows] += 1  # one operation per row the call touches

    def take_ops(self, index: slice | np.ndarray) -> np.ndarray | None:
        """Remove and return the inc operation counts of rows ``index`` (leaving in an update, the
        INC weights), or None where they are not counted. Each row leaves in one message, so each
        operation is counted once; what the client puts back (a residual) counts none."""
        if not self.ops.shape[0]:
            return None
        ops = self.ops[index].copy() if type(index) is slice else self.ops[index]
        self.ops[index] = 0
        return ops

    def dirty_rows(self) -> np.ndarray:
        return np.flatnonzero(self.dirty)

    def add_buffered_to(self, dst: np.ndarray, rows: np.ndarray, index: slice | np.ndarray | None = None) -> bool:
        """``dst[r] += `` what is buffered for row ``r``, for each of ``rows`` (fresh rows from a
        server, with this process's unsent updates put back on top; ``index``: ``rows`` as an index).
        Returns whether any of them had something buffered."""
        index = rows if index is None else index
        if self.pieces and self.staged[index].any():
            self.unstage()
        dirty = self.dirty[index]
        if not dirty.any():
            return False
        rowmath.add_rows_from(dst, self.delta, rows[dirty])
        return True

    def chunk_end(self, rows: np.ndarray, index: slice | np.ndarray) -> int:
        """How many of ``rows`` (sorted, dirty, of one server, at most a chunk; ``index``: them as an
        index) one message should take: a staged piece on its own, or the rows before the next one."""
        if not self.pieces:
            return rows.shape[0]
        staged = self.staged[index]
        if not staged[0]:
            return int(np.argmax(staged)) if staged.any() else rows.shape[0]
        piece = self.pieces.get(int(rows[0]))
        if piece is not None:
            n = piece[0].shape[0]
            if n <= rows.shape[0] and rowmath.stride_start(rows[:n], self.stride) >= 0:
                return n
        return rows.shape[0]  # part of a piece: take() moves the pieces back first

    def take_piece(self, rows: np.ndarray, k: int) -> tuple[np.ndarray, slice, np.ndarray, int | None] | None:
        """Take out the staged piece that ``rows[k:]`` (sorted, unique, of one server) begins with, if
        they hold all of it: (its rows, them as an index, its deltas, their non-zeros); else None."""
        if not self.pieces:
            return None
        first = int(rows[k])
        piece = self.pieces.get(first)
        if piece is None:
            return None
        n = piece[0].shape[0]
        end = k + n
        step = self.stride
        if end > rows.shape[0] or rows[end - 1] != first + (n - 1) * step:
            return None
        return rows[k:end], self._remove_piece(first, n), piece[0], piece[1]

    def _remove_piece(self, first: int, n: int) -> slice:
        """Forget the staged piece of ``n`` rows from row ``first`` (its rows are clean now, the
        caller has its deltas); returns its rows as an index."""
        del self.pieces[first]
        index = slice(first, first + n * self.stride, self.stride)
        self.staged[index] = False
        self.dirty[index] = False
        return index

    def send_pieces_as_frames(self, acked: Sequence[int]) -> None:
        """Make staged pieces inside ZeroMQ messages sent as they are (``BufferPool.send_as_frames``);
        ``acked``: per server, the highest update sequence number it acknowledged."""
        self._pool.send_as_frames(acked)

    def frame_of(self, block: np.ndarray) -> Any:
        """The ZeroMQ message a taken piece lives in (to send as it is), or None."""
        return self._pool.frame(block)

    def carried(self, block: np.ndarray, server: int, seq: int) -> None:
        """Message ``seq`` to ``server`` carries ``block``'s message (``frame_of``)."""
        self._pool.carried(block, server, seq)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Remove and return the buffered deltas of ``rows``."""
        return self.take_counted(rows)[0]

    def take_counted(self, rows: np.ndarray, index: slice | np.ndarray | None = None) -> tuple[np.ndarray, int | None]:
        """Remove and return the buffered deltas of ``rows`` (an array nothing else will write) and
        how many of them are non-zero (None: not known), which decides dense or sparse on the wire.
        A staged piece is returned as it is. ``index``: ``rows`` as an index, if known."""
        if index is None:
            index = rowmath.rows_index(rows)
        if self.pieces and rows.shape[0]:
            first = int(rows[0])
            piece = self.pieces.get(first)
            if (piece is not None and piece[0].shape[0] == rows.shape[0]
                    and rowmath.stride_start(rows, self.stride) >= 0):
                self._remove_piece(first, rows.shape[0])
                return piece
            if self.staged[index].any():
                self.unstage()
        self.dirty[index] = False
        return rowmath.take_and_clear(self.delta, rows)

    def unstage(self) -> None:
        """Move every staged piece into the dense buffer (their rows stay dirty)."""
        step = self.stride
        for first, (block, _) in self.pieces.items():
            rows = slice(first, first + block.shape[0] * step, step)
            self.delta[rows] = block  # a staged row's dense delta is zero
            self.staged[rows] = False
        self.pieces.clear()

    def _stage(self, lo: int, deltas: np.ndarray, mirror: np.ndarray | None, held: np.ndarray | None) -> bool | None:
        """Copy ``deltas`` (rows ``lo``...) into staged pieces (and add them to the ``mirror`` rows
        that are ``held``): True; False if they are not finite (nothing changed); None if the pool
        has too few free buffers (the dense buffer costs more, but a bounded pool bounds the memory
        of a worker that runs far ahead of its sends)."""
        n, step, per = deltas.shape[0], self.stride, self.chunk_rows
        # (first row, position in deltas, rows): one server's rows of the run, a chunk at a time
        parts = [(lo + o + k * step, o + k * step, min(per, len(range(o + k * step, n, step))))
                 for o in range(min(step, n)) for k in range(0, len(range(o, n, step)), per)]
        blocks = []
        for _, _, count in parts:
            block = self._pool.take(count)
            if block is None:
                return None
            blocks.append(block)
        if mirror is not None and held is not None and rowmath.min_max(held[lo:lo + n])[1] >= 0:  # some row is held
            if not rowmath.all_finite(deltas):  # before the cache changes
                return False
            counts = [rowmath.copy_counted_mirror(deltas[at:at + count * step:step], block, mirror, held, first, step)
                      for (first, at, count), block in zip(parts, blocks, strict=True)]
        else:
            counts = [rowmath.copy_counted(deltas[at:at + count * step:step], block)
                      for (_, at, count), block in zip(parts, blocks, strict=True)]
            if min(counts) < 0:
                return False
        for (first, _, _), block, nnz in zip(parts, blocks, counts, strict=True):
            self.pieces[first] = (block, nnz)
        self.staged[lo:lo + n] = True
        self.dirty[lo:lo + n] = True
        return True

    def _add_to_pieces(self, lo: int, hi: int, deltas: np.ndarray, mirror: np.ndarray | None,
                       held: np.ndarray | None) -> bool | None:
        """Add to staged pieces (and the ``held`` rows of ``mirror``) if rows ``lo:hi`` are exactly
        whole pieces (else None); False if the deltas are not finite (nothing added)."""
        step = self.stride
        found = []
        for first in range(lo, min(lo + step, hi)):
            while first < hi:
                piece = self.pieces.get(first)
                if piece is None or first + (piece[0].shape[0] - 1) * step >= hi:
                    return None
                found.append((first, piece[0]))
                first += piece[0].shape[0] * step
        if not rowmath.all_finite(deltas):
            return False
        for first, block in found:
            at = first - lo
            np.add(block, deltas[at:at + block.shape[0] * step:step], out=block)
            self.pieces[first] = (block, None)
        if mirror is not None:
            rowmath.add_where_held(mirror, lo, deltas, held)
        return True

    @property
    def staged_bytes(self) -> int:
        """Bytes of increments waiting in staged pieces."""
        return sum(b.nbytes for b, _ in self.pieces.values())

    def pool_stats(self) -> dict[str, int]:
        """The piece pool: memory it holds, pieces lent from reused buffers, and bulk increments
        that went to the dense buffer because every buffer was lent."""
        p = self._pool
        return {"pool_bytes": p.nbytes, "pool_reused": p.reused, "pool_refused": p.refused}


class InflightLog:
    """Updates sent to one server that its values may not contain yet (read-my-writes).

    Each entry is (sequence number, sorted rows, deltas). A value from the server says which of our
    sequence numbers it has applied; older entries are dropped, newer ones are added back on top.
    """

    def __init__(self) -> None:
        self.entries: deque[tuple[int, np.ndarray, np.ndarray]] = deque()
        self.settled = -1  # the highest "applied" seen: any later answer from the server says at least this
        self._pins: list[int] = []

    def add(self, seq: int, rows: np.ndarray, deltas: np.ndarray) -> None:
        self.entries.append((seq, rows, deltas))

    def settle(self, applied: int) -> None:
        if applied > self.settled:
            self.settled = applied
        if self._pins:
            applied = min(applied, min(self._pins))
        while self.entries and self.entries[0][0] <= applied:
            self.entries.popleft()

    def pin(self) -> int:
        """Keep every entry after what is settled now, until ``unpin``: a direct read's answer will
        say at least this much is applied, but may arrive after answers that say more."""
        self._pins.append(self.settled)
        return self.settled

    def unpin(self, floor: int) -> None:
        self._pins.remove(floor)

    def reapply(self, dst: np.ndarray, rows: np.ndarray, applied: int) -> bool:
        """Add to ``dst`` (fresh ``rows`` whose values contain our updates up to ``applied``) the
        logged updates after ``applied`` (entries up to it may be kept for a pinned read); returns
        whether any touched ``rows``."""
        added = False
        for seq, erows, deltas in self.entries:
            if seq <= applied:
                continue
            pos = np.searchsorted(erows, rows)
            pos[pos == erows.shape[0]] = 0
            hit = erows[pos] == rows
            if hit.any():
                rowmath.scatter_add(dst, rows[hit], deltas[pos[hit]])
                added = True
        return added

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes + d.nbytes for _, r, d in self.entries)
