"""Shared fixtures: free ports, real server clusters as subprocesses, worker subprocesses.

Everything here starts real processes that talk ZeroMQ over TCP on loopback. Every process a test
starts is stopped when the test ends, pass or fail (SIGTERM, a grace period, then SIGKILL), and a
server that exits non-zero on its own fails the test with the tail of its log.
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import pytest
import yaml

from bosen import status as status_mod
from bosen.errors import BosenError

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
WORKERS = TESTS / "workers"
PY = sys.executable

SERVER_READY_S = 30.0
STOP_GRACE_S = 5.0


# ------------------------------------------------------------------------------------------------
# ports


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free TCP ports (all sockets held open together, so no duplicates)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture
def free_port() -> int:
    return free_ports(1)[0]


# ------------------------------------------------------------------------------------------------
# processes


def tail(path: Path, n: int = 30) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + x for x in lines) or "    (log is empty)"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
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


class Proc:
    """One child process with its output in a log file."""

    def __init__(self, name: str, cmd: Sequence[str], log: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.cmd = list(map(str, cmd))
        self.log = log
        self.expected_exit = False  # set when a test stops or kills it on purpose
        with open(log, "w") as f:
            self.popen = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=child_env(env), cwd=str(cwd or REPO), start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 30) -> str:
        return tail(self.log, n)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """Exit status; on timeout the process is killed and the test fails with its log."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{self.name} did not finish within {timeout:g}s; log:\n{self.tail()}")

    def stop(self, grace: float = STOP_GRACE_S) -> int:
        """SIGTERM, wait ``grace`` seconds, SIGKILL (whole process group, so helpers die too)."""
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGTERM)
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(10)
        return self.popen.returncode


class ProcGroup:
    """Processes started by one test; ``stop_all`` at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[Proc] = []

    def spawn(self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> Proc:
        logs = self.tmp / "logs"
        logs.mkdir(exist_ok=True)
        p = Proc(name, cmd, logs / f"{name}.log", env, cwd)
        self.procs.append(p)
        return p

    def worker(self, script: str, config: Path | str, *args: Any, name: str | None = None,
               env: dict[str, str] | None = None) -> Proc:
        """``python tests/workers/SCRIPT --config CONFIG ARGS...``."""
        name = name or f"{Path(script).stem}-{len(self.procs)}"
        return self.spawn(name, [PY, str(WORKERS / script), "--config", str(config), *map(str, args)], env)

    def wait_all(self, procs: Sequence[Proc], timeout: float) -> list[int]:
        """Wait for every process (one shared deadline); kill all and fail on timeout."""
        deadline = time.monotonic() + timeout
        codes = []
        for p in procs:
            left = deadline - time.monotonic()
            try:
                codes.append(p.popen.wait(max(left, 0.1)))
            except subprocess.TimeoutExpired:
                logs = "\n".join(f"--- {q.name} (running={q.alive()}):\n{q.tail()}" for q in procs)
                for q in procs:
                    q.stop(grace=1.0)
                pytest.fail(f"{p.name} did not finish within {timeout:g}s\n{logs}")
        return codes

    def stop_all(self) -> None:
        for p in self.procs:
            if p.alive():
                try:
                    p.popen.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.stop()


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest):
    group = ProcGroup(tmp_path)
    request.node._bosen_groups = getattr(request.node, "_bosen_groups", []) + [group]
    try:
        yield group
    finally:
        group.stop_all()


def run_cmd(args: Sequence[Any], timeout: float = 60, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command to completion (stdout/stderr captured); fail the test on timeout."""
    try:
        return subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=timeout,
                              env=child_env(env), cwd=str(cwd or REPO), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{args} did not finish within {timeout:g}s; output:\n{e.stdout}\n{e.stderr}")


# ------------------------------------------------------------------------------------------------
# clusters


