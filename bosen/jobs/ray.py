"""``bosen launch CONFIG --ray [ADDRESS]``: the job's servers and workers inside Ray actors.

Ray only places and watches the processes; the job itself runs as without Ray. Each server and each
worker gets one bundle of a placement group (CPUs, GPUs and custom resources per role from the
config's ``ray`` section) and one small actor in it, a ``ProcessActor``, which starts the very
command ``bosen launch`` starts locally (``python -m bosen.server ...``, ``python -m APP``) as a
supervised child process (``bosen.jobs.supervise.Process``) on its node. So the servers are the same
uvloop/ZeroMQ daemons, the workers talk ZeroMQ over TCP to them as today, and nothing of the data
path goes through Ray (whose calls pickle their arguments): Ray carries only start, poll and stop
calls. A server binds on its actor's node IP, on a port free there; the launcher writes those
addresses into the config it gives the workers.

The launcher side, ``RayJob``, is a ``ProcessGroup`` whose members are ``RayProcess`` proxies of
the remote children, so ``LocalCluster``, ``start_worker`` and the launcher's watch loop drive them
unchanged: a child that exits, or an actor that dies with its node, is reported like a local process
that dies. Leaving the ``with`` block (the job's end, a failure, Ctrl-C) stops every child (SIGTERM,
grace, SIGKILL), kills the actors, removes the placement group and disconnects; a local Ray
started for the job (no ADDRESS) is shut down with it. Children die with their actor's process too
(PR_SET_PDEATHSIG), so a killed actor leaves nothing behind.

Logs, worker records and checkpoints are written under the run directory by the children
themselves: on several machines it must be a folder every node sees at the same path (a shared file
system, as with Slurm). Each placement is recorded in ``RUN_DIR/ray.json``.

``bosen scale`` on such a job (``bosen.jobs.scale``) asks ``RayJob.reserve`` for the actors of the
joining servers and workers before it starts anything: bundles freed by members that left are used
again, and the rest come in one new placement group per scale step (Ray's placement groups cannot
grow). A request the cluster cannot hold is refused (at once when the free resources are short,
else after the placement timeout) and nothing of the job changes. A member that leaves the job
(``RayJob.release``) has its actor killed; a step's placement group whose bundles are all free is
removed, so the cluster gets its resources back, while the launch's group is kept until the job ends.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bosen import faults
from bosen.config import Config, RayConfig
from bosen.errors import BosenError
from bosen.jobs.supervise import STOP_GRACE_S, Env, Process, ProcessFailed, ProcessGroup, tail

PLACEMENT_TIMEOUT_S = 60.0  # a placement group the cluster cannot hold is reported after this long
FREED_LAG_S = 2.0  # Ray's free resources lag a removed group or killed actor by about a second
SCALE_PLACEMENT_TIMEOUT_S = 30.0  # the same for a scale step's group (within the 90 s a scale request is answered)
CALL_TIMEOUT_S = 30.0  # one start/poll/stop call to an actor
PLACEMENT = "ray.json"
_MEMBER = re.compile(r"(server|worker)-(\d+)(?:\.\d+)?")  # names LocalCluster and start_worker give


def require_ray() -> Any:
    """The ``ray`` module, or a BosenError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise BosenError("--ray needs Ray: pip install -e '.[ray]' (ray==2.60.0)") from None
    return ray


