"""Incremental reads (``Table.view``, client/view.py) against real servers: every writer of the cache
moves a row's stamp, a refresh copies exactly the rows that moved, and ``refresh; compute; push``
leaves the tables bit for bit as ``get_rows; compute; inc_rows(new - old)``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ahead_reader, wait_until, worker

from bosen.client import Client


@pytest.mark.timeout(60)
def test_every_cache_writer_moves_the_stamp_and_a_refresh_copies_just_those_rows(bosen_cluster):
    """ROWS receipt, dense increments (scatter into buffer and cache; a staged bulk run; more of the
    same staged run), sparse increments, another view's push: each moves the stamps of the rows it
    wrote, and a view's refresh then copies exactly those rows, equal to get_rows."""
    cols = 4096  # a run of 16 rows is 256 KiB: staged (client/oplog.py STAGE_MIN_BYTES)
    c = bosen_cluster(1, workers=1, staleness=0, tables={"W": {"rows": 64, "cols": cols, "dtype": "float32"}})
    client = Client.connect(c.path, rank=0)
    try:
        W = client.table("W")
        stamp = W._st.cache.stamp
        rows = np.arange(0, 64, 3)  # every third row: 0, 3, ..., 63
        v = W.view(rows)
        assert v.seen.tolist() == [-1] * rows.shape[0]
        v.refresh()  # a blocking read: ROWS receipts
        assert v.copied == rows.shape[0] and (stamp[rows] > 0).all()
        np.testing.assert_array_equal(v.values, W.get_rows(rows))
        v.refresh()
        assert v.copied == 0  # nothing wrote them

        def moved(write, want_rows) -> None:
            before = stamp.copy()
            write()
            changed = np.flatnonzero(stamp != before)
            assert set(want_rows) <= set(changed.tolist()), (want_rows, changed)
            v.refresh()
            assert v.copied == len(set(want_rows) & set(rows.tolist())), (want_rows, v.copied)
            np.testing.assert_array_equal(v.values, W.get_rows(rows))

        moved(lambda: W.inc_rows(np.array([3, 9]), np.full((2, cols), 0.5, np.float32)), [3, 9])
        assert not W._st.oplog.pieces
        moved(lambda: W.inc_rows(np.arange(16, 32), np.full((16, cols), 0.25, np.float32)), range(18, 32, 3))
        assert W._st.oplog.pieces  # staged: copy_counted_mirror wrote the cache
        moved(lambda: W.inc_rows(np.arange(16, 32), np.full((16, cols), 0.25, np.float32)), range(18, 32, 3))
        assert W._st.oplog.pieces  # still staged: add_where_held wrote the cache
        moved(lambda: W.inc_rows(np.array([33, 33, 6]), np.array([1.0, 2.0, 3.0], np.float32),
                                 cols=np.array([0, 1, 2])), [33, 6])
        other = W.view(np.array([12, 13]))
        other.refresh()
        other.values += 1

        moved(other.push, [12])
        client.clock()  # the updates leave; the server's clock makes the rows fresh (no values sent back)
        v.refresh()
        assert v.copied == 0
        np.testing.assert_array_equal(v.values, W.get_rows(rows))
    finally:
        client.close()
    c.check()


def test_a_rows_receipt_moves_the_stamps_of_the_rows_it_wrote():
    """apply_rows, both ways: a run taken as it came, and rows of which some were newer already."""
    from bosen import config as config_mod
    from bosen.client.receive import apply_rows
    from bosen.client.state import TableState

    cfg = config_mod.load({"cluster": {"workers": 1, "servers": ["127.0.0.1:9000"]},
                           "tables": {"W": {"rows": 6, "cols": 2, "dtype": "int64"}}})
    st = TableState(0, cfg.tables[0], 0, 1, cfg.comm)
    apply_rows(st, 0, {"c": 3, "a": -1, "ss": 7}, np.array([1, 2]), np.full((2, 2), 30, np.int64))
    assert st.cache.stamp.tolist() == [0, 1, 1, 0, 0, 0]
    apply_rows(st, 0, {"c": 2, "a": -1, "ss": 5}, np.array([0, 1, 2, 4]), np.full((4, 2), 20, np.int64))
    assert st.cache.stamp.tolist() == [1, 1, 1, 0, 1, 0]  # rows 1, 2 kept their newer values