def job_config(servers: Sequence[str], workers: int = 1, tables: dict | None = None, staleness: int = 1,
               read_timeout_s: float = 20.0, comm: dict | None = None, app: dict | None = None) -> dict:
    cfg: dict[str, Any] = {
        "cluster": {"servers": list(servers), "workers": workers},
        "consistency": {"staleness": staleness, "read_timeout_s": read_timeout_s},
        "tables": copy.deepcopy(tables) if tables is not None else {"W": {"rows": 10, "cols": 4, "dtype": "int64"}},
    }
    if comm is not None:
        cfg["comm"] = dict(comm)
    if app is not None:
        cfg["app"] = dict(app)
    return cfg


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def wait_ready(address: str, proc: Proc, timeout: float = SERVER_READY_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive():
            pytest.fail(f"{proc.name} exited with {proc.popen.returncode} while starting; log:\n{proc.tail()}")
        try:
            status_mod.query(address, timeout=0.5)
            return
        except BosenError:
            if time.monotonic() > deadline:
                pytest.fail(f"{proc.name} at {address} did not answer within {timeout:g}s; log:\n{proc.tail()}")


class Cluster:
    """Running servers of one job: ``path`` (YAML), ``config`` (the dict), ``servers`` (Procs)."""

    def __init__(self, path: Path, config: dict, servers: list[Proc]) -> None:
        self.path = path
        self.config = config
        self.servers = servers

    @property
    def addresses(self) -> list[str]:
        return list(self.config["cluster"]["servers"])

    def __iter__(self):  # allows ``path, cfg = cluster(...)``
        return iter((self.path, self.config))

    def status(self, timeout: float = 3.0) -> list[dict[str, Any]]:
        return [status_mod.query(a, timeout=timeout) for a in self.addresses]

    def stop_server(self, i: int, sig: int = signal.SIGTERM) -> int:
        """Stop server ``i`` on purpose (the fixture will not count its exit as a failure)."""
        p = self.servers[i]
        p.expected_exit = True
        if sig == signal.SIGKILL:
            p.popen.kill()
            return p.popen.wait(10)
        return p.stop()

    def check(self) -> None:
        """Fail if a server died on its own."""
        for p in self.servers:
            code = p.popen.poll()
            if code is not None and not p.expected_exit:
                pytest.fail(f"{p.name} exited with {code} during the test; log:\n{p.tail()}")


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest):
    """Factory: ``cluster(n_servers=2, workers=1, tables=..., staleness=..., comm=..., config=...)``.

    Writes the config to ``tmp_path``, starts ``python -m bosen.server --config C --rank i`` for each
    server, waits until each answers a STATUS query, and returns a Cluster (iterable as
    ``(config_path, config_dict)``). All servers are stopped at teardown; one that exited non-zero
    (other than by the test's own doing) fails the test.
    """
    clusters: list[Cluster] = []
    request.node._bosen_clusters = clusters

    def start(n_servers: int = 2, workers: int = 1, *, config: dict | None = None, name: str | None = None,
              **kw: Any) -> Cluster:
        ports = free_ports(n_servers)
        servers = [f"127.0.0.1:{p}" for p in ports]
        if config is None:
            cfg = job_config(servers, workers, **kw)
        else:
            cfg = copy.deepcopy(config)
            cfg.setdefault("cluster", {})["servers"] = servers
        name = name or f"job{len(clusters)}"
        path = write_config(tmp_path / f"{name}.yaml", cfg)
        logs = tmp_path / "logs"
        logs.mkdir(exist_ok=True)
        c = Cluster(path, cfg, [])
        clusters.append(c)
        for i in range(n_servers):
            c.servers.append(Proc(f"{name}-server-{i}", [PY, "-m", "bosen.server", "--config", path, "--rank", i],
                                  logs / f"{name}-server-{i}.log"))
        for addr, p in zip(servers, c.servers):
            wait_ready(addr, p)
        return c

    failures = []
    try:
        yield start
    finally:
        died = {}
        for c in clusters:  # signal every server first, so they shut down in parallel
            for p in c.servers:
                died[p.name] = p.popen.poll()  # exited before teardown?
                if died[p.name] is None:
                    p.popen.send_signal(signal.SIGTERM)
        for c in clusters:
            for p in c.servers:
                code = p.stop()
                if p.expected_exit:
                    continue
                if died[p.name] is not None:
                    failures.append(f"{p.name} exited with {died[p.name]} during the test; log:\n{p.tail()}")
                elif code not in (0, -signal.SIGTERM):
                    failures.append(f"{p.name} exited with {code} on SIGTERM; log:\n{p.tail()}")
    if failures:
        pytest.fail("\n".join(failures))


# ------------------------------------------------------------------------------------------------
# failure reports carry the logs of the processes the test started


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call" or not rep.failed:
        return
    for c in getattr(item, "_bosen_clusters", []):
        for p in c.servers:
            rep.sections.append((f"log of {p.name} (exit {p.popen.poll()})", p.tail(40)))
    for g in getattr(item, "_bosen_groups", []):
        for p in g.procs:
            rep.sections.append((f"log of {p.name} (exit {p.popen.poll()})", p.tail(40)))


# ------------------------------------------------------------------------------------------------
# waiting for asynchronous effects


def wait_until(cond, timeout: float = 20.0, step: float = 0.002) -> bool:
    """Poll ``cond`` until it holds or ``timeout`` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()
