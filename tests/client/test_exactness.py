"""Exactness under managed communication (issue 27, point 4), as property tests.

With budgeted early sends and pushes at a high budget, chunked into a few rows per message, float16
on the wire, 2-4 servers and seeded random timing, every value a worker reads must be a server value
plus exactly this process's updates not yet in it, and the servers' final tables must be exact.
tests/workers/exact_worker.py says what each worker checks at every read; here: every worker ends
with zero violations, early sends and pushes did happen, and a client whose cache starts empty
reads the exact sums of every process's updates.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from conftest import WORKERS, worker

from bosen.client import Client

sys.path.insert(0, str(WORKERS))
import exact_worker as ew  # noqa: E402  (tests/workers is not a package)
import wide_worker  # noqa: E402


def comm(mbps: float, send_rows: int, push_rows: int, wire: str, priority: str) -> dict:
    return {"enabled": True, "client_bandwidth_mbps": mbps, "server_bandwidth_mbps": mbps,
            "client_send_rows": send_rows, "server_push_rows": push_rows, "wire_dtype": wire,
            "priority": priority}


# (servers, processes, staleness, int dtype, comm, seed, ticks[, residual])
CASES: dict[str, tuple] = {
    "2srv-2p-s1-int64-f16": (2, 2, 1, "int64", comm(2000, 2, 2, "float16", "relative"), 1, 6),
    "3srv-3p-s0-int32-f32": (3, 3, 0, "int32", comm(5000, 1, 3, "float32", "random"), 2, 8),
    "4srv-3p-s2-int64-f16": (4, 3, 2, "int64", comm(1000, 3, 1, "float16", "absolute"), 3, 10),
    "3srv-2p-s1-int64-f16-residual": (3, 2, 1, "int64", comm(2000, 2, 2, "float16", "round_robin"), 6, 8, True),
    # budgeted pushes to the last tick's readers rather than to every subscriber (comm.push_to)
    "2srv-2p-s1-int64-f16-readers": (2, 2, 1, "int64",
                                     {**comm(2000, 2, 2, "float16", "relative"), "push_to": "readers"}, 1, 6),
}
FAST = "2srv-2p-s1-int64-f16"


def run_exactness(bosen_cluster, bosen_procs, tmp_path, servers, procs, staleness, int_dtype, comm_cfg, seed,
                  ticks, residual=False, max_sleep_ms=6.0, storage="dense", cache_rows=None, send_rows=False):
    cols = procs + 1
    extra = {} if cache_rows is None else {"cache_rows": cache_rows}
    c = bosen_cluster(servers, workers=procs + 1, staleness=staleness, comm=comm_cfg, read_timeout_s=30,
                      tables={"I": {"rows": ew.ROWS, "cols": cols, "dtype": int_dtype, "storage": storage, **extra},
                              "F": {"rows": ew.ROWS, "cols": cols, "dtype": "float32", "storage": storage,
                                    **extra}})
    # rank `procs` reads the final tables: it joins first and clocks far ahead at once, so it never
    # holds the job back, and reads only after every worker has left
    reader = Client.connect(c.path, rank=procs)
    try:
        for _ in range(ticks + staleness + 1):
            reader.clock()
        flags = (["--residual"] if residual else []) + (["--send-rows"] if send_rows else [])
        ws = [worker(bosen_procs, "exact_worker.py", c.path, "--procs", procs, "--ticks", ticks, "--seed", seed,
                     "--max-sleep-ms", max_sleep_ms, "--result", tmp_path / f"r-{i}.json", *flags, name=f"exact-{i}")
              for i in range(procs)]
        codes = bosen_procs.wait_all(ws, timeout=100)
        assert codes == [0] * procs, "\n".join(f"{p.name} exit {p.returncode}:\n{p.tail()}" for p in ws)
        results = [json.loads((tmp_path / f"r-{i}.json").read_text()) for i in range(procs)]
        assert sorted(r["rank"] for r in results) == list(range(procs))
        for r in results:
            assert r["violation_count"] == 0, f"process {r['rank']}: {r['violations'][:10]}"
            assert r["reads"] >= ticks
        assert sum(r["rows_sent_budgeted"] for r in results) > 0, "no budgeted send happened"
        assert sum(r["rows_pushed_to_us"] for r in results) > 0, "no push happened"
        if send_rows:
            assert all(r["rows_sent_early"] > 0 for r in results), "no partial flush happened"

        # every process's own updates, as it recorded them, against what a fresh cache reads
        for name in "IF":
            want = np.sum([np.array(r["totals"][name]) for r in results], axis=0)
            got = reader.table(name).get_rows(np.arange(ew.ROWS))
            np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=f"final table {name}")
            assert (want == np.sum([_schedule_totals(seed, q, procs, ticks, name, residual)
                                    for q in range(procs)], axis=0)).all()
        for s in c.status():
            assert s["errors"] == 0
    finally:
        reader.close()
    c.check()
    return results


def _schedule_totals(seed: int, q: int, procs: int, ticks: int, table: str, residual: bool) -> np.ndarray:
    out = np.zeros((ew.ROWS, procs + 1))
    for (tb, r, col), ups in ew.cell_updates(ew.schedule(seed, q, procs, ticks, 6.0, residual), procs).items():
        if tb == table:
            out[r, col] = sum(v for _, v in ups)
    return out


@pytest.mark.timeout(60)
def test_exact_reads_and_final_tables_fast(bosen_cluster, bosen_procs, tmp_path):
    run_exactness(bosen_cluster, bosen_procs, tmp_path, *CASES[FAST])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", [FAST, "2srv-2p-s1-int64-f16-readers"])
def test_exact_reads_and_final_tables_on_sparse_tables(bosen_cluster, bosen_procs, tmp_path, case):
    """The same properties where the servers store only the rows touched (storage: sparse)."""
    run_exactness(bosen_cluster, bosen_procs, tmp_path, *CASES[case], storage="sparse")


@pytest.mark.timeout(60)
def test_exact_reads_and_final_tables_with_partial_flushes(bosen_cluster, bosen_procs, tmp_path):
    """The same properties where every increment's rows are sent at once (``Table.send_rows``, as
    PSModule's overlap does per bucket), beside budgeted sends and the end-of-tick flush: an update
    leaves once, before its tick's CLOCK."""
    run_exactness(bosen_cluster, bosen_procs, tmp_path, *CASES[FAST], send_rows=True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("storage", ["dense", "sparse"])
def test_exact_reads_and_final_tables_with_a_small_client_cache(bosen_cluster, bosen_procs, tmp_path, storage):
    """The same properties where each process caches at most 4 of the 12 rows (cache_rows): rows are
    evicted and read again all the time, and a read-my-writes value must still hold exactly the
    process's own updates (client/slots.py). Seed 5 without sleeps: its schedule makes evicted rows
    again by increments while pushes of them are on the way, which lost own updates (in 4 of 10
    runs alone, 4 of 4 beside another copy) before every update of a bounded table was logged in
    flight (client/encode.py ``log_inflight``)."""
    servers, procs, staleness, int_dtype, comm_cfg, _, ticks = CASES[FAST]
    run_exactness(bosen_cluster, bosen_procs, tmp_path, servers, procs, staleness, int_dtype, comm_cfg, 5, ticks,
                  max_sleep_ms=0.0, storage=storage, cache_rows=4)


@pytest.mark.timeout(120)
@pytest.mark.slow
@pytest.mark.parametrize("case", [k for k in CASES if k != FAST])
def test_exact_reads_and_final_tables(bosen_cluster, bosen_procs, tmp_path, case):
    run_exactness(bosen_cluster, bosen_procs, tmp_path, *CASES[case])


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_wide_rows_through_the_flush_window_stay_exact(bosen_cluster, bosen_procs, tmp_path):
    """64 rows of 32768 float32 columns, 2 processes writing every row (each its own column block),
    2 servers: each tick's dense increment is 4 MiB per server, which a low budget mostly leaves to
    the end-of-tick flush, so it goes out in several messages through the flush window (an ACK asked
    for every 2 MiB). Blocks read stay uniform (whole rows), prefix sums within the SSP bound, own
    blocks exact; a fresh reader gets the exact sums."""
    procs, ticks, rows, cols = 2, 4, 64, 32768
    c = bosen_cluster(2, workers=procs + 1, staleness=1, read_timeout_s=60,
                      comm=comm(100, 2, 2, "float32", "relative"),
                      tables={"W": {"rows": rows, "cols": cols, "dtype": "float32"}})
    reader = Client.connect(c.path, rank=procs)
    try:
        for _ in range(ticks + 2):
            reader.clock()
        ws = [worker(bosen_procs, "wide_worker.py", c.path, "--procs", procs, "--ticks", ticks,
                     "--result", tmp_path / f"w-{i}.json", name=f"wide-{i}") for i in range(procs)]
        assert bosen_procs.wait_all(ws, timeout=100) == [0] * procs, "\n".join(p.tail() for p in ws)
        results = sorted((json.loads((tmp_path / f"w-{i}.json").read_text()) for i in range(procs)),
                         key=lambda r: r["rank"])
        for r in results:
            assert r["violation_count"] == 0, f"process {r['rank']}: {r['violations'][:10]}"
        # the end-of-tick flushes carried at least a tick's worth of rows (not the budgeted sends)
        assert sum(r["rows_sent"] - r["rows_sent_budgeted"] for r in results) >= rows, results
        got = reader.table("W").get_rows(np.arange(rows))
        h = cols // procs
        for r in results:
            want = np.repeat(np.array(r["own"], dtype=np.float32)[:, None], h, axis=1)
            np.testing.assert_array_equal(got[:, r["rank"] * h:(r["rank"] + 1) * h], want)
        assert results[0]["own"][0] > 0
        assert all(s["errors"] == 0 for s in c.status())
    finally:
        reader.close()
    c.check()


# -- the checker has teeth ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["I", "F"])
def test_checker_accepts_exactly_the_allowed_values(name):
    """On synthetic reads of table ``name``: the values the schedules allow pass; a wrong value in
    any cell (own part one unit off, another process's part or a mixed-column digit that no prefix of
    its updates makes), another process's updates seen too stale or from too far ahead, the reader's
    own updates of this tick missing or counted twice: each is reported."""
    procs, ticks, s = 3, 10, 1
    exp = ew.Expect(11, procs, ticks, 6.0)
    me = 0

    def made_at(q: int, tick: int) -> bool:  # process q changed some cell of the table at `tick`
        return any(sum(v for t, v in ups if t == tick) for (tb, _, _), ups in exp.cells[q].items() if tb == name)

    # the reader's tick: one where it, process 1 at the oldest tick it must see and process 2 at the
    # newest it may see all made updates (so each case below changes some value)
    c = next(t for t in range(s + 1, ticks - s - 2)
             if made_at(me, t) and made_at(1, t - s - 1) and made_at(2, t + s + 1))

    def own_through(tick: int) -> dict:  # the reader's own updates, all of ticks < tick
        own: dict = {}
        for (tb, r, col), ups in exp.cells[me].items():
            own[(tb, r, col)] = sum(v for t, v in ups if t < tick)
        return own

    def table(own: dict, through: dict[int, int]) -> np.ndarray:
        """Values with the reader's ``own`` parts and process q's updates of ticks < through[q]."""
        vals = np.zeros((ew.ROWS, procs + 1))
        for r in range(ew.ROWS):
            for col in range(procs):
                vals[r, col] = own.get((name, r, col), 0.0) if col == me else \
                    sum(v for t, v in exp.cells[col].get((name, r, col), []) if t < through[col])
            if name == "I":
                key = (name, r, procs)
                vals[r, procs] = own.get(key, 0.0) + sum(
                    v for q in range(procs) if q != me for t, v in exp.cells[q].get(key, []) if t < through[q])
        return vals

    own = own_through(c + 1)  # mid-tick c, after all of its increments
    rows = list(range(ew.ROWS))
    for through in ({1: c - s, 2: c + s + 1}, {1: c + s + 1, 2: c - s}, {1: c, 2: c}):
        assert ew.check_read(exp, me, name, rows, table(own, through), own, c, s) == [], through
    good = {1: c - s, 2: c + s + 1}
    unit = 1.0 if name == "I" else 1 / 8
    vals = table(own, good)
    for r in (0, ew.SHARED - 1, ew.SHARED + 1, ew.ROWS - 1):
        for col in range(procs + (name == "I")):
            for wrong in wrong_values(exp, name, r, col, vals[r, col], unit):
                bad = vals.copy()
                bad[r, col] = wrong
                assert ew.check_read(exp, me, name, rows, bad, own, c, s), (r, col, wrong)
    assert ew.check_read(exp, me, name, rows, table(own, {1: c - s - 1, 2: c}), own, c, s)  # too stale
    assert ew.check_read(exp, me, name, rows, table(own, {1: c, 2: c + s + 2}), own, c, s)  # the future
    # this process's own updates: this tick's missing (no read-my-writes), or counted twice
    assert ew.check_read(exp, me, name, rows, table(own_through(c), good), own, c, s)
    assert ew.check_read(exp, me, name, rows, table({k: 2 * v for k, v in own.items()}, good), own, c, s)
    if name == "F":  # the float table's unwritten column must stay 0
        vals[0, procs] = 0.125
        assert ew.check_read(exp, me, name, rows, vals, own, c, s)


def test_checker_tolerance_for_float16_residuals():
    """With --residual another process's float part may miss a prefix sum by the residual its
    buffer holds (at most RESIDUAL_TOL), no more; own parts and the integer table stay exact."""
    exp = ew.Expect(6, 2, 8, 6.0, residual=True)
    (_, r, col), ups = next((k, u) for k, u in exp.cells[1].items() if k[0] == "F" and len(u) >= 2)
    c, s = 8, 0  # after the last tick: all of process 1's updates
    total = sum(v for _, v in ups)
    for off, ok in ((0.0, True), (ew.RESIDUAL_TOL, True), (-ew.RESIDUAL_TOL, True), (ew.RESIDUAL_TOL + 2**-13, False),
                    (-ew.RESIDUAL_TOL - 2**-13, False)):
        assert (ew.check_cell(exp, 0, "F", r, col, total + off, {}, c, s) == []) == ok, off
    own = {("F", r, 0): 0.5}
    assert ew.check_cell(exp, 0, "F", r, 0, 0.5 + 2**-13, own, c, s)  # own part: exact
    (_, ri, _), iups = next((k, u) for k, u in exp.cells[1].items() if k[0] == "I" and k[2] == 1)
    assert ew.check_cell(exp, 0, "I", ri, 1, sum(v for _, v in iups) + 1, {}, c, s)


def test_wide_checker_detects_split_rows_wrong_own_blocks_and_the_bound():
    rows, ticks, s, me, c = 8, 6, 1, 0, 3
    sums, ends = wide_worker.prefixes(wide_worker.updates(rows, ticks), rows)
    own = np.array([sums[r][ends[r, c + 1]] for r in range(rows)])  # mid-tick c, after its increments
    rr = np.arange(rows)

    def read(n_other: np.ndarray) -> np.ndarray:  # own block, then the other's with n_other[r] updates
        vals = np.zeros((rows, 8), dtype=np.float32)
        vals[:, :4] = own[:, None]
        vals[:, 4:] = np.array([sums[r][n_other[r]] for r in range(rows)])[:, None]
        return vals

    def check(vals: np.ndarray) -> list[str]:
        return wide_worker.check_blocks(rr, vals, c, s, me, 2, own, sums, ends)

    assert check(read(ends[:, c - s])) == [] and check(read(ends[:, c + s + 1])) == []
    assert check(read(ends[:, c - s] - 1))  # one update short of the SSP guarantee
    assert check(read(ends[:, c + s + 1] + 1))  # from a tick the other cannot have reached
    vals = read(ends[:, c])
    vals[2, 6] += 0.125  # a row arrived in parts
    assert any("not uniform" in b for b in check(vals))
    vals = read(ends[:, c])
    vals[5, :4] -= 0.25  # an own update missing
    assert any("own block" in b for b in check(vals))


def wrong_values(exp, name: str, r: int, col: int, v: float, unit: float) -> list[float]:
    """Values of cell (r, col) that no allowed read can hold: the reader's own part one unit off;
    another process's part above every prefix sum of its updates; a mixed-column digit above it."""
    procs, me = exp.procs, 0
    if col == me:
        return [v + unit, v - unit]
    if col < procs:
        ups = [u for _, u in exp.cells[col].get((name, r, col), [])]
        return [max(np.cumsum([0.0, *ups])) + unit, min(np.cumsum([0.0, *ups])) - unit]
    return [v + (sum(u for _, u in exp.cells[q].get((name, r, col), [])) // ew.BASE ** q + 1) * ew.BASE ** q
            for q in range(1, procs)]


def test_schedules_fit_the_exactness_argument():
    """The premises of the checks: every tick begins with a read; the float deltas' per-cell sums
    of |delta| stay below 256 (float16-exact partial sums); mixed-column digits stay below BASE;
    every process writes shared rows (pushes carry others' updates) and private ones."""
    for seed, procs, ticks, residual in ((1, 2, 10, False), (2, 3, 10, False), (3, 3, 12, False), (6, 2, 8, True)):
        for q in range(procs):
            sched = ew.schedule(seed, q, procs, ticks, 6.0, residual)
            assert all(ops[0].kind == "read_rows" for ops in sched)
            cells = ew.cell_updates(sched, procs)
            inexact = False
            updates = needs_residual = 0
            for (tb, r, col), ups in cells.items():
                if tb == "F":
                    assert sum(abs(v) for _, v in ups) < 256
                    assert all(float(np.float32(v)) == v and v * 2**13 == int(v * 2**13) for _, v in ups)
                    if not residual:
                        assert all(float(np.float16(v)) == v and v * 8 == int(v * 8) for _, v in ups)
                    else:
                        sums = np.cumsum([v for _, v in ups])
                        inexact |= bool((sums.astype(np.float16) != sums).any())
                        updates += len(ups)
                        needs_residual += sum(float(np.float16(v)) != v for _, v in ups)
                if col == procs:
                    assert sum(v for _, v in ups) < ew.BASE ** (q + 1)
                    assert tb == "I" and r < ew.SHARED
                else:
                    assert col == q
            assert inexact == residual  # float16 cannot carry some partial sum: the residual path is taken
            assert needs_residual >= updates // 3  # nor many single updates
            written = {r for (_, r, _) in cells}
            assert written & set(range(ew.SHARED)) and written - set(range(ew.SHARED))
