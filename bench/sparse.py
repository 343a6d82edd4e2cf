"""Sparse server tables (issue 29): a shard's memory against the rows it stores, and its increment and
read cost against a dense shard of the same rows.

``python -m bench.sparse memory --rows 1000000``: a fresh process builds a sparse shard (16 float32
columns, ids spread over int64) by increments of ``--batch`` new rows, and reports its resident
memory growth and ``TableShard.nbytes`` against the bytes of the rows stored (values + 8-byte ids).

``python -m bench.sparse throughput``: the server's CPU per increment and per read (thread time) of
the same rows on a dense and a sparse shard, alternated ``--rounds`` times; the median ratio with
its spread. It measures the shard (where sparse and dense differ), not the wire or the client.

``python -m bench.sparse e2e``: the same through real servers and a client, a dense and a sparse
table in two clusters up at once (2 servers each), ticks of ``inc_rows`` + ``clock`` + ``get_rows``
of ``--batch`` random rows alternated between them; the ticks-per-second ratio and what the
servers store.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from bench.common import rss_bytes
from bosen.config import UNBOUNDED, CommConfig, InitConfig, TableConfig
from bosen.partition import Partition
from bosen.server import procedures
from bosen.server.shard import TableShard
from bosen.wire import UpdateBatch

COLS = 16


def _shard(storage: str, rows: int) -> TableShard:
    cfg = TableConfig(name="E", rows=rows, cols=COLS, storage=storage, init=InitConfig(uniform=(-0.1, 0.1)))
    return TableShard(0, cfg, Partition(1), 0, 1, procedures.load(cfg, "bench"), CommConfig(enabled=False))


def memory(n: int, batch: int) -> dict[str, float]:
    """One sparse shard filled with ``n`` distinct ids; measured in this process."""
    ids = np.random.default_rng(0).integers(0, UNBOUNDED, size=n, dtype=np.int64)  # distinct w.h.p.
    ones = np.ones((batch, COLS), np.float32)
    warm = _shard("sparse", UNBOUNDED)  # kernels loaded (numba) before the baseline
    warm.apply(UpdateBatch(ids[:10], ones[:10]), 0)
    del warm
    base = rss_bytes()
    s = _shard("sparse", UNBOUNDED)
    for i in range(0, n, batch):
        part = ids[i:i + batch]
        s.apply(UpdateBatch(part, ones[:part.shape[0]]), 0)
    grown = rss_bytes() - base
    stored_bytes = s.stored * (COLS * 4 + 8)
    return {"rows": s.stored, "row_bytes": stored_bytes, "rss_growth": grown, "nbytes": s.nbytes,
            "rss_ratio": grown / stored_bytes, "nbytes_ratio": s.nbytes / stored_bytes}


def throughput(rows: int, touched: int, batch: int, rounds: int) -> dict[str, object]:
    """Thread CPU per increment of ``batch`` rows and per read of them (local_rows + gather), dense
    and sparse alternated on the same ``touched`` rows (a sparse shard that already holds them)."""
    rng = np.random.default_rng(1)
    ids = rng.choice(rows, size=touched, replace=False).astype(np.int64)
    shards = {k: _shard(k, rows) for k in ("dense", "sparse")}
    vals = np.ones((batch, COLS), np.float32)
    batches = [np.sort(rng.choice(ids, size=batch, replace=False)) for _ in range(64)]
    for s in shards.values():  # first touch and compilation outside the timing
        for i in range(0, touched, batch):
            s.apply(UpdateBatch(ids[i:i + batch], np.ones((ids[i:i + batch].shape[0], COLS), np.float32)), 0)
    per: dict[str, dict[str, list[float]]] = {k: {"inc": [], "read": []} for k in shards}
    for _ in range(rounds):
        for k, s in shards.items():
            t = time.thread_time()
            for b in batches:
                s.apply(UpdateBatch(b, vals), 0)
            per[k]["inc"].append((time.thread_time() - t) / len(batches))
            t = time.thread_time()
            for b in batches:
                local, index = s.local_rows(b, "READ")
                s.values[index].copy() if type(index) is slice else s.values[local]
            per[k]["read"].append((time.thread_time() - t) / len(batches))
    out: dict[str, object] = {"rows": rows, "touched": touched, "batch": batch, "rounds": rounds}
    for op in ("inc", "read"):
        # throughput ratio sparse / dense per round (the rounds alternate, so each pair shares its load)
        ratio = np.array(per["dense"][op]) / np.array(per["sparse"][op])
        out[op] = {"dense_rows_per_s": batch / float(np.median(per["dense"][op])),
                   "sparse_rows_per_s": batch / float(np.median(per["sparse"][op])),
                   "ratio_median": float(np.median(ratio)), "ratio_min": float(ratio.min()),
                   "ratio_max": float(ratio.max())}
    return out


def end_to_end(rows: int, touched: int, batch: int, rounds: int, ticks: int = 20) -> dict[str, object]:
    """Wall time per tick, dense and sparse alternated per round (round 0, first touches, not counted)."""
    import shutil
    import tempfile
    from pathlib import Path

    from bosen.client import Client
    from bosen.jobs.cluster import start_cluster
    from bosen.jobs.job import job_config
    from bosen.jobs.supervise import ProcessGroup

    tmp = Path(tempfile.mkdtemp(prefix="bench-sparse-"))
    rng = np.random.default_rng(0)
    pool = rng.choice(rows, touched, replace=False)
    batches = [rng.choice(pool, batch, replace=False) for _ in range(ticks)]
    vals = np.ones((batch, COLS), np.float32)
    per: dict[str, list[float]] = {"dense": [], "sparse": []}
    try:
        with ProcessGroup(tmp / "logs") as group:
            spec = {"rows": rows, "cols": COLS, "dtype": "float32"}
            clusters = {k: start_cluster(job_config([], 1, tables={"W": {**spec, "storage": k}}, staleness=0),
                                         tmp / k, 2, group=group, name=k) for k in per}
            clients = {k: Client.connect(c.path, rank=0) for k, c in clusters.items()}
            try:
                for rnd in range(rounds + 1):
                    for k, client in clients.items():
                        t = client.table("W")
                        t0 = time.perf_counter()
                        for b in batches:
                            t.inc_rows(b, vals)
                            client.clock()
                            t.get_rows(b)
                        if rnd:
                            per[k].append((time.perf_counter() - t0) / ticks)
                stored = {k: [s["tables"]["W"] for s in c.status()] for k, c in clusters.items()}
            finally:
                for client in clients.values():
                    client.close()
                for c in clusters.values():
                    c.stop(check=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = np.array(per["dense"]) / np.array(per["sparse"])
    return {"rows": rows, "batch": batch, "rounds": rounds, "ms_per_tick": {k: 1e3 * float(np.median(v))
                                                                          for k, v in per.items()},
            "ratio_median": float(np.median(ratio)), "ratio_min": float(ratio.min()),
            "ratio_max": float(ratio.max()),
            "servers": {k: [{"rows": x["rows"], "bytes": x["bytes"]} for x in v] for k, v in stored.items()}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sparse", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("memory", "throughput", "e2e"))
    p.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 5_000_000],
                   help="memory: rows stored (one fresh process each); throughput: the table's rows")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--touched", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.what == "memory":
        if a.child:
            print(json.dumps(memory(a.rows[0], a.batch)))
            return
        for n in a.rows:  # a fresh process per size: nothing freed earlier is reused
            r = subprocess.run([sys.executable, "-m", "bench.sparse", "memory", "--child", "--rows", str(n),
                                "--batch", str(a.batch)], check=True, capture_output=True, text=True)
            print(r.stdout.strip())
    elif a.what == "throughput":
        print(json.dumps(throughput(a.rows[0], a.touched, a.batch, a.rounds)))
    else:
        print(json.dumps(end_to_end(a.rows[0], a.touched, a.batch, a.rounds)))
    with open("/proc/loadavg") as f:
        print("loadavg", f.read().strip())


if __name__ == "__main__":
    main()
