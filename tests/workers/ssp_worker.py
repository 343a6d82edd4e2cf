"""SSP invariant checker, one worker process (tests/client/test_ssp.py).

Worker ``w`` at tick ``t`` adds ``t + 1`` to column ``w`` of every row, so a value in column ``w'``
is the triangular number T(n) = n(n+1)/2 where n is how many of w''s ticks it includes. Every tick
the worker reads all rows (get_rows before its increment, get_row / get after it), decodes n for
every column and checks, at its own tick c with staleness s:

* own column: n == c before the increment and n == c + 1 after it (read-my-writes);
* other columns: c - s <= n <= c + s + 1 (all ticks < c - s are included; nothing is included that
  its writer could not have made yet, because the writer reads before it writes and that read
  cannot get ahead of this worker by more than s).

Violations go to a JSON result file; the exit status is 0 when the run itself completed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time

import numpy as np

from bosen.client import Client


def tri_inverse(v: int) -> int | None:
    """n with n(n+1)/2 == v, or None if v is not a triangular number."""
    if v < 0:
        return None
    n = (math.isqrt(8 * v + 1) - 1) // 2
    return n if n * (n + 1) // 2 == v else None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--ticks", type=int, default=12)
    p.add_argument("--result", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-sleep-ms", type=float, default=20.0)
    p.add_argument("--slow-rank", type=int, default=-1, help="this rank sleeps --slow-ms more per tick")
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--assume-staleness", type=int, default=-1,
                   help="check against this staleness instead of the table's (to test the checker)")
    p.add_argument("--fresh-block", type=int, default=0,
                   help="also add to every row of table V each tick, then read a block of this many V rows "
                        "never read before: a direct read racing this worker's own update and others' pushes")
    args = p.parse_args()

    client = Client.connect(args.config)
    w = client.rank
    W = client.table("W")
    s = W.staleness if args.assume_staleness < 0 else args.assume_staleness
    writers = W.cols  # columns 0..cols-1 belong to worker ranks 0..cols-1
    assert 0 <= w < writers, f"rank {w} has no column (table has {writers})"
    rng = random.Random(args.seed * 1000 + w)
    all_rows = np.arange(W.rows, dtype=np.int64)
    violations: list[str] = []
    checks = 0
    ahead = 0  # reads that saw another worker's updates of ticks >= own tick (allowed, informational)

    def check(vals: np.ndarray, c: int, own: int, where: str) -> None:
        nonlocal checks, ahead
        for r in range(vals.shape[0]):
            for col in range(writers):
                v = int(vals[r, col])
                n = tri_inverse(v)
                checks += 1
                if n is None:
                    violations.append(f"{where}: tick {c} row {r} col {col}: {v} is not triangular")
                elif col == w:
                    if n != own:
                        violations.append(f"{where}: tick {c} row {r}: own column holds {n} ticks, expected {own}")
                elif n < c - s:
                    violations.append(f"{where}: tick {c} row {r} col {col}: only {n} ticks of worker {col}, "
                                      f"need >= {c - s} (staleness {s})")
                elif n > c + s + 1:
                    violations.append(f"{where}: tick {c} row {r} col {col}: {n} ticks of worker {col}, "
                                      f"at most {c + s + 1} possible")
                elif n > c:
                    ahead += 1

    t0 = time.monotonic()
    for c in range(args.ticks):
        vals = W.get_rows(all_rows)
        check(vals, c, c, "get_rows before inc")
        d = c + 1
        kind = c % 3
        if kind == 0:  # dense block
            deltas = np.zeros((W.rows, W.cols), dtype=np.int64)
            deltas[:, w] = d
            W.inc_rows(all_rows, deltas)
        elif kind == 1:  # one scalar per row
            for r in range(W.rows):
                W.inc(r, w, d)
        else:  # sparse COO, the delta split in two entries for the same (row, col)
            rows = np.concatenate([all_rows, all_rows])
            cols = np.full(rows.shape[0], w, dtype=np.int64)
            half = np.concatenate([np.full(W.rows, d // 2), np.full(W.rows, d - d // 2)]).astype(np.int64)
            W.inc_rows(rows, half, cols=cols)
        vals = np.stack([W.get_row(r) for r in range(W.rows)])
        check(vals, c, c + 1, "get_row after inc")
        if args.fresh_block:
            V = client.table("V")
            v_rows = np.arange(V.rows, dtype=np.int64)
            deltas = np.zeros((V.rows, V.cols), dtype=np.int64)
            deltas[:, w] = d
            V.inc_rows(v_rows, deltas)
            block = v_rows[c * args.fresh_block:(c + 1) * args.fresh_block]
            check(V.get_rows(block), c, c + 1, "first read of V rows after inc")
        got = W.get(rng.randrange(W.rows), w)
        if got != d * (d + 1) // 2:
            violations.append(f"get after inc: tick {c}: own value {got}, expected {d * (d + 1) // 2}")
        time.sleep(rng.uniform(0, args.max_sleep_ms) / 1000 + (args.slow_ms / 1000 if w == args.slow_rank else 0))
        client.clock()
    vals = W.get_rows(all_rows)
    check(vals, args.ticks, args.ticks, "get_rows after the last clock")
    elapsed = time.monotonic() - t0
    stats = client.stats()
    client.close()
    with open(args.result, "w") as f:
        json.dump({"rank": w, "staleness": s, "violations": violations[:100], "violation_count": len(violations),
                   "checks": checks, "ahead": ahead, "seconds": elapsed, "blocked_reads": stats["blocked_reads"],
                   "rows_sent": stats["rows_sent"], "rows_sent_budgeted": stats.get("rows_sent_budgeted", 0),
                   "rows_pushed_to_us": stats["rows_pushed_to_us"]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
