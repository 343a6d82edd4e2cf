"""The update buffer: a run of clean rows is copied in (large ones into staged pieces), anything
else scatter-added; whatever the path, nothing is lost or invented."""

import numpy as np
import pytest

from bosen.client.oplog import UpdateBuffer


def test_update_buffer_adds_whatever_path_it_takes():
    """A run of clean rows is copied, anything else scatter-added; the sums are the same."""
    buf = UpdateBuffer(8, 2, np.dtype(np.float64))
    cache = np.zeros((8, 2))
    held = np.full(8, -1, dtype=np.int64)
    buf.add_dense(np.arange(2, 5), np.ones((3, 2)), cache, held)  # clean run, nothing held: copy
    buf.add_dense(np.arange(3, 6), np.ones((3, 2)), cache, held)  # run with dirty rows: add
    held[6] = 0
    buf.add_dense(np.arange(6, 8), np.full((2, 2), 2.0), cache, held)  # clean run, row 6 held: mirror
    buf.add_dense(np.array([0, 0]), np.ones((2, 2)))  # duplicates, not a run
    assert buf.delta[:, 0].tolist() == [2, 0, 1, 2, 2, 1, 2, 2]
    assert buf.dirty.tolist() == [True, False, True, True, True, True, True, True]
    assert cache[:, 0].tolist() == [0, 0, 0, 0, 0, 0, 2, 0]  # only the held row mirrors


def staging_buffer(rows=64, cols=4, chunk_rows=8, monkeypatch=None, stride=1):
    """A float32 buffer whose pieces are ``chunk_rows`` rows and whose runs of 2+ rows are staged."""
    monkeypatch.setattr("bosen.client.oplog.CHUNK_BYTES", chunk_rows * cols * 4)
    monkeypatch.setattr("bosen.client.oplog.STAGE_MIN_BYTES", 2 * cols * 4)
    return UpdateBuffer(rows, cols, np.dtype(np.float32), stride=stride)


def test_a_bulk_run_is_staged_in_pieces_that_go_out_as_they_are(monkeypatch):
    buf = staging_buffer(monkeypatch=monkeypatch)
    d = np.arange(20 * 4, dtype=np.float32).reshape(20, 4) - 3  # one zero among them
    assert buf.add_dense(np.arange(10, 30), d)
    assert sorted(buf.pieces) == [10, 18, 26]  # cut at chunk_rows, from the run's first row
    assert buf.dirty[10:30].all() and buf.staged[10:30].all() and not buf.delta.any()
    rows = np.arange(10, 30)
    assert buf.chunk_end(rows, slice(10, 30)) == 8  # a piece on its own
    piece = buf.pieces[10][0]
    block, nnz = buf.take_counted(np.arange(10, 18))
    assert block is piece and nnz == 31 and np.array_equal(block, d[:8])
    assert not buf.dirty[10:18].any() and not buf.staged[10:18].any()
    # the same rows again: exactly whole pieces, added in place
    assert buf.add_dense(np.arange(18, 30), np.ones((12, 4), np.float32))
    block, nnz = buf.take_counted(np.arange(18, 26))
    assert np.array_equal(block, d[8:16] + 1) and nnz is None
    assert np.array_equal(buf.take(np.arange(26, 30)), d[16:20] + 1)
    assert not buf.pieces and not buf.dirty.any() and not buf.delta.any()


def test_anything_else_touching_a_staged_row_moves_the_pieces_back_first(monkeypatch):
    buf = staging_buffer(monkeypatch=monkeypatch)
    d = np.ones((16, 4), np.float32)
    buf.add_dense(np.arange(0, 16), d)
    buf.add_coo(np.array([3]), np.array([1]), np.array([5.0], np.float32))
    assert not buf.pieces and not buf.staged.any() and buf.delta[3, 1] == 6 and buf.delta[15, 0] == 1
    buf.add_dense(np.arange(32, 48), d)
    buf.add_dense(np.arange(36, 40), d[:4])  # part of a piece
    assert not buf.pieces and buf.delta[36, 0] == 2 and buf.delta[35, 0] == 1
    buf.add_dense(np.arange(48, 56), d[:8])
    cache = np.zeros((64, 4), np.float32)
    buf.add_buffered_to(cache, np.array([50, 60]))  # a read re-applies buffered updates
    assert not buf.pieces and cache[50, 0] == 1 and cache[60, 0] == 0
    buf.add_dense(np.arange(56, 64), d[:8])
    rows = np.array([1, 57, 58])
    assert buf.chunk_end(rows, rows) == 1  # up to the next staged row
    block = buf.take(np.array([57, 60]))  # part of a piece: moved back, then taken
    assert not buf.pieces and block[:, 0].tolist() == [1, 1] and buf.dirty[56] and not buf.dirty[57]


