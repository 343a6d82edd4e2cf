"""Memory and throughput against table size (issue 29): what a process pays for a table it touches
only a little of, and what a sparse table's servers pay against a dense one's.

    python -m bench.tablesize [--quick] [--sizes 1M,5M,20M,100M] [--storage dense,sparse]
                              [--only jobs,shard,stored] [--touch 10000] [--clocks 20] [--servers 2]
                              [--max-dense 20M] [--shard-touched 200k] [--shard-batch 1000]
                              [--shard-rounds 7] [--max-stored 20M] [--stored-batch 1000]

Three parts per size N (``--only`` picks), each a table of N rows x 16 float32 (64 bytes a row):

jobs: real servers and a client
    Each case is two jobs with identical processes and steps: one with a tiny table only, one with the
    tiny table plus the big table with the given ``storage``. One client subprocess warms up on the
    tiny table (imports, compiled kernels, sockets), then touches the same ``touch`` random rows of the
    big table (seeded) every clock: ``get_rows``, ``inc_rows`` of a delta, ``clock()``, for ``clocks``
    clocks, then waits until the servers applied everything. Held bytes = RSS of a process in the big
    job - RSS of the same process in the tiny job after the same steps, so everything the big table
    costs counts (values, per-row metadata, allocator slack) and nothing else.
shard: the server's table shard alone, in this process (``bench.tablesize.shard``)
    Thread CPU per increment and per read (the shard's row lookup and the gather a READ reply makes)
    of ``shard-batch`` sorted random rows of the same ``shard-touched`` rows, already stored, on a
    dense and a sparse shard alternated round by round; where the storages differ, without the wire,
    the client or the scheduler in the way.
stored: a sparse shard storing N rows (sparse only)
    A fresh process fills a sparse shard with N distinct ids spread over int64, ``stored-batch`` new
    rows per increment, and reports its resident memory growth and ``TableShard.nbytes``.

Results (``bench="tablesize"``, one JSON line each, progress on stderr):

client-held-MB
    The client's held MB after the last clock. Goal (issue 29): <= 50 MB at 20M rows with 10,000 rows
    touched, whatever the storage.
server-held-per-stored-byte
    The servers' held bytes (summed) / the value bytes of the rows they store: for a dense table
    every row, for a sparse one the rows touched. No goal here: at 10,000 rows touched the servers'
    fixed costs (a few MB) dominate; ``sparse-stored-bytes-per-row-byte`` holds the goal, with many rows.
touch-rows-per-s
    Rows read and incremented per second over the clocks after the first (the steady state a job
    sees); ``first_clock_s`` is the first clock (rows read cold: a sparse server creates them). A
    sparse record carries ``baseline`` = the dense table of the same size, and ``ratio``.
shard-inc-rows-per-s, shard-read-rows-per-s
    Rows per second of thread CPU, the median over rounds (``min``, ``max``). A sparse record carries
    ``baseline`` = the dense shard's median and ``ratio`` = the median of the per-round ratios
    (``ratio_min``, ``ratio_max``); goal (issue 29): sparse >= 0.7x dense for the same rows.
sparse-stored-bytes-per-row-byte
    RSS growth / the bytes of the rows stored (values + an 8-byte id each), ``nbytes_ratio`` the same
    for ``TableShard.nbytes``; goal <= 1.5x.

Sizes above ``--max-dense`` run sparse only (a dense table of 100M x 16 is 6.4 GB on the servers
alone), sizes above ``--max-stored`` have no stored part. The client keeps such tables by slot, only
the rows it touches (docs/design.md, "The client's rows by slot"): a 100M-row sparse job's client
holds about as much as a 1M-row one's. A storage the servers' config does not know yet is reported
as ``missing`` with the error.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Child, MiB, emit, log, report_rss, rss_bytes, servers, warm_memory_client
from bench.tablesize import shard as shard_bench
from bosen.errors import BosenError

COLS = 16
ROW_BYTES = COLS * 4
SELF = ("-m", "bench.tablesize")
CLIENT_GOAL_MB = 50.0  # at 20M rows, 10,000 touched (issue 29)
SPARSE_GOAL = 0.7  # sparse throughput / dense
STORED_GOAL = 1.5  # a sparse shard's RSS growth per byte of stored rows (values + ids)
STEPS = ("warm", "touched")
PARTS = ("jobs", "shard", "stored")


def parse_count(s: str) -> int:
    """'20M' -> 20_000_000, '10k' -> 10_000, '500' -> 500."""
    s = s.strip()
    scale = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9}.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if scale > 1 else s) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {s!r} (e.g. 500, 10k, 20M)") from None


def count_name(n: int) -> str:
    for unit, scale in (("M", 10**6), ("k", 10**3)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


# ----------------------------------------------------------------------------------------------
# the client subprocess: a line protocol on stdin/stdout with the bench process


def peer_client(config: str, touch: int, clocks: int, seed: int) -> None:
    client, tiny = warm_memory_client(config, COLS, 60.0)
    one = np.array([0], dtype=np.int64)
    report_rss(step="warm")
    sys.stdin.readline()
    times: list[float] = []
    if "big" in client.stats()["tables"]:
        big = client.table("big")
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(big.rows, size=min(touch, big.rows), replace=False)).astype(np.int64)
        delta = np.full((rows.shape[0], COLS), 1e-3, dtype=np.float32)
        for _ in range(clocks):
            t0 = time.perf_counter()
            big.get_rows(rows)
            big.inc_rows(rows, delta)
            client.clock()
            times.append(time.perf_counter() - t0)
        client.server_status(120.0)  # every update applied and acknowledged
    else:  # the tiny job takes the same steps on its one row
        for _ in range(clocks):
            tiny.get_rows(one)
            tiny.inc_rows(one, np.ones((1, COLS), dtype=np.float32))
            client.clock()
        client.server_status(120.0)
    report_rss(step="touched", clock_s=times)
    sys.stdin.readline()
    client.close()


# ----------------------------------------------------------------------------------------------
# the bench process


def run_job(rows: int | None, storage: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One job (tiny table only when ``rows`` is None): RSS of the client and of each server per step."""
    tables: dict[str, Any] = {"tiny": {"rows": 1, "cols": COLS, "dtype": "float32"}}
    if rows is not None:
        big: dict[str, Any] = {"rows": rows, "cols": COLS, "dtype": "float32"}
        if storage != "dense":
            big["storage"] = storage
        tables["big"] = big
    job = {"cluster": {"workers": 1}, "consistency": {"staleness": 2}, "tables": tables}
    out: dict[str, Any] = {}
    with servers(job, args.servers, workdir=workdir / f"{storage}-{rows or 0}") as cluster:
        pids = [s.pid for s in cluster.servers]
        cmd = [*SELF, "--peer", str(cluster.path), "--touch", str(args.touch), "--clocks", str(args.clocks),
               "--seed", str(args.seed)]
        with Child(cmd, "client", cluster.path.parent, pipes=True) as c:
            for step in STEPS:
                rec = c.read_json(timeout=600)
                if rec["step"] != step:
                    raise BosenError(f"client said step {rec['step']!r}, expected {step!r}")
                time.sleep(0.1)
                out[f"client_{step}"] = rec["rss"]
                out[f"server_{step}"] = sum(rss_bytes(p) for p in pids)
                out["clock_s"] = rec.get("clock_s", [])
                c.send_line("next")
            c.wait(60)
    return out


