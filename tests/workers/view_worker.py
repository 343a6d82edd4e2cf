"""Views under concurrent writers, one worker process (tests/client/test_view.py).

One view over every row of the int64 table ``I``; per tick a few mini-batches each refresh a random
set of positions, add random integers to them and push, and now and then a plain ``inc_rows`` writes
rows outside the view. Other processes do the same, so pushes from the servers land in the cache
while this one works. After every refresh and every push the checker takes the table's lock and
compares: every row whose cache stamp is still the view's must hold exactly the cache's value (the
view's promise). The result file has the violations and this process's total increments (the
servers' final table must be the sum over processes: integers add exactly in any order).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> int:
    from bosen.client import Client

    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--ticks", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result", required=True)
    args = p.parse_args()

    client = Client.connect(args.config)
    T = client.table("I")
    st = T._st  # the checker looks at the cache under the table's lock
    rng = np.random.default_rng([args.seed, client.rank])
    rows = np.arange(T.rows, dtype=np.int64)
    v = T.view(rows)
    total = np.zeros((T.rows, T.cols), np.int64)
    bad: list[str] = []
    checks = 0

    def check(where: str) -> None:
        nonlocal checks
        checks += 1
        with st.lock:
            same = st.cache.stamp[rows] == v.seen
            held = v.values[same]
            cached = st.cache.values[rows][same]
        if not np.array_equal(held, cached):
            wrong = np.flatnonzero(same)[(held != cached).any(axis=1)]
            bad.append(f"{where}: rows {wrong[:5].tolist()} differ from the cache at the view's own stamp")

    for tick in range(args.ticks):
        for mb in range(4):
            at = np.sort(rng.choice(T.rows, rng.integers(1, T.rows + 1), replace=False))
            v.refresh(at)
            check(f"tick {tick} batch {mb} refresh")
            d = rng.integers(-3, 4, (at.shape[0], T.cols))
            v.values[at] += d
            total[at] += d
            v.push(at)
            check(f"tick {tick} batch {mb} push")
            if rng.random() < 0.5:
                r = np.sort(rng.choice(T.rows, 3, replace=False))
                d2 = rng.integers(1, 3, (3, T.cols))
                T.inc_rows(r, d2)
                total[r] += d2
            if rng.random() < 0.5:
                time.sleep(rng.uniform(0, 0.004))
        client.clock()
    client.close()
    with open(args.result, "w") as f:
        json.dump({"rank": client.rank, "violations": bad, "checks": checks, "total": total.tolist()}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
