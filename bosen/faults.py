"""Fault injection for recovery tests: off unless ``$BOSEN_FAULT`` is set, read in one place (here).

Some failures need another process to be at a given point when they happen, which timing cannot
arrange on a loaded machine. Four:

``BOSEN_FAULT=hold-before-leave:RANK:PATH``
    worker rank ``RANK`` (a launched worker: ``$BOSEN_RUN_DIR`` is set) does not send the CLOCK of a
    scale-in's boundary B (a task plan, proposed or committed, with leavers, in
    ``$BOSEN_RUN_DIR/tasks/plan.json``) until the file ``PATH`` exists. It first writes
    ``PATH.held`` (``{"clock": B}``), so a test knows B and that the servers' clock stays below B
    meanwhile: the others run up to B (and their staleness bound) while it holds, and a worker lost
    there is lost at B before the servers reach it (docs/recovery.md, "A boundary reached while a
    lost worker is away"). A proposal it has not answered yet it answers first (it is before B and
    will wait there), so the scaler commits while it holds; a proposal withdrawn meanwhile (another
    worker was past B) lets it go on, and it holds again at the next B.

``BOSEN_FAULT=hold-before-clock:RANK:CLOCK:PATH``
    worker rank ``RANK`` does not send CLOCK(``CLOCK``) until the file ``PATH`` exists (it writes
    ``PATH.held`` first): the servers' clock stays below ``CLOCK`` meanwhile, so a test can act on
    the job at a known point (a scale request in a job's last clocks, a kill around a boundary). A
    task plan proposed meanwhile for ``CLOCK`` or later it answers (it will wait there), as the app
    would at its next boundary, so a scale step can be agreed while it holds.

``BOSEN_FAULT=no-parts-from:RANK:CLOCK``
    the first process of worker rank ``RANK`` (not a replacement, ``$BOSEN_REJOIN`` unset, nor one of
    a job resumed from a checkpoint, ``$BOSEN_RESUME`` unset) writes no checkpoint part of a clock at
    or past ``CLOCK``, as a process whose part writer fell behind would
    not have before it died. The servers save their parts meanwhile, but no checkpoint at or past
    ``CLOCK`` completes while it runs: killed later, it is replaced from a checkpoint before
    ``CLOCK`` (with a scale-in's boundary B >= ``CLOCK``: after its hand-off at B, docs/recovery.md, "A
    giver lost after its hand-off"), and the servers' parts of clocks in (C, T] were saved before the
    take-back ("A part saved before a take-back"). Its replacement writes its parts as usual.

``BOSEN_FAULT=hold-move:PATH``
    whoever moves partitions (``bosen.jobs.moves.move_partitions``: the launcher, for ``bosen scale
    --servers``) holds before it tells the clients to pause (the plan), until the file ``PATH``
    exists (it writes ``PATH.held`` first): the step is under way, its joining servers started, and
    a test can ask the launcher for its status or finish a worker meanwhile. Where ``PATH`` then
    says ``fail``, the move fails there (BosenError), as one timed out or refused would, with no
    plan made; where it says ``fail-after-map``, the move goes on and fails once every server has
    answered the new map (before any leaving server retires), as one whose connection broke then
    would; where it says ``fail-mid-map``, the move fails once server 0 has taken the new map and
    before any other server is sent it, as one cut off part-way would (the servers follow different
    maps, which the launcher cannot repair: it stops the job). Workers ignore it.

Several faults are separated by ``;`` (``hold-before-clock:0:11:/a;hold-before-clock:2:16:/b``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bosen.errors import BosenError, ConfigError

__all__ = ["ENV", "Fault", "HoldBeforeLeave", "HoldBeforeClock", "NoPartsFrom", "HoldMove", "Faults",
           "from_env", "HOLD_TIMEOUT_S"]

ENV = "BOSEN_FAULT"
HOLD_TIMEOUT_S = 120.0  # a held worker gives up (the test that set it is gone)


class Fault:
    """Where the client asks a fault what to do; each does nothing unless a fault says otherwise."""

    def before_clock(self, rank: int, clock: int, check: Callable[[], None] | None = None) -> None:
        """Called before this process sends CLOCK(``clock``)."""

    def skips_part(self, rank: int, clock: int) -> bool:
        """Whether this process writes no checkpoint part of ``clock``."""
        return False

    def before_plan(self, check: Callable[[], None] | None = None) -> None:
        """Called by whoever moves partitions before it tells the clients to pause (``check`` raises
        where the move is given up meanwhile)."""

    def mid_map(self, took: Callable[[], None]) -> None:
        """Called by whoever moves partitions once server 0 was sent the new map, before the others
        are; a fault that fails the move here first calls ``took`` (server 0's answer: it took the map)."""

    def after_map(self) -> None:
        """Called by whoever moves partitions once every server has taken the new map."""


@dataclass(frozen=True)
class HoldBeforeLeave(Fault):
    """Worker ``rank`` holds its CLOCK of a scale-in's boundary until ``release`` exists."""

    rank: int
    release: Path
    plan: Path

    def before_clock(self, rank: int, clock: int, check: Callable[[], None] | None = None) -> None:
        """Called before this process sends CLOCK(``clock``): hold there if the fault says so."""
        if rank != self.rank or self.release.exists():
            return
        try:
            plan = json.loads(self.plan.read_text())
        except (OSError, ValueError):
            return  # none yet, or being replaced: no scale-in at this clock
        if not (isinstance(plan, dict) and plan.get("clock") == clock and plan.get("leave")
                and plan.get("state") in ("proposed", "committed")):
            return
        if plan["state"] == "proposed" and isinstance(plan.get("id"), int) \
                and not self.plan.with_name(f"ack-{plan['id']}.rank-{rank}.json").exists():
            # read here first (during the tick before B): answer it now, as the app would at its next
            # boundary, or the proposal waits for this rank's answer while it holds. The answer file is
            # apps/microtasks.answer's (written here: the vocabulary does not import the apps)
            _ack(self.plan, plan["id"], rank, clock - 1)
        # a proposal withdrawn meanwhile (another worker was past B): the scaler proposes a later one
        _hold(self.release, rank, clock, check, lambda: self._withdrawn(clock))

    def _withdrawn(self, clock: int) -> bool:
        """The plan this rank holds for is no longer one at ``clock`` (withdrawn, or replaced)."""
        plan = _plan_of(self.plan)
        return plan is not None and (plan.get("clock") != clock or plan.get("state") == "withdrawn")


@dataclass(frozen=True)
class HoldBeforeClock(Fault):
    """Worker ``rank`` holds its CLOCK(``clock``) until ``release`` exists."""

    rank: int
    clock: int
    release: Path
    plan: Path | None = None  # the run's task plan: a proposal for this clock or later is answered

    def before_clock(self, rank: int, clock: int, check: Callable[[], None] | None = None) -> None:
        """Called before this process sends CLOCK(``clock``): hold there if the fault says so."""
        if rank != self.rank or clock != self.clock or self.release.exists():
            return
        _hold(self.release, rank, clock, check, lambda: self._answer(rank) and False)

    def _answer(self, rank: int) -> bool:
        """Answer a proposal for this clock or later not answered yet: this rank will wait there."""
        plan = _plan_of(self.plan) if self.plan is not None else None
        if self.plan is not None and plan is not None and plan.get("state") == "proposed" \
                and isinstance(plan.get("id"), int) and isinstance(plan.get("clock"), int) \
                and plan["clock"] >= self.clock \
                and not self.plan.with_name(f"ack-{plan['id']}.rank-{rank}.json").exists():
            _ack(self.plan, plan["id"], rank, self.clock - 1)
        return True


@dataclass(frozen=True)
class NoPartsFrom(Fault):
    """Worker ``rank``'s first process writes no checkpoint part of a clock at or past ``clock``."""

    rank: int
    clock: int
    # this process replaces a lost one ($BOSEN_REJOIN) or resumes the job ($BOSEN_RESUME): it writes its parts
    replacement: bool

    def skips_part(self, rank: int, clock: int) -> bool:
        return rank == self.rank and not self.replacement and clock >= self.clock


@dataclass(frozen=True)
class HoldMove(Fault):
    """Whoever moves partitions holds before the plan until ``release`` exists."""

    release: Path

    def before_plan(self, check: Callable[[], None] | None = None) -> None:
        if not self.release.exists():
            _hold(self.release, -1, -1, check, lambda: False)
        if self.release.read_text().strip() == "fail":
            raise BosenError(f"the partition move failed on purpose (${ENV}: {self.release} says fail)")

    def mid_map(self, took: Callable[[], None]) -> None:
        if self.release.exists() and self.release.read_text().strip() == "fail-mid-map":
            took()
            raise BosenError(f"the partition move failed on purpose with server 0 alone on the new map (${ENV}: "
                             f"{self.release} says fail-mid-map)")

    def after_map(self) -> None:
        if self.release.exists() and self.release.read_text().strip() == "fail-after-map":
            raise BosenError(f"the partition move failed on purpose after its map (${ENV}: {self.release} says "
                             "fail-after-map)")


@dataclass(frozen=True)
class Faults(Fault):
    """Several faults at once (``;`` in ``$BOSEN_FAULT``)."""

    each: tuple[Fault, ...]

    def before_clock(self, rank: int, clock: int, check: Callable[[], None] | None = None) -> None:
        for f in self.each:
            f.before_clock(rank, clock, check)

    def skips_part(self, rank: int, clock: int) -> bool:
        return any(f.skips_part(rank, clock) for f in self.each)

    def before_plan(self, check: Callable[[], None] | None = None) -> None:
        for f in self.each:
            f.before_plan(check)

    def mid_map(self, took: Callable[[], None]) -> None:
        for f in self.each:
            f.mid_map(took)

    def after_map(self) -> None:
        for f in self.each:
            f.after_map()


def _ack(plan: Path, pid: int, rank: int, at: int) -> None:
    """Rank ``rank``'s ok to proposal ``pid`` (apps/microtasks.answer's file, written here: the
    vocabulary does not import the apps)."""
    ack = plan.with_name(f"ack-{pid}.rank-{rank}.json")
    tmp = ack.with_name(f".{ack.name}.partial")
    tmp.write_text(json.dumps({"ok": True, "at": at}))
    os.replace(tmp, ack)


def _hold(release: Path, rank: int, clock: int, check: Callable[[], None] | None, give_up: Callable[[], bool]) -> bool:
    """Write ``release.held`` and wait until ``release`` exists (True) or ``give_up()`` (False, the held
    file removed); BosenError after HOLD_TIMEOUT_S."""
    held = release.with_name(release.name + ".held")
    tmp = held.with_name(f".{held.name}.{os.getpid()}.partial")  # ranks held on one file: each its own
    tmp.write_text(json.dumps({"clock": clock}))
    os.replace(tmp, held)
    deadline = time.monotonic() + HOLD_TIMEOUT_S
    while not release.exists():
        if give_up():
            held.unlink(missing_ok=True)
            return False
        if check is not None:
            check()
        if time.monotonic() > deadline:
            who = f"worker {rank} held before clock {clock}" if rank >= 0 else "the partition move held"
            raise BosenError(f"${ENV}: {who} for {HOLD_TIMEOUT_S:g}s and {release} was not written")
        time.sleep(0.01)
    return True


def _plan_of(path: Path) -> dict | None:
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) else None