def sparse_supported() -> str | None:
    """None when the config knows ``storage: sparse``; else the error it gives."""
    from bosen import config as config_mod

    try:
        config_mod.load({"cluster": {"servers": ["127.0.0.1:1"], "workers": 1},
                         "tables": {"t": {"rows": 10, "cols": 1, "storage": "sparse"}}})
    except Exception as e:  # the config's own error names the key
        return str(e)
    return None


def job_cases(n: int, storages: list[str], args: argparse.Namespace, workdir: Path, tiny: dict[str, Any],
              missing: str | None) -> None:
    """The jobs part for a table of ``n`` rows: one job per storage, its memory and touch rate."""
    dense_rate = None
    for storage in storages:
        base = {"bench": "tablesize", "rows": n, "size": count_name(n), "storage": storage,
                "cols": COLS, "touch": args.touch, "clocks": args.clocks, "servers": args.servers}
        if storage == "dense" and n > args.max_dense:
            continue
        if storage == "sparse" and missing is not None:
            emit(**base, case="touch-rows-per-s", metric="rows_per_s", unit="rows/s", ours=None,
                 missing=True, error=missing)
            continue
        log(f"tablesize: {count_name(n)} rows, {storage} job ...")
        t0 = time.perf_counter()
        got = run_job(n, storage, args, workdir)
        held_client = (got["client_touched"] - tiny["client_touched"]) / 1e6
        held_server = got["server_touched"] - tiny["server_touched"]
        stored = n if storage == "dense" else min(args.touch, n)
        steady = got["clock_s"][1:]
        rate = args.touch * len(steady) / sum(steady)
        job_s = time.perf_counter() - t0
        emit(**base, case="client-held-MB", metric="held_MB", unit="MB", ours=held_client,
             lower_is_better=True, rss_MB=got["client_touched"] / 1e6, job_s=job_s,
             **({"goal": f"<= {CLIENT_GOAL_MB:g} MB", "met": held_client <= CLIENT_GOAL_MB}
                if n >= 20_000_000 and args.touch <= 10_000 else {}))
        emit(**base, case="server-held-per-stored-byte", metric="bytes_per_value_byte", unit="x",
             ours=held_server / (stored * ROW_BYTES), lower_is_better=True, held_MB=held_server / 1e6,
             stored_rows=stored)
        rec: dict[str, Any] = dict(base, case="touch-rows-per-s", metric="rows_per_s", unit="rows/s",
                                   ours=rate, first_clock_s=got["clock_s"][0],
                                   clock_s_median=float(np.median(steady)), clock_s_max=float(max(steady)))
        if storage == "dense":
            dense_rate = rate
        elif dense_rate is not None:
            rec.update(baseline=dense_rate, baseline_name="the same rows of a dense table",
                       ratio=rate / dense_rate, goal=f">= {SPARSE_GOAL:g}x dense",
                       met=rate / dense_rate >= SPARSE_GOAL)
        emit(**rec)