def test_non_finite_deltas_change_nothing_on_any_path(monkeypatch):
    buf = staging_buffer(monkeypatch=monkeypatch)
    bad = np.ones((16, 4), np.float32)
    bad[9, 2] = np.nan
    assert not buf.add_dense(np.arange(0, 16), bad)  # staged path: checked while copying
    assert not buf.add_dense(np.arange(0, 16) * 2, bad)  # scatter path
    assert not buf.pieces and not buf.dirty.any() and not buf.delta.any()
    buf.add_dense(np.arange(0, 16), np.ones((16, 4), np.float32))
    bad[9, 2] = np.inf
    assert not buf.add_dense(np.arange(0, 16), bad)  # adding to whole pieces
    assert np.array_equal(buf.take(np.arange(0, 16)), np.ones((16, 4), np.float32))


def test_an_exhausted_pool_falls_back_to_the_dense_buffer(monkeypatch):
    monkeypatch.setattr("bosen.client.oplog.POOL_BYTES", 8 * 4 * 4)  # one piece, plus one per server: two
    buf = staging_buffer(monkeypatch=monkeypatch)
    buf.add_dense(np.arange(0, 16), np.ones((16, 4), np.float32))
    buf.add_dense(np.arange(16, 24), np.full((8, 4), 2, np.float32))
    assert sorted(buf.pieces) == [0, 8] and buf.delta[16, 0] == 2
    lent = buf.take(np.arange(0, 8))
    buf.add_dense(np.arange(32, 40), np.ones((8, 4), np.float32))
    assert 32 not in buf.pieces  # the piece taken out is still referenced (a message in flight)
    del lent
    buf.add_dense(np.arange(40, 48), np.ones((8, 4), np.float32))
    assert 40 in buf.pieces  # and is reused once it is not


def test_a_flush_takes_a_whole_piece_its_rows_begin_with_in_one_step(monkeypatch):
    buf = staging_buffer(monkeypatch=monkeypatch, stride=2, chunk_rows=4)
    d = np.arange(16 * 4, dtype=np.float32).reshape(16, 4)
    assert buf.add_dense(np.arange(0, 16), d)  # server 0: pieces at 0 (rows 0..6) and 8 (8..14)
    queued = np.arange(0, 16, 2)
    assert buf.take_piece(queued, 1) is None  # begins mid-piece
    assert buf.take_piece(queued[:3], 0) is None  # holds only part of it
    rows, index, block, nnz = buf.take_piece(queued, 0)
    assert np.array_equal(rows, [0, 2, 4, 6]) and index == slice(0, 8, 2) and np.array_equal(block, d[0:8:2])
    assert not buf.dirty[0:8:2].any() and not buf.staged[0:8:2].any() and buf.dirty[1] and 0 not in buf.pieces
    rows, _, block, _ = buf.take_piece(queued, 4)
    assert np.array_equal(rows, [8, 10, 12, 14]) and np.array_equal(block, d[8:16:2])
    assert buf.take_piece(queued, 0) is None  # already sent


def test_pieces_of_several_servers_hold_every_stride_th_row(monkeypatch):
    buf = staging_buffer(monkeypatch=monkeypatch, stride=3, chunk_rows=4)
    d = np.arange(20 * 4, dtype=np.float32).reshape(20, 4)
    assert buf.add_dense(np.arange(10, 30), d)
    # server 1 owns rows 10, 13, ... 28 (7 rows): pieces at 10 (4 rows) and 22 (3 rows)
    assert sorted(buf.pieces) == [10, 11, 12, 22, 23, 24]
    mine = np.arange(10, 30, 3)
    assert buf.chunk_end(mine, mine) == 4
    block = buf.take(mine[:4])
    assert block is not None and np.array_equal(block, d[0:12:3])
    assert buf.add_dense(np.arange(10, 30), np.ones((20, 4), np.float32)) and not buf.pieces  # 10 went out
    assert np.array_equal(buf.take(np.arange(11, 30, 3)), d[1::3] + 1)


