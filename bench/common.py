"""Helpers shared by the benchmarks (docs/design.md, "Benchmarks"): JSON result lines, child processes, memory.

- ``emit(**fields)`` prints one result as a JSON line on stdout (flushed at once).
- ``Child`` starts a Python subprocess whose output goes to a log file; ``stop()`` always ends it.
  It runs in the repository root with the root on PYTHONPATH, so ``Child(["-m", "bench.NAME", ...])``
  finds the ``bench`` package whatever the caller's directory.
- ``servers(job, n)`` starts the servers of a job on free local ports and stops them on exit
  (``bosen.jobs.cluster``); ``bosen.jobs.job.run_job`` runs a whole job through ``bosen launch``.
- ``rss_bytes(pid)`` is a process's resident set size (psutil).

Benchmarks run from the root of a source checkout as ``python -m bench.NAME``; nothing here depends
on the current directory.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from bosen.errors import BosenError
from bosen.jobs.cluster import LocalCluster, start_cluster
from bosen.jobs.supervise import Process

MiB = 1 << 20
KiB = 1 << 10
REPO = Path(__file__).resolve().parents[1]  # the checkout: configs/, data/, and the bench package


# ----------------------------------------------------------------------------------------------
# output


def _round(v: Any, digits: int = 5) -> Any:
    """Floats to ``digits`` significant digits (results are measurements, not exact values)."""
    if isinstance(v, float) and math.isfinite(v) and v != 0.0:
        return round(v, max(0, digits - 1 - int(math.floor(math.log10(abs(v))))))
    if isinstance(v, dict):
        return {k: _round(x, digits) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_round(x, digits) for x in v]
    return v


def emit(**fields: Any) -> dict[str, Any]:
    """Print one result line: a JSON object with the given fields, floats rounded to 5 digits."""
    rec = _round(fields)
    print(json.dumps(rec), flush=True)
    return rec


def log(msg: str) -> None:
    """Progress for humans: stderr, so stdout stays JSON lines only."""
    print(msg, file=sys.stderr, flush=True)


def median(xs: Iterable[float]) -> float:
    return float(statistics.median(list(xs)))


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements (fields for a result line)."""
    return {"median": median(xs), "min": float(min(xs)), "max": float(max(xs)), "reps": len(xs)}


# ----------------------------------------------------------------------------------------------
# processes (supervised by bosen.jobs.supervise: own process group, stop with grace then kill, and on
# Linux they die with the bench process)


