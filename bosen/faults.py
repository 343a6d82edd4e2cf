"""Fault injection for recovery tests: off unless ``$BOSEN_FAULT`` is set, read in one place (here).

Some failures need another process to be at a given point when they happen, which timing cannot
arrange on a loaded machine. Two faults, one at a time:

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

``BOSEN_FAULT=no-parts-from:RANK:CLOCK``
    the first process of worker rank ``RANK`` (not a replacement: ``$BOSEN_REJOIN`` unset) writes no
    checkpoint part of a clock at or past ``CLOCK``, as a process whose part writer fell behind would
    not have before it died. The servers save their parts meanwhile, but no checkpoint at or past
    ``CLOCK`` completes while it runs: killed later, it is replaced from a checkpoint before
    ``CLOCK`` (with a scale-in's boundary B >= ``CLOCK``: after its hand-off at B, docs/recovery.md, "A
    giver lost after its hand-off"), and the servers' parts of clocks in (C, T] were saved before the
    take-back ("A part saved before a take-back"). Its replacement writes its parts as usual.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bosen.errors import BosenError, ConfigError

__all__ = ["ENV", "Fault", "HoldBeforeLeave", "NoPartsFrom", "from_env", "HOLD_TIMEOUT_S"]

ENV = "BOSEN_FAULT"
HOLD_TIMEOUT_S = 120.0  # a held worker gives up (the test that set it is gone)


class Fault:
    """Where the client asks a fault what to do; each does nothing unless a fault says otherwise."""

    def before_clock(self, rank: int, clock: int, check: Callable[[], None] | None = None) -> None:
        """Called before this process sends CLOCK(``clock``)."""

    def skips_part(self, rank: int, clock: int) -> bool:
        """Whether this process writes no checkpoint part of ``clock``."""
        return False


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
            ack = self.plan.with_name(f"ack-{plan['id']}.rank-{rank}.json")
            ack_tmp = ack.with_name(f".{ack.name}.partial")
            ack_tmp.write_text(json.dumps({"ok": True, "at": clock - 1}))
            os.replace(ack_tmp, ack)
        held = self.release.with_name(self.release.name + ".held")
        tmp = held.with_name(f".{held.name}.partial")
        tmp.write_text(json.dumps({"clock": clock}))
        os.replace(tmp, held)
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while not self.release.exists():
            if self._withdrawn(clock):  # another worker was past B: the scaler proposes a later one
                held.unlink(missing_ok=True)
                return
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise BosenError(f"${ENV}: worker {rank} held before clock {clock} for {HOLD_TIMEOUT_S:g}s and "
                                 f"{self.release} was not written")
            time.sleep(0.01)

    def _withdrawn(self, clock: int) -> bool:
        """The plan this rank holds for is no longer one at ``clock`` (withdrawn, or replaced)."""
        plan = _plan_of(self.plan)
        return plan is not None and (plan.get("clock") != clock or plan.get("state") == "withdrawn")


@dataclass(frozen=True)
class NoPartsFrom(Fault):
    """Worker ``rank``'s first process writes no checkpoint part of a clock at or past ``clock``."""

    rank: int
    clock: int
    replacement: bool  # this process replaces a lost one ($BOSEN_REJOIN): it writes its parts

    def skips_part(self, rank: int, clock: int) -> bool:
        return rank == self.rank and not self.replacement and clock >= self.clock


def _plan_of(path: Path) -> dict | None:
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) else None


def from_env() -> Fault | None:
    """The fault ``$BOSEN_FAULT`` names (None where it is unset); ConfigError naming what is wrong."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    kind, _, rest = spec.partition(":")
    rank, _, path = rest.partition(":")
    hold = kind == "hold-before-leave" and rank.isdigit() and path
    parts = kind == "no-parts-from" and rank.isdigit() and path.isdigit()
    if not (hold or parts):
        raise ConfigError(f"${ENV}={spec!r}: expected hold-before-leave:RANK:PATH or no-parts-from:RANK:CLOCK "
                          "(bosen/faults.py)")
    run_dir = os.environ.get("BOSEN_RUN_DIR")
    if not run_dir:
        raise ConfigError(f"${ENV}={spec!r}: a launched worker's fault ($BOSEN_RUN_DIR is not set)")
    if parts:
        return NoPartsFrom(int(rank), int(path), bool(os.environ.get("BOSEN_REJOIN")))
    plan = Path(run_dir, "tasks", "plan.json")
    return HoldBeforeLeave(int(rank), Path(path), plan)
