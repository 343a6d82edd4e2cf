"""Worker for the shaped-link tests (tests/client/test_multihost.py); prints one JSON line.

``sum``: increments every row by (rank+1) per tick for ``--ticks`` ticks, reading each tick;
prints the final values it reads. ``flood``: keeps every row dirty for ``--seconds`` without
clocking (budgeted sends only) and prints the client's update-latency statistics.
"""

import argparse
import json
import time

import numpy as np

from bosen.client import Client

p = argparse.ArgumentParser()
p.add_argument("--config", required=True)
p.add_argument("--mode", choices=["sum", "flood"], required=True)
p.add_argument("--ticks", type=int, default=5)
p.add_argument("--seconds", type=float, default=3.0)
a = p.parse_args()

client = Client.connect(a.config)
W = client.table("W")
rows = np.arange(W.rows)
if a.mode == "sum":
    for _ in range(a.ticks):
        W.get_rows(rows)
        W.inc_rows(rows, np.full((W.rows, W.cols), client.rank + 1, dtype=W.dtype))
        client.clock()
    final = W.get_rows(rows)  # at tick `ticks`: with staleness 0 this holds every tick's updates
    client.close()
    print(json.dumps({"rank": client.rank, "values": sorted(set(final.ravel().tolist()))}))
else:
    d = np.full((W.rows, W.cols), 1e-3, dtype=np.float32)
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        W.inc_rows(rows, d)
        time.sleep(0.002)
    s = client.stats()
    client.abort()  # a flooded link would take long to drain; the measurement is done
    print(json.dumps({k: s[k] for k in ("ack_latency_ms_mean", "ack_latency_ms_max", "ack_latency_ms_last",
                                        "bytes_sent", "acks", "window_paused_s", "uptime_s")}))
