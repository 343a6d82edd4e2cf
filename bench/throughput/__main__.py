"""Throughput benchmark (docs/design.md, "Benchmarks"): update ingest and row fetch MB/s through client
and server, beside raw pyzmq moving the same frames in the same run; cache-hit read latency; resident
memory per byte held.

    python -m bench.throughput [--quick] [--only ingest,fetch,latency,memory]

Output: one JSON object per line on stdout (progress goes to stderr), each with ``bench="throughput"``,
``case``, ``metric``, ``unit``, ``ours`` and, where a baseline ran in the same run, ``baseline``,
``baseline_name`` and ``ratio``, oriented so that ``ratio > 1`` means we are better: ``ours / baseline``
for MB/s, ``baseline / ours`` for latency. Goals are separate fields (``goal``, ``meets_goal``).
Memory lines have no baseline and so no ``ratio``: ``ours`` is bytes held per raw byte (unit "x",
``lower_is_better``). Throughput lines also carry ``per_MiB`` / ``baseline_per_MiB``: CPU milliseconds
and minor page faults per MiB moved, per process, and CPU microseconds per MiB per thread
(``thread_cpu_us``: worker ``MainThread``, ``bosen-comm``, ZeroMQ I/O ``ZMQbg/IO/0``, ``pyzmq-gc``, the
server's loop ``python``), which stay meaningful on a busy machine and show where the time goes.

Every case runs its own job (one ``bosen.server`` subprocess on 127.0.0.1 holding only the case's
table; the Client in this process), because per-clock work scales with every table's row count.
Float32 tables with 256 columns: one row is 1 KiB.

ingest-1KiB / ingest-1MiB
    A batch is 1 row (1 KiB) or 1024 rows (1 MiB). Timed: 4 (quick) or 8 passes over every row of a
    2 MiB / 64 MiB table, ``table.inc_rows(rows, deltas); client.clock()`` per batch (staleness 10^9: nothing ever
    blocks), each pass ended by a STATUS round trip on the same connection, which the server answers
    only after it has applied every earlier message; the server's ``rows_applied`` must equal what was
    sent (the round trip also keeps one pass's updates from coalescing with the next one's).
    An untimed pass first makes every page of the table resident on both sides.
    MB/s = float32 value bytes / seconds (the int64 row-id frame, headers and CLOCK/ACK/SCLOCK messages
    are not counted as payload; they do travel). The client library sends what is buffered whenever
    its communication thread runs, so several batches may go as one INC message: ``inc_msgs`` says how
    many went. Baseline "pyzmq PUSH/PULL": one message per batch with the same three frames as our INC
    message (msgpack header, int64 row ids, float32 values), from this process to a receiver subprocess
    that only counts them, each pass ended by an END message the receiver answers on a second socket.
    The baseline's processes use the allocator settings our server and client use (``bosen.malloc``):
    with glibc's defaults the receiver page-faults 10-40 times per MiB, which made raw pyzmq slower
    and noisier than it need be (and flattered ``ratio``).

ingest-1MiB-curve
    The ingest-1MiB pass (1 MiB batches over a 64 MiB table) through two jobs that run side by side
    and differ only in ``security``: one plaintext, one CURVE (``security.mode: on`` with keys made by
    ``bosen.security.make_keys``: every message encrypted and authenticated). Repetitions alternate
    (plaintext first on even ones, CURVE first on odd ones), so load on a shared machine hits both
    alike. ``ours`` = CURVE MB/s, baseline = plaintext MB/s of the same run, ``ratio`` = CURVE /
    plaintext; goal >= 0.5 (issue 32). A second line, ``ingest-1MiB-curve-vs-pyzmq``, sets the same
    CURVE MB/s beside raw pyzmq PUSH/PULL with CURVE moving the same frames (a third member of each
    alternation): how much of the cost is libzmq's encryption itself. A third,
    ``ingest-1MiB-curve-pyzmq-only``, is raw pyzmq with CURVE against raw pyzmq without (a fourth
    member): libzmq's own CURVE/plaintext ratio on this machine. Where thread times exist, the lines
    carry what the CPU per MiB allows the ratio to be: ``cpu_bound_ratio`` (all cores busy: total
    thread CPU per MiB, plaintext / CURVE) and ``stage_bound_ratio`` (cores to spare: the busiest
    thread's, plaintext / CURVE), per pair, the median. ``ingest-1MiB-curve-cipher``: thread CPU us
    of libsodium encrypting and decrypting one 1 MiB frame (``crypto_box_easy_afternm`` and its
    open, XSalsa20-Poly1305, in the libsodium libzmq loaded), the floor of what CURVE adds per MiB,
    with ``cpu_bound_ratio_at_best`` = plaintext CPU / (plaintext CPU + that floor).
    ``ingest-1MiB-curve-pyzmq-2conn``: raw pyzmq with CURVE over two connections (messages round
    robin, each connection on an I/O thread of its own at both ends; a fifth member) against one:
    what spreading the encryption over threads gives on this machine. Not in the default ``--only``
    set: ``--only curve``.

fetch-1KiB / fetch-1MiB
    ``table.get_row(r)`` (1 KiB) or ``table.get_rows(1024 rows)`` (1 MiB) of rows never read before, so
    every call is one READ -> ROWS round trip. Their memory was made resident beforehand on both sides
    (by incrementing them; the client's cache pages by writing them, see ``touch``), so ``ours`` is the
    steady-state path; ``ours_cold`` is the same on rows
    whose memory neither side has touched yet (first-touch page faults included). MB/s = value bytes
    returned / seconds. Baseline "pyzmq DEALER/ROUTER": as many sequential round trips, request =
    [header, row ids], reply = [header, row ids, values] from a preallocated buffer in a subprocess.

get_row-hit, get_rows-hit-N
    Calls on rows already cached: best of several timed loops, microseconds per call. Baseline
    "numpy copy": ``values[r].copy()`` / ``values[idx]`` on a plain array of the same shape, the floor
    any cached read pays. ``goal`` (2 us) applies to get_row.

memory-server / memory-client-buffered / memory-client
    Two jobs run one after the other with identical processes and steps: one with only a tiny table,
    one with the tiny table plus the big table (``raw_MiB``). A client subprocess warms up on the tiny
    table (imports, compiled kernels, sockets), then reads every row of the big table (1024 rows per
    get_rows), increments every row, clocks and waits until the server has applied it. Held bytes =
    RSS of a process in the big job - RSS of the same process in the tiny job after the same steps:
    everything the big table costs counts (values, per-row metadata, allocator slack), nothing else.
    ``ours`` = held / raw bytes of the big table. The client is measured with the increments still
    buffered (``memory-client-buffered``: cache + update buffer) and after the clock (``memory-client``).
    ``peak_held_MiB`` compares the high-water marks (transient message buffers). Goals: server <= 2x,
    client <= 3x.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from bench.common import (
    Child,
    MiB,
    ProcCounters,
    emit,
    log,
    median,
    peak_rss_bytes,
    prewarm_memory,
    report_rss,
    rss_bytes,
    servers,
    warm_memory_client,
)
from bosen.jobs.cluster import free_ports
from bosen.malloc import reuse_large_buffers

BENCH = "throughput"
COLS = 256  # float32 columns: one row is 1 KiB
ROW_BYTES = COLS * 4
STALENESS = 10**9  # nothing ever waits for a clock
GET_ROW_GOAL_US = 2.0
STATUS_TIMEOUT_S = 300.0  # the server answers after its whole backlog
PEER_TIMEOUT_S = 60  # a baseline peer that does not answer by then has died
LARGE_RATIO_GOAL = 0.5
SERVER_MEM_GOAL = 2.0
CLIENT_MEM_GOAL = 3.0
SELF = ("-m", "bench.throughput")  # the baseline peers and the memory client are this module with --peer


@dataclass(frozen=True)
class Plan:
    reps: int
    ingest_small_MiB: int  # table size; a repetition passes over every row ``ingest_passes`` times
    ingest_large_MiB: int
    ingest_passes: int  # long enough repetitions (0.1 s and up) that scheduling noise averages out
    fetch_small_calls: int
    fetch_large_calls: int
    latency_calls: int
    latency_loops: int
    memory_table_MiB: int


# Same ingest and fetch table sizes in both modes, so quick and full numbers compare; full repeats more.
QUICK = Plan(reps=3, ingest_small_MiB=2, ingest_large_MiB=64, ingest_passes=4, fetch_small_calls=1000,
             fetch_large_calls=24, latency_calls=20_000, latency_loops=5, memory_table_MiB=32)
FULL = Plan(reps=7, ingest_small_MiB=2, ingest_large_MiB=64, ingest_passes=8, fetch_small_calls=3000,
            fetch_large_calls=64, latency_calls=100_000, latency_loops=7, memory_table_MiB=128)


def result(case: str, metric: str, unit: str, ours: float, baseline: float | None = None,
           baseline_name: str | None = None, ratio: float | None = None, **extra: Any) -> None:
    fields: dict[str, Any] = dict(bench=BENCH, case=case, metric=metric, unit=unit, ours=ours)
    if baseline is not None:
        fields.update(baseline=baseline, baseline_name=baseline_name, ratio=ratio)
    emit(**fields, **extra)


def median_index(xs: list[float]) -> int:
    """Index of the median repetition (the upper one of two for an even count)."""
    return sorted(range(len(xs)), key=xs.__getitem__)[len(xs) // 2]


def header_like(n: int) -> bytes:
    """A msgpack header of the size our INC/ROWS headers have."""
    return msgpack.packb({"t": 2, "s": 123456, "tb": 0, "n": n, "dt": "float32", "sp": False}, use_bin_type=True)


# ----------------------------------------------------------------------------------------------
# baseline peers (subprocesses running this module: --peer pull | router)


def peer_pull(ports: list[int], ctl_port: int, curve_key: str | None = None) -> None:
    """Count messages and bytes until an END has come on every port, report them on the control
    socket; exit on QUIT. ``curve_key``: a server secret key file: the PULL is a CURVE server (any
    client key). Several ports: one I/O thread each (a sender's connection per port)."""
    ctx = zmq.Context(io_threads=len(ports))
    pull = ctx.socket(zmq.PULL)
    if curve_key is not None:
        from bosen.security import load_key_file

        public, secret = load_key_file(curve_key, secret=True)
        pull.curve_server = True
        pull.curve_publickey = public
        pull.curve_secretkey = secret  # type: ignore[assignment]
    pull.setsockopt(zmq.RCVHWM, 0)
    for i, port in enumerate(ports):
        pull.setsockopt(zmq.AFFINITY, 1 << i)  # libzmq otherwise may serve every connection on one I/O thread
        pull.bind(f"tcp://127.0.0.1:{port}")
    ctl = ctx.socket(zmq.PUSH)
    ctl.connect(f"tcp://127.0.0.1:{ctl_port}")
    msgs = nbytes = ends = 0
    while True:
        frames = pull.recv_multipart(copy=False)
        first = frames[0].bytes if len(frames) == 1 else None
        if first == b"END":
            ends += 1  # each connection is FIFO: its END comes after everything sent on it
            if ends == len(ports):
                ctl.send_json([msgs, nbytes])
                msgs = nbytes = ends = 0
        elif first == b"QUIT":
            break
        else:
            msgs += 1
            nbytes += sum(len(f) for f in frames)
    pull.close(0)
    ctl.close(0)
    ctx.term()


def peer_router(port: int) -> None:
    """Answer [header, row ids] with [header, row ids, values] from a preallocated buffer."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{port}")
    buffers: dict[int, np.ndarray] = {}
    while True:
        ident, hdr, rows = sock.recv_multipart(copy=False)
        if hdr.bytes == b"QUIT":
            break
        n = msgpack.unpackb(hdr.bytes)["n"]
        vals = buffers.get(n)
        if vals is None:
            vals = buffers[n] = np.ones((n, COLS), dtype=np.float32)
        sock.send_multipart([ident, hdr, rows, vals], copy=False)
    sock.close(0)
    ctx.term()


def push_ingest(pushes: list[zmq.Socket], ctl: zmq.Socket, pull: Any, rows_per_msg: int, msgs: int,
                what: str) -> float:
    """Seconds to push ``msgs`` INC-shaped messages, round robin over ``pushes`` (one connection each),
    and hear from the receiver (``ctl``) that all arrived: the raw pyzmq baselines' ingest, plain or CURVE."""
    frames = [header_like(rows_per_msg), np.arange(rows_per_msg, dtype=np.int64),
              np.full((rows_per_msg, COLS), 1e-3, dtype=np.float32)]
    n = len(pushes)
    t0 = time.perf_counter()
    for k in range(msgs):
        pushes[k % n].send_multipart(frames, copy=False)
    for push in pushes:
        push.send(b"END")
    if not ctl.poll(PEER_TIMEOUT_S * 1000):
        raise RuntimeError(f"{what} receiver did not answer within {PEER_TIMEOUT_S}s:\n{pull.tail()}")
    got, _ = ctl.recv_json()
    dt = time.perf_counter() - t0
    assert got == msgs, f"{what} receiver counted {got} of {msgs} messages"
    return dt


class Baselines:
    """The raw-pyzmq peers, started once for the whole run."""

    def __init__(self, workdir: Path) -> None:
        self.ctx = zmq.Context()
        self.pull_port, self.router_port = free_ports(2)
        self.ctl = self.ctx.socket(zmq.PULL)
        ctl_port = self.ctl.bind_to_random_port("tcp://127.0.0.1")
        self.pull = Child([*SELF, "--peer", "pull", "--ports", str(self.pull_port), "--ctl-port", str(ctl_port)],
                          "peer-pull", workdir)
        self.router = Child([*SELF, "--peer", "router", "--port", str(self.router_port)], "peer-router", workdir)
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.connect(f"tcp://127.0.0.1:{self.pull_port}")
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.connect(f"tcp://127.0.0.1:{self.router_port}")
        for s in (self.ctl, self.push, self.dealer):
            s.setsockopt(zmq.LINGER, 0)
        self.dealer.setsockopt(zmq.RCVTIMEO, PEER_TIMEOUT_S * 1000)
        self.ingest(1, 1)  # both peers are up and connected before anything is timed
        self.fetch(1, 1)

    def ingest(self, rows_per_msg: int, msgs: int) -> float:
        """Seconds to push ``msgs`` INC-shaped messages and hear that all arrived."""
        return push_ingest([self.push], self.ctl, self.pull, rows_per_msg, msgs, "pyzmq")

    def fetch(self, rows_per_msg: int, calls: int) -> float:
        """Seconds for ``calls`` sequential request/reply round trips returning ``rows_per_msg`` rows."""
        hdr = header_like(rows_per_msg)
        rows = np.arange(rows_per_msg, dtype=np.int64)
        want = rows_per_msg * ROW_BYTES
        t0 = time.perf_counter()
        for _ in range(calls):
            self.dealer.send_multipart([hdr, rows], copy=False)
            reply = self.dealer.recv_multipart(copy=False)  # zmq.Again after PEER_TIMEOUT_S
            vals = np.frombuffer(reply[2].buffer, dtype=np.float32)
        dt = time.perf_counter() - t0
        assert vals.nbytes == want
        return dt

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.push.send(b"QUIT", zmq.NOBLOCK)
            self.dealer.send_multipart([b"QUIT", b""], zmq.NOBLOCK)
        time.sleep(0.05)
        for s in (self.push, self.dealer, self.ctl):
            s.close(0)
        self.ctx.term()
        self.pull.stop()
        self.router.stop()


# ----------------------------------------------------------------------------------------------
# ingest, fetch, latency


@contextlib.contextmanager
def job_client(tables: dict[str, int], workdir: Path,
               security: dict[str, Any] | None = None) -> Iterator[tuple[Any, int]]:
    """A one-server job holding only ``tables`` (name -> rows; COLS float32 columns): (Client, server pid).

    Each case gets its own job: per-clock client work scans every table's row clocks, so tables of
    other cases would slow a case down.
    """
    from bosen.client import Client

    job: dict[str, Any] = {"cluster": {"workers": 1}, "consistency": {"staleness": STALENESS},
                           "tables": {k: {"rows": v, "cols": COLS, "dtype": "float32"} for k, v in tables.items()}}
    if security is not None:
        job["security"] = security
    with servers(job, workdir=workdir / ("-".join(tables) + ("-curve" if security else ""))) as cluster:
        with Client.connect(cluster.path) as client:
            yield client, cluster.servers[0].pid


def ingest_ours(client: Any, table: str, rows_per_batch: int, counters: ProcCounters,
                passes: int = 1) -> dict[str, Any]:
    """``passes`` passes over every row of ``table``, ``rows_per_batch`` rows per inc_rows + clock,
    each ended by a STATUS round trip (so no update of one pass coalesces with the next one's)."""
    t = client.table(table)
    deltas = np.full((rows_per_batch, COLS), 1e-3, dtype=np.float32)
    sets = [np.arange(k, k + rows_per_batch, dtype=np.int64) for k in range(0, t.rows, rows_per_batch)]
    s0 = client.server_status(STATUS_TIMEOUT_S)[0]
    c0 = client.stats()["update_batches"]
    counters.start()
    t0 = time.perf_counter()
    for _ in range(passes):
        for rows in sets:
            t.inc_rows(rows, deltas)
            client.clock()
        s1 = client.server_status(STATUS_TIMEOUT_S)[0]  # answered once every earlier INC and CLOCK is applied
    dt = time.perf_counter() - t0
    counters.stop()
    applied = (s1["rows_applied"] - s0["rows_applied"]) * ROW_BYTES
    submitted = passes * len(sets) * rows_per_batch * ROW_BYTES
    assert applied == submitted, f"server applied {applied} of {submitted} bytes"
    return dict(seconds=dt, bytes=applied, batches=passes * len(sets), passes=passes,
                inc_msgs=client.stats()["update_batches"] - c0)


def run_ingest(base: Baselines, plan: Plan, workdir: Path) -> None:
    for case, rpb, table_MiB in (("ingest-1KiB", 1, plan.ingest_small_MiB),
                                 ("ingest-1MiB", 1024, plan.ingest_large_MiB)):
        with job_client({"ingest": table_MiB * MiB // ROW_BYTES}, workdir) as (client, spid):
            ours_ctr = ProcCounters(client=None, server=spid)
            base_ctr = ProcCounters(sender=None, receiver=base.pull.pid)
            ingest_ours(client, "ingest", rpb, ours_ctr.start())  # warm-up: every page of the table resident
            base.ingest(rpb, max(table_MiB * MiB // (rpb * ROW_BYTES) // 10, 4))
            ours, theirs, runs = [], [], []
            for rep in range(plan.reps):
                r = ingest_ours(client, "ingest", rpb, ours_ctr.start(), plan.ingest_passes)
                r["ctr"] = ours_ctr.per(r["bytes"] / MiB)
                base_ctr.start()
                b = sum(base.ingest(rpb, r["batches"] // r["passes"]) for _ in range(r["passes"]))
                r["base_ctr"] = base_ctr.stop().per(r["bytes"] / MiB)
                ours.append(r["bytes"] / r["seconds"] / 1e6)
                theirs.append(r["bytes"] / b / 1e6)
                runs.append(r)
                log(f"{case} rep {rep}: ours {ours[-1]:.1f} MB/s ({r['batches']} batches in {r['inc_msgs']} "
                    f"INC messages), pyzmq {theirs[-1]:.1f} MB/s")
        o, b = median(ours), median(theirs)
        r = runs[median_index(ours)]
        extra = dict(goal=LARGE_RATIO_GOAL, meets_goal=o / b >= LARGE_RATIO_GOAL) if rpb > 1 else {}
        result(case, "ingest_throughput", "MB/s", o, b, "pyzmq PUSH/PULL", o / b, **extra, reps=plan.reps,
               ours_all=ours, baseline_all=theirs, batch_bytes=rpb * ROW_BYTES, batches=r["batches"],
               inc_msgs=r["inc_msgs"], table_MiB=table_MiB, passes=plan.ingest_passes,
               payload="float32 values; row ids, headers and CLOCK/ACK/SCLOCK messages not counted",
               per_MiB=r["ctr"], baseline_per_MiB=r["base_ctr"])


class RawPush:
    """pyzmq PUSH/PULL, with CURVE when ``keys`` is given (the receiver a subprocess, as the plaintext
    baseline's): what libzmq alone does on this machine, plain and encrypted, in the same run.
    ``conns`` > 1: that many connections, each on an I/O thread of its own at both ends (ZMQ_AFFINITY),
    messages round robin: what spreading the encryption over threads gives here."""

    def __init__(self, workdir: Path, keys: Path | None, conns: int = 1) -> None:
        from bosen.security import load_key_file

        self.what = "CURVE" if keys is not None else "pyzmq"
        self.ctx = zmq.Context(io_threads=conns)
        self.ctl = self.ctx.socket(zmq.PULL)
        ctl_port = self.ctl.bind_to_random_port("tcp://127.0.0.1")
        ports = free_ports(conns)
        curve = ["--curve-key", str(keys / "server.key_secret")] if keys is not None else []
        name = f"peer-pull-{'curve' if keys is not None else 'plain'}-{conns}"
        self.pull = Child([*SELF, "--peer", "pull", "--ports", ",".join(map(str, ports)), "--ctl-port", str(ctl_port),
                           *curve], name, workdir)
        self.pushes = []
        for i, port in enumerate(ports):
            push = self.ctx.socket(zmq.PUSH)
            if keys is not None:
                server_public, _ = load_key_file(keys / "server.key", secret=False)
                public, secret = load_key_file(keys / "client-0.key_secret", secret=True)
                push.curve_serverkey = server_public
                push.curve_publickey = public
                push.curve_secretkey = secret  # type: ignore[assignment]
            push.setsockopt(zmq.AFFINITY, 1 << i)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(f"tcp://127.0.0.1:{port}")
            self.pushes.append(push)
        self.ctl.setsockopt(zmq.LINGER, 0)
        self.ingest(1024, 4)

    def ingest(self, rows_per_msg: int, msgs: int) -> float:
        return push_ingest(self.pushes, self.ctl, self.pull, rows_per_msg, msgs, self.what)

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.pushes[0].send(b"QUIT", zmq.NOBLOCK)
        time.sleep(0.05)
        for push in self.pushes:
            push.close(0)
        self.ctl.close(0)
        self.ctx.term()
        self.pull.stop()


def libsodium_path() -> str | None:
    """The libsodium file this process's libzmq loaded (from /proc/self/maps; None where there is none:
    a libzmq built with its own TweetNaCl, or no /proc)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.rpartition(" ")[2]
        if "libsodium" in Path(path).name:
            return path
    return None


def cipher_us_per_MiB(reps: int = 30) -> dict[str, Any] | None:
    """Thread CPU us for libsodium's crypto_box_easy_afternm / crypto_box_open_easy_afternm
    (XSalsa20-Poly1305, what libzmq's CURVE runs per message frame) of 1 MiB, in the libsodium that
    libzmq loaded: the floor of CURVE's cost per MiB per side, whatever the rest of the path does.
    Medians (min-max) over ``reps``."""
    import ctypes

    path = libsodium_path()
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    if lib.sodium_init() < 0:
        return None
    vp, size = ctypes.c_void_p, ctypes.c_ulonglong
    box, box_open = lib.crypto_box_easy_afternm, lib.crypto_box_open_easy_afternm
    box.argtypes = box_open.argtypes = [vp, vp, size, vp, vp]
    plain = np.full(MiB, 7, dtype=np.uint8)
    boxed = np.empty(MiB + 16, dtype=np.uint8)  # crypto_box_MACBYTES
    opened = np.empty(MiB, dtype=np.uint8)
    nonce, key = np.zeros(24, dtype=np.uint8), np.ones(32, dtype=np.uint8)
    enc, dec = [], []
    for _ in range(reps):
        t = time.thread_time()
        box(boxed.ctypes.data, plain.ctypes.data, MiB, nonce.ctypes.data, key.ctypes.data)
        t1 = time.thread_time()
        ok = box_open(opened.ctypes.data, boxed.ctypes.data, MiB + 16, nonce.ctypes.data, key.ctypes.data)
        t2 = time.thread_time()
        assert ok == 0, "crypto_box_open_easy_afternm refused its own box"
        enc.append((t1 - t) * 1e6)
        dec.append((t2 - t1) * 1e6)
    return dict(library=path, encrypt_us=median(enc), encrypt_min_max=[min(enc), max(enc)],
                decrypt_us=median(dec), decrypt_min_max=[min(dec), max(dec)])


def cpu_bounds(plain: dict[str, Any], curve: dict[str, Any]) -> dict[str, float] | None:
    """What the thread CPU per MiB of one plaintext and one CURVE repetition allows the ratio to be:
    ``cpu``: total plaintext / total CURVE (a machine whose cores are all busy: throughput goes as
    CPU per MiB), ``stage``: plaintext's busiest thread / CURVE's (cores to spare: the pipeline's
    slowest stage sets the pace)."""
    def threads(per: dict[str, Any]) -> list[float]:
        return [us for proc in per["thread_cpu_us"].values() for us in proc.values()]

    p, c = threads(plain), threads(curve)
    if not p or not c:
        return None
    return {"cpu": sum(p) / sum(c), "stage": max(p) / max(c)}


def run_ingest_curve(plan: Plan, workdir: Path, reps: int) -> None:
    """ingest-1MiB with CURVE beside plaintext, alternated (module doc, ingest-1MiB-curve)."""
    from bosen.security import make_keys

    keys = workdir / "keys"
    make_keys(keys, clients=1)
    curve = {"mode": "on", "server_key": str(keys / "server.key"), "client_key": str(keys / "client-0.key_secret"),
             "allowed_clients": [str(keys / "clients")]}
    rpb, table_MiB, case = 1024, plan.ingest_large_MiB, "ingest-1MiB-curve"
    rows = table_MiB * MiB // ROW_BYTES
    order = ("plain", "curve", "raw", "rawplain", "raw2")
    with job_client({"ingest": rows}, workdir) as (plain, plain_pid), \
            job_client({"ingest": rows}, workdir, curve) as (enc, enc_pid):
        ctrs = {"plain": ProcCounters(client=None, server=plain_pid),
                "curve": ProcCounters(client=None, server=enc_pid)}
        clients = {"plain": plain, "curve": enc}
        for name, c in clients.items():  # warm-up: every page of both tables resident
            ingest_ours(c, "ingest", rpb, ctrs[name].start())
        raws = {"raw": RawPush(workdir, keys), "rawplain": RawPush(workdir, None), "raw2": RawPush(workdir, keys, 2)}
        for name, raw in raws.items():
            ctrs[name] = ProcCounters(sender=None, receiver=raw.pull.pid)
        mbs: dict[str, list[float]] = {name: [] for name in order}
        per: dict[str, list[Any]] = {name: [] for name in order}
        try:
            for rep in range(reps):
                for name in (order if rep % 2 == 0 else order[::-1]):
                    if name in raws:
                        ctrs[name].start()
                        secs = sum(raws[name].ingest(rpb, rows // rpb) for _ in range(plan.ingest_passes))
                        nbytes = plan.ingest_passes * rows * ROW_BYTES
                        mbs[name].append(nbytes / secs / 1e6)
                        per[name].append(ctrs[name].stop().per(nbytes / MiB))
                        continue
                    r = ingest_ours(clients[name], "ingest", rpb, ctrs[name].start(), plan.ingest_passes)
                    mbs[name].append(r["bytes"] / r["seconds"] / 1e6)
                    per[name].append(ctrs[name].per(r["bytes"] / MiB))
                log(f"{case} rep {rep}: CURVE {mbs['curve'][-1]:.1f} MB/s, plaintext {mbs['plain'][-1]:.1f} MB/s, "
                    f"ratio {mbs['curve'][-1] / mbs['plain'][-1]:.3f}; raw pyzmq CURVE {mbs['raw'][-1]:.1f} MB/s, "
                    f"plaintext {mbs['rawplain'][-1]:.1f} MB/s, ratio {mbs['raw'][-1] / mbs['rawplain'][-1]:.3f}, "
                    f"CURVE on 2 connections {mbs['raw2'][-1]:.1f} MB/s")
        finally:
            for raw in raws.values():
                raw.close()
    ratios = [c / p for c, p in zip(mbs["curve"], mbs["plain"], strict=True)]
    bounds = [b for b in map(cpu_bounds, per["plain"], per["curve"]) if b is not None]
    extra: dict[str, Any] = {}
    if bounds:  # per pair, then the median: each pair ran under the same load
        extra = dict(cpu_bound_ratio=median([b["cpu"] for b in bounds]),
                     stage_bound_ratio=median([b["stage"] for b in bounds]))
    o, b = median(mbs["curve"]), median(mbs["plain"])
    i = median_index(mbs["curve"])
    result(case, "ingest_throughput", "MB/s", o, b, "the same ingest without security", o / b,
           goal=LARGE_RATIO_GOAL, meets_goal=o / b >= LARGE_RATIO_GOAL, reps=reps, ours_all=mbs["curve"],
           baseline_all=mbs["plain"], pair_ratios=ratios, pair_ratio_median=median(ratios),
           pair_ratio_min=min(ratios), pair_ratio_max=max(ratios), **extra, batch_bytes=rpb * ROW_BYTES,
           table_MiB=table_MiB, passes=plan.ingest_passes, per_MiB=per["curve"][i],
           baseline_per_MiB=per["plain"][median_index(mbs["plain"])])
    raw_ratios = [c / r for c, r in zip(mbs["curve"], mbs["raw"], strict=True)]
    result(f"{case}-vs-pyzmq", "ingest_throughput", "MB/s", o, median(mbs["raw"]), "pyzmq PUSH/PULL with CURVE",
           o / median(mbs["raw"]), reps=reps, ours_all=mbs["curve"], baseline_all=mbs["raw"],
           pair_ratios=raw_ratios, pair_ratio_median=median(raw_ratios), pair_ratio_min=min(raw_ratios),
           pair_ratio_max=max(raw_ratios), batch_bytes=rpb * ROW_BYTES, table_MiB=table_MiB,
           passes=plan.ingest_passes, baseline_per_MiB=per["raw"][median_index(mbs["raw"])])
    # libzmq's own price of CURVE: raw pyzmq encrypted / raw pyzmq plaintext, the same frames, same run
    lib_ratios = [c / p for c, p in zip(mbs["raw"], mbs["rawplain"], strict=True)]
    lib_bounds = [b for b in map(cpu_bounds, per["rawplain"], per["raw"]) if b is not None]
    lib_extra: dict[str, Any] = {}
    if lib_bounds:
        lib_extra = dict(cpu_bound_ratio=median([b["cpu"] for b in lib_bounds]),
                         stage_bound_ratio=median([b["stage"] for b in lib_bounds]))
    ro, rb = median(mbs["raw"]), median(mbs["rawplain"])
    result(f"{case}-pyzmq-only", "ingest_throughput", "MB/s", ro, rb, "pyzmq PUSH/PULL without security", ro / rb,
           reps=reps, ours_all=mbs["raw"], baseline_all=mbs["rawplain"], pair_ratios=lib_ratios,
           pair_ratio_median=median(lib_ratios), pair_ratio_min=min(lib_ratios), pair_ratio_max=max(lib_ratios),
           **lib_extra, batch_bytes=rpb * ROW_BYTES, table_MiB=table_MiB, passes=plan.ingest_passes,
           per_MiB=per["raw"][median_index(mbs["raw"])],
           baseline_per_MiB=per["rawplain"][median_index(mbs["rawplain"])])
    two = [c / r for c, r in zip(mbs["raw2"], mbs["raw"], strict=True)]
    ro2 = median(mbs["raw2"])
    result(f"{case}-pyzmq-2conn", "ingest_throughput", "MB/s", ro2, ro, "pyzmq PUSH/PULL with CURVE, one connection",
           ro2 / ro, reps=reps, ours_all=mbs["raw2"], baseline_all=mbs["raw"], pair_ratios=two,
           pair_ratio_median=median(two), pair_ratio_min=min(two), pair_ratio_max=max(two),
           batch_bytes=rpb * ROW_BYTES, table_MiB=table_MiB, passes=plan.ingest_passes,
           per_MiB=per["raw2"][median_index(mbs["raw2"])])
    cipher = cipher_us_per_MiB()
    if cipher is not None:
        # the floor: a MiB encrypted once and decrypted once, beside plaintext's whole CPU per MiB
        plain_us = median([sum(us for proc in p["thread_cpu_us"].values() for us in proc.values())
                           for p in per["plain"]])
        crypto_us = cipher["encrypt_us"] + cipher["decrypt_us"]
        result(f"{case}-cipher", "cpu_per_MiB", "us", crypto_us, **cipher, plaintext_path_us=plain_us,
               cpu_bound_ratio_at_best=plain_us / (plain_us + crypto_us), lower_is_better=True)


def fetch_ours(client: Any, table: str, rows_per_call: int, calls: int, first_row: int) -> float:
    """Seconds for ``calls`` reads of rows never read before, from ``first_row`` on."""
    t = client.table(table)
    if rows_per_call == 1:
        rows = range(first_row, first_row + calls)
        t0 = time.perf_counter()
        for r in rows:
            t.get_row(r)
        return time.perf_counter() - t0
    sets = [np.arange(first_row + k * rows_per_call, first_row + (k + 1) * rows_per_call, dtype=np.int64)
            for k in range(calls)]
    t0 = time.perf_counter()
    for s in sets:
        t.get_rows(s)
    return time.perf_counter() - t0


def touch(client: Any, table: str, lo: int, hi: int) -> None:
    """Make the memory of rows [lo, hi) resident on both sides without reading them: increment them
    (the server's values and the client's update buffer), and write the client's cache pages directly,
    which increments no longer touch for rows the cache does not hold (reaching into the client here
    is bench-only: those cache entries hold no row yet, and every read overwrites them)."""
    t = client.table(table)
    ones = np.full((1024, COLS), 1e-3, dtype=np.float32)
    for k in range(lo, hi, 1024):
        rows = np.arange(k, min(k + 1024, hi), dtype=np.int64)
        t.inc_rows(rows, ones[: rows.shape[0]])
    client.clock()
    client.server_status(STATUS_TIMEOUT_S)
    cache = client._state(table).cache
    assert (cache.clock[lo:hi] < 0).all(), "touch() is for rows the client has never read"
    cache.values[lo:hi] = 0


def run_fetch(base: Baselines, plan: Plan, workdir: Path, fetch: bool = True, latency: bool = True) -> None:
    cases = (("fetch-1KiB", 1, plan.fetch_small_calls), ("fetch-1MiB", 1024, plan.fetch_large_calls))
    # rows per table: warm-up, then one range per repetition (memory resident), then one cold range
    layout = {case: (max(calls // 20, 2) * rpc, calls * rpc) for case, rpc, calls in cases}
    tables = {case: warm + (plan.reps + 1) * span for case, (warm, span) in layout.items()}
    with job_client(tables, workdir) as (client, spid):
        ours_ctr, base_ctr = ProcCounters(client=None, server=spid), ProcCounters(client=None, server=base.router.pid)
        for case, rpc, calls in cases if fetch else ():
            warm, span = layout[case]
            nbytes = span * ROW_BYTES
            cold_first = warm + plan.reps * span
            touch(client, case, 0, cold_first)
            fetch_ours(client, case, rpc, warm // rpc, 0)
            base.fetch(rpc, warm // rpc)
            ours, theirs, ctrs = [], [], []
            for rep in range(plan.reps):
                ours_ctr.start()
                dt = fetch_ours(client, case, rpc, calls, warm + rep * span)
                ours_ctr.stop()
                base_ctr.start()
                b = base.fetch(rpc, calls)
                ctrs.append((ours_ctr.per(nbytes / MiB), base_ctr.stop().per(nbytes / MiB)))
                ours.append(nbytes / dt / 1e6)
                theirs.append(nbytes / b / 1e6)
                log(f"{case} rep {rep}: ours {ours[-1]:.1f} MB/s ({dt / calls * 1e6:.0f} us/call), "
                    f"pyzmq {theirs[-1]:.1f} MB/s ({b / calls * 1e6:.0f} us/call)")
            cold = nbytes / fetch_ours(client, case, rpc, calls, cold_first) / 1e6
            log(f"{case} cold (first touch of the pages on both sides): ours {cold:.1f} MB/s")
            o, b = median(ours), median(theirs)
            mid = ctrs[median_index(ours)]
            extra = dict(goal=LARGE_RATIO_GOAL, meets_goal=o / b >= LARGE_RATIO_GOAL) if rpc > 1 else {}
            result(case, "fetch_throughput", "MB/s", o, b, "pyzmq DEALER/ROUTER", o / b, **extra, reps=plan.reps,
                   ours_all=ours, baseline_all=theirs, bytes_per_call=rpc * ROW_BYTES, calls=calls,
                   ours_us_per_call=rpc * ROW_BYTES / o, baseline_us_per_call=rpc * ROW_BYTES / b,
                   ours_cold=cold, payload="float32 values only", per_MiB=mid[0], baseline_per_MiB=mid[1],
                   note="rows never read before; ours_cold: their memory also never touched on either side")
        if latency:
            run_latency(client, "fetch-1KiB", plan)


def per_call_us(fn: Any, arg: Any, calls: int, loops: int) -> tuple[float, float]:
    """(best, median) microseconds per call over ``loops`` timed loops of ``calls`` calls."""
    times = []
    for _ in range(loops):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(arg)
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return min(times), median(times)


def run_latency(client: Any, table: str, plan: Plan) -> None:
    t = client.table(table)
    t.get_rows(np.arange(100, dtype=np.int64))  # the first 100 rows are cached from here on
    assert client.stats()["tables"][table]["cached_rows"] >= 100
    plain = np.ones((t.rows, COLS), dtype=np.float32)
    row = 7
    best, med = per_call_us(t.get_row, row, plan.latency_calls, plan.latency_loops)
    bbest, _ = per_call_us(lambda r: plain[r].copy(), row, plan.latency_calls, plan.latency_loops)
    result("get_row-hit", "latency", "us", best, bbest, "numpy copy", bbest / best, goal=GET_ROW_GOAL_US,
           meets_goal=best <= GET_ROW_GOAL_US, ours_median=med, calls=plan.latency_calls, loops=plan.latency_loops,
           row_bytes=ROW_BYTES, statistic="best of loops; ratio = baseline / ours")
    rng = np.random.default_rng(0)
    for k in (1, 10, 100):
        idx = rng.permutation(100)[:k].astype(np.int64)
        calls = max(plan.latency_calls // max(k // 10, 1), 1000)
        best, med = per_call_us(t.get_rows, idx, calls, plan.latency_loops)
        bbest, _ = per_call_us(plain.__getitem__, idx, calls, plan.latency_loops)
        result(f"get_rows-hit-{k}", "latency", "us", best, bbest, "numpy copy", bbest / best, ours_median=med,
               calls=calls, loops=plan.latency_loops, rows=k, statistic="best of loops; ratio = baseline / ours")


# ----------------------------------------------------------------------------------------------
# memory


def peer_memclient(config: str) -> None:
    """Client side of the memory case; a line protocol on stdin/stdout with the bench process."""
    client, _ = warm_memory_client(config, COLS, STATUS_TIMEOUT_S)
    report_rss(step="warm")
    big = client.table("big") if "big" in client.stats()["tables"] else None
    sys.stdin.readline()
    if big is not None:
        chunks = [np.arange(k, min(k + 1024, big.rows), dtype=np.int64) for k in range(0, big.rows, 1024)]
        for c in chunks:
            big.get_rows(c)
        ones = np.ones((1024, COLS), dtype=np.float32)
        for c in chunks:
            big.inc_rows(c, ones[: c.shape[0]])
    report_rss(step="buffered")
    sys.stdin.readline()
    client.clock()
    client.server_status(STATUS_TIMEOUT_S)  # every update applied and acknowledged, the pushes received
    report_rss(step="flushed")
    sys.stdin.readline()
    client.close()


def memory_job(table_MiB: int | None, workdir: Path) -> dict[str, int]:
    tables: dict[str, Any] = {"tiny": {"rows": 1, "cols": COLS, "dtype": "float32"}}
    if table_MiB:
        tables["big"] = {"rows": table_MiB * MiB // ROW_BYTES, "cols": COLS, "dtype": "float32"}
    job = {"cluster": {"workers": 1}, "consistency": {"staleness": STALENESS}, "tables": tables}
    out: dict[str, int] = {}
    with servers(job, workdir=workdir / f"memory-{table_MiB or 0}") as cluster:
        spid = cluster.servers[0].pid
        with Child([*SELF, "--peer", "memclient", "--config", str(cluster.path)], "memclient",
                   cluster.path.parent, pipes=True) as c:
            for step in ("warm", "buffered", "flushed"):
                rec = c.read_json()
                assert rec["step"] == step, rec
                time.sleep(0.1)
                out[f"client_{step}"] = rec["rss"]
                out[f"server_{step}"] = rss_bytes(spid)
                c.send_line("next")
            out["client_peak"] = rec["peak"] or 0
            out["server_peak"] = peak_rss_bytes(spid) or 0
            c.wait(30)
    return out


def run_memory(plan: Plan, workdir: Path) -> None:
    raw = plan.memory_table_MiB * MiB
    tiny = memory_job(None, workdir)
    big = memory_job(plan.memory_table_MiB, workdir)
    log(f"memory (RSS bytes): tiny job {tiny}, big job {big}")
    common = dict(lower_is_better=True, raw_MiB=plan.memory_table_MiB,
                  method="held = RSS(job with big table) - RSS(job with tiny table only), same steps; "
                         "ours = held / raw")
    for case, who, step, goal in (("memory-server", "server", "flushed", SERVER_MEM_GOAL),
                                  ("memory-client-buffered", "client", "buffered", CLIENT_MEM_GOAL),
                                  ("memory-client", "client", "flushed", CLIENT_MEM_GOAL)):
        key = f"{who}_{step}"
        held = big[key] - tiny[key]
        result(case, "bytes_per_raw_byte", "x", held / raw, goal=goal, meets_goal=held / raw <= goal, **common,
               held_MiB=held / MiB, rss_MiB=big[key] / MiB, rss_tiny_job_MiB=tiny[key] / MiB,
               within_process_MiB=(big[key] - big[f"{who}_warm"]) / MiB,
               peak_held_MiB=(big[f"{who}_peak"] - tiny[f"{who}_peak"]) / MiB,
               state={"buffered": "every row read and incremented, updates still buffered",
                      "flushed": "after clock(): updates applied by the server and acknowledged"}[step])


# ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="fewer repetitions and a smaller memory table (CI: under a minute)")
    p.add_argument("--only", default="ingest,fetch,latency,memory",
                   help="comma-separated subset of: ingest, fetch, latency, memory, curve (ingest with CURVE "
                        "security beside plaintext; not run by default)")
    p.add_argument("--curve-reps", type=int, default=None,
                   help="alternated plaintext/CURVE pairs of --only curve (default: the plan's repetitions)")
    p.add_argument("--prewarm-GiB", type=float, default=2.0,
                   help="touch and free this much memory first (fresh VM pages are slow to fault in; see "
                        "bench/common.py prewarm_memory); 0 skips it")
    p.add_argument("--peer", choices=("pull", "router", "memclient"), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ports", help=argparse.SUPPRESS)  # the pull peer's: comma-separated
    p.add_argument("--ctl-port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--curve-key", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peer in ("pull", "router"):
        reuse_large_buffers()  # the allocator settings our server and client use: no page faults per message
    if args.peer == "pull":
        peer_pull([int(x) for x in args.ports.split(",")], args.ctl_port, args.curve_key)
        return 0
    if args.peer == "router":
        peer_router(args.port)
        return 0
    if args.peer == "memclient":
        peer_memclient(args.config)
        return 0

    plan = QUICK if args.quick else FULL
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - {"ingest", "fetch", "latency", "memory", "curve"}
    if unknown:
        p.error(f"--only: unknown part {sorted(unknown)[0]!r}")
    started = time.perf_counter()
    if args.prewarm_GiB > 0:
        log(f"touched and freed {args.prewarm_GiB:g} GiB of memory in "
            f"{prewarm_memory(int(args.prewarm_GiB * (1 << 30))):.1f}s (machine warm-up)")
    with tempfile.TemporaryDirectory(prefix="bosen-bench-") as tmp:
        workdir = Path(tmp)
        if only & {"ingest", "fetch", "latency"}:
            base = Baselines(workdir)
            try:
                if "ingest" in only:
                    run_ingest(base, plan, workdir)
                if only & {"fetch", "latency"}:
                    run_fetch(base, plan, workdir, fetch="fetch" in only, latency="latency" in only)
            finally:
                base.close()
        if "memory" in only:
            run_memory(plan, workdir)
        if "curve" in only:
            run_ingest_curve(plan, workdir, args.curve_reps or plan.reps)
    log(f"throughput bench done in {time.perf_counter() - started:.1f}s ({'quick' if args.quick else 'full'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
