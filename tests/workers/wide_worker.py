"""Exactness of wide rows through the flush window, one worker process (tests/client/test_exactness.py).

Table ``W`` (float32, ``rows x cols``, cols a multiple of P) gives process p the column block
``[p*H, (p+1)*H)``, H = cols / P. Every update of p adds one amount to a whole row of its block, so
each block of each row read must be uniform (rows travel whole, never in parts) and its value a
prefix sum of its owner's amounts for that row; the schedule (:func:`updates`) is the same for every
process and known to all, and its amounts are positive multiples of 1/8, so prefix sums are exact in
float32 and identify how many updates a value holds.

Each tick a process reads every row, adds to every row of its block (one dense ``inc_rows`` of
``rows x H`` values: with 64 rows of 32768 columns that is 4 MiB per server, more than the flush's
ACK spacing of 2 MiB), reads a few rows, adds to every other row, and clocks; at a low budget most
of that is still buffered at the clock, so the end-of-tick flush carries it through the window.
Checks per read at tick c (staleness s): own block exactly this process's updates so far; another
block uniform and holding n of its owner's updates for that row with (its updates of ticks < c - s)
<= n <= (its updates of ticks <= c + s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def updates(rows: int, ticks: int) -> list[list[tuple[np.ndarray, float]]]:
    """Per tick, the increments every process makes: (rows, amount added to each of them)."""
    out = []
    for t in range(ticks):
        out.append([(np.arange(rows), (t % 3 + 1) / 8), (np.arange(t % 2, rows, 2), 0.25)])
    return out


def prefixes(sched: list[list[tuple[np.ndarray, float]]], rows: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Per row, the prefix sums of one process's amounts (from 0), and ``ends[r, t]``: how many of
    its updates to row r are of ticks < t."""
    amounts: list[list[float]] = [[] for _ in range(rows)]
    ends = np.zeros((rows, len(sched) + 1), dtype=np.int64)
    for t, incs in enumerate(sched):
        for rr, a in incs:
            for r in rr:
                amounts[r].append(a)
        ends[:, t + 1] = [len(x) for x in amounts]
    return [np.cumsum([0.0, *x]) for x in amounts], ends


def check_blocks(rr: np.ndarray, vals: np.ndarray, c: int, s: int, me: int, procs: int, own: np.ndarray,
                 sums: list[np.ndarray], ends: np.ndarray) -> list[str]:
    """Violations in rows ``rr`` read as ``vals`` at tick c by process ``me`` (see the module doc)."""
    bad = []
    h = vals.shape[1] // procs
    ticks = ends.shape[1] - 1
    for q in range(procs):
        block = vals[:, q * h:(q + 1) * h]
        first = block[:, 0]
        for i in np.flatnonzero((block != first[:, None]).any(axis=1))[:3]:
            bad.append(f"tick {c}: row {rr[i]} block {q} not uniform: {np.unique(block[i])[:5].tolist()}")
        for i, r in enumerate(rr):
            v = float(first[i])
            if q == me:
                if v != own[r]:
                    bad.append(f"tick {c}: row {r} own block {v}, made {own[r]}")
                continue
            n = np.flatnonzero(sums[r] == v)
            lo, hi = ends[r, max(0, min(c - s, ticks))], ends[r, min(c + s + 1, ticks)]
            if n.size == 0:
                bad.append(f"tick {c}: row {r} block {q} = {v}: no prefix sum")
            elif not lo <= n[0] <= hi:
                bad.append(f"tick {c}: row {r} block {q} holds {n[0]} updates, SSP allows {lo}..{hi}")
    return bad


def main() -> int:
    from bosen.client import Client

    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--procs", type=int, required=True)
    p.add_argument("--ticks", type=int, default=4)
    p.add_argument("--result", required=True)
    args = p.parse_args()

    client = Client.connect(args.config)
    w, P = client.rank, args.procs
    W = client.table("W")
    R, H = W.rows, W.cols // P
    s = W.staleness
    sched = updates(R, args.ticks)
    sums, ends = prefixes(sched, R)
    own = np.zeros(R)
    bad: list[str] = []
    reads = 0

    def check(rr: np.ndarray, vals: np.ndarray, c: int, where: str) -> None:
        nonlocal reads
        reads += 1
        bad.extend(f"{where}: {b}" for b in check_blocks(rr, vals, c, s, w, P, own, sums, ends))

    all_rows = np.arange(R, dtype=np.int64)
    t0 = time.monotonic()
    for c, incs in enumerate(sched):
        check(all_rows, W.get_rows(all_rows), c, "start")
        for k, (rows, a) in enumerate(incs):
            d = np.zeros((rows.shape[0], W.cols), dtype=np.float32)
            d[:, w * H:(w + 1) * H] = a
            W.inc_rows(rows, d)
            own[rows] += a
            few = all_rows[(c + k) % 4::16]
            check(few, W.get_rows(few), c, f"after inc {k}")
        client.clock()
    check(all_rows, W.get_rows(all_rows), args.ticks, "after the last clock")
    elapsed = time.monotonic() - t0
    stats = client.stats()
    client.close()
    with open(args.result, "w") as f:
        json.dump({"rank": w, "violations": bad[:100], "violation_count": len(bad), "reads": reads,
                   "seconds": elapsed, "own": own.tolist(), "rows_sent_budgeted": stats.get("rows_sent_budgeted", 0),
                   "rows_sent": stats["rows_sent"], "rows_pushed_to_us": stats["rows_pushed_to_us"]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
