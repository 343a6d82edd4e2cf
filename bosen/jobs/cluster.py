"""The servers of one job on this machine: free ports, start, wait until each answers, stop.

A server is ready when it answers a STATUS request (``bosen.jobs.status.query``). ``bosen launch``, the
benchmarks and the tests' ``bosen_cluster`` fixture start servers through ``LocalCluster``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import zmq

from bosen import config as config_mod
from bosen.config import Config
from bosen.errors import BosenError
from bosen.jobs import status as status_mod
from bosen.jobs.job import write_config
from bosen.jobs.supervise import STOP_GRACE_S, Process, ProcessFailed, ProcessGroup, describe_exit
from bosen.security import Refused, Security

READY_TIMEOUT_S = 60.0
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1")
PORTS_FROM = 10000  # free_ports draws from here up to the ephemeral range
PORTS_ENV = "BOSEN_PORTS"  # "LOW-HIGH": draw free ports from [LOW, HIGH) instead


def port_range() -> tuple[int, int]:
    """Where ``free_ports`` draws: ``$BOSEN_PORTS`` ("LOW-HIGH", HIGH excluded) where set, so that
    several suites or jobs started side by side on one machine draw from ranges of their own (two
    drawing from one range may both take a port in the moment between one's draw and its server's
    bind); otherwise from ``PORTS_FROM`` up to the kernel's ephemeral range."""
    text = os.environ.get(PORTS_ENV)
    if not text:
        return PORTS_FROM, ephemeral_low()
    try:
        low, high = (int(x) for x in text.split("-"))
    except ValueError:
        raise BosenError(f"${PORTS_ENV}: {text!r} is not LOW-HIGH (two port numbers)") from None
    if not 1024 <= low < high <= 65536:
        raise BosenError(f"${PORTS_ENV}: {text!r} must have 1024 <= LOW < HIGH <= 65536")
    return low, high


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free TCP ports on ``host`` (all held open together, so no duplicates).

    They are drawn below the kernel's ephemeral range where it leaves room (or from ``port_range``):
    a port the kernel hands out for ``bind(0)`` is also where it puts the local end of outgoing
    connections, so on a busy machine one freed here could be taken by a connection before the
    server binds it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    first, end = port_range()
    draw = random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        for _ in range(20 * n + 100):
            if len(socks) == n or end - first < 1000:
                break
            s = socket.socket(family)
            try:
                s.bind((host, draw.randrange(first, end)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:  # no room below the ephemeral range (or it is full): the kernel's choice
            s = socket.socket(family)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux default 32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def local_addresses(addresses: Sequence[str], where: str = "cluster.servers") -> list[str]:
    """``addresses`` with port 0 replaced by free ports (local hosts only, so examples never collide)."""
    zeros: dict[str, list[int]] = {}
    for addr in addresses:
        host, _, port = addr.rpartition(":")
        if port == "0":
            if host not in LOCAL_HOSTS:
                raise BosenError(f"{where}: port 0 (pick a free port) only works for local hosts, not {host}")
            zeros.setdefault(host, []).append(0)
    free = {h: free_ports(len(z), "127.0.0.1" if h == "localhost" else h) for h, z in zeros.items()}
    out = []
    for addr in addresses:
        host, _, port = addr.rpartition(":")
        out.append(f"{host}:{free[host].pop()}" if port == "0" else addr)
    return out


def resolve_ports(cfg: Config) -> Config:
    """``cfg`` with port 0 in its server addresses replaced by free local ports."""
    servers = tuple(local_addresses(cfg.cluster.servers, str(cfg.source)))
    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, servers=servers))