@pytest.mark.parametrize("stride", [1, 2, 3])
def test_random_operations_lose_and_invent_nothing(monkeypatch, stride):
    """Whatever mix of paths: everything taken plus everything still buffered equals everything added."""
    rng = np.random.default_rng(7 + stride)
    buf = staging_buffer(monkeypatch=monkeypatch, stride=stride)
    added = np.zeros((64, 4))
    taken = np.zeros((64, 4))
    cache, mirrored = np.zeros((64, 4), np.float32), np.zeros((64, 4))  # read-my-writes mirror
    held = np.where(rng.random(64) < 0.5, 0, -1)
    lent = []
    for _ in range(600):
        op = rng.random()
        mirror = rng.random() < 0.5
        if op < 0.02:  # the cache got or lost rows
            held = np.where(rng.random(64) < 0.5, 0, -1)
            continue
        if op < 0.4:
            lo = int(rng.integers(0, 60))
            rows = np.arange(lo, min(64, lo + int(rng.integers(1, 20))))
        else:
            rows = rng.integers(0, 64, size=int(rng.integers(1, 6)))
        if op < 0.55:
            d = rng.integers(-3, 4, size=(rows.shape[0], 4)).astype(np.float32)
            assert buf.add_dense(rows, d, cache, held) if mirror else buf.add_dense(rows, d)
            np.add.at(added, rows, d)
            if mirror:
                np.add.at(mirrored, rows[held[rows] >= 0], d[held[rows] >= 0])
        elif op < 0.6:
            rows, cols = rng.integers(0, 64, size=3), rng.integers(0, 4, size=3)
            buf.add_coo(rows, cols, np.ones(3, np.float32))
            np.add.at(added, (rows, cols), 1)
        else:  # a send: the chunking the communication thread does, or an arbitrary subset
            dirty = buf.dirty_rows()
            if rng.random() < 0.7:  # one server's rows: a whole piece if they begin with one, else a chunk
                mine = dirty[dirty % stride == rng.integers(stride)]
                k = int(rng.integers(mine.shape[0])) if mine.shape[0] and rng.random() < 0.2 else 0
                piece = buf.take_piece(mine, k) if mine.shape[0] else None
                if piece is not None:
                    rows, index, block, nnz = piece
                    assert np.array_equal(rows, np.arange(64)[index]) and block.shape[0] == rows.shape[0]
                    assert nnz is None or nnz == np.count_nonzero(block)
                    taken[rows] += block
                    lent.append(block)
                    if len(lent) > 3:
                        lent.pop(0)
                    continue
                rows = mine[:buf.chunk_rows]
                if rows.shape[0]:
                    rows = rows[:buf.chunk_end(rows, rows)]
            else:
                rows = np.sort(rng.choice(64, size=int(rng.integers(1, 10)), replace=False))
                rows = rows[buf.dirty[rows]]
            if rows.shape[0]:
                block, nnz = buf.take_counted(rows)
                assert nnz is None or nnz == np.count_nonzero(block)
                taken[rows] += block
                lent.append(block)
                if len(lent) > 3:
                    lent.pop(0)
    remaining = np.zeros((64, 4))
    rows = buf.dirty_rows()
    if rows.shape[0]:
        remaining[rows] = buf.take(rows)
    assert np.array_equal(taken + remaining, added)
    assert np.array_equal(cache, mirrored)
    assert not buf.delta.any() and not buf.pieces


def test_staging_can_be_off(monkeypatch):
    """Tables whose sends pick rows one by one (budgeted sends, versioned flushes) do not stage."""
    monkeypatch.setattr("bosen.client.oplog.STAGE_MIN_BYTES", 8)
    buf = UpdateBuffer(64, 4, np.dtype(np.float32), staging=False)
    assert buf.add_dense(np.arange(0, 16), np.ones((16, 4), np.float32))
    assert not buf.pieces and buf.delta[15, 0] == 1
    buf = UpdateBuffer(64, 4, np.dtype(np.float32))
    buf.add_dense(np.arange(0, 16), np.ones((16, 4), np.float32))
    assert buf.pieces
    buf.stop_staging()
    assert not buf.pieces and buf.dirty[:16].all() and buf.delta[15, 0] == 1
    buf.add_dense(np.arange(16, 32), np.ones((16, 4), np.float32))
    assert not buf.pieces


def test_inc_operations_are_counted_per_row_and_leave_with_the_rows(monkeypatch):
    """Freshness probes' unit: each call adds one per row it touches, whichever path it takes
    (staged pieces too); taking the rows out returns and resets them; a residual adds none."""
    monkeypatch.setattr("bosen.client.oplog.CHUNK_BYTES", 8 * 4 * 4)
    monkeypatch.setattr("bosen.client.oplog.STAGE_MIN_BYTES", 2 * 4 * 4)
    buf = UpdateBuffer(64, 4, np.dtype(np.float32), ops=True)
    ones = np.ones((20, 4), np.float32)
    buf.add_dense(np.arange(10, 30), ones)  # staged in pieces
    buf.add_dense(np.arange(10, 30), ones)  # added to the pieces
    buf.add_dense(np.array([12, 12]), ones[:2])  # one call: one operation on row 12 (pieces move back)
    buf.add_coo(np.array([40, 40, 41]), np.array([0, 1, 0]), np.ones(3, np.float32))
    assert not buf.add_dense(np.array([1]), np.full((1, 4), np.nan, np.float32))  # refused: not counted
    buf.add_dense(np.array([41]), ones[:1], count=False)  # what the client puts back
    assert buf.ops[10:30].tolist() == [2, 2, 3] + [2] * 17 and buf.ops[40:42].tolist() == [1, 1]
    assert buf.ops[:10].sum() == 0
    assert buf.take_ops(slice(10, 20)).tolist() == [2, 2, 3] + [2] * 7
    assert buf.take_ops(np.array([40, 41])).tolist() == [1, 1]
    assert buf.ops.sum() == 10 * 2  # rows 20..29 still buffered
    off = UpdateBuffer(8, 2, np.dtype(np.float64))
    off.add_dense(np.arange(2), np.ones((2, 2)))
    assert off.take_ops(slice(0, 2)) is None  # not counted: no weights on the wire
