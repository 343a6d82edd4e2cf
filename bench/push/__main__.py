"""Server CPU per pushed MB (issue 27, "Servers that keep up"): one server, N client processes that all
read the same rows, and writers keeping them changing.

Every client subscribes to every row of a table of 1 KiB rows (``--rows``, 1024 by default: 1 MiB,
one chunk) and then, until the run ends, reads all rows from its cache and ends a clock every
``--tick-ms``; writer clients (ranks below ``--writers``) first add to every row. Managed
communication is on with a high server budget, so the server pushes changed rows mid-clock to every
subscriber (budgeted pushes) and again at each clock advance. Over a steady window the bench reads
the server process's CPU seconds (psutil) and its STATUS counters, and reports:

- ``cpu-per-pushed-MB``: server CPU ms per MB of pushed row values (rows_pushed x row bytes; headers,
  row ids, acks and SCLOCKs are not counted as payload, but their cost is in the CPU);
- ``pushed-MBps``: pushed MB per second of wall time;
- ``apply-lag``: the server's ``apply_lag_ms`` (an INC read off the socket until applied) and
  ``push_stall_ms`` (one push call's time, during which the loop reads nothing), where the server
  reports them (servers before issue 27 do not);
- how the server sent its pushes: messages from shared frames, own gathers.

No baseline runs in the same process: compare runs of this module on two checkouts, alternated.

    python -m bench.push [--clients 4,8] [--writers 1] [--window 6] [--label NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Child, ProcCounters, emit, log, servers

COLS = 256  # float32: 1 KiB rows
ROW_BYTES = COLS * 4


def _job(clients: int, server_mbps: float, priority: str, rows: int) -> dict[str, Any]:
    return {
        "cluster": {"workers": clients},
        "consistency": {"staleness": 2, "read_timeout_s": 60},
        "comm": {"client_bandwidth_mbps": 2000, "server_bandwidth_mbps": server_mbps,
                 "client_send_rows": 1024, "server_push_rows": 1024, "priority": priority},
        "tables": {"W": {"rows": rows, "cols": COLS}},
    }


def child(path: str, writers: int, tick_s: float, seconds: float) -> None:
    """One client process: subscribe to every row, say so on stdout, then read (and write) and clock."""
    from bosen.client import Client

    client = Client.connect(path)
    table = client.table("W")
    rows = np.arange(client.config.tables[0].rows)
    table.get_rows(rows)
    writer = client.rank < writers
    d = np.full((rows.shape[0], COLS), 1e-4, dtype=np.float32)
    print(json.dumps({"rank": client.rank, "writer": writer}), flush=True)
    end = time.monotonic() + seconds
    total = 0.0
    while time.monotonic() < end:
        if writer:
            table.inc_rows(rows, d)
        total += float(table.get_rows(rows)[:, 0].sum())
        client.clock()
        time.sleep(tick_s)
    client.close()


def measure(clients: int, writers: int, window: float, warmup: float, tick_s: float, server_mbps: float,
            priority: str, rows: int, logs: Path) -> dict[str, Any]:
    with servers(_job(clients, server_mbps, priority, rows), 1, workdir=logs / f"n{clients}") as cluster:
        counters = ProcCounters(server=cluster.servers[0].pid)
        kids = [Child(["-m", "bench.push", "--child", str(cluster.path), "--writers", str(writers),
                       "--tick-ms", str(tick_s * 1e3), "--seconds", str(warmup + window + 3)],
                      f"client-{i}", logs / f"n{clients}", pipes=True) for i in range(clients)]
        try:
            for k in kids:
                k.read_json(timeout=120)
            time.sleep(warmup)
            s0, t0 = cluster.status(10)[0], time.monotonic()
            counters.start()
            time.sleep(window)
            counters.stop()
            s1, t1 = cluster.status(10)[0], time.monotonic()
            for k in kids:
                k.wait(60)
        finally:
            for k in kids:
                k.stop()

    def d(key: str) -> float:
        return float(s1.get(key, 0) - s0.get(key, 0))

    cpu = counters.delta["server"][0]
    pushed_mb = d("rows_pushed") * ROW_BYTES / 1e6
    out: dict[str, Any] = {"cpu_s": cpu, "pushed_mb": pushed_mb, "seconds": t1 - t0,
                           "cpu_ms_per_mb": cpu * 1e3 / pushed_mb if pushed_mb else float("nan"),
                           "budgeted_share": d("rows_pushed_budgeted") / d("rows_pushed") if d("rows_pushed") else 0.0,
                           "bytes_out_mb": d("bytes_out") / 1e6, "rows_applied": d("rows_applied"),
                           "clock_advances": d("clock_advances"),
                           # per thread: the event loop ("python"), ZeroMQ's I/O thread (the kernel's
                           # copy into each subscriber's TCP socket), pyzmq's collector
                           "thread_cpu_ms_per_mb": {k: round(ns / 1e6 / pushed_mb, 4) if pushed_mb else None
                                                    for k, ns in counters.thread_delta["server"].items()
                                                    if ns > 1e6}}
    for key in ("push_gathers", "push_shared_msgs", "push_part_msgs", "push_own_gathers", "pushes_in_turns"):
        if key in s1:
            out[key] = d(key)
    for key in ("apply_lag_ms", "push_stall_ms"):  # cumulative since start: the window's mean from totals
        a, b = s0.get(key), s1.get(key)
        if a is not None and b is not None and b["n"] > a["n"]:
            out[key] = {"mean": (b["total_s"] - a["total_s"]) * 1e3 / (b["n"] - a["n"]), "max_since_start": b["max_ms"],
                        "n": b["n"] - a["n"], "busy_share": (b["total_s"] - a["total_s"]) / (t1 - t0)}
            if "squares_s2" in b:  # what a message arriving at a random time waits behind these, on average
                out[key]["wait_ms"] = (b["squares_s2"] - a["squares_s2"]) / (2 * (t1 - t0)) * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    ap.add_argument("--clients", default="4,8", help="comma-separated client process counts")
    ap.add_argument("--writers", type=int, default=1, help="clients that also write every row")
    ap.add_argument("--tick-ms", type=float, default=50.0, help="each client's pause between clocks")
    ap.add_argument("--server-mbps", type=float, default=4000.0, help="server push budget")
    ap.add_argument("--priority", default="relative", help="comm.priority: relative scores every update the "
                    "server applies (a cost per applied MB), random scores nothing")
    ap.add_argument("--rows", type=int, default=1024, help="table rows of 1 KiB (above 1024 a clock-advance push "
                    "is several chunks)")
    ap.add_argument("--window", type=float, default=6.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--quick", action="store_true", help="short windows, 4 clients")
    ap.add_argument("--label", default="ours", help="name of the checkout measured (in every line)")
    ap.add_argument("--logs", default="runs/bench-push", help="folder for the processes' logs")
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.writers, args.tick_ms / 1e3, args.seconds)
        return
    counts = [4] if args.quick else [int(c) for c in args.clients.split(",")]
    window, warmup = (2.0, 1.0) if args.quick else (args.window, args.warmup)
    logs = Path(args.logs).resolve()
    for n in counts:
        log(f"push: {n} clients, {args.writers} writer(s) ...")
        m = measure(n, args.writers, window, warmup, args.tick_ms / 1e3, args.server_mbps, args.priority,
                    args.rows, logs)
        case = f"clients-{n}-writers-{args.writers}-{args.priority}"
        case += f"-rows-{args.rows}" if args.rows != 1024 else ""
        extra = {k: v for k, v in m.items() if k not in ("cpu_ms_per_mb",)}
        emit(bench="push", case=case, metric="server-cpu-per-pushed-MB", unit="ms/MB", ours=m["cpu_ms_per_mb"],
             lower_is_better=True, label=args.label, **extra)
        emit(bench="push", case=case, metric="pushed-MBps", unit="MB/s", ours=m["pushed_mb"] / m["seconds"],
             label=args.label)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