class LocalCluster:
    """The servers of one job, each ``python -m bosen.server`` as a supervised process of ``group``.

    ``path`` is the job's YAML, ``addresses`` its ``cluster.servers``, ``config`` the config data
    when the cluster was made from it (``start_cluster``). ``start()`` starts every server and waits
    until each answers STATUS. ``stop()`` stops them and, with ``check``, raises ProcessFailed for
    any server that exited on its own while the cluster ran or did not exit cleanly on SIGTERM.
    As a context manager it checks only when the body succeeded (a body's error comes first).
    """

    def __init__(self, path: str | Path, addresses: Sequence[str], group: ProcessGroup, *,
                 config: Mapping[str, Any] | None = None, name: str = "server",
                 server_args: Sequence[str] = ()) -> None:
        self.path = Path(path)
        self.addresses = list(addresses)
        self.group = group
        self.config = config
        self.name = name
        self.server_args = list(server_args)
        self.servers: list[Process] = []
        self._on_purpose: set[int] = set()  # stopped by stop_server: their exit is no failure
        self._terminated = False  # terminate() sent SIGTERM to all
        self._died: dict[int, int] = {}  # exited on their own before stop(): index -> status

    @functools.cached_property
    def security(self) -> Security | None:
        """The job's client keys when it runs with CURVE (``bosen.security``): for STATUS queries."""
        return Security.load(config_mod.load(self.path), "client")

    def __iter__(self) -> Iterator[Any]:  # ``path, cfg = cluster``
        return iter((self.path, self.config))

    def start(self, ready_timeout: float = READY_TIMEOUT_S) -> LocalCluster:
        """Start every server and wait until all answer; on failure stop them and raise ProcessFailed."""
        try:
            for i in range(len(self.addresses)):
                self.servers.append(self.group.python(f"{self.name}-{i}", "-m", "bosen.server", "--config", self.path,
                                                      "--rank", i, *self.server_args))
            self.wait_ready(ready_timeout)
        except BaseException:
            self.stop(check=False)
            raise
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait until every server answers STATUS (one deadline for all); ProcessFailed names a
        server that exited meanwhile or did not answer in time, with its log."""
        deadline = time.monotonic() + timeout
        ctx = zmq.Context()
        try:
            for proc, addr in zip(self.servers, self.addresses, strict=True):
                _await_answer(proc, addr, deadline, timeout, ctx, lambda: self.check("while starting"), self.security)
        finally:
            ctx.term()

    def status(self, timeout: float = 3.0) -> list[dict[str, Any]]:
        """Every server's STATUS, in rank order."""
        return [status_mod.query(a, timeout=timeout, security=self.security) for a in self.addresses]

    def stop_server(self, i: int, sig: int = signal.SIGTERM) -> int:
        """Stop server ``i`` on purpose (SIGKILL: at once, like a crash); its exit status."""
        self._on_purpose.add(i)
        p = self.servers[i]
        return p.kill() if sig == signal.SIGKILL else p.stop()

    def replace_server(self, i: int, extra_args: Sequence[str], ready_timeout: float = READY_TIMEOUT_S) -> Process:
        """Start a new server ``i`` in place of one that exited (``extra_args``: how it restores its
        state), and wait until it answers; ProcessFailed if it does not."""
        old = self.servers[i]
        if old.returncode is None:
            raise ProcessFailed(f"{old.name} is still running: nothing to replace")
        n = sum(1 for p in self.group.procs if p.name.startswith(f"{self.name}-{i}"))
        new = self.group.python(f"{self.name}-{i}.{n}", "-m", "bosen.server", "--config", self.path, "--rank", i,
                                *self.server_args, *extra_args)
        self.servers[i] = new
        self._died.pop(i, None)
        _await_started(new, self.addresses[i], f"replacing {old.name}", ready_timeout, self.security)
        return new

    def add_server(self, ready_timeout: float = READY_TIMEOUT_S, address: str | None = None,
                   gone: Sequence[int] = ()) -> str:
        """Start a server that joins the running job (``--join``, at ``address``, default a free local
        port) and wait until it answers; its address. It holds no partition until
        ``bosen.jobs.moves.scale_servers`` gives it some. ``gone``: worker ranks that have finished
        (``--gone``): it does not wait for them, whatever server 0's STATUS said when it asked."""
        address = address or f"127.0.0.1:{free_ports(1)[0]}"
        i = len(self.servers)
        n = sum(1 for p in self.group.procs if p.name.startswith(f"{self.name}-{i}"))  # rank i joined before
        args = list(self.server_args)
        if "--resume" in args:  # a resumed job's: a server joining starts empty, from server 0's STATUS
            at = args.index("--resume")
            del args[at:at + 2]
        if gone:
            args += ["--gone", ",".join(str(r) for r in gone)]
        new = self.group.python(f"{self.name}-{i}" + (f".{n}" if n else ""), "-m", "bosen.server", "--config",
                                self.path, "--join", address, *args)
        self.servers.append(new)
        self.addresses.append(address)
        _await_started(new, address, f"joining at {address}", ready_timeout, self.security)
        return address

    def retired(self, i: int, timeout: float = 30.0) -> int:
        """Server ``i``, the last, left the job (its partitions moved away): wait for it to exit and
        drop it from ``servers`` and ``addresses``; its exit status."""
        if i != len(self.servers) - 1:
            raise ValueError(f"servers leave at the end of the list: {i} is not the last of {len(self.servers)}")
        p = self.servers[i]
        code = p.wait(timeout)
        if code != 0:
            raise ProcessFailed(f"{p.name} {describe_exit(code)} leaving the job:\n{p.tail()}")
        self.servers.pop()
        self.addresses.pop()
        self._died.pop(i, None)
        self._on_purpose.discard(i)
        return code

    def drop_joined(self, i: int) -> int:
        """Server ``i``, the last, joined but took no partitions (its step failed), or owns none any more
        but did not leave (a scale-in whose move failed after its map): stop it and drop it from
        ``servers`` and ``addresses``; its exit status."""
        if i != len(self.servers) - 1:
            raise ValueError(f"joined servers are dropped from the end: {i} is not the last of {len(self.servers)}")
        code = self.stop_server(i)
        self.servers.pop()
        self.addresses.pop()
        self._died.pop(i, None)
        self._on_purpose.discard(i)
        return code

    def check(self, when: str = "while its cluster was running") -> None:
        """Raise ProcessFailed if a server has exited without being asked to."""
        for i, p in enumerate(self.servers):
            code = p.returncode
            if code is not None and i not in self._on_purpose:
                self._died.setdefault(i, code)
                raise ProcessFailed(f"{p.name} {describe_exit(code)} {when}. Last log lines:\n{p.tail()}")

    def terminate(self) -> None:
        """Send every running server SIGTERM (``stop`` waits); lets several clusters stop in parallel.
        A server that exited before the first call died on its own; after it, our SIGTERM stopped it."""
        for i, p in enumerate(self.servers):
            code = p.returncode
            if code is not None and i not in self._on_purpose and not self._terminated:
                self._died.setdefault(i, code)
            p.terminate()
        self._terminated = True

    def stop(self, check: bool = True, grace: float = STOP_GRACE_S) -> None:
        """Stop every server (SIGTERM, ``grace`` seconds, SIGKILL); with ``check``, then raise
        ProcessFailed for each server that died on its own or did not exit cleanly on SIGTERM."""
        self.terminate()
        deadline = time.monotonic() + grace
        problems = []
        for i, p in enumerate(self.servers):
            code = p.stop(max(deadline - time.monotonic(), 0.0))
            if i in self._on_purpose:
                continue
            if i in self._died:
                problems.append(f"{p.name} {describe_exit(self._died[i])} while its cluster was running. "
                                f"Last log lines:\n{p.tail()}")
            elif p.escalated:
                problems.append(f"{p.name} did not exit within {grace:g}s of SIGTERM and was killed. "
                                f"Last log lines:\n{p.tail()}")
            elif code not in (0, -signal.SIGTERM):
                problems.append(f"{p.name} {describe_exit(code)} when stopped with SIGTERM. Last log lines:\n"
                                f"{p.tail()}")
        if check and problems:
            raise ProcessFailed("\n".join(problems))

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop(check=exc_type is None)


