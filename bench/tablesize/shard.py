"""The server's table shard alone, in one process (bench.tablesize): where dense and sparse storage
differ, without the wire, the client or another process's noise in the way.

``rates`` times increments and reads of the same rows on a dense and a sparse shard, alternated round
by round so that each pair of rounds shares the machine's load; ``fill_sparse`` measures what a sparse
shard holds against the rows it stores (run it in a fresh process: nothing freed earlier is reused).
"""

from __future__ import annotations

import time

import numpy as np

from bench.common import rss_bytes
from bosen.config import UNBOUNDED, CommConfig, InitConfig, TableConfig
from bosen.partition import Partition
from bosen.server import procedures
from bosen.server.shard import TableShard
from bosen.wire import UpdateBatch

OPS = ("inc", "read")
ID_BYTES = 8  # a sparse shard keeps each stored row's id (the map's ids); a dense one knows it by place


def make_shard(storage: str, rows: int, cols: int) -> TableShard:
    """One shard (server 0 of 1, one client, no managed communication) of a ``rows`` x ``cols``
    float32 table, initialised uniformly as a model's embedding would be."""
    cfg = TableConfig(name="big", rows=rows, cols=cols, storage=storage, init=InitConfig(uniform=(-0.1, 0.1)))
    return TableShard(0, cfg, Partition(1), 0, 1, procedures.load(cfg, "bench.tablesize"), CommConfig(enabled=False))


def rates(rows: int, storages: list[str], cols: int, touched: int, batch: int, rounds: int,
          seed: int = 1) -> dict[str, dict[str, list[float]]]:
    """Per storage and op, the thread CPU seconds per batch of each round: ``batch`` sorted random rows
    of the same ``touched`` rows (stored before the timing, first touched in random order, so a sparse
    shard only looks them up and its slots are not in id order), an increment (``apply``) or a read
    (``local_rows`` and the gather a READ reply makes)."""
    rng = np.random.default_rng(seed)
    # in random order: a sparse shard's slots follow first touches, which do not come in id order
    ids = rng.choice(rows, size=min(touched, rows), replace=False).astype(np.int64)
    batches = [np.sort(rng.choice(ids, size=min(batch, ids.shape[0]), replace=False)) for _ in range(64)]
    vals = np.full((batches[0].shape[0], cols), 1e-3, np.float32)
    shards = {k: make_shard(k, rows, cols) for k in storages}
    for s in shards.values():  # first touches and compilation outside the timing
        for i in range(0, ids.shape[0], batch):
            part = ids[i:i + batch]
            s.apply(UpdateBatch(part, np.zeros((part.shape[0], cols), np.float32)), 0)
    out: dict[str, dict[str, list[float]]] = {k: {op: [] for op in OPS} for k in shards}
    for _ in range(rounds):
        for k, s in shards.items():
            t = time.thread_time()
            for b in batches:
                s.apply(UpdateBatch(b, vals), 0)
            out[k]["inc"].append((time.thread_time() - t) / len(batches))
            t = time.thread_time()
            for b in batches:
                local, index = s.local_rows(b, "READ")
                s.values[index].copy() if type(index) is slice else s.values[local]
            out[k]["read"].append((time.thread_time() - t) / len(batches))
    return out


def fill_sparse(n: int, cols: int, batch: int, seed: int = 0) -> dict[str, float]:
    """A sparse shard filled with ``n`` distinct ids spread over int64, ``batch`` new rows per increment:
    its resident memory growth and ``TableShard.nbytes`` against the bytes of the rows it stores
    (values + an 8-byte id each). The ids and deltas are made, and the kernels loaded, before the
    baseline, so the growth is the shard's alone."""
    ids = np.unique(np.random.default_rng(seed).integers(0, UNBOUNDED, size=n, dtype=np.int64))
    np.random.default_rng(seed + 1).shuffle(ids)  # first-touch order is not id order
    ones = np.ones((batch, cols), np.float32)
    warm = make_shard("sparse", UNBOUNDED, cols)
    warm.apply(UpdateBatch(ids[:10], ones[:10]), 0)
    del warm
    base = rss_bytes()
    s = make_shard("sparse", UNBOUNDED, cols)
    t0 = time.perf_counter()
    for i in range(0, ids.shape[0], batch):
        part = ids[i:i + batch]
        s.apply(UpdateBatch(part, ones[:part.shape[0]]), 0)
    fill_s = time.perf_counter() - t0
    grown = rss_bytes() - base
    row_bytes = s.stored * (cols * 4 + ID_BYTES)
    return {"stored_rows": s.stored, "row_bytes": row_bytes, "rss_growth": grown, "nbytes": s.nbytes,
            "rss_ratio": grown / row_bytes, "nbytes_ratio": s.nbytes / row_bytes, "fill_s": fill_s}