@pytest.mark.timeout(90)
@pytest.mark.parametrize("comm", [None, {"enabled": True, "priority": "relative", "client_bandwidth_mbps": 50,
                                         "server_bandwidth_mbps": 50}], ids=["bsp", "managed"])
@pytest.mark.parametrize("positions", [False, True], ids=["per-batch", "one-view-at"])
def test_view_equals_get_rows_and_inc_rows_bit_for_bit(bosen_cluster, comm, positions, tmp_path):
    """Two identical float32 tables, one process: A through get_rows / inc_rows(new - old), B through
    views kept across clocks (overlapping mini-batches, several per clock, plus plain increments of
    B's rows outside the views and a second view over some of the same rows). Updates that do not
    round-trip (x * 0.9 + noise) would show any drift: every refresh must equal A's read, and the
    (``positions``: one view of every row, each batch refreshing and pushing its rows with ``at``)
    servers' tables must end equal (bit for bit where each clock's updates leave in one message: a
    server adds floats in the order they come)."""
    rows, cols = 300, 8
    init = tmp_path / "init.npy"
    np.save(init, np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32))
    c = bosen_cluster(2, workers=2, staleness=1, comm=comm, tables={
        "A": {"rows": rows, "cols": cols, "dtype": "float32", "init": {"file": str(init)}},
        "B": {"rows": rows, "cols": cols, "dtype": "float32", "init": {"file": str(init)}}})
    reader = ahead_reader(c.path, 1, 40)
    client = Client.connect(c.path, rank=0)
    try:
        A, B = client.table("A"), client.table("B")
        np.testing.assert_array_equal(A.get_rows(np.arange(rows)), B.get_rows(np.arange(rows)))
        rng = np.random.default_rng(5)
        batches = [np.unique(rng.integers(0, rows, 60)) for _ in range(6)]
        big = B.view(np.arange(rows))  # positions are then the rows
        views = [big if positions else B.view(b) for b in batches]
        copied = []
        for tick in range(10):
            for b, v in zip(batches, views, strict=True):
                at = b if positions else None
                a = A.get_rows(b)
                got = v.refresh(at)
                np.testing.assert_array_equal(got[b] if positions else got, a, err_msg=f"tick {tick}")
                copied.append(v.copied)
                noise = rng.standard_normal(a.shape).astype(np.float32) * np.float32(0.01)
                new = a * np.float32(0.9) + noise
                new[::4] = a[::4]  # some rows unchanged: left out of the push
                A.inc_rows(b, new - a)
                if positions:
                    v.values[b] = new
                else:
                    v.values[:] = new
                assert v.push(at) == int((new != a).any(axis=1).sum())
            extra = np.unique(rng.integers(0, rows, 20))  # writes outside the views
            d = rng.standard_normal((extra.shape[0], cols)).astype(np.float32)
            A.inc_rows(extra, d)
            B.inc_rows(extra, d)
            client.clock()
            if comm is None:  # each clock's sum in one message, as the servers add floats in arrival order
                wait_until(lambda: not (A._st.oplog.dirty.any() or B._st.oplog.dirty.any()))
        assert min(copied[len(batches):]) < max(batches[0].shape[0], 1)  # refreshes skipped unchanged rows
        client.close()
        client = None
        final_a, final_b = reader.table("A").get_rows(np.arange(rows)), reader.table("B").get_rows(np.arange(rows))
        if comm is None:
            np.testing.assert_array_equal(final_a, final_b)
        else:  # budgeted sends leave at times of their own: the servers' float sums may round apart
            np.testing.assert_allclose(final_a, final_b, rtol=1e-5, atol=1e-6)
    finally:
        if client is not None:
            client.close()
        reader.close()
    c.check()


@pytest.mark.timeout(30)
def test_view_rejects_bad_rows_and_changes(bosen_cluster):
    c = bosen_cluster(1, workers=1, tables={"F": {"rows": 8, "cols": 2, "dtype": "float32"}})
    client = Client.connect(c.path)
    try:
        F = client.table("F")
        with pytest.raises(ValueError, match="unique"):
            F.view([1, 2, 1])
        with pytest.raises(IndexError, match="out of range"):
            F.view([3, 8])
        v = F.view([1, 2])
        v.refresh()
        v.values[1, 0] = np.inf
        with pytest.raises(ValueError, match="NaN or infinity"):
            v.push()
        assert not F._st.oplog.dirty.any()  # nothing added
        v.values = v.values[:, :1]
        with pytest.raises(ValueError, match="C-contiguous"):
            v.push()
        v.values = v.base.copy()
        ro = F.view([1, 2], base=False)
        ro.refresh()
        ro.values[0, 0] = 5.0
        with pytest.raises(ValueError, match="only reads"):
            ro.push()
        v.values[1, 0] = 2.0
        assert v.push() == 1
        np.testing.assert_array_equal(F.get_rows(np.array([1, 2])), [[0, 0], [2, 0]])
    finally:
        client.close()
    c.check()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("comm", [None, {"enabled": True, "priority": "absolute", "client_bandwidth_mbps": 20,
                                         "server_bandwidth_mbps": 20, "client_send_rows": 4, "server_push_rows": 4}],
                         ids=["bsp", "managed"])