def _await_started(proc: Process, addr: str, role: str, timeout: float, security: Security | None) -> None:
    """Until one server started on its own (``role``: why, for the error) answers at ``addr``;
    ProcessFailed with its log if it exits first or does not answer within ``timeout``."""
    def exited() -> None:
        if proc.returncode is not None:
            raise ProcessFailed(f"{proc.name} ({role}) {describe_exit(proc.returncode)}:\n{proc.tail()}")

    ctx = zmq.Context()
    try:
        _await_answer(proc, addr, time.monotonic() + timeout, timeout, ctx, exited, security)
    finally:
        ctx.term()


def _await_answer(proc: Process, addr: str, deadline: float, timeout: float, ctx: zmq.Context,
                  check: Callable[[], None], security: Security | None) -> None:
    """Until the server at ``addr`` answers STATUS; ``check`` raises if it died meanwhile. A refused
    security handshake is raised at once (retrying cannot help)."""
    while True:
        check()
        try:
            status_mod.query(addr, timeout=0.5, ctx=ctx, security=security)
            return
        except Refused:
            raise
        except BosenError:
            if time.monotonic() > deadline:
                raise ProcessFailed(f"{proc.name} at {addr} did not answer within {timeout:g}s:\n"
                                    f"{proc.tail()}") from None


def start_cluster(job: Mapping[str, Any], workdir: str | Path, n_servers: int | None = None, *,
                  group: ProcessGroup | None = None, name: str = "job", ready_timeout: float = READY_TIMEOUT_S,
                  server_args: Sequence[str] = ()) -> LocalCluster:
    """Start the servers of ``job`` (config data, what a YAML file holds) on this machine.

    With ``n_servers``, ``cluster.servers`` becomes that many 127.0.0.1 addresses on free ports;
    without, port 0 in the job's own addresses is replaced by free ports. The config goes to
    WORKDIR/NAME.yaml (checked first, so a bad one fails here naming the key); server logs go to the
    group's log folder (default: a new group logging to WORKDIR/logs). Servers are named
    ``NAME-server-I``.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = copy.deepcopy(dict(job))
    cluster = dict(cfg.get("cluster") or {})
    if n_servers is not None:
        cluster["servers"] = [f"127.0.0.1:{p}" for p in free_ports(n_servers)]
    else:
        cluster["servers"] = local_addresses(cluster.get("servers") or [], "cluster.servers")
    cfg["cluster"] = cluster
    path = write_config(workdir / f"{name}.yaml", cfg)
    config_mod.load(path)
    group = group if group is not None else ProcessGroup(workdir / "logs")
    return LocalCluster(path, cluster["servers"], group, config=cfg, name=f"{name}-server",
                        server_args=server_args).start(ready_timeout)
