"""``python -m bench.elastic [--mb 100] [--moves 4] [--joins 2] [--quick] [--update adarevision] [--backup]``:
partitions moved between the two servers of a running job while two worker processes train (read,
add, clock as fast as they can); then a third server joins (``bosen-server --join``, taking a third
of the partitions) and leaves again (handing them back), ``--joins`` times.

Each move gives half of the partitions to the other server, ``--mb`` MB of rows, and the next one
gives them back (alternated). Per move: ``pause_s``, from the plan to the last server's new map (how
long clients held their sends), and the longest gap between two clocks of any worker during the move
beside the median gap outside moves (``stall_s``: what training lost). One result line per metric:
median and min-max over the moves, the bytes moved, and the load average; the same for the joins
(case ``server-join``) and the leaves (``server-leave``), timed from the plan to the leaving server's
exit (its clients' BYE included).

``--backup``: table E has backup workers (static k = n = 2; docs/design.md, "Backup workers"): the
workers' ticks are the table's iterations, a move waits until the servers agree on the step's
position, and each moved row carries the step's float64 gradient buffers of both ranks.

``--checkpoint``: the job makes checkpoints (every 50 clocks), so each server writes its part of every
move inside the move's pause (``part_s``, docs/recovery.md).

``--chaos [--app lda|mf] [--kills 10]``: instead, a checkpointed job under random SIGKILLs of servers
and workers against a failure-free run (bench/elastic/chaos.py).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Child, emit, log, median, servers, spread
from bosen.config import load
from bosen.jobs.moves import MoveReport, move_partitions, scale_servers

COLS = 128  # float32: 512 bytes a row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mb", type=float, default=100.0, help="MB of rows each move carries (half the table)")
    p.add_argument("--moves", type=int, default=4)
    p.add_argument("--joins", type=int, default=2, help="a third server joins and leaves this many times")
    p.add_argument("--quick", action="store_true", help="10 MB, 2 moves, 1 join (CI); with --chaos: 2 kills")
    p.add_argument("--update", choices=["add", "adarevision"], default="add",
                   help="table E's stored procedure (adarevision: versioned; its state is 3 float64 per value, and "
                        "row versions, snapshots and client references move with the rows)")
    p.add_argument("--backup", action="store_true",
                   help="table E has backup workers (static k = n = 2): a moved row carries the step's float64 "
                        "gradient buffers of both ranks, and a move waits for the servers' step positions to agree")
    p.add_argument("--chaos", action="store_true", help="random SIGKILLs of servers and workers instead")
    p.add_argument("--app", choices=["lda", "mf"], action="append", help="--chaos: default lda and mf")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--epochs", type=int, default=120, help="--chaos: the failure-free job's clocks")
    p.add_argument("--every", type=int, default=5, help="--chaos: a checkpoint every this many clocks")
    p.add_argument("--gap", type=int, default=3, help="--chaos: clocks of progress between two kills")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--checkpoint", action="store_true",
                   help="moves: the job makes checkpoints (every 50 clocks), so each server writes its part of "
                        "every move inside the move's pause (part_s)")
    p.add_argument("--servers-only", action="store_true", help="--chaos: kill servers only")
    p.add_argument("--repeats", type=int, default=3, help="--chaos: failure-free and chaos runs each (alternated)")
    p.add_argument("--data-scale", type=int, default=8, help="--chaos: times the data of bench.workerloss's jobs "
                                                              "(a job of minutes: room for the kills)")
    a = p.parse_args()
    if a.chaos:
        _chaos(a)
        return
    mb, moves, joins = (10.0, 2, 1) if a.quick else (a.mb, a.moves, a.joins)
    rows = int(2 * mb * 1e6 / (COLS * 4))
    job = {"cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": 2},
           "consistency": {"staleness": 2, "read_timeout_s": 120},
           "comm": {"client_bandwidth_mbps": 2000, "server_bandwidth_mbps": 2000},
           "tables": {"E": {"rows": rows, "cols": COLS, "dtype": "float32",
                            **({"update": a.update, "update_args": {"alpha": 0.01}} if a.update != "add" else {}),
                            **({"backup": {"mode": "static", "k": 2, "lr": 0.01}} if a.backup else {})}}}
    loads = [os.getloadavg()[0]]
    ck = tempfile.TemporaryDirectory(prefix="bench-elastic-ck-")
    if a.checkpoint:
        job["checkpoint"] = {"every_clocks": 50, "dir": ck.name, "keep": 1}
    with ck, tempfile.TemporaryDirectory(prefix="bench-elastic-") as d, servers(job, 2, workdir=d) as c:
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
            windows: dict[str, list[tuple[float, float]]] = {"move": [], "server-join": [], "server-leave": []}
            reports: dict[str, list[MoveReport]] = {k: [] for k in windows}

            def timed(case: str, step: Any) -> None:
                t0 = time.time()
                reports[case].append(step())
                windows[case].append((t0, time.time()))
                loads.append(os.getloadavg()[0])
                log(f"{case} {len(reports[case])}: {reports[case][-1]}")
                time.sleep(1.5)

            for k in range(moves):
                timed("move", lambda k=k: move_partitions(cfg, swapped if k % 2 == 0 else home, timeout=120))
            two = list(cfg.cluster.servers)
            for _ in range(joins):
                added = c.add_server()  # its process starts (seconds) before the clock runs
                time.sleep(1.0)
                timed("server-join", lambda added=added: scale_servers(cfg, [*two, added], timeout=120))
                timed("server-leave", lambda: scale_servers(cfg, two, timeout=120))
                c.retired(len(c.servers) - 1)
            for o in outs:
                o.with_suffix(".stop").touch()
            for w in ws:
                w.wait(timeout=120)
        finally:
            for w in ws:
                w.stop()
        times = [np.array(json.loads(o.read_text())["clock_times"]) for o in outs]
    every = [w for ws_ in windows.values() for w in ws_]
    gaps_out = []
    for t in times:
        g = np.diff(t)
        inside = np.zeros(g.shape[0], dtype=bool)
        for lo, hi in every:
            inside |= (t[1:] >= lo) & (t[:-1] <= hi + 0.2)
        gaps_out.extend(g[~inside].tolist())
    typical = median(gaps_out)
    tag = f"{mb:g}MB" + ("" if a.update == "add" else f"-{a.update}") + ("-backup" if a.backup else "")
    for case, label in (("move", f"move-{tag}"), ("server-join", f"server-join-{tag}"),
                        ("server-leave", f"server-leave-{tag}")):
        if reports[case]:
            _emit(label + ("-checkpoints" if a.checkpoint else ""), windows[case], reports[case], times, typical,
                  loads)


def _chaos(a: argparse.Namespace) -> None:
    from bench.elastic import chaos

    kills, epochs = (2, 30) if a.quick else (a.kills, a.epochs)
    for app in a.app or ["lda", "mf"]:
        with tempfile.TemporaryDirectory(prefix=f"bench-chaos-{app}-") as d:
            load0 = os.getloadavg()[0]
            r = chaos.measure(app, Path(d), epochs=epochs, every=a.every, kills=kills, gap=a.gap, seed=a.seed,
                              servers_only=a.servers_only, repeats=1 if a.quick else a.repeats,
                              scale=1 if a.quick else a.data_scale)
            emit(bench="elastic", case=f"chaos-{app}" + ("-servers" if a.servers_only else ""),
                 metric="extra_clocks", unit="clocks", ours=r.pop("extra_clocks"), goal=2,
                 load_avg=spread([load0, os.getloadavg()[0]]), **r)


def _emit(case: str, windows: list[tuple[float, float]], reports: list[MoveReport], times: list[np.ndarray],
          typical: float, loads: list[float]) -> None:
    gaps_in = []
    for lo, hi in windows:
        worst = 0.0
        for t in times:
            g = np.diff(t)
            ends = t[1:]
            during = (ends >= lo) & (t[:-1] <= hi)  # a gap that overlaps the move
            if during.any():
                worst = max(worst, float(g[during].max()))
        gaps_in.append(worst)
    pauses = [r.pause_s for r in reports]
    stalls = [g - typical for g in gaps_in]
    common = {"bench": "elastic", "case": case, "moves": len(reports),
              "bytes_moved": median([r.bytes for r in reports]), "load_avg": spread(loads)}
    emit(**common, metric="pause_s", unit="s", ours=median(pauses), spread=spread(pauses),
         wait_s=median([r.wait_s for r in reports]), export_s=median([r.export_s for r in reports]),
         map_s=median([r.map_s for r in reports]), part_s=median([r.part_s for r in reports]), target_s=1.0)
    emit(**common, metric="stall_s", unit="s", ours=median(stalls), spread=spread(stalls),
         clock_gap_typical_s=typical, target_s=1.0)


if __name__ == "__main__":
    main()
