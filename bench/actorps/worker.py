"""One worker process of ours in ``python -m bench.actorps``: ``python -m bench.actorps.worker SPEC_JSON``.

A line protocol with the bench on stdin/stdout (JSON lines): it joins the job and prints ``ready``;
reads ``{"t0", "t1"}`` and iterates (``loop.Window``: read, ``inc_rows``, ``clock`` each
iteration) until an iteration ends past t1; clocks once more (a worker at staleness 0 may be waiting
for that clock), waits until the servers applied everything it sent and prints its counts, its
phases and the CPU time of each of its threads over the window. On ``clock`` it clocks past anything
the checking worker can wait for; on ``check`` it clocks past its staleness bound, reads the whole
table and prints its sum; on ``quit`` it leaves the job.

The read is what a user of our API should write for each case: ``table.get_rows(rows)`` for the
sparse case's fresh random draw; for the dense cases, which read the same rows (all of them) every
iteration, a read-only ``table.view(rows, base=False)`` made once and ``refresh()``-ed each iteration
(client/view.py, the documented fast path): it copies into one array it keeps, and only the rows
written since its last copy, where ``get_rows`` returns a fresh 16 MiB array each time.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from bench.actorps.loop import Window, Workload
from bench.common import thread_cpu_ns
from bosen.client import Client

STATUS_TIMEOUT_S = 120.0


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def main(spec: dict[str, Any]) -> None:
    wl = Workload(**spec["workload"])
    client = Client.connect(spec["config"], rank=spec["rank"])
    try:
        table = client.table("w")
        draw = wl.draws(spec["rank"])
        deltas = wl.deltas()
        state: dict[str, Any] = {"rows": draw()}
        view = table.view(state["rows"], base=False) if wl.rows_per_iter >= wl.rows else None
        # one iteration before the window is set: imports, compiled kernels and connections are ready
        table.get_rows(state["rows"]) if view is None else view.refresh()
        table.inc_rows(state["rows"], deltas)
        client.clock()
        say(step="ready")
        go = json.loads(sys.stdin.readline())
        threads: dict[str, dict[str, int]] = {}
        stats: dict[str, dict[str, Any]] = {}

        def snap(key: str) -> None:
            threads[key] = thread_cpu_ns()
            stats[key] = client.stats()

        win = Window(go["t0"], go["t1"], on_open=lambda: snap("open"), on_close=lambda: snap("close"))

        def d() -> None:
            state["rows"] = draw()

        def r() -> None:
            state["vals"] = table.get_rows(state["rows"]) if view is None else view.refresh()

        def i() -> None:
            table.inc_rows(state["rows"], deltas)

        win.run([d, r, i, client.clock])
        client.clock()
        client.server_status(STATUS_TIMEOUT_S)  # every update this worker sent is applied
        n = max(win.iterations, 1)
        opened, closed = threads.get("open", {}), threads.get("close", {})  # none: no iteration in the window
        thr = {k: (ns - opened[k]) / 1e3 / n for k, ns in closed.items() if k in opened}
        keys = ("bytes_sent", "bytes_received", "update_batches", "rows_sent", "blocked_s")
        s0, s1 = stats.get("open", {}), stats.get("close", {})
        counts = {k: (s1[k] - s0[k]) / n for k in keys if k in s1 and k in s0}
        say(step="done", **win.result(), rows_incremented=(win.total + 1) * wl.rows_per_iter,
            thread_cpu_us={k: round(v, 1) for k, v in sorted(thr.items(), key=lambda x: -x[1]) if v >= 1},
            per_iteration=counts)
        while (line := sys.stdin.readline().strip()) != "quit":
            if line == "check":
                # every worker is done and its updates applied: clock past the staleness bound so that
                # no cached row can be served, then read every row
                for _ in range(spec["staleness"] + 1):
                    client.clock()
                total = 0.0
                for lo in range(0, wl.rows, 4096):
                    rows = np.arange(lo, min(lo + 4096, wl.rows), dtype=np.int64)
                    total += float(table.get_rows(rows).sum(dtype=np.float64))
                say(step="check", table_sum=total)
            elif line == "clock":  # the checking worker may be s + 1 ticks ahead and clocks s + 1 more
                for _ in range(2 * spec["staleness"] + 4):
                    client.clock()
                say(step="clocked")
    finally:
        client.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