def test_views_stay_the_cache_under_other_processes_pushes(bosen_cluster, bosen_procs, tmp_path, comm):
    """Three processes push into the same rows through views (positions) and plain increments while
    the servers push the others' updates back (mid-clock under managed communication): every row a
    view holds at the cache's stamp equals the cache, after every refresh and push, and the final
    table is the exact sum of every process's increments (tests/workers/view_worker.py)."""
    procs, ticks = 3, 8
    c = bosen_cluster(2, workers=procs + 1, staleness=1, comm=comm, read_timeout_s=30,
                      tables={"I": {"rows": 24, "cols": 3, "dtype": "int64"}})
    reader = ahead_reader(c.path, procs, ticks + 3)
    try:
        ws = [worker(bosen_procs, "view_worker.py", c.path, "--ticks", ticks, "--seed", 7,
                     "--result", tmp_path / f"v-{i}.json", name=f"view-{i}") for i in range(procs)]
        assert bosen_procs.wait_all(ws, timeout=100) == [0] * procs, "\n".join(p.tail() for p in ws)
        results = [json.loads((tmp_path / f"v-{i}.json").read_text()) for i in range(procs)]
        for r in results:
            assert r["violations"] == [], f"process {r['rank']}: {r['violations'][:5]}"
            assert r["checks"] == ticks * 4 * 2
        want = np.sum([np.array(r["total"]) for r in results], axis=0)
        np.testing.assert_array_equal(reader.table("I").get_rows(np.arange(24)), want)
    finally:
        reader.close()
    c.check()


@pytest.mark.timeout(90)
def test_view_equals_get_rows_and_inc_rows_on_every_kind_of_table(bosen_cluster):
    """Tables without read-my-writes (turned off, or a procedure's: sgd) and versioned ones
    (adarevision: the push goes through inc_rows) behave through a view as through get_rows and
    inc_rows: each pair of twin tables, one each way, reads alike at every step and ends alike."""
    kinds = {"A": {}, "Q": {"read_my_writes": False}, "S": {"update": "sgd", "update_args": {"lr": 0.5}},
             "V": {"update": "adarevision"}}
    tables = {f"{k}{i}": {"rows": 6, "cols": 2, "dtype": "float64", **extra} for k, extra in kinds.items()
              for i in (1, 2)}
    c = bosen_cluster(2, workers=2, staleness=0, tables=tables, read_timeout_s=30)
    reader = ahead_reader(c.path, 1, 12)
    client = Client.connect(c.path, rank=0)
    try:
        rows = np.arange(6)
        assert client.table("V1").versioned and not client.table("S1").read_my_writes
        pairs = [(client.table(f"{k}1"), client.table(f"{k}2")) for k in kinds]
        views = [T2.view(rows) for _, T2 in pairs]
        rng = np.random.default_rng(3)
        for tick in range(8):
            for (T1, _), v in zip(pairs, views, strict=True):
                a = T1.get_rows(rows)
                np.testing.assert_array_equal(v.refresh(), a, err_msg=f"{T1.name} tick {tick}")
                new = a + rng.standard_normal((6, 2))
                new[tick % 6] = a[tick % 6]
                T1.inc_rows(rows, new - a)
                v.values[:] = new
                v.push()
            client.clock()
            wait_until(lambda: not any(T._st.oplog.dirty.any() for pair in pairs for T in pair))
        client.close()
        client = None
        for k in kinds:
            np.testing.assert_array_equal(reader.table(f"{k}1").get_rows(rows), reader.table(f"{k}2").get_rows(rows),
                                          err_msg=k)
    finally:
        if client is not None:
            client.close()
        reader.close()
    c.check()
