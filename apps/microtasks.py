"""Micro-tasks (Litz): an app's data cut into T pieces, many more than workers, each with its own state.

A worker process runs the tasks it owns; scaling a job is moving tasks between processes at a clock
boundary, not re-partitioning data. T is fixed for a job's life (``app.args.micro_tasks``; 0 = one
per worker at the start, the layout of a job without micro-tasks), so a task's data, its random
streams and its state mean the same whichever process runs it, and a checkpoint made by K workers
resumes with K' (each worker loads the tasks it owns now; ``client.restored_state()`` holds every
worker's ``task.*`` arrays).

Ownership is contiguous blocks of task ids over the workers in rank order (:func:`assign`), so a
worker's tasks are one range of the data and the tasks' global order follows the ranks'.

State of task t goes into a checkpoint as arrays named ``task.<t>.<name>`` (no pickle); a live hand-off
(:meth:`MicroTasks.handoff`) writes each given task's arrays as ``task-<t>.clock-<c>.npz`` into a
folder the receiver reads. :class:`FilePlan` is how a running job learns a new assignment: a JSON file
``{"clock": C, "owners": [...]}`` (``owners[t]`` = the rank that runs task t from clock C on).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bosen import checkpoint
from bosen.apps.state import rng_state, set_rng_state
from bosen.errors import BosenError, ConfigError

__all__ = ["count", "assign", "owned", "key", "pack", "unpack", "saved_tasks", "give", "take",
           "FilePlan", "MicroTasks", "TaskState", "drop_handoffs", "keep_plan", "drop_run_plans", "answer",
           "HANDOFF_TIMEOUT_S",
           "HANDOFF_DIR",
           "run_plan",
           "start_owners", "join_clock", "join", "start", "JOIN_AHEAD", "join_ahead", "ready", "await_join",
           "announce_join", "Draws", "share", "job_end"]

TaskState = dict[str, np.ndarray]
HANDOFF_TIMEOUT_S = 120.0  # a receiver waits this long for a giver's file
HANDOFF_DIR = "tasks"  # under the run directory: plan.json (a new assignment) and the hand-off files
JOIN_AHEAD = "ahead"  # $BOSEN_JOIN of a joiner started before its boundary is agreed
JOIN_FILE = "join.json"  # in HANDOFF_DIR: the boundary joiners started ahead join at
END_FILE = "end-{rank}.json"  # in HANDOFF_DIR: the clock at which a worker's training ends (FilePlan.ends_at)
JOIN_AHEAD_TIMEOUT_S = 600.0  # a joiner started ahead waits this long for its boundary
_KEY = re.compile(r"^task\.(\d+)\.(.+)$")
_HANDOFF = re.compile(r"^task-\d+\.clock-(\d+)\.npz$")
PAST_FILE = "plan-{clock}.json"  # in HANDOFF_DIR: a committed plan, kept for a replacement that redoes its clock
_PAST = re.compile(r"^plan-(\d+)\.json$")


def count(setting: int, workers: int, saved: Mapping[str, np.ndarray] | None = None) -> int:
    """The job's number of tasks: the checkpoint's when it holds tasks (T is fixed for a job's life),
    else ``setting`` (``app.args.micro_tasks``), 0 meaning one per worker. ConfigError if the
    setting contradicts the checkpoint or there are fewer tasks than workers."""
    if setting < 0:
        raise ConfigError(f"app.args.micro_tasks: must be >= 0 (0 = one per worker), got {setting}")
    got = saved_tasks(saved) if saved is not None else 0
    if got and setting and setting != got:
        raise ConfigError(f"app.args.micro_tasks={setting}, but the checkpoint this job resumes from holds {got} "
                          "micro-tasks: a job keeps its tasks for life (leave micro_tasks unset or set it to "
                          f"{got})")
    T = got or setting or workers
    if T < workers:
        raise ConfigError(f"{workers} workers but {T} micro-tasks: every worker needs one at least "
                          f"(set app.args.micro_tasks >= {workers}, or use fewer workers)")
    return T


def assign(T: int, ranks: Sequence[int]) -> np.ndarray:
    """The owner of each of T tasks when the workers ``ranks`` run the job: contiguous blocks in rank
    order, sizes differing by at most one (int64, length T)."""
    ranks = sorted(ranks)
    if not ranks:
        raise ValueError("assign: no workers")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"assign: a rank twice in {ranks}")
    k = len(ranks)
    block = np.arange(T, dtype=np.int64) * k // T  # task t's block: floor(t k / T)
    return np.asarray(ranks, dtype=np.int64)[block]


def owned(owners: np.ndarray, rank: int) -> np.ndarray:
    """The task ids ``rank`` owns (sorted int64)."""
    return np.flatnonzero(owners == rank).astype(np.int64)


def key(t: int, name: str) -> str:
    """The checkpoint array name of task ``t``'s array ``name``."""
    return f"task.{t}.{name}"


def pack(states: Mapping[int, Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Tasks' states as one flat dict of checkpoint arrays (``task.<t>.<name>``)."""
    return {key(t, n): np.asarray(v) for t, st in states.items() for n, v in st.items()}


def unpack(saved: Mapping[str, np.ndarray], tasks: Iterable[int], names: Sequence[str]) -> dict[int, TaskState]:
    """The states of ``tasks`` from checkpoint arrays; BosenError names the first one missing."""
    out: dict[int, TaskState] = {}
    for t in tasks:
        st = {}
        for n in names:
            k = key(int(t), n)
            if k not in saved:
                raise BosenError(f"the checkpoint this job resumes from has no state {k!r} of micro-task {t} "
                                 f"({saved_tasks(saved)} tasks there)")
            st[n] = saved[k]
        out[int(t)] = st
    return out


def saved_tasks(saved: Mapping[str, np.ndarray]) -> int:
    """How many tasks checkpoint arrays describe (0: none; they are numbered 0..T-1)."""
    ids = {int(m.group(1)) for k in saved if (m := _KEY.match(k))}
    return max(ids) + 1 if ids else 0


def _path(folder: Path, t: int, clock: int) -> Path:
    return folder / f"task-{t}.clock-{clock}.npz"


def give(folder: str | Path, clock: int, states: Mapping[int, Mapping[str, np.ndarray]]) -> list[Path]:
    """Write each task's state as ``task-<t>.clock-<clock>.npz`` in ``folder`` (written whole, then
    renamed: a reader never sees half a file). A file already there stays: the first hand-off of a task
    at a clock is the one its receiver may have taken (a lost giver's, which its replacement adopts
    instead of writing its own: :meth:`MicroTasks.adopt`). Returns the files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for t, st in states.items():
        final = _path(folder, t, clock)
        out.append(final)
        if final.exists():
            continue
        tmp = final.with_name(f".{final.name}.{os.getpid()}.partial")
        with tmp.open("wb") as f:
            arrays: dict[str, Any] = {n: np.asarray(v) for n, v in st.items()}
            np.savez(f, **arrays)
        os.replace(tmp, final)
    return out


def _await_file(path: Path, deadline: float, check: Callable[[], None] | None, why: str, interval: float) -> None:
    """Until ``path`` exists: ``check`` (which raises if this worker's job failed) every ``interval``
    seconds, BosenError(``why``) past ``deadline`` (``time.monotonic``)."""
    while not path.exists():
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise BosenError(why)
        time.sleep(interval)


def take(folder: str | Path, clock: int, tasks: Iterable[int], timeout: float = HANDOFF_TIMEOUT_S,
         check: Callable[[], None] | None = None) -> dict[int, TaskState]:
    """The states of ``tasks`` that their givers wrote at ``clock`` (waiting up to ``timeout`` s for each
    file; ``check`` is called while waiting, to fail early). The files stay: a receiver lost before a
    checkpoint past ``clock`` is complete is replaced from an older one, redoes its ticks up to
    ``clock`` and takes them again (the giver has gone on or left); :func:`drop_handoffs` removes them."""
    folder = Path(folder)
    deadline = time.monotonic() + timeout
    out: dict[int, TaskState] = {}
    for t in tasks:
        p = _path(folder, int(t), clock)
        _await_file(p, deadline, check, f"micro-task {t}: no hand-off at clock {clock} in {folder} within "
                    f"{timeout:g}s (its giver is gone?)", 0.01)
        with np.load(p, allow_pickle=False) as z:
            out[int(t)] = {n: z[n] for n in z.files}
    return out


def drop_handoffs(folder: str | Path, below: int) -> int:
    """Remove the hand-off files and kept plans (:func:`keep_plan`) of clocks below ``below`` (the run's
    newest complete checkpoint: a replacement restarts there or later, and a process at that clock has
    its tasks in the checkpoint's parts). Returns how many went."""
    n = 0
    for p in [*Path(folder).glob("task-*.clock-*.npz"), *Path(folder).glob("plan-*.json")]:
        m = _HANDOFF.match(p.name) or _PAST.match(p.name)
        if m and int(m.group(1)) < below:
            p.unlink(missing_ok=True)
            n += 1
    return n


def drop_run_plans(folder: Path) -> int:
    """Remove what an earlier run left in the hand-off folder (``plan.json``, the kept plans, answers,
    releases, join, ready and end notices, hand-off files): a job resumed from a checkpoint starts
    there with its own assignment (``assign(T, range(K'))``, states from every part) and makes its own
    steps; the first run's would move its tasks at that run's boundaries, to ranks it may not have.
    Returns how many files went."""
    n = 0
    for p in Path(folder).glob("*"):
        if p.is_file():
            p.unlink(missing_ok=True)
            n += 1
    return n


def keep_plan(folder: Path, plan: Mapping[str, Any]) -> None:
    """Keep a committed plan as ``plan-<clock>.json`` beside ``plan.json`` (which the next step
    overwrites): a lost worker's replacement restarted from a checkpoint before that clock redoes
    it and moves its tasks there as the live workers did (:meth:`FilePlan.at`)."""
    path = folder / PAST_FILE.format(clock=int(plan["clock"]))
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(dict(plan)))
    os.replace(tmp, path)


class FilePlan:
    """A new assignment of the tasks from a given clock on, read from a JSON file
    ``{"clock": C, "owners": [rank of task 0, ...]}`` (whoever scales the job writes it, renamed into
    place). :meth:`at` is asked at every clock boundary.

    A plan with an ``id`` is agreed in two phases, so it is race-free whatever the workers' speeds
    (``bosen scale``, bosen/jobs/scale.py): ``"state": "proposed"`` asks each worker that reads it to
    answer in ``ack-<id>.rank-<r>.json`` whether it is still before C (``{"ok": true}``: it will wait at
    C) or already past it (``{"ok": false}``: it goes on with the old assignment); a worker that
    reaches C waits there until the scaler writes ``"committed"`` (every worker answered ok: the
    tasks move at C) or ``"withdrawn"`` (someone was late: nothing moves; a later C is proposed).
    ``"leave": [ranks]`` names workers that give all their tasks away at C and leave the job. A plan
    without an ``id`` holds as written (it must reach every worker before C).

    An app says where its training ends (:meth:`ends_at`: the clock after its last tick, the last at
    which it asks :meth:`at`): a proposal for that clock or later is answered ``{"ok": false, "ends": E}``,
    since this worker would never wait there (it runs no tick after E, and past E it reads no plan).

    A lost worker's replacement (``replay``) redoes clocks the job has passed: at a boundary older than
    ``plan.json``'s it takes the plan committed there from ``plan-<clock>.json`` (:func:`keep_plan`)."""

    def __init__(self, path: str | Path, rank: int | None = None, timeout: float = HANDOFF_TIMEOUT_S,
                 replay: bool = False) -> None:
        self.path = Path(path)
        self.rank = rank
        self.timeout = timeout
        self.replay = replay
        self._seen: tuple[int, int, int] | None = None
        self._plan: tuple[int, np.ndarray] | None = None
        self._meta: dict[str, Any] = {}
        self._refused: set[int] = set()  # proposals this worker was already past
        self._answered: set[int] = set()
        self.end: int | None = None  # the clock at which this worker's training ends (``ends_at``)

    def ends_at(self, clock: int) -> None:
        """This worker's training ends at ``clock`` (it asks :meth:`at` up to that clock and runs no tick
        after it): a boundary there or later moves nothing, so it is refused (:meth:`_answer`), and the
        scaler, which reads ``end-<rank>.json``, does not propose one (bosen/jobs/scale.py)."""
        self.end = int(clock)
        if self.rank is None:
            return
        path = self.path.with_name(END_FILE.format(rank=self.rank))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
        tmp.write_text(json.dumps({"clock": self.end}))
        os.replace(tmp, path)

    def initial(self, clock: int, T: int, default: np.ndarray) -> np.ndarray:
        """The owners for a process that starts at ``clock`` (a resumed or replacement worker): the
        plan's if one holds from ``clock`` or earlier, else ``default``; a later plan comes by :meth:`at`."""
        owners = self._read(T)
        if owners is not None and self._plan is not None and self._plan[0] <= clock and self._holds():
            return owners
        return default

    def committed(self, clock: int, T: int) -> np.ndarray | None:
        """The owners of a plan for ``clock`` that is in force already (committed, or without an id),
        else None; answers and waits for nothing (:meth:`at` does, at the boundary)."""
        self._fresh(clock, T)
        return self.step_at(clock, T)

    def step_at(self, clock: int, T: int) -> np.ndarray | None:
        """The owners of the step in force at ``clock``: ``plan.json``'s if it is of that clock and
        committed (or without an id), else, for a replacement (``replay``), the one kept for it."""
        self._read(T)
        if self._plan is not None and self._plan[0] > clock:
            return self._past(clock, T)
        if self._plan is None or self._plan[0] != clock or not self._holds():
            return None
        return self._plan[1]

    def _past(self, clock: int, T: int) -> np.ndarray | None:
        """For a replacement redoing clocks (``replay``): the owners of the plan committed for ``clock``
        that ``plan.json`` no longer holds (a later step replaced it), or None."""
        if not self.replay:
            return None
        path = self.path.with_name(PAST_FILE.format(clock=clock))
        try:
            d = json.loads(path.read_text())
            owners = np.asarray(d["owners"], dtype=np.int64)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BosenError(f"{path}: not a task plan {{\"clock\": C, \"owners\": [...]}}: {e}") from None
        if owners.shape != (T,) or int(d.get("clock", -1)) != clock:
            raise BosenError(f"{path}: not the plan of clock {clock} for {T} micro-tasks")
        return owners

    def _fresh(self, clock: int, T: int) -> None:
        """Read the plan if it changed; a new plan without an id for a clock before ``clock`` (the boundary
        this worker is at or about to reach) is an error: this worker would run the old assignment."""
        if self._read(T) is not None and self._plan is not None and "id" not in self._meta:
            if self._plan[0] < clock:
                raise BosenError(f"{self.path}: a plan for clock {self._plan[0]} reached this worker at clock {clock}")

    def _holds(self) -> bool:
        """The plan read last is in force (no id, or committed)."""
        return self._meta.get("state", "committed") == "committed"

    def _read(self, T: int) -> np.ndarray | None:
        """The plan's owners if the file changed since the last read (None otherwise or without one)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._seen:
            return None
        self._seen = stamp
        try:
            d = json.loads(self.path.read_text())
            c, owners = int(d["clock"]), np.asarray(d["owners"], dtype=np.int64)
        except FileNotFoundError:  # replaced between stat and read: the next look reads the new one
            self._seen = None
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BosenError(f"{self.path}: not a task plan {{\"clock\": C, \"owners\": [...]}}: {e}") from None
        if owners.shape != (T,):
            raise BosenError(f"{self.path}: {owners.size} owners for {T} micro-tasks")
        self._plan = (c, owners)
        self._meta = d if isinstance(d, dict) else {}
        return owners

    def _answer(self, clock: int) -> None:
        """Answer a new proposal: before (or at) its clock, this worker will wait there; past it, not."""
        pid = self._meta.get("id")
        if self._meta.get("state") != "proposed" or not isinstance(pid, int) or self.rank is None \
                or self._plan is None or pid in self._answered:
            return
        self._answered.add(pid)
        ends = self.end is not None and self._plan[0] >= self.end  # the training ends first: never waits there
        ok = self._plan[0] >= clock and not ends
        if not ok:
            self._refused.add(pid)
        answer(self.path, pid, self.rank, clock, ok, self.end if ends else None)

    def at(self, clock: int, T: int, check: Callable[[], None] | None = None) -> np.ndarray | None:
        """The owners that hold from ``clock`` on if the plan changes them there, else None. A proposed
        plan for ``clock`` is waited for here (committed: its owners; withdrawn: None). A plan without
        an id for a clock this worker has passed is an error (it would run the old assignment)."""
        self._fresh(clock, T)
        self._answer(clock)  # a proposal read now or earlier (at the start) is answered once
        if self._plan is not None and self._plan[0] > clock and (past := self._past(clock, T)) is not None:
            return past  # a replacement redoing a step that a later one has replaced in plan.json
        if self._plan is None or self._plan[0] != clock or self._meta.get("id") in self._refused:
            return None
        if self._meta.get("state") == "proposed":
            self._wait(clock, T, check)
        return self._plan[1] if self._plan is not None and self._plan[0] == clock and self._holds() else None

    def _wait(self, clock: int, T: int, check: Callable[[], None] | None) -> None:
        """At a proposal's clock: wait until it is committed or withdrawn (or replaced by another)."""
        pid = self._meta.get("id")
        deadline = time.monotonic() + self.timeout
        while self._meta.get("id") == pid and self._meta.get("state") == "proposed":
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise BosenError(f"{self.path}: waited {self.timeout:g}s at clock {clock} for task plan {pid} to be "
                                 "committed or withdrawn (is the launcher that proposed it gone?)")
            time.sleep(0.005)
            self._read(T)
            self._answer(clock)

    def leaving(self, check: Callable[[], None] | None = None, end: Callable[[], None] | None = None) -> bool:
        """The plan in force says this worker leaves the job at its clock (after giving its tasks away).
        A plan with ``"durable": C`` keeps a leaver here until the scaler writes ``left-<id>.json``: every
        server's checkpoint part of clock C (which holds all the leaver sent) is on disk, so a server lost
        after the leaver's BYE is restored exactly; one lost before it is resent to by the leaver, still
        connected (docs/recovery.md). ``end`` (the client's ``end_clocks``) is called before that wait,
        so the servers stop counting the leaver's clock and the others run on meanwhile."""
        leave = self._meta.get("leave", [])
        if not (self._holds() and isinstance(leave, list) and self.rank in leave):
            return False
        if isinstance(self._meta.get("durable"), int):
            if end is not None:
                end()
            release = self.path.with_name(f"left-{self._meta.get('id')}.json")
            deadline = time.monotonic() + self.timeout
            _await_file(release, deadline, check, f"{release}: not written within {self.timeout:g}s (this "
                        "worker leaves the job once every server's checkpoint part of its clock is on disk)", 0.005)
        return True

    def joined(self, clock: int, T: int, check: Callable[[], None] | None = None) -> np.ndarray:
        """For a worker that joins the job at ``clock`` (``bosen scale``): wait for the plan of that clock
        to be committed; its owners. BosenError if it is withdrawn or does not come in time."""
        deadline = time.monotonic() + self.timeout
        while True:
            self._read(T)
            if self._plan is not None and self._plan[0] == clock and self._meta.get("state") != "proposed":
                if not self._holds():
                    raise BosenError(f"{self.path}: the task plan this worker joined for (clock {clock}) was "
                                     "withdrawn")
                return self._plan[1]
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise BosenError(f"{self.path}: no committed task plan for clock {clock} within {self.timeout:g}s "
                                 "(this worker joined the job for one)")
            time.sleep(0.005)


def answer(plan: Path, pid: int, rank: int, clock: int, ok: bool, ends: int | None = None) -> None:
    """Worker ``rank``'s answer to proposal ``pid`` of the plan at ``plan``, read at ``clock``: ``ok``
    (before its boundary: it waits there) or not (past it, or its training ends at ``ends``, at or
    before the boundary). bosen/faults.py writes the same file for a rank it holds."""
    ack = plan.with_name(f"ack-{pid}.rank-{rank}.json")
    tmp = ack.with_name(f".{ack.name}.partial")
    tmp.write_text(json.dumps({"ok": ok, "at": clock, **({"ends": ends} if ends is not None else {})}))
    os.replace(tmp, ack)


def job_end(folder: Path, ranks: Iterable[int]) -> tuple[int, int] | None:
    """The earliest clock at which the training of one of ``ranks`` ends, and that rank (from their
    ``end-<rank>.json``, :meth:`FilePlan.ends_at`); None where none of them said (an app that does not)."""
    ends = []
    for r in ranks:
        try:
            ends.append((int(json.loads((folder / END_FILE.format(rank=r)).read_text())["clock"]), int(r)))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BosenError(f"{folder / END_FILE.format(rank=r)}: not an end notice {{\"clock\": E}}: {e}") from None
    return min(ends) if ends else None


def join_clock() -> int | None:
    """``$BOSEN_JOIN``: the clock at which this worker process joins a running job (``bosen scale``)."""
    v = os.environ.get("BOSEN_JOIN")
    return int(v) if v and v != JOIN_AHEAD else None


def join_ahead() -> bool:
    """This process was started before its boundary was agreed (``$BOSEN_JOIN=ahead``): it prepares
    its data, says so (:func:`ready`) and waits for its clock (:func:`await_join`) before it joins."""
    return os.environ.get("BOSEN_JOIN") == JOIN_AHEAD


def ready(folder: Path, rank: int) -> None:
    """Tell the scaler that joiner ``rank`` has its data ready (``ready-<rank>.json``): the boundary
    is proposed only then, so the running workers do not wait at it while new processes start."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ready-{rank}.json"
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps({"pid": os.getpid()}))
    os.replace(tmp, path)


def await_join(folder: Path, rank: int, timeout: float = JOIN_AHEAD_TIMEOUT_S) -> int:
    """The clock at which joiner ``rank`` joins: from ``join.json`` (``{"clock": B, "ranks": [...]}``,
    written once every running worker agreed to wait at B). Ranks are never reused, so a file of an
    earlier step does not name this one. BosenError if none comes within ``timeout``."""
    path = folder / JOIN_FILE
    deadline = time.monotonic() + timeout
    while True:
        try:
            d = json.loads(path.read_text())
            if rank in d["ranks"]:
                return int(d["clock"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BosenError(f"{path}: not a join notice {{\"clock\": B, \"ranks\": [...]}}: {e}") from None
        if time.monotonic() > deadline:
            raise BosenError(f"{path}: no clock to join at for worker {rank} within {timeout:g}s (is the launcher "
                             "that started it gone?)")
        time.sleep(0.005)


def announce_join(folder: Path, clock: int, ranks: Sequence[int]) -> None:
    """Tell joiners ``ranks`` (started ahead) to join at ``clock`` (read by :func:`await_join`)."""
    path = folder / JOIN_FILE
    tmp = path.with_name(f".{JOIN_FILE}.partial")
    tmp.write_text(json.dumps({"clock": int(clock), "ranks": [int(r) for r in ranks]}))
    os.replace(tmp, path)


def join(T: int, rank: int, clock: int, plan: FilePlan | None, folder: Path | None) -> tuple[MicroTasks,
                                                                                           dict[int, TaskState]]:
    """A worker joining at ``clock``: its tasks (from the committed plan of that clock) and their states,
    taken from the workers that held them (:meth:`MicroTasks.handoff`)."""
    if plan is None or folder is None:
        raise BosenError("BOSEN_JOIN is set but not BOSEN_RUN_DIR: a joining worker takes its micro-tasks from "
                         "the run directory's task plan")
    owners = plan.joined(clock, T)
    tasks = MicroTasks(T, np.full(T, -1, dtype=np.int64), rank)
    return tasks, tasks.handoff(clock, owners, folder, lambda t: {})


def start(T: int, rank: int, workers: int, saved: Mapping[str, np.ndarray] | None
          ) -> tuple[MicroTasks, dict[int, TaskState], FilePlan | None, Path | None]:
    """An app's micro-tasks as its worker process starts: those it owns (a worker joining the running
    job at ``$BOSEN_JOIN``: the committed plan's, with the states handed to it; else the start's, the
    saved checkpoint's or a plan's), the states received, and the run's plan and hand-off folder."""
    plan, folder = run_plan()
    joining = join_clock()
    if joining is not None:
        tasks, received = join(T, rank, joining, plan, folder)
        return tasks, received, plan, folder
    return MicroTasks(T, start_owners(T, workers, saved, plan), rank), {}, plan, folder


def run_plan() -> tuple[FilePlan | None, Path | None]:
    """A launched worker's plan (``$BOSEN_RUN_DIR/tasks/plan.json``) and hand-off folder
    (``$BOSEN_RUN_DIR/tasks``); (None, None) outside a run directory (nothing will move)."""
    run_dir = os.environ.get("BOSEN_RUN_DIR")
    if not run_dir:
        return None, None
    folder = Path(run_dir, HANDOFF_DIR)
    rank = os.environ.get("BOSEN_RANK")
    return FilePlan(folder / "plan.json", int(rank) if rank else None, replay=bool(os.environ.get("BOSEN_REJOIN"))), \
        folder


def start_owners(T: int, workers: int, saved: Mapping[str, np.ndarray] | None, plan: FilePlan | None) -> np.ndarray:
    """Who owns which task when a worker process starts: ``assign(T, range(workers))``, or the plan's
    owners where a plan holds from the clock the process starts at (``saved["tick"]``, 0 when new):
    a worker runs tasks where a plan of this run put them (a launch empties ``tasks/``,
    :func:`drop_run_plans`; a plan naming ranks the job does not have is ignored). A lost worker's
    replacement (``$BOSEN_REJOIN``) restarted from checkpoint C takes the owners C's worker parts
    record (:func:`bosen.checkpoint.task_owners`), or those of a step committed at C itself, and
    follows the later steps at their clocks (:meth:`FilePlan.at`), as the live workers did: with
    ``plan.json`` alone it would take the newest step's owners, or the start's, whichever steps lay
    between C and now."""
    owners = assign(T, range(workers))
    start = int(saved["tick"][0]) if saved is not None and "tick" in saved else 0
    live = bool(os.environ.get("BOSEN_REJOIN"))
    resume = os.environ.get("BOSEN_RESUME")
    # the checkpoint a resumed run started from was made by the run before (other workers, perhaps):
    # at its clock this run's workers own what the rule below gave them
    made_here = os.environ.get("BOSEN_RESUMED_AT") != str(start)
    if live and saved is not None and resume and made_here:
        at_c = checkpoint.task_owners(Path(resume))
        if at_c is not None and at_c.shape == (T,):
            step = plan.step_at(start, T) if plan is not None else None  # a step at C: after C's parts
            return step if step is not None else at_c
    if plan is None:
        return owners
    planned = plan.initial(start, T, owners)
    # a replacement in a running job trusts the plan (ranks past cluster.workers joined it: bosen scale);
    # otherwise a plan naming ranks the job does not have is of another job shape
    return planned if planned.size and (live or int(planned.max()) < workers) else owners


class MicroTasks:
    """Which tasks this worker runs, and moving them: the app keeps each task's state, this says
    which are whose and carries states between processes (checkpoints, hand-offs)."""

    def __init__(self, T: int, owners: np.ndarray, rank: int) -> None:
        owners = np.asarray(owners, dtype=np.int64)
        if owners.shape != (T,):
            raise ValueError(f"MicroTasks: {owners.size} owners for {T} tasks")
        self.T, self.owners, self.rank = T, owners, rank

    @property
    def mine(self) -> np.ndarray:
        """This worker's task ids, sorted."""
        return owned(self.owners, self.rank)

    @property
    def workers(self) -> int:
        """The job's workers now: the ranks that run its tasks (what the goodput agent's K counts)."""
        return int(np.unique(self.owners).size)

    def handoff(self, clock: int, new_owners: np.ndarray, folder: str | Path,
                states: Callable[[int], Mapping[str, np.ndarray]], timeout: float = HANDOFF_TIMEOUT_S,
                check: Callable[[], None] | None = None) -> dict[int, TaskState]:
        """At the boundary ``clock``: write the states of the tasks this worker gives away (``states(t)``,
        as they are now) into ``folder``, then load those it receives, and own ``new_owners``' share
        from now on. A leaving worker (no task in ``new_owners``) gives all away. Returns the received
        states by task id; the app rebuilds its data for :attr:`mine` from them and its kept tasks'."""
        new_owners = np.asarray(new_owners, dtype=np.int64)
        if new_owners.shape != (self.T,):
            raise ValueError(f"handoff: {new_owners.size} owners for {self.T} tasks")
        old = self.owners
        given = np.flatnonzero((old == self.rank) & (new_owners != self.rank))
        got = np.flatnonzero((new_owners == self.rank) & (old != self.rank))
        give(folder, clock, {int(t): states(int(t)) for t in given})
        received = take(folder, clock, got, timeout, check)
        self.owners = new_owners
        return received


    def adopt(self, clock: int, plan: FilePlan | None, folder: str | Path | None) -> dict[int, TaskState]:
        """Just before this worker's CLOCK(``clock``): the tasks it gives away at ``clock`` (a committed
        plan) whose hand-off file is already there, with the states in them. Such a file was written by
        an earlier process of this rank (one lost after its hand-off, whose replacement redoes the ticks
        below ``clock``; or a run this one resumes) and its receiver may already run on from it, so the
        file stays (:func:`give`) and the app *adopts* it: it puts those states in place of its own
        and adds to the tables what differs between their contributions and its own states' (LDA:
        the counts of the assignments), as updates of the tick before ``clock``. Then the tables, this
        worker's checkpoint part of ``clock`` and the receiver all follow the state handed off.
        Empty outside a run directory or when nothing is given at ``clock``."""
        if plan is None or folder is None:
            return {}
        new = plan.committed(clock, self.T)
        if new is None:
            return {}
        given = np.flatnonzero((self.owners == self.rank) & (new != self.rank))
        out: dict[int, TaskState] = {}
        for t in given.tolist():
            try:
                with np.load(_path(Path(folder), t, clock), allow_pickle=False) as z:
                    out[t] = {n: z[n] for n in z.files}
            except FileNotFoundError:  # none: this worker hands it off itself
                continue
        return out


class Draws:
    """Mini-batches drawn from micro-tasks without replacement, for a synchronous step (MLR's, the CNN's):
    task t is the t-th contiguous share of the ``n`` training samples (:func:`share`) and walks a
    permutation of it (its own generator), a new one when it is used up, so every sample of a task is
    used once per the task's pass whichever worker runs it. A worker's mini-batch of b samples takes
    from its tasks in id order, b split evenly; the state moves with the task (checkpoints, hand-offs)."""

    NAMES = ("rng", "order", "pos")

    def __init__(self, n: int, tasks: Iterable[int], n_tasks: int, seed: int) -> None:
        self.tasks = [int(t) for t in tasks]
        self.ids = {t: share(n, t, n_tasks) for t in self.tasks}
        self.rng = {t: np.random.default_rng([seed, t]) for t in self.tasks}
        self.order = {t: self.rng[t].permutation(self.ids[t].size).astype(np.int64) for t in self.tasks}
        self.pos = dict.fromkeys(self.tasks, 0)
        self.passes = dict.fromkeys(self.tasks, 0)

    def draw(self, b: int) -> np.ndarray:
        """The next ``b`` samples (ids into the training set)."""
        cuts = np.linspace(0, b, len(self.tasks) + 1).round().astype(np.int64)
        out = []
        for t, want in zip(self.tasks, np.diff(cuts).tolist(), strict=True):
            n = self.ids[t].size
            while want > 0 and n:
                take = min(want, n - self.pos[t])
                out.append(self.ids[t][self.order[t][self.pos[t]:self.pos[t] + take]])
                self.pos[t] += take
                want -= take
                if self.pos[t] == n:  # the task's pass is done: a new order
                    self.order[t] = self.rng[t].permutation(n).astype(np.int64)
                    self.pos[t] = 0
                    self.passes[t] += 1
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def state(self, t: int) -> dict[str, np.ndarray]:
        """Task ``t``'s generator, its pass's order, and where it is in it (and its passes done)."""
        return {"rng": rng_state(self.rng[t]), "order": self.order[t].copy(),
                "pos": np.array([self.pos[t], self.passes[t]], dtype=np.int64)}

    def load(self, states: Mapping[int, Mapping[str, np.ndarray]], source: str) -> None:
        for t in self.tasks:
            st = states[t]
            if st["order"].shape != self.order[t].shape:
                raise ConfigError(f"{source}: micro-task {t}'s saved sample order has {st['order'].size} samples, "
                                  f"the task has {self.ids[t].size}: another data set?")
            self.order[t] = np.asarray(st["order"], dtype=np.int64).copy()
            self.pos[t], self.passes[t] = (int(x) for x in st["pos"])
            set_rng_state(self.rng[t], st["rng"])


def share(n: int, t: int, T: int) -> np.ndarray:
    """Sample ids of task ``t`` of ``T`` over ``n`` samples: contiguous, sizes differing by at most one."""
    bounds = np.linspace(0, n, T + 1).round().astype(np.int64)
    return np.arange(bounds[t], bounds[t + 1], dtype=np.int64)
