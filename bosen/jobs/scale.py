"""``bosen scale``: a running job gains or loses worker processes (Litz), asked of its launcher.

The launcher of a job (``bosen launch``) listens on a small control endpoint: a ZeroMQ ROUTER socket
on loopback whose address it writes to ``RUN_DIR/control.json`` (JSON requests and replies, no pickle;
clients use REQ sockets). A ROUTER keeps no send/receive lockstep, so a request whose answer was cut
off (the launcher stopping) leaves nothing that breaks the next one.
``bosen scale RUN_DIR --workers M`` (:func:`scale`) sends ``{"op": "scale", "workers": M}``, then asks
for progress until the job runs with M workers. What can be scaled is a table of handlers keyed by
its name (:attr:`Scaler.handlers`): ``servers`` (first: servers join on free local ports, ``bosen-server
--join``, or the last ones leave, while ``bosen.jobs.moves.scale_servers`` moves the partitions on a
thread of its own, so the launcher keeps answering requests and watching its processes) and then
``workers``. A request is checked whole (:attr:`Scaler.checks`) before any part of it starts, so a
refused part never leaves another done; one scale at a time (another request meanwhile is refused,
saying so). ``{"op": "status"}`` (:func:`launcher_status`) says the job's shape and the step under way.

Scaling workers moves micro-tasks at a clock boundary B (apps/microtasks.py, ``FilePlan``) in two
phases, so no worker can be past B when the tasks move: the launcher proposes a plan for B (a few
clocks past the fastest worker's clock on the servers); every worker answers whether it is still
before B (then it waits at B) or past it; if any was past, the plan is withdrawn and a later B
proposed. New workers start first, ahead of the proposal (``BOSEN_JOIN=ahead``): each loads its data
while the job runs on and says it is ready (``tasks/ready-R.json``); only then is B proposed, so the
running workers never wait at B for a process to start. Once all answered, the launcher names B to
the new workers (``tasks/join.json``; each joins the servers as the next rank at clock B, which holds
nobody back: the servers' clock is at most B while the others wait there) and, once every server
counts them, the plan is committed: the givers write their tasks'
states at B, the new workers take them, and leaving workers (the newest ranks: scale-in is last in,
first out) give all theirs away and leave by BYE. A scale step ends when every new worker has
passed B on every server and every server has every leaving one's BYE.

On a job launched with ``--ray`` (``Host.ray_job``), the actors of the joining servers and workers are
asked of Ray (``RayJob.reserve``) when the request arrives, before anything starts or any plan is
proposed: a request Ray cannot place is refused and the job runs on unchanged. A joining server
listens on its actor's node IP; a member that left has its actor released (``RayJob.release``).
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import zmq

from bosen import checkpoint
from bosen.apps import microtasks
from bosen.config import Config
from bosen.errors import BosenError
from bosen.jobs import status as status_mod
from bosen.jobs.cluster import LocalCluster
from bosen.jobs.job import JobFailed, MetricsMerger
from bosen.jobs.moves import MoveReport, SplitMaps, current_servers, map_of, retire_servers, scale_servers
from bosen.jobs.supervise import Process, ProcessFailed, describe_exit
from bosen.security import Security

if TYPE_CHECKING:
    from bosen.jobs.ray import RayJob

CONTROL_FILE = "control.json"
PLAN_AHEAD = 2  # the first boundary B proposed: this many clocks past the newest one seen; doubled per retry
ANSWER_TIMEOUT_S = 60.0  # every worker answers a proposal within this (it reads the plan at each clock)
JOIN_TIMEOUT_S = 120.0  # a new worker process starts (imports, data) and joins every server within this
SETTLE_TIMEOUT_S = 120.0
# leavers wait at B for every server's part of B on disk; where one says no part of B is coming (none
# asked, none deferred, no lost worker awaited), they leave after this anyway
DURABLE_WAIT_S = 30.0
MAX_PROPOSALS = 10  # a job of 300 clocks a second needed 4 (margins 2, 4, 8, 16)
RETIRE_TIMEOUT_S = 10.0  # a leaving server answers ``retire`` (every client's BYE) and exits within this
REQUEST_TIMEOUT_S = 90.0  # a scale request is answered within this (a servers step starts processes first)


def leave_boundary(clock: int, config: Config, leavers: bool) -> int:
    """The boundary B proposed for a step at or after ``clock``: where workers leave and the job makes
    checkpoints, the next checkpoint boundary (``clock`` itself if it is one). A leaver's updates are
    all of ticks < B (it sent CLOCK(B), then gives its tasks away and says BYE), which is exactly what
    every server's part at B holds: a server lost once that part is on disk is replaced exactly
    (nobody has to resend for the leaver). Under a time rule (``every_s``, ``mttf_s``) the servers save
    only the boundaries rank 0 chooses, so the scaler asks each for B (SAVE) before proposing it."""
    ck = config.checkpoint
    if not leavers or ck is None or checkpoint.is_boundary(clock, ck.every_clocks):
        return clock
    return checkpoint.next_boundary(clock, ck.every_clocks)


class ScaleError(BosenError):
    """A scale request that cannot be met, or one that failed on the way (the job runs on as it was)."""


@dataclass
class _Step:
    """One scale request being carried out by the launcher's loop."""

    id: int
    target: int  # workers wanted
    started: float
    lines: list[str] = field(default_factory=list)
    phase: str = "propose"  # "prepare" first where workers join
    clock: int = -1  # the proposed boundary B
    proposals: int = 0
    deadline: float = 0.0
    joiners: list[int] = field(default_factory=list)
    leavers: list[int] = field(default_factory=list)
    owners: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # each task's rank after the step
    done: bool = False
    error: str | None = None
    seconds: float | None = None
    durable: bool = False  # leavers wait at B until every server's part of B is on disk (``left-<id>.json``)
    at_b: float | None = None  # when nothing told of a part of B coming any more (the fallback wait began)
    asked: dict[str, float] = field(default_factory=dict)  # server -> when it was asked for a part of B (SAVE)
    what: str = ""  # what was asked ("to 3 servers, then 2 workers"), for status and a refused second request
    then: list[tuple[str, Any]] = field(default_factory=list)  # the request's parts still to start, in order
    kept: str | None = None  # the last line of the request's parts done so far (one refused after says so)
    servers: tuple[int, int] = (0, 0)  # a servers part: the job's servers before it and after it
    mover: threading.Thread | None = None  # a servers part: the partition move, off the launcher's loop
    cancel: threading.Event = field(default_factory=threading.Event)  # set: the move is given up (stopping)
    report: MoveReport | None = None
    failure: BaseException | None = None


