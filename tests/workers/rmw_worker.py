"""Read-my-writes checker, one worker process (tests/client/test_client.py).

Worker ``w`` adds ``t + 1`` to column ``w`` of every row at tick ``t``; its own column must read
exactly T(t + 1) = (t+1)(t+2)/2 at every moment after the increment: at once (only in the cache),
while early sends and pushes travel, right after clock() (flushed but not yet pushed back), and
after the server's push has arrived (then the server value holds it and the cache must not add it a
second time). The other worker's column must always be a triangular number within SSP bounds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from bosen.client import Client


def tri(n: int) -> int:
    return n * (n + 1) // 2


def tri_inverse(v: int) -> int | None:
    if v < 0:
        return None
    n = (math.isqrt(8 * v + 1) - 1) // 2
    return n if tri(n) == v else None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--ticks", type=int, default=8)
    p.add_argument("--result", required=True)
    args = p.parse_args()

    client = Client.connect(args.config)
    w = client.rank
    W = client.table("W")
    s = W.staleness
    writers = W.cols
    rows = np.arange(W.rows, dtype=np.int64)
    bad: list[str] = []
    reads = 0

    def check(vals: np.ndarray, c: int, own: int, where: str) -> None:
        nonlocal reads
        reads += 1
        got = vals[:, w]
        if not (got == tri(own)).all():
            bad.append(f"{where} (tick {c}): own column {got.tolist()}, expected {tri(own)} everywhere")
        for col in range(writers):
            if col == w:
                continue
            for r, v in enumerate(vals[:, col]):
                n = tri_inverse(int(v))
                if n is None or not (c - s <= n <= c + s + 1):
                    bad.append(f"{where} (tick {c}): row {r} col {col} = {int(v)} (n={n}), staleness {s}")

    pushed_before = []
    for c in range(args.ticks):
        check(W.get_rows(rows), c, c, "start of tick")  # after the previous tick's push (staleness 0)
        deltas = np.zeros((W.rows, W.cols), dtype=np.int64)
        deltas[:, w] = c + 1
        W.inc_rows(rows, deltas)
        check(W.get_rows(rows), c, c + 1, "right after inc")
        for k in range(5):  # early sends / acks / early pushes happen meanwhile
            time.sleep(0.01)
            check(np.stack([W.get_row(r) for r in rows]), c, c + 1, f"after inc, {10 * (k + 1)} ms")
        pushed_before.append(client.stats()["rows_pushed_to_us"])
        client.clock()
        check(W.get_rows(rows), c + 1, c + 1, "right after clock")
        time.sleep(0.02)
        check(W.get_rows(rows), c + 1, c + 1, "20 ms after clock")
    stats = client.stats()
    client.close()
    with open(args.result, "w") as f:
        json.dump({"rank": w, "bad": bad[:50], "bad_count": len(bad), "reads": reads,
                   "rows_pushed_to_us": stats["rows_pushed_to_us"],
                   "rows_pushed_early_to_us": stats.get("rows_pushed_early_to_us", 0),
                   "rows_sent_budgeted": stats.get("rows_sent_budgeted", 0), "acks": stats["acks"]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
