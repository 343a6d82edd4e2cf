"""What a replacement for a lost worker takes back: each rank's plain-addition updates since the
oldest checkpoint the job keeps.

A lost worker's replacement restores its state as of checkpoint C and redoes ticks C, C+1, ...; the
servers already applied the lost worker's updates of those ticks. For a table of plain addition
(``update: add``) the server takes them back when the replacement joins, before it redoes them, so
every update counts once: with deterministic updates (integer counts, a fixed schedule) the job ends
with the tables of a run without the failure, and LDA's counts stay those of some assignment of
topics (docs/recovery.md, "A lost worker is replaced"). Updates of other procedures (a server-side
optimizer step) cannot be taken back and count twice.

Entries are the update batches as they arrived (their arrays are the messages' own, no copy), tagged
with the sender's clock when they arrived: at a checkpoint boundary B every update of ticks < B is
sent before CLOCK(B) and none after, so the updates of ticks >= C are exactly those tagged >= C.
"""

from __future__ import annotations

from collections import deque

from bosen.wire import UpdateBatch


class UndoLog:
    """Per worker rank, (clock when it arrived, table index, batch) of every plain-addition update."""

    def __init__(self, start: int = 0) -> None:
        self._entries: dict[int, deque[tuple[int, int, UpdateBatch]]] = {}
        self.floor = 0  # entries tagged below this clock are dropped (no checkpoint kept that old)
        # the clock this server's values start from (a restored part's, or the first after a partition
        # move): updates of earlier ticks are in those values and not in this log (never logged, or
        # dropped at the move), so none of them can be taken back
        self.start = start

    @property
    def reach(self) -> int:
        """The oldest clock a lost worker's replacement may restart from and have every update of its
        predecessor since then taken back here (STATUS ``take_back_from``): ticks below ``start`` are
        in the values this server started from or took at a partition move, those below ``floor``
        were dropped. ``bosen launch`` restarts the whole job from its newest complete checkpoint where
        that is older."""
        return max(self.start, self.floor)

    def moved(self, first: int) -> None:
        """This server's partitions moved (gained or given away) while every client was paused, none
        of them past clock ``first - 1`` (server/moves.py): what it logged before holds rows it may no
        longer own, and the rows it gained come with updates logged by their old owner. Neither can be
        taken back exactly, so the log starts again at ``first``: a lost worker's replacement from an
        older checkpoint is not taken back here (``reach``; ``bosen launch`` restarts the whole job)."""
        self.start = max(self.start, first)
        self._entries.clear()

    def record(self, rank: int, clock: int, table: int, batch: UpdateBatch) -> None:
        self._entries.setdefault(rank, deque()).append((clock, table, batch))

    def trim(self, floor: int) -> None:
        """No checkpoint older than clock ``floor`` is kept: what came before it is not needed."""
        if floor <= self.floor:
            return
        self.floor = floor
        for log in self._entries.values():
            while log and log[0][0] < floor:
                log.popleft()

    def take_since(self, rank: int, clock: int) -> list[tuple[int, int, UpdateBatch]] | None:
        """Remove and return ``rank``'s updates of ticks >= ``clock`` as (their tick tag, table, the
        batch negated), or None (nothing removed) if the log no longer reaches back to ``clock``."""
        if clock < self.floor:
            return None
        log = self._entries.get(rank, deque())
        keep: deque[tuple[int, int, UpdateBatch]] = deque()
        out = []
        for c, table, b in log:
            if c >= clock:
                out.append((c, table, UpdateBatch(b.rows, -b.values, b.indptr, b.cols)))
            else:
                keep.append((c, table, b))
        self._entries[rank] = keep
        return out

    @property
    def nbytes(self) -> int:
        return sum(b.rows.nbytes + b.values.nbytes for log in self._entries.values() for _, _, b in log)