class Host(Protocol):
    """What the scaler uses of the launcher (bosen/jobs/launch.py ``Launcher``)."""

    config: Config
    run_dir: Path
    workers: list[Process]  # by rank; ranks are never reused
    cluster: LocalCluster | None
    dropped: set[int]
    servers_changed: bool  # servers joined or left: a lost one's replacement takes their list and map from a live one
    security: Security | None  # the job's client keys (CURVE) for STATUS queries

    @property
    def merger(self) -> MetricsMerger | None: ...

    @property
    def ray_job(self) -> RayJob | None: ...  # the job's processes are Ray actors (``bosen launch --ray``)

    def say(self, msg: str) -> None: ...

    def start_joiner(self, rank: int) -> None: ...


class Scaler:
    """The launcher's side: answers control requests and moves the job to the asked shape, one step per
    call of :meth:`step` (from the launcher's watch loop, the thread that started the processes)."""

    def __init__(self, launcher: Host) -> None:
        self.launcher = launcher
        self.run_dir = launcher.run_dir
        self.folder = self.run_dir / microtasks.HANDOFF_DIR
        self.plan_path = self.folder / "plan.json"
        # what can be scaled, each asked in this order (one done at once goes before one that starts a step),
        # and each one's checks: a request is checked whole before any part of it starts, so a refused
        # part never leaves the other done
        self.handlers: dict[str, Callable[[tuple[Any, _Step]], _Step | None]] = {"servers": self._servers,
                                                                                 "workers": self._workers}
        self.checks: dict[str, Callable[[Any], bool]] = {"servers": self._check_servers,
                                                          "workers": self._check_workers}
        self.steps: dict[int, _Step] = {}
        self.current: _Step | None = None
        # the ranks in the job: joiners count from the commit on, leavers no more from it (a leaving
        # process may still be exiting when the next step starts)
        self.members = set(range(len(launcher.workers)))
        self._ids = 0
        self._plan_ids = int(time.time() * 1000) % (1 << 30)  # plan ids differ across launches in one directory
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        path = self.run_dir / CONTROL_FILE
        tmp = path.with_name(f".{CONTROL_FILE}.partial")
        tmp.write_text(json.dumps({"address": self.address, "pid": os.getpid()}))
        os.replace(tmp, path)

    def close(self) -> None:
        """Stop listening; a partition move under way is given up (before its map, the clients resume)."""
        (self.run_dir / CONTROL_FILE).unlink(missing_ok=True)
        step = self.current
        if step is not None and step.mover is not None:
            step.cancel.set()
            step.mover.join(timeout=10.0)
        self._sock.close(0)
        self._ctx.term()

    @property
    def busy(self) -> bool:
        return self.current is not None

    @property
    def joining(self) -> list[int]:
        """Ranks started by the step under way that have not joined yet: their exit fails the step, not the job."""
        step = self.current
        return step.joiners if step is not None and step.phase in ("prepare", "answers", "joined") else []

    # -- requests ------------------------------------------------------------------------------

    def poll(self) -> None:
        """Answer every waiting control request (non-blocking; nothing once closed). Each reply goes
        back under its request's envelope (the ROUTER's peer id, and a REQ's empty delimiter)."""
        while not self._sock.closed and self._sock.poll(0):
            frames = self._sock.recv_multipart()
            try:
                req = json.loads(frames[-1])
                reply = self._answer(req if isinstance(req, dict) else {})
            except (ValueError, BosenError) as e:
                reply = {"ok": False, "error": str(e)}
            except Exception as e:  # a bug here must not leave the client without its answer
                reply = {"ok": False, "error": f"internal error in the launcher: {e!r}"}
            self._sock.send_multipart([*frames[:-1], json.dumps(reply).encode()])

    def _answer(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "scale":
            asked = {k: req[k] for k in self.handlers if req.get(k) is not None}
            if not asked:
                raise ScaleError(f"nothing to scale: give one of {', '.join('--' + k for k in self.handlers)}")
            if self.current is not None:
                raise ScaleError(f"a scale is in progress (step {self.current.id}: {self.current.what}, "
                                 f"{self.current.phase}): ask again once it is done")
            for what, value in asked.items():
                self.checks[what](value)
            self._ids += 1
            step = _Step(self._ids, len(self.members), time.time(),
                         what=", then ".join(f"to {v} {k}" for k, v in asked.items()), then=list(asked.items()))
            self._next(step)
            if not step.lines:
                return {"ok": True, "id": -1, "lines": ["nothing to do: the job already has that shape"], "done": True}
            self.steps[step.id] = step
            return {"ok": True, "id": step.id}
        if op == "shape":  # the job's workers now (a step under way counts its joiners from its commit)
            return {"ok": True, "workers": len(self.members), "scaling": self.current is not None}
        if op == "status":  # the job's shape and the step under way, answered while it moves
            cluster, now = self.launcher.cluster, self.current
            return {"ok": True, "workers": len(self.members), "ranks": sorted(self.members), "running": self.live(),
                    "servers": len(cluster.addresses) if cluster is not None else None,
                    "scaling": None if now is None else {
                        "id": now.id, "what": now.what, "phase": now.phase,
                        "seconds": round(time.time() - now.started, 3),
                        "line": now.lines[-1] if now.lines else None}}
        if op == "progress":
            asked_for = self.steps.get(req.get("id", -2))
            if asked_for is None:
                raise ScaleError(f"no scale step {req.get('id')!r}")
            start = req.get("from", 0)
            return {"ok": True, "lines": asked_for.lines[start if isinstance(start, int) else 0:],
                    "done": asked_for.done, "error": asked_for.error, "seconds": asked_for.seconds}
        raise ScaleError(f"unknown request {op!r} (scale, progress, shape, status)")

    def _next(self, step: _Step) -> None:
        """Start the request's next part (one that changes nothing is skipped); the step is done when
        none is left. A part refused after an earlier one was done says what the job kept."""
        while step.then:
            what, value = step.then.pop(0)
            try:  # each handler checks its part again: the job ran on while an earlier part moved
                started = self.handlers[what]((value, step))
            except ScaleError as e:
                if step.kept is None:
                    raise
                self._finish(step, f"{e} (the job kept the rest of this request: {step.kept})")
                return
            if started is not None:
                return
        if step.lines:
            self._finish(step)

    def _finish(self, step: _Step, error: str | None = None) -> None:
        step.seconds = round(time.time() - step.started, 3)
        step.error, step.done, self.current = error, True, None
        if error is not None:
            self._say(step, f"failed: {error}")

    @property
    def moving_servers(self) -> bool:
        """A servers part is under way: its partition move runs (the launcher tells every server,
        the joining ones too, about a rank that finishes meanwhile)."""
        return self.current is not None and self.current.phase == "move"

    def leaving(self, server: int) -> bool:
        """Whether ``server`` leaves in the servers part under way: it exits once its partitions moved
        away, maybe before ``_move`` has retired it, and that exit is no loss to replace."""
        if not self.moving_servers:
            return False
        assert self.current is not None
        _, n = self.current.servers
        return server >= n

    def finished(self) -> list[int]:
        """The job's ranks whose process has ended its training (exit status 0: its BYE answered)."""
        return [r for r in sorted(self.members) if self.launcher.workers[r].returncode == 0]

    def _servers(self, asked: tuple[Any, _Step]) -> _Step | None:
        """Servers join (``bosen-server --join``, on free local ports, told which ranks have finished:
        ``--gone``) or the last ones leave: ``bosen.jobs.moves.scale_servers`` moves the partitions on
        its own thread while the workers compute on (their sends pause) and the launcher's loop goes
        on (``_move``). Done before a workers part of the same request starts."""
        n, step = asked
        cluster = self.launcher.cluster
        assert cluster is not None
        now = list(cluster.addresses)
        if not self._check_servers(n):
            return None
        self._say(step, f"scaling from {len(now)} to {n} servers")
        ray = self.launcher.ray_job
        joining = [f"server-{i}" for i in range(len(now), n)]
        try:
            if ray is not None and joining:  # their actors first: a request Ray cannot place changes nothing
                took = ray.reserve(joining)
                self._say(step, f"Ray placed actors for {', '.join(joining)} in {took:.2f}s")
            # from the launcher's thread: a child dies with the thread that started it
            added = [cluster.add_server(address=None if ray is None else ray.free_address(m), gone=self.finished())
                     for m in joining]
        except (BosenError, ValueError) as e:
            if ray is not None:  # actors of servers that did not join
                for m in joining[len(cluster.addresses) - len(now):]:
                    ray.release(m)
            raise ScaleError(f"--servers {n}: {e}") from None
        if added:
            self._say(step, f"servers {', '.join(added)} started; moving partitions to them")
        step.servers = (len(now), n)
        step.mover = threading.Thread(target=self._move_partitions, args=(step, now[:n] + added),
                                      name="bosen-scale-servers", daemon=True)
        step.phase, self.current = "move", step
        step.mover.start()
        return step

    def _move_partitions(self, step: _Step, servers: list[str]) -> None:
        """The partition move of a servers part, on its own thread (it waits for every client to pause:
        seconds, more under load); its outcome is read by ``_move`` once the thread has ended."""
        try:
            step.report = scale_servers(self.launcher.config, servers, timeout=JOIN_TIMEOUT_S, cancel=step.cancel)
        except BaseException as e:  # noqa: BLE001 - handed to the launcher's thread, which fails the step with it
            step.failure = e

    def _move(self, step: _Step) -> None:
        """A servers part's move has ended: the leaving servers exit, and the request goes on."""
        assert step.mover is not None
        if step.mover.is_alive():
            return
        step.mover = None
        before, n = step.servers
        if step.failure is not None:
            version = self._took_effect(step)
            if version is None:
                raise ScaleError(f"--servers {n}: {step.failure}{self._drop_joined(step)}")
            self.launcher.servers_changed = True  # as below: the job runs on its servers' new list and map
            self._say(step, f"the move took effect: the job runs on {n} servers (every one follows the new map; "
                            f"the move then failed: {step.failure}){self._retire_left(step, version)}")
            step.phase, step.kept = "propose", step.lines[-1]
            self._next(step)
            return
        cluster, ray, report = self.launcher.cluster, self.launcher.ray_job, step.report
        assert cluster is not None and report is not None
        self.launcher.servers_changed = True  # the job follows its servers' list and map from here on
        for i in range(before - 1, n - 1, -1):
            cluster.retired(i)
            if ray is not None:
                ray.release(f"server-{i}")
                self._say(step, f"server-{i} exited; its Ray actor released")
        self._say(step, f"the job runs on {n} servers: {report.moved} partitions ({report.bytes / 1e6:.1f} MB) "
                        f"moved, sends paused {report.pause_s:.2f}s")
        step.phase, step.kept = "propose", step.lines[-1]
        self._next(step)

    def _took_effect(self, step: _Step) -> int | None:
        """After a failed move: the new map's version where it failed once every server had taken that
        map (server 0 lists the ``n`` servers, and every server of the step, those joining or leaving
        too, as far as they run, follows one map that gives partitions to the first ``n`` and to none
        beyond), else None.
        JobFailed where the servers follow different maps: a client takes a map only once every server
        sent it, so the job's clients wait for ever and nobody can tell which map holds which rows."""
        _, n = step.servers
        cluster = self.launcher.cluster
        assert cluster is not None
        try:
            listed = len(current_servers(self.launcher.config))
            # a leaving server that has exited had taken the map (it exits once it retired)
            version, owner = map_of(self.launcher.config, [a for i, (a, q) in enumerate(zip(
                cluster.addresses, cluster.servers, strict=True)) if i < n or q.returncode is None])
        except SplitMaps as e:
            why = f"--servers {n}: {step.failure}; then {e}"
            self._finish(step, why)
            raise JobFailed(f"a servers scale step failed part-way: {why}; stopping the job") from None
        except BosenError:
            return None  # a server did not answer: _drop_joined says what became of the joined ones
        took = listed == n and bool(owner.shape[0]) and int(owner.max()) == n - 1
        return version if took else None

    def _retire_left(self, step: _Step, version: int) -> str:
        """After a scale-in whose move failed once every server took the new map: the leaving servers
        (they own nothing) are asked to leave as the move would have (``retire_servers``), those that
        do not exit are stopped, and all leave the launcher's list (their Ray actors released), so
        that it counts the ``n`` servers the job runs on; what became of them, for the step's line."""
        before, n = step.servers
        cluster, ray = self.launcher.cluster, self.launcher.ray_job
        assert cluster is not None
        if n >= before:
            return ""
        running = [cluster.addresses[i] for i in range(n, before) if cluster.servers[i].returncode is None]
        refused = retire_servers(self.launcher.config, running, version, timeout=RETIRE_TIMEOUT_S)
        said = []
        for i in range(before - 1, n - 1, -1):
            name, address = cluster.servers[i].name, cluster.addresses[i]
            if address in refused:
                code = cluster.drop_joined(i)
                said.append(f"{name} did not leave ({refused[address]}): stopped, it {describe_exit(code)}")
            else:
                try:
                    cluster.retired(i, timeout=RETIRE_TIMEOUT_S)
                    said.append(f"{name} exited")
                except ProcessFailed as e:  # it answered but did not exit cleanly: stopped by now
                    cluster.drop_joined(i)
                    said.append(f"{name} stopped ({e})")
            if ray is not None:
                ray.release(f"server-{i}")
                said[-1] += ", its Ray actor released"
        return "; " + "; ".join(reversed(said))

    def _drop_joined(self, step: _Step) -> str:
        """After a failed move: the servers that joined for it stop and leave the launcher's list (their
        Ray actors released) where server 0 still lists the old servers (none took the new map), and
        the job runs on with those; what became of them, for the step's error."""
        before, n = step.servers
        cluster, ray = self.launcher.cluster, self.launcher.ray_job
        assert cluster is not None
        if n <= before:
            return ""
        try:
            listed = len(current_servers(self.launcher.config))
        except BosenError as e:
            return f"; the joined servers keep running: server 0 did not say which servers the job has ({e})"
        if listed != before:
            return f"; the joined servers keep running: server 0 lists {listed} servers"
        names = []
        for i in range(n - 1, before - 1, -1):
            names.append(cluster.servers[i].name)
            cluster.drop_joined(i)
            if ray is not None:
                ray.release(f"server-{i}")
        return (f"; {', '.join(reversed(names))} stopped{' and their Ray actors released' if ray else ''}, "
                f"back to {before} servers")

    def _check_servers(self, n: Any) -> bool:
        """ScaleError if the job cannot run on ``n`` servers; whether that changes anything."""
        assert self.launcher.cluster is not None
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ScaleError(f"--servers {n!r}: a job needs at least 1 server")
        if n == len(self.launcher.cluster.addresses):
            return False
        parts = self.launcher.config.cluster.num_partitions
        if n > parts:
            raise ScaleError(f"--servers {n}: the job's rows are in {parts} partitions (cluster.partitions), so at "
                             f"most {parts} servers")
        if not self.live():
            raise ScaleError(f"--servers {n}: the job has finished (every worker ended its training): nothing moved")
        return True

    def _check_workers(self, m: Any) -> bool:
        """ScaleError if the job cannot run with ``m`` worker processes; whether that changes anything."""
        cfg = self.launcher.config
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ScaleError(f"--workers {m!r}: a job needs at least 1 worker")
        if cfg.checkpoint is None:
            raise ScaleError(f"{cfg.source}: this job makes no checkpoints (no checkpoint section): a job that scales "
                             "must, so that a lost worker's micro-tasks can be restored (docs/recovery.md)")
        module = cfg.app.module or ""
        try:
            app = importlib.import_module(module)
        except ImportError as e:
            raise ScaleError(f"app {module}: cannot import it here: {e}") from None
        if not getattr(app, "ELASTIC", False):
            raise ScaleError(f"app {module} has no micro-tasks that move to joining workers (docs/app-contract.md)")
        for t in cfg.tables:  # a synchronous table: each iteration counts the job's workers
            if t.backup is None:
                continue
            if not getattr(app, "SYNC_ELASTIC", False):
                raise ScaleError(f"app {module}: its synchronous path (tables.{t.name} has backup) does not follow "
                                 "micro-tasks, so its workers cannot change while it runs")
        # an app elastic in some configs only says why not this one (of the workers its processes count:
        # cluster.workers, as each worker's client.num_workers)
        why = getattr(app, "not_elastic", None)
        if callable(why) and (reason := why(cfg.app.args, cfg.cluster.workers)):
            raise ScaleError(f"app {module}: {reason}")
        T = self.tasks()
        if m > T:
            raise ScaleError(f"--workers {m}: the app has {T} micro-tasks (app.args.micro_tasks"
                             f"{'' if cfg.app.args.get('micro_tasks') else ', 0: one per worker at the start'}), "
                             f"so at most {T} workers")
        if not self.live():
            raise ScaleError(f"--workers {m}: the job has finished (every worker ended its training): nothing moved")
        if m == len(self.members):
            return False
        self._check_end(self._earliest(m < len(self.members)), m)
        return True

    def _earliest(self, leavers: bool) -> int:
        """The boundary a step would propose now (its first try): ``PLAN_AHEAD`` past the newest clock
        any server reports, and where workers leave, the next checkpoint boundary from there."""
        cluster = self.launcher.cluster
        assert cluster is not None
        stats = [status_mod.query(a, timeout=3.0, security=self.launcher.security) for a in cluster.addresses]
        seen = [c for st in stats for c in [st["clock"], *st["client_clocks"]] if isinstance(c, int)]
        return leave_boundary(max(seen) + PLAN_AHEAD, self.launcher.config, leavers)

    def _check_end(self, b: int, m: int) -> None:
        """ScaleError if the job's training ends at or before the boundary ``b`` (the workers say where,
        ``FilePlan.ends_at``): no tick would run after the move, and past its end a worker reads no
        plan, so it would never wait at ``b`` (a leaver would wait for a release, a joiner for hand-offs,
        that never come). The job is left to finish as it is."""
        end = microtasks.job_end(self.folder, self.live())
        if end is None or b < end[0]:
            return
        leaving = m < len(self.members)
        raise ScaleError(f"--workers {m}: the job's training ends at clock {end[0]} (worker {end[1]}), at or "
                         f"before clock {b}, the earliest boundary where its micro-tasks could move now"
                         f"{' (workers leave at a checkpoint boundary)' if leaving else ''}: too few clocks remain; "
                         f"nothing moved, and the job finishes with its {len(self.members)} workers")

    def _workers(self, asked: tuple[Any, _Step]) -> _Step | None:
        m, step = asked
        if not self._check_workers(m):
            return None
        now = sorted(self.members)
        T = self.tasks()
        step.target = m
        nxt = len(self.launcher.workers)  # ranks are never reused
        step.joiners = list(range(nxt, nxt + m - len(now))) if m > len(now) else []
        step.leavers = now[m:]  # the newest leave first
        step.durable = bool(step.leavers)  # a scale needs checkpoints (``_check_workers``)
        step.owners = microtasks.assign(T, sorted((set(now) | set(step.joiners)) - set(step.leavers)))
        self._say(step, f"scaling from {len(now)} to {m} workers"
                  + (f": ranks {step.joiners} join" if step.joiners else f": ranks {step.leavers} leave"))
        ray = self.launcher.ray_job
        if ray is not None and step.joiners:  # before any plan: a request Ray cannot place changes nothing
            try:
                took = ray.reserve([f"worker-{r}" for r in step.joiners])
            except BosenError as e:
                raise ScaleError(f"--workers {m}: {e}") from None
            self._say(step, f"Ray placed actors for workers {step.joiners} in {took:.2f}s")
        self.current = step
        if step.joiners:  # started ahead: they load their data while the job runs on
            for old in [*self.folder.glob("ready-*.json"), self.folder / microtasks.JOIN_FILE]:
                old.unlink(missing_ok=True)
            for r in step.joiners:
                self.launcher.start_joiner(r)
            step.phase, step.deadline = "prepare", time.monotonic() + JOIN_TIMEOUT_S
            self._say(step, f"started worker(s) {step.joiners}; waiting for them to load their data")
        return step

    # -- the job's shape -----------------------------------------------------------------------

    def tasks(self) -> int:
        """The job's micro-tasks (fixed for its life: app.args.micro_tasks, 0 = one per worker at the start)."""
        cfg = self.launcher.config
        t = cfg.app.args.get("micro_tasks", 0)
        return int(t) if isinstance(t, int) and t > 0 else cfg.cluster.workers

    def live(self) -> list[int]:
        """The job's ranks whose process runs (not yet finished)."""
        return [r for r in sorted(self.members) if self.launcher.workers[r].returncode is None]

    def _stats(self) -> list[dict[str, Any]]:
        cluster = self.launcher.cluster
        assert cluster is not None
        return [status_mod.query(a, timeout=3.0, security=self.launcher.security) for a in cluster.addresses]

    def _clocks(self) -> list[list[Any]]:
        return [st["client_clocks"] for st in self._stats()]

    # -- carrying a step out -------------------------------------------------------------------

    def _say(self, step: _Step, line: str) -> None:
        line = f"{time.time() - step.started:6.2f}s {line}"  # since the request: where a step spends its time
        step.lines.append(line)
        self.launcher.say(f"scale: {line}")

    def _fail(self, step: _Step, why: str) -> None:
        if step.phase in ("answers", "joined") and self.plan_path.exists():  # not yet committed: nothing moves
            self._write_plan(step, "withdrawn")
        for r in step.joiners:  # new workers that did not get their tasks stop
            if r < len(self.launcher.workers):
                self.launcher.workers[r].stop(grace=2.0)
                self.launcher.dropped.add(r)
            if self.launcher.ray_job is not None:
                self.launcher.ray_job.release(f"worker-{r}", grace=2.0)
        step.error, step.done, self.current = why, True, None
        self._say(step, f"failed: {why}; the job runs on as it was")

    def step(self) -> None:
        """Advance the current scale step by what is ready now."""
        step = self.current
        if step is None:
            return
        try:
            getattr(self, f"_{step.phase}")(step)
        except JobFailed:  # the step left the job unable to run on (it says why)
            raise
        except (BosenError, OSError) as e:
            self._fail(step, str(e))


    def _write_plan(self, step: _Step, state: str) -> None:
        d = {"id": self._plan_ids, "clock": step.clock, "owners": step.owners.tolist(), "state": state,
             "leave": step.leavers, **({"durable": step.clock} if step.durable else {})}
        self.folder.mkdir(parents=True, exist_ok=True)
        if state == "committed":  # kept past the next step's plan.json: a replacement may redo this clock
            microtasks.keep_plan(self.folder, d)
        tmp = self.folder / ".plan.json.partial"
        tmp.write_text(json.dumps(d))
        os.replace(tmp, self.plan_path)

    def _prepare(self, step: _Step) -> None:
        """Joiners started ahead load their data while the job runs on; the boundary is proposed once
        every one is ready, so the running workers wait at it only for the hand-off itself."""
        self._check_joiners(step)
        if not all((self.folder / f"ready-{r}.json").exists() for r in step.joiners):
            if time.monotonic() > step.deadline:
                raise ScaleError(f"new worker(s) {step.joiners} did not load their data within {JOIN_TIMEOUT_S:g}s")
            return
        self._say(step, f"worker(s) {step.joiners} ready")
        step.phase = "propose"
        self._propose(step)

    def _check_joiners(self, step: _Step) -> None:
        for r in step.joiners:
            code = self.launcher.workers[r].returncode
            if code is not None:
                raise ScaleError(f"new worker {r} exited (status {code}) before it joined. Last log lines:\n"
                                 f"{self.launcher.workers[r].tail(10)}")

    def _propose(self, step: _Step) -> None:
        if step.proposals >= MAX_PROPOSALS:
            raise ScaleError(f"{MAX_PROPOSALS} proposed boundaries were each passed by a worker before it read them")
        cluster = self.launcher.cluster
        assert cluster is not None
        stats = [status_mod.query(a, timeout=3.0, security=self.launcher.security) for a in cluster.addresses]
        seen = [c for st in stats for c in [st["clock"], *st["client_clocks"]] if isinstance(c, int)]
        step.clock = leave_boundary(max(seen) + PLAN_AHEAD * 2 ** step.proposals,  # a wider margin each retry
                                    self.launcher.config, bool(step.leavers))
        step.proposals += 1
        self._check_end(step.clock, step.target)  # the job ran on while joiners started or a proposal failed
        if step.leavers and not self._ask_save(step, cluster.addresses):
            return  # a server passed B unsaved: a later one (still "propose")
        self._plan_ids += 1
        for old in self.folder.glob("ack-*.json"):
            old.unlink(missing_ok=True)
        self._write_plan(step, "proposed")
        step.phase, step.deadline = "answers", time.monotonic() + ANSWER_TIMEOUT_S
        self._say(step, f"proposed clock {step.clock} for the move; waiting for every worker to reach it")

    def _ask_save(self, step: _Step, addresses: list[str]) -> bool:
        """Ask ``addresses`` for a checkpoint part at B (SAVE), whatever the job's rule: under a time rule
        B is otherwise saved only if rank 0 picks it. False if one has passed B without a part."""
        for a in addresses:
            if not status_mod.ask_save(a, step.clock, security=self.launcher.security):
                self._say(step, f"server {a} is past clock {step.clock} without a checkpoint part there: "
                          "proposing a later clock")
                return False
            step.asked[a] = time.monotonic()
        return True

    def _answers(self, step: _Step) -> None:
        live = [r for r in self.live() if r not in step.joiners]
        if not live:
            raise ScaleError("the job's workers finished before they reached the proposed clock")
        answers = {}
        for r in live:
            path = self.folder / f"ack-{self._plan_ids}.rank-{r}.json"
            if path.exists():
                answers[r] = json.loads(path.read_text())
        ends = [a["ends"] for a in answers.values() if isinstance(a.get("ends"), int)]
        if ends:  # a worker's training ends at or before B: it will not wait there (FilePlan.ends_at)
            self._write_plan(step, "withdrawn")
            self._check_end(step.clock, step.target)
            raise ScaleError(f"the job's training ends at clock {min(ends)}, at or before the proposed clock "
                             f"{step.clock}: too few clocks remain; nothing moved")
        late = [r for r, a in answers.items() if not a.get("ok")]
        if late:
            self._write_plan(step, "withdrawn")
            self._say(step, f"worker(s) {late} were past clock {step.clock} when they read the plan: withdrawn")
            step.phase = "propose"
            return
        if len(answers) < len(live):
            if time.monotonic() > step.deadline:
                missing = sorted(set(live) - set(answers))
                raise ScaleError(f"worker(s) {missing} did not read the plan for clock {step.clock} within "
                                 f"{ANSWER_TIMEOUT_S:g}s (is the job finishing?)")
            return
        self._say(step, f"every worker waits at clock {step.clock}")
        if step.joiners:
            microtasks.announce_join(self.folder, step.clock, step.joiners)
            self._say(step, f"worker(s) {step.joiners} join at clock {step.clock}")
        step.phase, step.deadline = "joined", time.monotonic() + JOIN_TIMEOUT_S

    def _joined(self, step: _Step) -> None:
        self._check_joiners(step)
        if step.joiners and not all(len(c) > max(step.joiners) for c in self._clocks()):
            if time.monotonic() > step.deadline:
                raise ScaleError(f"new worker(s) {step.joiners} did not join every server within {JOIN_TIMEOUT_S:g}s")
            return
        self._write_plan(step, "committed")
        self.members = (self.members | set(step.joiners)) - set(step.leavers)
        if self.launcher.merger is not None:
            self.launcher.merger.workers_from(step.clock, step.target)
        step.phase, step.deadline = "settle", time.monotonic() + SETTLE_TIMEOUT_S
        self._say(step, f"committed: micro-tasks move at clock {step.clock} "
                  f"({', '.join(f'worker {r}: {len(t)}' for r, t in self._shares(step).items())})")

    def _shares(self, step: _Step) -> dict[int, np.ndarray]:
        owners = step.owners
        return {int(r): microtasks.owned(owners, int(r)) for r in np.unique(owners)}

    def _release(self, step: _Step, stats: list[dict[str, Any]]) -> None:
        """Leavers wait at B (``FilePlan.leaving``) until every server's part of B is on disk: then what
        they sent is all in the servers' newest parts and they may leave (``left-<id>.json``). A server
        replaced since it was asked for B (its uptime says so) is asked again. The wait follows what
        the servers say: a part deferred (a worker lost at B: saved once its replacement has redone
        its ticks up to B) or a lost worker awaited means the part comes; only where none does and no
        part of B is on disk after DURABLE_WAIT_S do they leave anyway, and a server lost before its
        next part is then refused (docs/recovery.md)."""
        release = self.folder / f"left-{self._plan_ids}.json"
        if not step.durable or release.exists():
            return
        cluster = self.launcher.cluster
        assert cluster is not None
        now = time.monotonic()
        for a, st in zip(cluster.addresses, stats, strict=True):
            if st["clock"] < step.clock and st.get("uptime_s", 0.0) < now - step.asked.get(a, now):
                self._ask_save(step, [a])  # a replacement started after the request: it has none
        if not all(st["clock"] >= step.clock for st in stats):
            return
        durable = all(st.get("checkpoints", {}).get("durable", -1) >= step.clock for st in stats)
        coming = any(st.get("checkpoints", {}).get("deferred") == step.clock or st.get("awaiting_replacement")
                     for st in stats)
        if coming:
            step.at_b = None
            if not durable:
                return
        else:
            at_b = step.at_b = now if step.at_b is None else step.at_b
            if not durable and now - at_b < DURABLE_WAIT_S:
                return
        tmp = self.folder / f".{release.name}.partial"
        tmp.write_text(json.dumps({"clock": step.clock, "durable": durable}))
        os.replace(tmp, release)
        self._say(step, f"every server's checkpoint part of clock {step.clock} is on disk: worker(s) "
                  f"{step.leavers} leave" if durable else
                  f"no checkpoint part of clock {step.clock} on every server, nor one coming, within "
                  f"{DURABLE_WAIT_S:g}s: worker(s) {step.leavers} leave (a server lost before its next part is "
                  "refused)")

    def _settle(self, step: _Step) -> None:
        try:
            stats = self._stats()
        except BosenError as e:  # a server lost while the tasks move: the launcher replaces it, and the
            # leavers, waiting at B for their release, must not be left there by a failed step
            if time.monotonic() > step.deadline:
                raise ScaleError(f"the move at clock {step.clock} did not finish within {SETTLE_TIMEOUT_S:g}s: "
                                 f"{e}") from None
            return
        self._release(step, stats)
        clocks = [st["client_clocks"] for st in stats]
        joined = all(isinstance(c[r], int) and c[r] > step.clock for c in clocks for r in step.joiners)
        # a leaving worker is out once every server has its BYE (its process then exits on its own)
        left = all(c[r] == "left" or self.launcher.workers[r].returncode == 0 for c in clocks for r in step.leavers)
        if not (joined and left):
            for r in step.leavers:
                code = self.launcher.workers[r].returncode
                # killed (a signal): the launcher replaces it, and the replacement redoes its clocks up
                # to B, hands off again and waits for this step's release (docs/recovery.md)
                if code is not None and code > 0:
                    raise ScaleError(f"leaving worker {r} exited with status {code}")
            if any(isinstance(x, int) and x < step.clock for c in clocks for x in c):
                step.deadline = time.monotonic() + SETTLE_TIMEOUT_S  # still on the way to B (a checkpoint boundary)
            if time.monotonic() > step.deadline:
                raise ScaleError(f"the move at clock {step.clock} did not finish within {SETTLE_TIMEOUT_S:g}s")
            return
        step.seconds = round(time.time() - step.started, 3)
        step.done, self.current = True, None
        self._say(step, f"the job runs with {step.target} workers (ranks {sorted(self.members)}) "
                  f"after {step.seconds:.2f}s")


def control_address(target: str | os.PathLike[str]) -> str:
    """The control endpoint of the launcher running the job of ``target`` (its run directory, or a
    file in it such as its config.yaml)."""
    path = Path(target)
    run_dir = path if path.is_dir() else path.parent
    control = run_dir / CONTROL_FILE
    if not control.exists():
        raise ScaleError(f"{target}: no running launcher ({control} is absent): `bosen scale` takes the run "
                         "directory of a job that `bosen launch` is running")
    try:
        d = json.loads(control.read_text())
        address, pid = str(d["address"]), int(d["pid"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ScaleError(f"{control}: not a launcher's control file: {e}") from None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise ScaleError(f"{target}: its launcher (pid {pid}) is not running any more") from None
    except PermissionError:
        pass
    return address


def scale(target: str | os.PathLike[str], workers: int | None = None, servers: int | None = None,
          out: Callable[[str], None] | None = print, timeout: float = 600.0) -> float:
    """Ask the launcher of the running job ``target`` (its run directory) for ``workers`` worker
    processes and ``servers`` server processes; prints progress lines through ``out``, returns when
    the job runs with that shape (seconds it took). ScaleError if the request cannot be met."""
    address = control_address(target)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    t0 = time.time()

    def ask(req: dict[str, Any]) -> dict[str, Any]:
        sock.send(json.dumps(req).encode())
        waited = 0.0
        while not sock.poll(100):
            waited += 0.1
            if not (Path(target if Path(target).is_dir() else Path(target).parent) / CONTROL_FILE).exists():
                raise ScaleError("the job ended (its launcher stopped listening) before the scale step finished")
            if waited > REQUEST_TIMEOUT_S:
                raise ScaleError(f"the launcher at {address} did not answer within {REQUEST_TIMEOUT_S:g}s")
        reply = json.loads(sock.recv())
        if not reply.get("ok"):
            raise ScaleError(str(reply.get("error")))
        return reply  # type: ignore[no-any-return]

    try:
        first = ask({"op": "scale", "workers": workers, "servers": servers})
        seen = 0
        while True:
            if first.get("id", -1) == -1:  # nothing to do
                lines, done, error = first.get("lines", []), True, None
            else:
                reply = ask({"op": "progress", "id": first["id"], "from": seen})
                lines, done, error = reply["lines"], reply["done"], reply.get("error")
            for line in lines:
                if out is not None:
                    out(line)
            seen += len(lines)
            if error:
                raise ScaleError(error)
            if done:
                return time.time() - t0
            if time.time() - t0 > timeout:
                raise ScaleError(f"the scale step did not finish within {timeout:g}s")
            time.sleep(0.05)
    finally:
        sock.close(0)
        ctx.term()


def _request(target: str | os.PathLike[str], req: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One request to the launcher running the job ``target`` (its run directory), answered; ScaleError
    if no launcher runs it, it does not answer within ``timeout`` seconds, or it refuses."""
    address = control_address(target)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(json.dumps(req).encode())
        if not sock.poll(int(timeout * 1000)):
            raise ScaleError(f"the launcher at {address} did not answer within {timeout:g}s")
        reply = json.loads(sock.recv())
    finally:
        sock.close(0)
        ctx.term()
    if not reply.get("ok"):
        raise ScaleError(str(reply.get("error")))
    return reply  # type: ignore[no-any-return]


def workers_now(target: str | os.PathLike[str], timeout: float = 10.0) -> int:
    """The worker processes the running job ``target`` (its run directory) has now, as its launcher
    counts them (a job scaled since its launch, by anyone, has another count than its config's).
    ScaleError if no launcher runs it or it does not answer within ``timeout`` seconds."""
    return int(_request(target, {"op": "shape"}, timeout)["workers"])


def launcher_status(target: str | os.PathLike[str], timeout: float = 10.0) -> dict[str, Any]:
    """What the launcher of the running job ``target`` (its run directory) says of it, also while a
    scale step moves partitions or micro-tasks: ``workers`` (the job's ranks now, ``ranks``; those whose
    process runs, ``running``), ``servers``, and ``scaling`` (None, or the step under way: ``id``,
    ``what``, ``phase``, ``seconds``, its last ``line``). ScaleError as for :func:`workers_now`."""
    reply = _request(target, {"op": "status"}, timeout)
    reply.pop("ok", None)
    return reply