def shard_cases(n: int, storages: list[str], args: argparse.Namespace) -> None:
    """The shard part for a table of ``n`` rows: increments and reads per second, dense and sparse
    alternated; a sparse record's ratio is the median of the per-round ratios."""
    kinds = [k for k in storages if k != "dense" or n <= args.max_dense]
    if not kinds:
        return
    log(f"tablesize: {count_name(n)} rows, shards ({', '.join(kinds)}) ...")
    per = shard_bench.rates(n, kinds, COLS, args.shard_touched, args.shard_batch, args.shard_rounds, args.seed)
    batch = min(args.shard_batch, args.shard_touched, n)
    for op in shard_bench.OPS:
        dense = per.get("dense", {}).get(op)
        for storage, times in per.items():
            rows_per_s = [batch / t for t in times[op]]
            rec: dict[str, Any] = dict(
                bench="tablesize", rows=n, size=count_name(n), storage=storage, cols=COLS,
                case=f"shard-{op}-rows-per-s", metric="rows_per_s", unit="rows/s",
                ours=float(np.median(rows_per_s)), min=min(rows_per_s), max=max(rows_per_s),
                touched=min(args.shard_touched, n), batch=batch, rounds=args.shard_rounds, timing="thread CPU")
            if storage == "sparse" and dense is not None:
                ratio = [d / t for d, t in zip(dense, times[op], strict=True)]
                rec.update(baseline=float(np.median([batch / t for t in dense])),
                           baseline_name="the same rows of a dense shard", ratio=float(np.median(ratio)),
                           ratio_min=min(ratio), ratio_max=max(ratio),
                           goal=f">= {SPARSE_GOAL:g}x dense", met=float(np.median(ratio)) >= SPARSE_GOAL)
            emit(**rec)