def from_env(only: tuple[str, ...] | None = None) -> Fault | None:
    """The fault(s) ``$BOSEN_FAULT`` names (None where it is unset); ConfigError naming what is wrong.
    ``only``: the kinds this process acts on (the launcher's mover: ``hold-move``); the others are
    other processes' faults, left to them."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    each = [_one(x) for x in spec.split(";") if only is None or x.partition(":")[0] in only]
    if not each:
        return None
    return each[0] if len(each) == 1 else Faults(tuple(each))


def _one(spec: str) -> Fault:
    kind, _, rest = spec.partition(":")
    if kind == "hold-move":
        if not rest:
            raise ConfigError(f"${ENV}={spec!r}: expected hold-move:PATH (bosen/faults.py)")
        return HoldMove(Path(rest))
    rank, _, path = rest.partition(":")
    if kind == "hold-before-clock":
        clock, _, path = path.partition(":")
        if not (rank.isdigit() and clock.isdigit() and path):
            raise ConfigError(f"${ENV}={spec!r}: expected hold-before-clock:RANK:CLOCK:PATH (bosen/faults.py)")
        run_dir = os.environ.get("BOSEN_RUN_DIR")
        plan = Path(run_dir, "tasks", "plan.json") if run_dir else None
        return HoldBeforeClock(int(rank), int(clock), Path(path), plan)
    hold = kind == "hold-before-leave" and rank.isdigit() and path
    parts = kind == "no-parts-from" and rank.isdigit() and path.isdigit()
    if not (hold or parts):
        raise ConfigError(f"${ENV}={spec!r}: expected hold-before-leave:RANK:PATH, "
                          "hold-before-clock:RANK:CLOCK:PATH, no-parts-from:RANK:CLOCK or hold-move:PATH "
                          "(bosen/faults.py)")
    run_dir = os.environ.get("BOSEN_RUN_DIR")
    if not run_dir:
        raise ConfigError(f"${ENV}={spec!r}: a launched worker's fault ($BOSEN_RUN_DIR is not set)")
    if parts:
        later = os.environ.get("BOSEN_REJOIN") or os.environ.get("BOSEN_RESUME")
        return NoPartsFrom(int(rank), int(path), bool(later))
    return HoldBeforeLeave(int(rank), Path(path), Path(run_dir, "tasks", "plan.json"))