class ProcessActor:
    """Runs one command of the job as a child process on its node (a Ray actor class: ``RayJob``
    wraps it with ``ray.remote``). Its methods are quick, so one call at a time suffices."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd if os.path.isdir(cwd) else None  # the launcher's folder, where this node has it
        self.proc: Process | None = None

    def node(self) -> tuple[str, str, int]:
        """This actor's node id, node IP and pid."""
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid()

    def free_port(self, host: str) -> int:
        from bosen.jobs.cluster import free_ports

        return free_ports(1, host)[0]

    def start(self, name: str, cmd: list[str], log: str, env: dict[str, str]) -> int:
        """Start ``cmd`` (its stdout and stderr to ``log``); its pid. One child at a time: a new one
        (a replacement server) only once the previous one has exited."""
        if self.proc is not None and self.proc.returncode is None:
            raise BosenError(f"{self.proc.name} still runs in this actor: cannot start {name}")
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        self.proc = Process(name, [sys.executable if c == "{python}" else c for c in cmd], log, env=env,
                            cwd=self.cwd)
        return self.proc.pid

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def terminate(self) -> None:
        if self.proc is not None:
            self.proc.terminate()

    def stop(self, grace: float) -> tuple[int | None, bool]:
        """Stop the child (SIGTERM, ``grace``, SIGKILL); its exit status and whether it had to be killed."""
        if self.proc is None:
            return None, False
        code = self.proc.stop(grace)
        return code, self.proc.escalated

    def tail(self, n: int) -> str:
        return "    (not started)" if self.proc is None else self.proc.tail(n)


