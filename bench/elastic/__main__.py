"""``python -m bench.elastic [--mb 100] [--moves 4] [--quick]``: partitions moved between the two
servers of a running job while two worker processes train (read, add, clock as fast as they can).

Each move gives half of the partitions to the other server, ``--mb`` MB of rows, and the next one
gives them back (alternated). Per move: ``pause_s``, from the plan to the last server's new map (how
long clients held their sends), and the longest gap between two clocks of any worker during the move
beside the median gap outside moves (``stall_s``: what training lost). One result line per metric:
median and min-max over the moves, the bytes moved, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import Child, emit, log, median, servers, spread
from bosen.config import load
from bosen.jobs.moves import move_partitions

COLS = 128  # float32: 512 bytes a row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mb", type=float, default=100.0, help="MB of rows each move carries (half the table)")
    p.add_argument("--moves", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="10 MB, 2 moves (CI)")
    a = p.parse_args()
    mb, moves = (10.0, 2) if a.quick else (a.mb, a.moves)
    rows = int(2 * mb * 1e6 / (COLS * 4))
    job = {"cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": 2},
           "consistency": {"staleness": 2, "read_timeout_s": 120},
           "comm": {"client_bandwidth_mbps": 2000, "server_bandwidth_mbps": 2000},
           "tables": {"E": {"rows": rows, "cols": COLS, "dtype": "float32"}}}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as d, servers(job, 2, workdir=d) as c:
        cfg = load(c.path)
        parts = cfg.cluster.num_partitions
        home = np.arange(parts, dtype=np.int32) % 2
        swapped = np.where(np.arange(parts) % 4 < 2, 1 - home, home).astype(np.int32)  # half the partitions
        outs = [Path(d) / f"w{i}.json" for i in range(2)]
        ws = [Child(["-m", "bench.elastic.worker", str(c.path), str(o)], f"w{i}", Path(d))
              for i, o in enumerate(outs)]
        try:
            while not all(s["clients_joined"] == 2 for s in c.status()):
                time.sleep(0.05)
            time.sleep(3.0)  # every worker's cache warm, clocks steady
            windows, reports = [], []
            for k in range(moves):
                t0 = time.time()
                reports.append(move_partitions(cfg, swapped if k % 2 == 0 else home, timeout=120))
                windows.append((t0, time.time()))
                loads.append(os.getloadavg()[0])
                log(f"move {k}: {reports[-1]}")
                time.sleep(1.5)
            for o in outs:
                o.with_suffix(".stop").touch()
            for w in ws:
                w.wait(timeout=120)
        finally:
            for w in ws:
                w.stop()
        times = [np.array(json.loads(o.read_text())["clock_times"]) for o in outs]
    gaps_in, gaps_out = [], []
    for lo, hi in windows:
        worst = 0.0
        for t in times:
            g = np.diff(t)
            ends = t[1:]
            during = (ends >= lo) & (t[:-1] <= hi)  # a gap that overlaps the move
            if during.any():
                worst = max(worst, float(g[during].max()))
        gaps_in.append(worst)
    for t in times:
        g = np.diff(t)
        inside = np.zeros(g.shape[0], dtype=bool)
        for lo, hi in windows:
            inside |= (t[1:] >= lo) & (t[:-1] <= hi + 0.2)
        gaps_out.extend(g[~inside].tolist())
    typical = median(gaps_out)
    pauses = [r.pause_s for r in reports]
    stalls = [g - typical for g in gaps_in]
    common = {"bench": "elastic", "case": f"move-{mb:g}MB", "moves": moves,
              "bytes_moved": median([r.bytes for r in reports]), "load_avg": spread(loads)}
    emit(**common, metric="pause_s", unit="s", ours=median(pauses), spread=spread(pauses),
         wait_s=median([r.wait_s for r in reports]), export_s=median([r.export_s for r in reports]),
         map_s=median([r.map_s for r in reports]), target_s=1.0)
    emit(**common, metric="stall_s", unit="s", ours=median(stalls), spread=spread(stalls),
         clock_gap_typical_s=typical, target_s=1.0)


if __name__ == "__main__":
    main()
