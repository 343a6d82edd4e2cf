"""A client process's lifecycle: one phase, its allowed transitions, and the failure it keeps.

Every thread of a client asks the same object whether it may go on: worker threads before each call
(``check``), the communication thread before it sends (``failed``) and when it decides whether a lost
connection matters (``leaving``). The phases, in order::

    STARTING ──▶ RUNNING ──▶ CLOSING ──▶ LEAVING ──▶ CLOSED
        │           │           │           │          ▲
        └───────────┴───────────┴───────────┴─▶ FAILED ┘

- STARTING: the communication thread is up and the process is joining the job.
- RUNNING: workers read, increment and clock.
- CLOSING: ``close()`` was called: buffered updates go out; workers' calls raise ``ClientClosed``.
- LEAVING: every update is acknowledged and BYE is on its way: pushes are no longer acknowledged
  and a server closing its connection is expected.
- FAILED: the first fatal error (a lost server, a rejected update, a malformed message, a bug) is
  kept and never cleared; every worker thread raises a copy of it at its next call.
- CLOSED: the communication thread has stopped (after a clean leave, ``abort()`` or a failure).

Per-server connection states (joined, being replaced) are the links' own (``link.LinkState``).
"""

from __future__ import annotations

import enum
import threading

from bosen.errors import BosenError, ClientClosed


class Phase(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    LEAVING = "leaving"
    FAILED = "failed"
    CLOSED = "closed"


_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.FAILED, Phase.CLOSED}),
    Phase.RUNNING: frozenset({Phase.CLOSING, Phase.FAILED, Phase.CLOSED}),
    Phase.CLOSING: frozenset({Phase.LEAVING, Phase.FAILED, Phase.CLOSED}),
    Phase.LEAVING: frozenset({Phase.FAILED, Phase.CLOSED}),
    Phase.FAILED: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}
_CLOSED_TO_WORKERS = frozenset({Phase.CLOSING, Phase.LEAVING, Phase.CLOSED})


class Lifecycle:
    """The phase (read without a lock: one attribute) and the kept failure; transitions are locked
    and checked, so an impossible one is a bug raised where it happens."""

    def __init__(self) -> None:
        self.phase = Phase.STARTING
        self.error: BosenError | None = None  # the first fatal error, kept after CLOSED too
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Lifecycle {self.phase.value}{f': {self.error}' if self.error else ''}>"

    def to(self, phase: Phase) -> None:
        """Move to ``phase``; raises if that is not a transition the diagram allows."""
        with self._lock:
            if phase is not self.phase and phase not in _NEXT[self.phase]:
                raise RuntimeError(f"client lifecycle: no transition {self.phase.value} -> {phase.value}")
            self.phase = phase

    def fail(self, err: BosenError) -> bool:
        """Keep ``err`` as the failure and move to FAILED; True if it is the first (later ones, and
        any after CLOSED, change nothing)."""
        with self._lock:
            if self.error is not None or self.phase is Phase.CLOSED:
                return False
            self.error = err
            self.phase = Phase.FAILED
            return True

    @property
    def running(self) -> bool:
        """Workers may go on (the hot paths' one test; ``check`` says why not)."""
        return self.phase is Phase.RUNNING

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def leaving(self) -> bool:
        """BYE is on its way, or the client stopped: a server's connection closing is no loss."""
        return self.phase is Phase.LEAVING or self.phase is Phase.CLOSED

    def check(self) -> None:
        """Raise if workers may not go on: ``ClientClosed`` once ``close()`` began, else a copy of
        the kept failure (caused by the original, so every thread's traceback is its own)."""
        phase = self.phase
        if phase in _CLOSED_TO_WORKERS:
            raise ClientClosed("client is closed")
        if phase is Phase.FAILED:
            assert self.error is not None
            raise again(self.error)

    def raise_failure(self) -> None:
        """Raise a copy of the kept failure, if there is one (whatever the phase)."""
        if self.error is not None:
            raise again(self.error)


def again(err: BosenError) -> BosenError:
    """A fresh copy of a kept failure to raise in one more thread (an exception object raised in
    several threads at once would share, and garble, one traceback), caused by the original."""
    try:
        copy = type(err)(*err.args)
    except Exception:
        copy = BosenError(str(err))
    copy.__cause__ = err
    return copy