class RayProcess(Process):
    """The launcher's handle of one child running in a ``ProcessActor`` (a ``Process`` to whoever
    drives it). An actor that is gone (its node lost, killed) reads as a child killed by SIGKILL,
    and its log tail says so."""

    def __init__(self, name: str, actor: Any, node: tuple[str, str, int], log: Path, pid: int) -> None:
        # no Popen: everything below asks the actor
        self.name = name
        self.log = log
        self.actor = actor
        self.node_id, self.node_ip, self.actor_pid = node
        self._pid = pid
        self._terminated = False
        self.escalated = False
        self._code: int | None = None
        self._stopped = False
        self.lost: str | None = None  # why the actor is gone, if it is

    def __repr__(self) -> str:
        return f"<RayProcess {self.name} pid={self._pid} on {self.node_ip} ({self.node_id[:8]})>"

    @property
    def pid(self) -> int:
        return self._pid

    def _call(self, method: str, *args: Any) -> Any:
        """``actor.method(*args)``, or None once the actor is gone (``lost`` says why)."""
        if self.lost is not None:
            return None
        import ray

        try:
            return ray.get(getattr(self.actor, method).remote(*args), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            self.lost = f"its Ray actor on {self.node_ip} ({self.node_id[:8]}) is gone: {type(e).__name__}"
            return None

    @property
    def returncode(self) -> int | None:
        if self._code is None:
            code = self._call("returncode")
            self._code = -int(signal.SIGKILL) if self.lost is not None else code
        return self._code

    def tail(self, n: int = 30) -> str:
        text = self._call("tail", n)
        if text is None:  # the actor is gone: the log file, if this machine sees it
            text = tail(self.log, n)
        return text if self.lost is None else f"    ({self.lost})\n{text}"

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else self.tail(10_000)

    def terminate(self) -> None:
        if not self._terminated and self._code is None:
            self._terminated = True
            self._call("terminate")

    def stop(self, grace: float = STOP_GRACE_S) -> int:
        if not self._stopped:
            self._stopped = True
            result = self._call("stop", grace)
            if result is not None and result[0] is not None:
                self._code, self.escalated = result
        code = self.returncode
        return -int(signal.SIGKILL) if code is None else code


def bundles(rc: RayConfig, servers: int, workers: int) -> list[dict[str, float]]:
    """One placement-group bundle per server, then one per worker (zero amounts left out)."""
    return [_bundle(rc, "server")] * servers + [_bundle(rc, "worker")] * workers


def _bundle(rc: RayConfig, role: str) -> dict[str, float]:
    """The bundle of one server or one worker (zero amounts left out)."""
    b = {"CPU": rc.server_cpus, **rc.server_resources} if role == "server" else \
        {"CPU": rc.worker_cpus, "GPU": rc.worker_gpus, **rc.worker_resources}
    return {k: float(v) for k, v in b.items() if v > 0}


def _summed(items: Sequence[dict[str, float]]) -> dict[str, float]:
    need: dict[str, float] = {}
    for b in items:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    return need


@dataclass
class _Slot:
    """One bundle of one of the job's placement groups and the actor in it (None once released)."""

    role: str  # server or worker
    pg: Any
    index: int  # in its placement group
    actor: Any = None
    node: tuple[str, str, int] | None = None  # the actor's node id, node IP and pid


class RayJob(ProcessGroup):
    """The processes of one job on Ray (see the module docstring); use as a context manager.

    ``address``: a running cluster (``ray start --head`` prints it; ``auto`` finds the local one), or
    None to start a local Ray for this job, sized so that the job's bundles fit (and those of a scale
    out up to the app's micro-tasks and twice the servers). ``place(config)`` returns the config with
    the servers' addresses on their nodes; ``spawn`` (``python``) then starts member
    ``server-I``/``worker-R`` in its bundle's actor. ``reserve``/``release``: members joining and
    leaving the running job (``bosen scale``).
    """

    def __init__(self, config: Config, run_dir: str | Path, address: str | None = None, *,
                 grace: float = STOP_GRACE_S) -> None:
        super().__init__(Path(run_dir) / "logs", grace=grace, env={"PYTHONUNBUFFERED": "1"})
        self.run_dir = Path(run_dir)
        self.address = address
        self.rc = config.ray
        self.n_servers, self.n_workers = len(config.cluster.servers), config.cluster.workers
        self.bundles = bundles(config.ray, self.n_servers, self.n_workers)
        tasks = config.app.args.get("micro_tasks", 0)
        most = max(self.n_workers, tasks if isinstance(tasks, int) else 0)
        self._local_bundles = bundles(config.ray, 2 * self.n_servers, most)  # a local Ray: room to scale out
        self.strategy = config.ray.strategy
        self.slots: dict[str, _Slot] = {}  # member (server-I, worker-R) -> its bundle and actor
        self.free: list[_Slot] = []  # bundles whose member left: the next joiner of that role takes one
        self.groups: list[Any] = []  # placement groups, the launch's first
        self._specs: dict[str, list[dict[str, float]]] = {}  # each group's bundles, by its id
        self.released: set[str] = set()  # processes whose actor was released (members that left)
        self._connected = False  # this job called ray.init (so it disconnects / shuts down)
        self.startup_s: float | None = None
        self.scale_placements: list[dict[str, Any]] = []  # each reserve of a scale step: what it asked, how long

    @property
    def nodes(self) -> list[tuple[str, str, int]]:
        """The launch's actors' nodes, servers first (node id, node IP, actor pid)."""
        names = [f"server-{i}" for i in range(self.n_servers)] + [f"worker-{r}" for r in range(self.n_workers)]
        return [n for n in (self.slots[m].node if m in self.slots else None for m in names) if n is not None]

    # -- placing -------------------------------------------------------------------------------

    def __enter__(self) -> RayJob:
        try:
            self._connect()
            self._place()
        except BaseException:
            self._teardown()
            raise
        return self

    def _connect(self) -> None:
        ray = require_ray()
        if ray.is_initialized():  # a driver that already runs Ray (Python API): use its connection
            return
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR",
                              "configure_logging": True}
        if self.address is None:  # a local Ray for this job: logical resources enough for every bundle
            need = _summed(self._local_bundles)
            kw["num_cpus"] = max(os.cpu_count() or 1, int(-(-need.pop("CPU", 0.0) // 1)))
            if "GPU" in need:
                kw["num_gpus"] = int(-(-need.pop("GPU") // 1))
            if need:
                kw["resources"] = need
            kw["address"] = "local"  # a new one, even where another Ray runs on this machine
        else:
            kw["address"] = self.address
        try:
            ray.init(**kw)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = f"the Ray cluster at {self.address}" if self.address else "a local Ray"
            hint = ""
            if self.address not in (None, "auto") and "RAY_AUTH_MODE" not in os.environ:
                # Ray enables token auth for `ray start` where a token exists, but a driver given an
                # explicit address only uses it when asked to
                hint = ("; if the cluster uses token authentication (`ray start` enables it where "
                        "~/.ray/auth_token exists), run with RAY_AUTH_MODE=token")
            raise BosenError(f"--ray: cannot connect to {where}: {e}{hint}") from None
        self._connected = True

    def _place(self) -> None:
        ray = require_ray()
        t0 = time.monotonic()
        need = _summed(self.bundles)
        have = ray.cluster_resources()
        short = {k: v for k, v in need.items() if v > have.get(k, 0.0) + 1e-9}
        if short:  # Ray would wait forever (or for an autoscaler): say at once what is missing
            raise BosenError(f"--ray: cannot place the job: it asks for {short} in all (config section ray, "
                             f"{self.n_servers} servers, {self.n_workers} workers), the cluster has "
                             f"{ {k: have.get(k, 0.0) for k in short} }")
        pg = self._group(self.bundles, PLACEMENT_TIMEOUT_S, "the job")
        names = [f"server-{i}" for i in range(self.n_servers)] + [f"worker-{r}" for r in range(self.n_workers)]
        slots = [_Slot(_role(n), pg, i) for i, n in enumerate(names)]
        self.slots.update(zip(names, slots, strict=True))  # teardown finds the actors even if they fail
        self._start_actors(slots, PLACEMENT_TIMEOUT_S)
        self.startup_s = time.monotonic() - t0

    def _group(self, items: list[dict[str, float]], timeout: float, what: str) -> Any:
        """A ready placement group of ``items`` (kept in ``groups``); BosenError if Ray cannot place it in time."""
        ray = require_ray()
        from ray.util.placement_group import placement_group, remove_placement_group

        pg = placement_group(items, strategy=self.strategy, name=f"bosen:{self.run_dir.name}:{len(self.groups)}")
        try:
            ray.get(pg.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            asked = ", ".join(f"{n} x {b}" for n, b in _counted(items))
            raise BosenError(f"--ray: the cluster could not place {what} within {timeout:g}s (strategy "
                             f"{self.strategy}): it asks for {asked}; the cluster has {ray.cluster_resources()} "
                             f"({ray.available_resources()} free). Change the config's ray section or add nodes"
                             ) from None
        self.groups.append(pg)
        self._specs[pg.id.hex()] = items
        return pg

    def _start_actors(self, slots: list[_Slot], timeout: float) -> None:
        """A ``ProcessActor`` in each slot's bundle, and its node."""
        ray = require_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_cls = ray.remote(max_restarts=0)(ProcessActor)
        for s in slots:
            b = _bundle(self.rc, s.role)
            custom = {k: v for k, v in b.items() if k not in ("CPU", "GPU")}
            s.actor = actor_cls.options(
                num_cpus=b.get("CPU", 0.0), num_gpus=b.get("GPU", 0.0), resources=custom,
                scheduling_strategy=PlacementGroupSchedulingStrategy(s.pg, placement_group_bundle_index=s.index),
            ).remote(os.getcwd())
        try:
            nodes = ray.get([s.actor.node.remote() for s in slots], timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            raise BosenError(f"--ray: the job's actors did not start: {e}") from None
        for s, n in zip(slots, nodes, strict=True):
            s.node = tuple(n)  # type: ignore[assignment]

    def place(self, config: Config) -> Config:
        """``config`` with ``cluster.servers`` on the server actors' nodes (node IP, a port free there)."""
        import dataclasses

        servers = tuple(self.free_address(f"server-{i}") for i in range(self.n_servers))
        return dataclasses.replace(config, cluster=dataclasses.replace(config.cluster, servers=servers))

    def free_address(self, name: str) -> str:
        """HOST:PORT where member ``name`` (a server) can listen: its actor's node IP, a port free there."""
        ray = require_ray()
        s = self._slot(name)
        assert s.node is not None
        return f"{s.node[1]}:{ray.get(s.actor.free_port.remote(s.node[1]), timeout=CALL_TIMEOUT_S)}"

    def reserve(self, names: Sequence[str], timeout: float = SCALE_PLACEMENT_TIMEOUT_S) -> float:
        """An actor for each member in ``names`` that has none (servers or workers joining the running
        job): a free bundle of its role, else one of a new placement group for this call. All or
        nothing: BosenError (what was asked, what the cluster has) and nothing kept when Ray cannot
        place them. Seconds it took."""
        ray = require_ray()
        t0 = time.monotonic()
        names = [n for n in dict.fromkeys(_key(n) for n in names) if n not in self.slots]
        taken: list[tuple[str, _Slot]] = []
        rest: list[str] = []
        for n in names:
            slot = next((s for s in self.free if s.role == _role(n)), None)
            if slot is None:
                rest.append(n)
            else:
                self.free.remove(slot)
                taken.append((n, slot))
        pg = None
        try:
            if rest:
                items = [_bundle(self.rc, _role(n)) for n in rest]
                need, free = _summed(items), ray.available_resources()
                short = {k: v for k, v in need.items() if v > free.get(k, 0.0) + 1e-9}
                settle = time.monotonic() + FREED_LAG_S
                while short and time.monotonic() < settle:  # resources just freed show up late
                    time.sleep(0.2)
                    free = ray.available_resources()
                    short = {k: v for k, v in need.items() if v > free.get(k, 0.0) + 1e-9}
                if short:  # would wait out the timeout: say at once
                    raise BosenError(f"--ray: cannot place {', '.join(rest)}: they ask for {need} in all (config "
                                     f"section ray), the cluster has { {k: free.get(k, 0.0) for k in short} } "
                                     f"free of {short} (of { {k: ray.cluster_resources().get(k, 0.0) for k in short} }"
                                     " in all). Add nodes or ask for fewer")
                pg = self._group(items, timeout, ", ".join(rest))
                taken += [(n, _Slot(_role(n), pg, i)) for i, n in enumerate(rest)]
            self._start_actors([s for _, s in taken], timeout)
        except BaseException:
            for _, s in taken:
                self._kill(s)
                if s.pg is not pg:
                    self.free.append(s)
            if pg is not None:
                self._remove_group(pg)
            raise
        self.slots.update(taken)
        seconds = time.monotonic() - t0
        self.scale_placements.append({"members": names, "reused": len(names) - len(rest), "new_bundles": len(rest),
                                      "seconds": round(seconds, 3)})
        self._record()
        return seconds

    def release(self, name: str, grace: float = STOP_GRACE_S) -> None:
        """Member ``name`` left the job: stop what still runs in its actor, kill the actor, free its
        bundle; a scale step's placement group with every bundle free is removed (the cluster gets
        its resources back)."""
        key = _key(name)
        s = self.slots.pop(key, None)
        if s is None:
            return
        for p in self.procs:
            if _key(p.name) == key:
                if p.returncode is None:
                    p.stop(grace)
                self.released.add(p.name)
        self._kill(s)
        self.free.append(s)
        if s.pg is not self.groups[0] and not any(t.pg is s.pg for t in self.slots.values()):
            self.free = [t for t in self.free if t.pg is not s.pg]
            self._remove_group(s.pg)
        self._record()

    def _slot(self, name: str) -> _Slot:
        """The slot of member ``name`` (``server-I``, ``worker-R``, a replacement ``worker-R.N``); one
        that has none yet is placed now."""
        key = _key(name)
        if key not in self.slots:
            self.reserve([key], PLACEMENT_TIMEOUT_S)
        return self.slots[key]

    def _kill(self, s: _Slot) -> None:
        if s.actor is not None:
            try:
                require_ray().kill(s.actor, no_restart=True)
            except Exception:  # already gone
                pass
        s.actor, s.node = None, None

    def _remove_group(self, pg: Any) -> None:
        try:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(pg)
        except Exception:
            pass
        self.groups = [g for g in self.groups if g is not pg]

    # -- members -------------------------------------------------------------------------------

    def spawn(self, name: str, cmd: Sequence[str | os.PathLike[str] | int], *, env: Env | None = None,
              cwd: str | Path | None = None, pipes: bool = False) -> Process:
        """Start ``cmd`` as member ``name`` in the actor of its bundle (this interpreter's path is
        replaced by the node's Python); logs to LOG_DIR/NAME.log as a local member would."""
        if pipes or cwd is not None:
            raise BosenError(f"--ray: {name}: pipes and a working directory are not supported on Ray")
        if any(p.name == name for p in self.procs):
            raise BosenError(f"this group already has a process named {name!r} (log {self.log_dir / name}.log)")
        slot = self._slot(name)
        node = slot.node
        assert node is not None
        args = ["{python}" if str(c) == sys.executable else os.fspath(c) if isinstance(c, os.PathLike) else str(c)
                for c in cmd]
        merged: dict[str, str] = {}
        for k, v in {**self.env, **(env or {})}.items():
            if v is not None:
                merged[k] = os.fspath(v) if isinstance(v, os.PathLike) else str(v)
        # what the launcher imports, the children import (apps, tests); a fault a test injects
        # ($BOSEN_FAULT, bosen/faults.py) reaches them as it reaches a plain launch's children
        for var in ("PYTHONPATH", faults.ENV):
            if os.environ.get(var):
                merged.setdefault(var, os.environ[var])
        log = (self.log_dir / f"{name}.log").resolve()
        ray = require_ray()
        try:
            pid = ray.get(slot.actor.start.remote(name, args, str(log), merged), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            raise ProcessFailed(f"--ray: could not start {name} on {node[1]}: {e}") from None
        p = RayProcess(name, slot.actor, node, log, pid)
        self.procs.append(p)
        self._record()
        return p

    def _record(self) -> None:
        """RUN_DIR/ray.json: where each member runs (node id and IP, actor and child pid; ``released``:
        it left the job, its actor is gone) and each placement group's bundles and members now."""
        procs = {p.name: {"node_id": p.node_id, "node_ip": p.node_ip, "actor_pid": p.actor_pid, "pid": p.pid,
                          **({"released": True} if p.name in self.released else {})}
                 for p in self.procs if isinstance(p, RayProcess)}
        groups = [{"id": g.id.hex(), "bundles": self._specs.get(g.id.hex()),
                   "members": {i: m for m, s in self.slots.items() if s.pg is g for i in [s.index]}}
                  for g in self.groups]
        data = {"address": self.address or "local", "strategy": self.strategy, "bundles": self.bundles,
                "startup_s": self.startup_s, "processes": procs, "placement_groups": groups,
                "scale_placements": self.scale_placements}
        (self.run_dir / PLACEMENT).write_text(json.dumps(data, indent=1) + "\n")

    # -- tearing down --------------------------------------------------------------------------

    def __exit__(self, *exc: Any) -> None:
        try:
            self.stop_all()
        finally:
            self._teardown()

    def _teardown(self) -> None:
        """Kill every actor, remove the placement groups, disconnect (a local Ray ends with it)."""
        try:
            import ray
        except ImportError:
            return
        if not ray.is_initialized():
            return
        for s in self.slots.values():
            self._kill(s)
        for g in list(self.groups):
            self._remove_group(g)
        self.free = []
        if self._connected:
            ray.shutdown()
            self._connected = False


def _key(name: str) -> str:
    """The member a process name belongs to: ``server-I`` or ``worker-R`` (a replacement ``.N`` left out)."""
    m = _MEMBER.fullmatch(name)
    if m is None:
        raise BosenError(f"--ray: no bundle for a process named {name!r} (server-I or worker-R)")
    return f"{m.group(1)}-{int(m.group(2))}"


def _role(name: str) -> str:
    return _key(name).partition("-")[0]


def _counted(items: list[dict[str, float]]) -> list[tuple[int, dict[str, float]]]:
    out: list[tuple[int, dict[str, float]]] = []
    for b in items:
        if out and out[-1][1] == b:
            out[-1] = (out[-1][0] + 1, b)
        else:
            out.append((1, b))
    return out