def repo_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` with the repository root first on PYTHONPATH: what a ``python -m bench.NAME`` child needs
    to import the ``bench`` package (applied on top of this process's environment)."""
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths), **(env or {})}


class Child(Process):
    """``python ARGS...`` as a supervised process, its log in LOG_DIR/NAME.log; it runs in the
    repository root with the root on PYTHONPATH (``repo_env``), so ``-m bench.NAME`` works.

    With ``pipes`` its stdin and stdout are pipes (line protocols with the bench process) and only
    stderr goes to the log.
    """

    def __init__(self, args: Sequence[str], name: str, log_dir: Path, *, pipes: bool = False,
                 env: Mapping[str, str] | None = None) -> None:
        super().__init__(name, [sys.executable, *args], Path(log_dir) / f"{name}.log", env=repo_env(env),
                         cwd=REPO, pipes=pipes)

    def send_line(self, line: str) -> None:
        assert self.popen.stdin is not None, f"{self.name} was started without pipes"
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def read_json(self, timeout: float = 120.0) -> dict[str, Any]:
        """Next stdout line of a piped child, parsed as JSON (fails with its log tail if it died).

        For lockstep protocols (one line per request): a second line already buffered here would not
        wake the select below.
        """
        import selectors

        assert self.popen.stdout is not None, f"{self.name} was started without pipes"
        sel = selectors.DefaultSelector()
        sel.register(self.popen.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                raise BosenError(f"{self.name}: no answer within {timeout:g}s\n{self.tail()}")
        finally:
            sel.close()
        line = self.popen.stdout.readline()
        if not line:
            code = self.wait(5)
            raise BosenError(f"{self.name} exited with status {code}\n{self.tail()}")
        return json.loads(line)


@contextlib.contextmanager
def servers(job: Mapping[str, Any], n: int = 1, *, workdir: str | Path | None = None,
            log_level: str = "WARNING") -> Iterator[LocalCluster]:
    """The servers of ``job`` (config data without ``cluster.servers``): ``n`` on free local ports,
    ready when the block starts, stopped when it ends, whatever happened in between.

    The job's YAML (``cluster.path``, what every client should load) and the logs go to ``workdir``
    (default: a temporary folder, removed afterwards).
    """
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bosen-bench-"))
        yield stack.enter_context(start_cluster(job, workdir, n, server_args=["--log-level", log_level]))


# ----------------------------------------------------------------------------------------------
# memory


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of process ``pid`` (default: this one), in bytes."""
    return psutil.Process(pid if pid is not None else os.getpid()).memory_info().rss


class ProcCounters:
    """CPU seconds and minor page faults of some processes between ``start()`` and ``stop()``, and
    the CPU time of each of their threads.

    ``per(unit)`` gives them per unit of work (e.g. per MiB moved), per process label. Page faults
    and thread times come from /proc (Linux); elsewhere they are None / empty. Thread times are in
    nanoseconds at the source, so they stay meaningful where process CPU time (10 ms ticks) does not;
    they show which thread (worker, communication, ZeroMQ I/O, server loop) spends what.
    """

    def __init__(self, **pids: int | None) -> None:
        self.procs = {k: psutil.Process(pid if pid is not None else os.getpid()) for k, pid in pids.items()}
        self._start: dict[str, tuple[float, int | None, dict[str, int]]] = {}
        self.delta: dict[str, tuple[float, int | None]] = {}
        self.thread_delta: dict[str, dict[str, int]] = {}

    def _read(self, p: psutil.Process) -> tuple[float, int | None, dict[str, int]]:
        t = p.cpu_times()
        return t.user + t.system, minor_faults(p.pid), thread_cpu_ns(p.pid)

    def start(self) -> ProcCounters:
        self._start = {k: self._read(p) for k, p in self.procs.items()}
        return self

    def stop(self) -> ProcCounters:
        for k, p in self.procs.items():
            cpu, flt, thr = self._read(p)
            cpu0, flt0, thr0 = self._start[k]
            self.delta[k] = (cpu - cpu0, None if flt is None or flt0 is None else flt - flt0)
            self.thread_delta[k] = {name: ns - thr0[name] for name, ns in thr.items() if name in thr0}
        return self

    def per(self, units: float) -> dict[str, dict[str, Any]]:
        """Per unit: CPU ms and page faults per process; CPU us per thread (threads below 1 us left out)."""
        threads = {k: {name: round(ns / 1e3 / units, 1) for name, ns in sorted(d.items(), key=lambda x: -x[1])
                       if ns / 1e3 / units >= 1}
                   for k, d in self.thread_delta.items()}
        return {"cpu_ms": {k: cpu * 1e3 / units for k, (cpu, _) in self.delta.items()},
                "minor_faults": {k: (None if f is None else f / units) for k, (_, f) in self.delta.items()},
                "thread_cpu_us": threads}


def thread_cpu_ns(pid: int | None = None) -> dict[str, int]:
    """CPU time of each thread of a process so far, in ns (/proc/PID/task/*/schedstat; empty where
    there is none), keyed by thread name: Python's names for this process's own threads, the OS's
    for others (a server's loop is "python"); "pyzmq-gc" releases zero-copy buffers. Same-named
    threads (one ZeroMQ I/O thread per context) are summed."""
    pid = pid if pid is not None else os.getpid()
    names = {t.native_id: "pyzmq-gc" if type(t).__name__ == "GarbageCollectorThread" else t.name
             for t in threading.enumerate()} if pid == os.getpid() else {}
    out: dict[str, int] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            name = names.get(int(tid)) or Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
        out[name] = out.get(name, 0) + ns
    return out


def minor_faults(pid: int | None = None) -> int | None:
    """Minor page faults of a process so far (Linux /proc/PID/stat field 10); None elsewhere."""
    try:
        text = Path(f"/proc/{pid if pid is not None else os.getpid()}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[7])


def peak_rss_bytes(pid: int | None = None) -> int | None:
    """High-water mark of the resident set (Linux VmHWM); None where the platform has none."""
    try:
        text = Path(f"/proc/{pid if pid is not None else os.getpid()}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def report_rss(**fields: Any) -> None:
    """A memory client's line to the bench process: its resident set now (after a collection, and a
    pause for ZeroMQ's zero-copy frees to settle), its peak, and ``fields``."""
    gc.collect()
    time.sleep(0.2)
    print(json.dumps({"rss": rss_bytes(), "peak": peak_rss_bytes(), **fields}), flush=True)


def warm_memory_client(config: str, cols: int, status_timeout: float) -> tuple[Any, Any]:
    """A memory case's client, joined and warmed up on the job's one-row ``tiny`` table (imports,
    compiled kernels, sockets), so that what it holds afterwards is the big table's: (client, tiny)."""
    import numpy as np

    from bosen.client import Client

    client = Client.connect(config)
    tiny = client.table("tiny")
    one = np.array([0], dtype=np.int64)
    tiny.get_rows(one)
    tiny.inc_rows(one, np.ones((1, cols), dtype=np.float32))
    client.clock()
    client.server_status(status_timeout)
    return client, tiny


def prewarm_memory(nbytes: int) -> float:
    """Touch ``nbytes`` of fresh memory once and free it; returns the seconds that took.

    On virtual machines whose host backs guest memory lazily (these benchmark machines), the first
    touch of a guest page that was never used since boot costs a host fault: measured here, 6 GiB took
    17 s (about 2.8 ms per MiB, 25x an ordinary page fault) the first time and 0.1 ms per MiB after.
    That cost lands on whichever process happens to get never-used pages, ours or a baseline, and is
    not what either one costs; once touched and freed, the pages go back to the guest kernel and later
    allocations reuse them. The bench therefore warms the machine first.
    """
    import numpy as np

    t0 = time.perf_counter()
    buf = np.empty(nbytes, dtype=np.uint8)
    buf[::4096] = 1  # one write per page faults it in (the kernel zeroes the whole page)
    del buf
    return time.perf_counter() - t0
