"""Helpers shared by the benchmarks (DESIGN §9): JSON result lines, child processes, memory.

- ``emit(**fields)`` prints one result as a JSON line on stdout (flushed at once).
- ``Child`` starts a Python subprocess whose stderr goes to a log file, and always stops it.
- ``ServerProcs`` writes a job config with free local ports, starts one ``bosen-server`` per address
  as a subprocess, waits until each answers a STATUS query, and stops them all on exit (SIGTERM, then
  SIGKILL), whatever happened in between. On Linux the children also die with the bench process.
- ``rss_bytes(pid)`` is a process's resident set size (psutil).

Benchmarks run from a source checkout as ``python bench/NAME.py``; nothing here depends on the
current directory.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import psutil
import yaml

from bosen import config as config_mod
from bosen import status as status_mod
from bosen.config import Config
from bosen.errors import BosenError

STOP_GRACE_S = 5.0
READY_TIMEOUT_S = 60.0
MiB = 1 << 20
KiB = 1 << 10


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
# processes


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM when the bench process dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Child:
    """A Python subprocess (``python ARGS...``) with stderr in a log file; ``stop()`` always ends it.

    ``stdin``/``stdout`` are pipes when asked for (line protocols with the bench process).
    """

    _live: set[Child] = set()

    def __init__(self, args: Sequence[str], name: str, log_dir: Path, *, pipes: bool = False,
                 env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.log_path = Path(log_dir) / f"{name}.log"
        self._log = self.log_path.open("w")
        pipe = subprocess.PIPE if pipes else subprocess.DEVNULL
        self.popen = subprocess.Popen(
            [sys.executable, *args], stdin=pipe, stdout=pipe if pipes else self._log, stderr=self._log,
            env={**os.environ, **(env or {})}, text=True, bufsize=1,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        Child._live.add(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send_line(self, line: str) -> None:
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def read_json(self, timeout: float = 120.0) -> dict[str, Any]:
        """Next stdout line of a piped child, parsed as JSON (fails with its log tail if it died).

        For lockstep protocols (one line per request): a second line already buffered here would not
        wake the select below.
        """
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.popen.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                raise BosenError(f"{self.name}: no answer within {timeout:g}s\n{self.tail()}")
        finally:
            sel.close()
        line = self.popen.stdout.readline()
        if not line:
            self.popen.wait(5)
            raise BosenError(f"{self.name} exited with status {self.popen.returncode}\n{self.tail()}")
        return json.loads(line)

    def tail(self, n: int = 20) -> str:
        self._log.flush()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return "    (no log)"
        return "\n".join("    " + s for s in lines) or "    (log is empty)"

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; returns the exit status."""
        p = self.popen
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            except ProcessLookupError:
                pass
        for f in (p.stdin, p.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        self._log.close()
        Child._live.discard(self)
        return p.returncode

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@atexit.register
def _stop_all_children() -> None:
    for c in list(Child._live):
        c.stop(grace=2.0)


def wait_until(pred: Callable[[], bool], timeout: float, what: str, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise BosenError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)


class ServerProcs:
    """Start the servers of a job on free local ports; stop them all on exit.

    ``job`` is config data (what a YAML file holds) without ``cluster.servers``; ``n`` servers are
    added at 127.0.0.1 on free ports. Inside the ``with`` block: ``config`` (the loaded Config),
    ``config_path`` (the YAML every client should load), ``pids`` and ``children``.
    """

    def __init__(self, job: Mapping[str, Any], n: int = 1, *, log_level: str = "WARNING",
                 ready_timeout: float = READY_TIMEOUT_S, workdir: str | Path | None = None) -> None:
        self.job = json.loads(json.dumps(job))  # deep copy of plain data
        self.n = n
        self.log_level = log_level
        self.ready_timeout = ready_timeout
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._workdir = Path(workdir) if workdir else None
        self.children: list[Child] = []
        self.config: Config | None = None
        self.config_path: Path | None = None

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    @property
    def dir(self) -> Path:
        assert self.config_path is not None
        return self.config_path.parent

    def __enter__(self) -> ServerProcs:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        if self._workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="bosen-bench-")
            self._workdir = Path(self._tmp.name)
        self._workdir.mkdir(parents=True, exist_ok=True)
        job = self.job
        job.setdefault("cluster", {})["servers"] = [f"127.0.0.1:{status_mod.free_port()}" for _ in range(self.n)]
        self.config_path = self._workdir / "job.yaml"
        self.config_path.write_text(yaml.safe_dump(job, sort_keys=False))
        self.config = config_mod.load(self.config_path)
        for rank in range(self.n):
            self.children.append(Child(["-m", "bosen.server", "--config", str(self.config_path), "--rank",
                                        str(rank), "--log-level", self.log_level],
                                       f"server{rank}", self._workdir))
        for child, addr in zip(self.children, self.config.cluster.servers):
            self._wait_ready(child, addr)

    def _wait_ready(self, child: Child, addr: str) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if not child.alive():
                raise BosenError(f"{child.name} ({addr}) exited with status {child.popen.returncode} "
                                 f"before it was ready:\n{child.tail()}")
            try:
                status_mod.query(addr, timeout=0.5)
                return
            except BosenError:
                if time.monotonic() > deadline:
                    raise BosenError(f"{child.name} ({addr}) not ready after {self.ready_timeout:g}s:\n"
                                     f"{child.tail()}") from None

    def status(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """STATUS of every server, from a side connection (not a job member)."""
        assert self.config is not None
        return [status_mod.query(a, timeout=timeout) for a in self.config.cluster.servers]

    def stop(self) -> None:
        for c in self.children:
            c.stop()
        self.children = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


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
    for others (a server's loop is "python"); "pyzmq-gc" releases zero-copy buffers. Same-named threads (one ZeroMQ I/O thread per context)
    are summed."""
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