def stored_case(n: int, args: argparse.Namespace, workdir: Path) -> None:
    """The stored part: a fresh process fills a sparse shard with ``n`` rows."""
    log(f"tablesize: a sparse shard storing {count_name(n)} rows ...")
    cmd = [*SELF, "--stored-peer", str(n), "--stored-batch", str(args.stored_batch), "--seed", str(args.seed)]
    with Child(cmd, f"stored-{n}", workdir, pipes=True) as c:
        got = c.read_json(timeout=1800)
        c.wait(60)
    emit(bench="tablesize", rows=n, size=count_name(n), storage="sparse", cols=COLS,
         case="sparse-stored-bytes-per-row-byte", metric="bytes_per_row_byte", unit="x", ours=got["rss_ratio"],
         lower_is_better=True, nbytes_ratio=got["nbytes_ratio"], stored_rows=got["stored_rows"],
         row_MB=got["row_bytes"] / 1e6, rss_growth_MB=got["rss_growth"] / 1e6, nbytes_MB=got["nbytes"] / 1e6,
         batch=args.stored_batch, fill_s=got["fill_s"], goal=f"<= {STORED_GOAL:g}x",
         met=got["rss_ratio"] <= STORED_GOAL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tablesize", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="1M rows, 1,000 touched, 5 clocks; shards: 20k rows touched, 3 rounds (CI: about a minute)")
    p.add_argument("--sizes", default="1M,5M,20M,100M", help="table rows, comma-separated (k, M suffixes)")
    p.add_argument("--storage", default="dense,sparse", help="comma-separated subset of: dense, sparse")
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated subset of: {', '.join(PARTS)}")
    p.add_argument("--touch", type=parse_count, default=10_000, help="rows the client touches each clock")
    p.add_argument("--clocks", type=int, default=20)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--max-dense", type=parse_count, default=20_000_000,
                   help="largest table run with dense storage")
    p.add_argument("--shard-touched", type=parse_count, default=200_000, help="rows the shards store and touch")
    p.add_argument("--shard-batch", type=parse_count, default=1000, help="rows per shard increment and read")
    p.add_argument("--shard-rounds", type=int, default=7)
    p.add_argument("--max-stored", type=parse_count, default=20_000_000,
                   help="largest size whose rows a sparse shard stores (the stored part)")
    p.add_argument("--stored-batch", type=parse_count, default=1000, help="new rows per increment (stored part)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--peer", help=argparse.SUPPRESS)  # the client subprocess: the job's config path
    p.add_argument("--stored-peer", type=int, help=argparse.SUPPRESS)  # the stored part's process
    args = p.parse_args(argv)
    if args.peer:
        peer_client(args.peer, args.touch, args.clocks, args.seed)
        return 0
    if args.stored_peer is not None:
        print(json.dumps(shard_bench.fill_sparse(args.stored_peer, COLS, args.stored_batch, args.seed)), flush=True)
        return 0
    if args.quick:
        args.sizes, args.touch, args.clocks = "1M", 1_000, 5
        args.shard_touched, args.shard_rounds = 20_000, 3
    sizes = [parse_count(s) for s in args.sizes.split(",") if s.strip()]
    storages = [s.strip() for s in args.storage.split(",") if s.strip()]
    parts = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = set(storages) - {"dense", "sparse"}
    if bad:
        p.error(f"--storage takes dense and/or sparse, got {sorted(bad)}")
    if set(parts) - set(PARTS):
        p.error(f"--only takes {', '.join(PARTS)}, got {sorted(set(parts) - set(PARTS))}")
    if args.clocks < 2 or args.touch < 1 or args.servers < 1:
        p.error("--clocks must be >= 2, --touch and --servers >= 1")
    if args.shard_touched < 1 or args.shard_batch < 1 or args.shard_rounds < 1 or args.stored_batch < 1:
        p.error("--shard-touched, --shard-batch, --shard-rounds and --stored-batch must be >= 1")
    missing = sparse_supported() if "sparse" in storages else None
    sparse_ok = [k for k in storages if k != "sparse" or missing is None]
    with tempfile.TemporaryDirectory(prefix="bench-tablesize-") as tmp:
        workdir = Path(tmp)
        tiny: dict[str, Any] = {}
        if "jobs" in parts:
            tiny = run_job(None, "dense", args, workdir)
            log(f"tablesize: tiny job RSS client {tiny['client_touched'] / MiB:.1f} MiB, "
                f"servers {tiny['server_touched'] / MiB:.1f} MiB")
        for n in sizes:
            if "jobs" in parts:
                job_cases(n, storages, args, workdir, tiny, missing)
            if "shard" in parts:
                shard_cases(n, sparse_ok, args)
            if "stored" in parts and "sparse" in sparse_ok and n <= args.max_stored:
                stored_case(n, args, workdir)
    with open("/proc/loadavg") as f:
        log(f"tablesize: load average {f.read().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
