"""Measured egress against the configured bandwidth budget (docs/design.md, "Managed communication" and "Benchmarks").

For each budget, a saturating update load runs against real server processes and the bench reads
the egress of one side over a steady window:

- ``client``: one client keeps every row of a table dirty (inc_rows in a loop, no clock), so its
  communication thread always has more to send than the budget allows; egress = its bytes_sent.
- ``server``: a writer client keeps rows changing with a budget of 4x the server's (at least
  100 Mbps): more changed rows than the server may push, without burying the 2-core machine in
  update traffic; a reader client subscribes to every row; the server pushes changed rows early under
  ``server_bandwidth_mbps``; egress = the server's bytes_out (STATUS), which includes acks and
  every other message it sends.

Each result line: ours = measured Mbps, baseline = the budget, ratio = measured / budget (1.0 is
perfect tracking), within_5pct. A budget the machine cannot saturate shows up as ratio < 1 with
``saturated: false`` (the demand side could not produce more than that).

    python -m bench.budget [--quick] [--budgets 10,100,1000]
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

from bench.common import emit, log, servers
from bosen.client import Client

ROWS, COLS = 2000, 256  # 1 KiB rows
STATUS_TIMEOUT_S = 10.0


def _job(client_mbps: float, server_mbps: float, workers: int) -> dict:
    return {
        "cluster": {"workers": workers},
        "consistency": {"staleness": 1_000_000, "read_timeout_s": 60},
        "comm": {"client_bandwidth_mbps": client_mbps, "server_bandwidth_mbps": server_mbps,
                 "client_send_rows": 100, "server_push_rows": 100, "priority": "random"},
        "tables": {"W": {"rows": ROWS, "cols": COLS}},
    }


class Writer(threading.Thread):
    """Keeps every row dirty: the demand side of the bench."""

    def __init__(self, table) -> None:
        super().__init__(daemon=True)
        self.table = table
        self.stop = threading.Event()
        self.batches = 0

    def run(self) -> None:
        rows = np.arange(ROWS)
        d = np.full((ROWS, COLS), 1e-3, dtype=np.float32)
        while not self.stop.is_set():
            self.table.inc_rows(rows, d)
            self.batches += 1
            time.sleep(0.001)


def measure_client(budget: float, window: float, warmup: float) -> dict:
    with servers(_job(budget, 10_000, 1), 1) as cluster:
        client = Client.connect(cluster.path)
        w = Writer(client.table("W"))
        try:
            w.start()
            time.sleep(warmup)
            b0, t0 = client.stats()["bytes_sent"], time.monotonic()
            time.sleep(window)
            b1, t1 = client.stats()["bytes_sent"], time.monotonic()
            backlog = int(client._state("W").oplog.dirty.sum())
        finally:
            w.stop.set()
            w.join()
            client.abort()
    return {"mbps": (b1 - b0) * 8 / 1e6 / (t1 - t0), "saturated": backlog > 0}


def measure_server(budget: float, window: float, warmup: float) -> dict:
    with servers(_job(max(4 * budget, 100), budget, 2), 1) as cluster:
        reader = Client.connect(cluster.path)
        writer = Client.connect(cluster.path)
        w = Writer(writer.table("W"))
        try:
            reader.table("W").get_rows(np.arange(ROWS))  # subscribe to every row
            w.start()
            # the subscription reply (the whole table) is charged to the server's budget too: wait
            # until that debt is paid, or the window would start with the bucket still in debt
            time.sleep(warmup + ROWS * COLS * 4 * 8 / (budget * 1e6))
            s0, t0 = cluster.status(STATUS_TIMEOUT_S)[0], time.monotonic()
            time.sleep(window)
            s1, t1 = cluster.status(STATUS_TIMEOUT_S)[0], time.monotonic()
        finally:
            w.stop.set()
            w.join()
            writer.abort()
            reader.abort()
    # saturated: rows were still waiting to be pushed, i.e. demand exceeded the budget
    pushed = s1["rows_pushed_budgeted"] - s0["rows_pushed_budgeted"]
    applied = s1["rows_applied"] - s0["rows_applied"]
    return {"mbps": (s1["bytes_out"] - s0["bytes_out"]) * 8 / 1e6 / (t1 - t0), "saturated": applied > pushed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer budgets, shorter windows (CI)")
    ap.add_argument("--budgets", default=None, help="comma-separated Mbps values")
    args = ap.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")] if args.budgets else (
        [10, 100, 1000] if args.quick else [10, 30, 100, 300, 1000])
    window, warmup = (2.0, 0.5) if args.quick else (5.0, 1.0)
    for side, fn in (("client", measure_client), ("server", measure_server)):
        for b in budgets:
            log(f"budget: {side} at {b:g} Mbps ...")
            m = fn(b, window, warmup)
            emit(bench="budget", case=f"{side}-{b:g}mbps", metric="egress", unit="Mbps", ours=m["mbps"],
                 baseline=b, baseline_name="configured budget", ratio=m["mbps"] / b,
                 within_5pct=abs(m["mbps"] / b - 1) <= 0.05, saturated=m["saturated"], window_s=window)


if __name__ == "__main__":
    main()
