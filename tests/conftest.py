"""Helpers of this test suite. Clusters and worker processes come from the ``bosen`` pytest plugin
(bosen/jobs/pytest_plugin.py: ``bosen_cluster``, ``bosen_procs``).

Everything starts real processes that talk ZeroMQ over TCP on loopback. Every process a test starts
is stopped when the test ends, pass or fail (SIGTERM, a grace period, then SIGKILL to its process
group), and a failing test's report carries the processes' logs.
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from bosen.jobs.cluster import (
    PORTS_ENV,
    PORTS_FROM,
    ephemeral_low,
    free_ports,  # noqa: F401  (tests import it from here)
    port_range,
)
from bosen.jobs.job import job_config, write_config  # noqa: F401  (tests import them from here)
from bosen.jobs.supervise import Forked, Process, ProcessGroup, tail  # noqa: F401
from bosen.jobs.zygote import PRELOAD, Zygote

pytest_plugins = ("pytester",)  # tests/bosen/jobs/test_pytest_plugin.py runs pytest on small test files

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
WORKERS = TESTS / "workers"
PY = sys.executable


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs the suite in 2 processes) each process draws free ports
    from a slice of its own (``$BOSEN_PORTS``, which the servers, workers and launchers it starts
    inherit), so two tests never take one port between its draw and its bind."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker and count and PORTS_ENV not in os.environ:
        i, n = int(worker.removeprefix("gw")), int(count)
        width = (ephemeral_low() - PORTS_FROM) // n
        os.environ[PORTS_ENV] = f"{PORTS_FROM + i * width}-{PORTS_FROM + (i + 1) * width}"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the checkout's code once, before any test: with ``PYTHONDONTWRITEBYTECODE`` set (as
    where ``make test`` runs) no process writes ``__pycache__/*.pyc``, so each of the suite's thousands
    of servers, workers and launchers compiled the ~70 modules it imports from source again (~0.2 s of
    CPU each). Python reads a .pyc that exists whatever that variable says; up to date, this is a stat."""
    for folder in ("bosen", "server", "client", "apps", "bench", "tests/workers"):
        compileall.compile_dir(REPO / folder, quiet=2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """With ``BOSEN_TEST_CPU=FILE``, append each test's wall and CPU seconds (user + system of pytest
    itself and of the children it waited for: servers, workers, launchers) to FILE, one tab-separated
    line per test: the suite's cost on a loaded machine is CPU, which wall time does not show."""
    path = os.environ.get("BOSEN_TEST_CPU")
    if not path:
        yield
        return
    t0, s0, c0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    yield
    s1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    own = s1.ru_utime - s0.ru_utime + s1.ru_stime - s0.ru_stime
    kids = c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime
    with open(path, "a") as f:
        f.write(f"{item.nodeid}\t{time.monotonic() - t0:.2f}\t{own:.2f}\t{kids:.2f}\n")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for commands a test runs itself (``run_cmd``, ``bosen launch``): tests/workers and
    the checkout on PYTHONPATH (``python -m launch_worker``), no ``BOSEN_*`` job variables."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    paths = [str(WORKERS), str(REPO)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("BOSEN_RANK", None)
    env.pop("BOSEN_RUN_DIR", None)
    env.pop("BOSEN_CONFIG", None)
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture(scope="session")
def bosen_zygote(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The plugin's (bosen/jobs/pytest_plugin.py), with torch imported too where it is installed: a
    launcher forked from it (``run_cmd``) and its own zygote, a fork of it (bosen/jobs/zygote.py), then
    import torch no more; ~30 s of CPU less over 22 PyTorch tests, ~2.5 s more (the import, larger
    forks) over 25 tests without torch (docs/design.md, the zygote)."""
    preload = (*PRELOAD, "torch") if importlib.util.find_spec("torch") else PRELOAD
    with Zygote(tmp_path_factory.mktemp("zygote") / "zygote.log", preload) as zygote:
        yield zygote


_ZYGOTE: list[Zygote] = []  # the session's (bosen_zygote), for run_cmd


@pytest.fixture(scope="session", autouse=True)
def _run_cmd_zygote(bosen_zygote: Zygote) -> Any:
    """``run_cmd`` forks ``python -m bosen ...`` from the session's zygote too (bosen/jobs/zygote.py):
    a launcher's imports cost ~1 s of CPU, and the suite runs hundreds."""
    _ZYGOTE.append(bosen_zygote)
    yield
    _ZYGOTE.clear()


def run_cmd(args: Sequence[Any], timeout: float = 60, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command to completion (stdout/stderr captured); fail the test on timeout. A Python
    command is forked from the session's zygote where it can be (on timeout its process group is killed)."""
    cmd, full, where = list(map(str, args)), child_env(env), str(cwd or REPO)
    if _ZYGOTE:
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            pid = _ZYGOTE[0].spawn(cmd, full, where, out.fileno(), err.fileno())
            if pid is not None:
                child = Forked(pid)
                try:
                    code = child.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(pid, signal.SIGKILL)
                    child.wait()
                    out.seek(0)
                    err.seek(0)
                    pytest.fail(f"{args} did not finish within {timeout:g}s; output:\n{out.read()}\n{err.read()}")
                out.seek(0)
                err.seek(0)
                return subprocess.CompletedProcess(cmd, code, out.read(), err.read())
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full, cwd=where,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{args} did not finish within {timeout:g}s; output:\n{e.stdout}\n{e.stderr}")


def worker(group: ProcessGroup, script: str, config: Path | str, *args: Any, name: str | None = None,
           env: dict[str, str] | None = None) -> Process:
    """``python tests/workers/SCRIPT --config CONFIG ARGS...`` as a member of ``group``."""
    name = name or f"{Path(script).stem}-{len(group)}"
    return group.python(name, WORKERS / script, "--config", config, *args, env=env)


def wait_until(cond, timeout: float = 20.0, step: float = 0.002) -> bool:
    """Poll ``cond`` until it holds or ``timeout`` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def ahead_reader(path: Path | str, rank: int, clocks: int) -> Any:
    """A client (``bosen.client.Client``) that joins now and clocks ``clocks`` ticks at once, so it
    never holds the job back; once the others have left, its reads (through an empty cache) return
    the servers' exact values."""
    from bosen.client import Client

    c = Client.connect(path, rank=rank)
    for _ in range(clocks):
        c.clock()
    return c


def checkpoint_job(tmp_path: Path, args: dict[str, Any], staleness: int = 3, every: int | None = 2,
                   comm: bool = False, storage: str = "dense", cache_rows: int | None = None,
                   **ckpt: object) -> Path:
    """The config of a job of ``checkpoint_worker`` (tests/workers) on 2 servers and 2 workers, one
    int64 table W of 8 x 2; checkpoints every ``every`` clocks (None: none); ``comm``: budgeted sends
    and pushes mid-clock besides the end-of-tick flushes."""
    cfg: dict[str, Any] = {
        "cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": 2},
        "consistency": {"staleness": staleness, "read_timeout_s": 30},
        "tables": {"W": {"rows": 8, "cols": 2, "dtype": "int64", "storage": storage,
                         **({} if cache_rows is None else {"cache_rows": cache_rows})}},
        "app": {"module": "checkpoint_worker", "args": args},
    }
    if every is not None:
        cfg["checkpoint"] = {"every_clocks": every, "keep": 100, **ckpt}
    if comm:
        cfg["comm"] = {"client_bandwidth_mbps": 1, "server_bandwidth_mbps": 1, "client_send_rows": 2,
                       "server_push_rows": 2}
    return write_config(tmp_path / "job.yaml", cfg)


def launch_job(*args: object, timeout: float = 120) -> tuple[int, str]:
    """``bosen launch ARGS --no-plot``: its exit status and output."""
    r = run_cmd([PY, "-m", "bosen", "launch", *args, "--no-plot"], timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def saved_table(base: Path, clock: int) -> Any:
    """Table W of ``checkpoint_job`` as checkpoint ``clock`` holds it (both servers' parts together)."""
    import numpy as np

    from bosen import checkpoint

    parts = checkpoint.check_complete(base, clock, 2, 2, None)
    full = np.zeros((8, 2), dtype=np.int64)
    for j in range(2):
        arrays = parts[f"server-{j}"].load()
        full[arrays["t0.rows"]] = arrays["t0.values"]
    return full


def free_port_run(n: int) -> int:
    """A port P with P .. P + n - 1 all free on loopback now (what ``metrics.port`` P takes for the
    launcher and n - 1 servers)."""
    for _ in range(200):
        first, end = port_range()
        base = random.randrange(first, end - n)  # where connections never take them
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def scrape(port: int) -> dict[str, dict[tuple, float]]:
    """One GET http://127.0.0.1:PORT/metrics, parsed by prometheus_client's own text parser:
    {sample name: {sorted (label, value) pairs: value}}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def first_worker(launcher_pid: int, rank: int) -> psutil.Process:
    """A launcher's first process of worker ``rank`` (not a replacement: no ``BOSEN_REJOIN``)."""
    found = []
    for c in psutil.Process(launcher_pid).children(recursive=True):
        try:
            env = c.environ()
            if env.get("BOSEN_RANK") == str(rank) and "BOSEN_REJOIN" not in env and "bosen.server" not in c.cmdline():
                found.append(c)
        except psutil.Error:
            continue
    assert len(found) == 1, found
    return found[0]


def descendants(pid: int) -> list[tuple[psutil.Process, list[str]]]:
    """The live processes under ``pid`` with their command lines; one that ends (or is a zombie not yet
    reaped) while they are read is left out, not an error."""
    out = []
    for c in psutil.Process(pid).children(recursive=True):
        try:
            out.append((c, c.cmdline()))
        except psutil.Error:
            continue
    return out

