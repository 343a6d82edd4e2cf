"""``BackupStep``: one server's share of a synchronous table with backup workers (DBW; docs/design.md,
"Backup workers").

The table's value moves by iterations, not by the SSP clock: w_t is the value of iteration t. A
worker at tick t reads w_t (the table is synchronous and pulled: a read for tick t waits here until
the iteration reaches t), adds its gradient of w_t and clocks; its CLOCK(t + 1) says the gradient is
complete (every update of a tick arrives before the clock that ends it). The first k_t complete
gradients of iteration t are accepted; at the k_t-th the server steps, w_{t+1} = w_t − η·mean, and the
reads parked for t + 1 are answered. A gradient of an older iteration, or one more of the current
from a worker already counted, is dropped, never applied: it only times the round trip. One of a
later iteration is held until the table gets there: only a resend brings it (a lost server's
replacement, restored at C, hears each worker's gradients of C, C + 1, ... in a run), and only what
a resend brings: the rank's gradients of ticks below the clock it had sent the lost server (HELLO
``cs``, :meth:`resending`), then one more, the gradient of the tick in flight (of w_t it read from the
lost server, a catch-up past ``cs`` included). After that its every read waits for this server, so
a worker, which computes on the iteration it has read, sends nothing ahead: any other gradient ahead
of the table is a bug, refused with an error (:meth:`check_clock`) before it is held, which bounds what
is held by what correct resends need. Workers
whose gradient was dropped read w_{t+1} (or later) next and go on from there. Updates buffer per
worker rank until their clock, as the rows they touched (``Gradient``); gradients are accumulated,
averaged and stepped in float64. The accepted sum and the last mean are whole shares with a mask of the
rows they may be non-zero at, so an embedding table's step (a batch's rows of a large table) costs
those rows, and its memory per worker follows them too.

The job's workers (n) change at an iteration (``bosen scale``): a worker that joins at clock B
(``joined``) and one that leaves after its CLOCK(B) (``left`` with ``at``: its BYE, or before it the
"fc" that ends its clocks while it waits for its release) count from, and no more from, iteration B,
whenever their messages arrive: iteration B - 1 still waits for the leaver's
gradient and not for the joiner's, iteration B for the joiner's and not for the leaver's. A worker
lost (no BYE) leaves at once and n stays: DBW's k_t ≤ the workers alive.

Partitions of the table move between servers (``bosen scale --servers``) with their step state:
``hand_over`` gives, per row leaving, the ranks' partial gradients, the sum of the accepted ones and
the last step's mean, and the shard's iteration, accepted ranks and estimator; ``take_over`` lays
them out beside the rows that stay. The mover moves only when every server holding rows of the table
is at the same iteration with the same ranks accepted (``position``), so the rows that arrive are of
the iteration the receiving server is at; a server that held none of the table's rows takes the
whole state over (its k_t history goes on from the giver's).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from bosen.backup import BackupPolicy
from bosen.config import TableConfig
from bosen.errors import ProtocolError
from bosen.gradstats import Moments
from bosen.procedure import StoredProcedure
from bosen.wire import UpdateBatch

log = logging.getLogger("bosen.server")

HISTORY = 1000  # k_t and applied ranks of the most recent iterations kept for STATUS
KEEP_STARTS = 64  # iterations back whose start time late gradients are still timed against
COUNTS = ("accepted", "dropped_late", "dropped_repeat", "held_ahead", "steps")  # order in a checkpoint


class BackupStep(StoredProcedure):
    """The stored procedure of a table with ``backup``: ``apply`` buffers a rank's gradient,
    ``clocked`` accepts or drops it, ``left`` lowers k_t when a worker is gone."""

    read_my_writes = False
    float_only = True

    def __init__(self, table: TableConfig, **args: Any) -> None:
        super().__init__(table, **args)
        assert table.backup is not None
        self.backup = table.backup
        self.iteration = 0
        self.policy: BackupPolicy | None = None
        self.values: np.ndarray | None = None
        # rank -> its gradient of the tick in progress: the rows it touched, so memory and time follow
        # them (an embedding table's gradient is a batch's rows of a large table)
        self.buffers: dict[int, Gradient] = {}
        # the rows each array below may be non-zero at (a bool mask per local row; None: any row), so that
        # zeroing, summing and stepping cost the rows gradients touched, not the shard: the accepted sum
        # (acc, sq), the last mean
        self.acc_rows: np.ndarray | None = None
        self.prev_rows: np.ndarray | None = None
        self.has: set[int] = set()  # ranks with updates since their last clock
        self.alive: set[int] = set()  # members not lost
        self.members: set[int] = set()  # the job's workers (n): joined, not left by BYE
        self.changes: dict[int, tuple[set[int], set[int]]] = {}  # iteration -> (ranks joining, leaving) there
        self.k = 1
        self.accepted: list[int] = []  # ranks accepted in the current iteration, in arrival order
        self.acc: np.ndarray | None = None  # their sum, float64
        self.sq: np.ndarray | None = None  # per row, Σ‖g_j‖² of the accepted (moves with its row)
        self.prev_mean: np.ndarray | None = None
        self.starts: dict[int, tuple[float, int]] = {}  # iteration -> (when w_t came, k_{t-1})
        self.arrivals: dict[int, int] = {}  # iteration -> gradients of it arrived so far
        self.k_history: list[int] = []
        self.applied: list[list[int]] = []  # per iteration, the ranks whose gradient it applied (recent)
        self.counts = dict.fromkeys(COUNTS, 0)
        # complete gradients of iterations the table has not reached, in arrival order: (tick, rank, gradient).
        # Only a resend brings them (workers read w_t before they compute on it): a lost server's
        # replacement, restored at C, gets each worker's gradients of C, C + 1, ... one after another
        self.ahead: list[tuple[int, int, Gradient]] = []
        # rank -> the last clock it sent this server's lost predecessor (HELLO "cs"): its resent
        # gradients of ticks before it, and its next one after (the tick in flight), may be ahead of
        # the table; none later (``check_clock``)
        self.resend_until: dict[int, int] = {}
        self._resume: dict[str, np.ndarray] | None = None  # a checkpoint's table_state, taken at start

    def create(self, global_rows: np.ndarray, values: np.ndarray) -> None:
        self.values = values

    def start(self, workers: int, iteration: int, now: float, members: list[int] | None = None) -> None:
        """The job as launched with ``workers`` ranks, the iteration the server starts at (its clock);
        ``members``: the ranks in the job now where they differ (a server started in a job that scaled)."""
        self.policy = BackupPolicy(self.backup, workers)
        self.members = set(range(workers)) if members is None else set(members)
        self.alive = set(self.members)
        if len(self.members) != workers and self.members:
            self.policy.resize(len(self.members))
        self.iteration = iteration
        self.k = self.policy.choose(len(self.alive))
        if self._resume is not None:
            self._continue(self._resume)
            self._resume = None
        self.starts[iteration] = (now, self.k_history[-1] if self.k_history else workers)
        self.arrivals[iteration] = 0

    def table_state(self) -> dict[str, np.ndarray]:
        """The iteration, k_t, its history and the estimator's state (``BackupPolicy.snapshot``), for a
        checkpoint: a resumed job's k_t goes on as if it had not stopped. Round-trip start times are
        not saved: a resume starts every worker afresh at the checkpoint's iteration."""
        if self.policy is None:
            return {}
        lens = np.array([len(a) for a in self.applied], dtype=np.int64)
        flat = np.array([r for a in self.applied for r in a], dtype=np.int64)
        return {**self.policy.snapshot(), "iteration": np.array([self.iteration], dtype=np.int64),
                "k": np.array([self.k], dtype=np.int64), "k_history": np.array(self.k_history, dtype=np.int64),
                "applied_ranks": flat, "applied_lens": lens,
                "counts": np.array([self.counts[c] for c in COUNTS], dtype=np.int64),
                "prev_mean": np.empty((0,)) if self.prev_mean is None else self.prev_mean.copy()}

    def load_table_state(self, arrays: dict[str, np.ndarray]) -> None:
        missing = sorted({"iteration", "k", "k_history", "applied_ranks", "applied_lens", "counts", "prev_mean",
                          "rtt_sums", "rtt_counts", "variance", "sqnorm", "smooth", "prev"} - set(arrays))
        if missing:
            raise ValueError(f"backup state {missing[0]!r} is missing")
        self._resume = {k: np.asarray(v) for k, v in arrays.items()}

    def _continue(self, a: dict[str, np.ndarray]) -> None:
        """Take back a checkpoint's ``table_state`` (``start`` has made the policy)."""
        saved = int(a["iteration"][0])
        if saved != self.iteration:
            log.warning("table %s: its backup state was saved at iteration %d, the server starts at %d",
                        self.table.name, saved, self.iteration)
        self._take(a)
        self.prev_mean = a["prev_mean"].astype(np.float64) if a["prev_mean"].size else None
        self.prev_rows = None

    def _take(self, a: dict[str, np.ndarray]) -> None:
        """The estimator, k_t, its history and the counters of a ``table_state`` (a checkpoint's or,
        in a partition move, the giving server's)."""
        assert self.policy is not None
        try:
            self.policy.restore(a)
        except ValueError as e:
            log.warning("table %s: the round-trip estimates start afresh: %s", self.table.name, e)
        self.k_history = a["k_history"].astype(int).tolist()
        ends = np.cumsum(a["applied_lens"])
        self.applied = [a["applied_ranks"][e - m:e].astype(int).tolist()
                        for m, e in zip(a["applied_lens"], ends, strict=True)]
        self.counts.update(zip(COUNTS, a["counts"].astype(int).tolist(), strict=True))
        self.k = min(int(a["k"][0]), len(self.alive)) if self.backup.mode != "static" else self.k

    def position(self) -> list[int]:
        """Where the step is: the iteration and the ranks accepted in it (sorted). Rows move between
        two servers only where both are at the same position (``bosen.jobs.moves``)."""
        return [self.iteration, *sorted(self.accepted)]

    def hand_over(self, local_rows: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Rows ``local_rows`` leave for another server: per row ("has": which ranks' gradient of the
        tick in progress has started, "buf": those partial gradients, "acc" and "sq": the sums over the
        accepted, "prev" and "prev_ok": the last step's mean), and the whole shard's step (``table_state``
        without the mean, and the ranks accepted), which a server that holds none of the table's rows
        takes over."""
        if self.policy is None:
            return {}, {}  # not started: no step under way
        m = local_rows.shape[0]
        n = max([self.policy.n, *(r + 1 for r in self.has | self.members)])  # ranks, not n: a job that scaled
        cols = self.table.cols
        has = np.zeros((m, n), dtype=bool)
        buf = np.zeros((m, n, cols))
        for r in sorted(self.has):
            has[:, r] = True
            buf[:, r] = self.buffers[r].at(local_rows)
        summed = bool(self.accepted) and self.acc is not None and self.sq is not None
        rows = {"has": has, "buf": buf,
                "acc": self.acc[local_rows] if summed and self.acc is not None else np.zeros((m, cols)),
                "sq": self.sq[local_rows] if summed and self.sq is not None else np.zeros(m),
                "prev": np.zeros((m, cols)) if self.prev_mean is None else self.prev_mean[local_rows],
                "prev_ok": np.full(m, self.prev_mean is not None)}
        whole = {k: v for k, v in self.table_state().items() if k != "prev_mean"}
        whole["accepted"] = np.array(self.accepted, dtype=np.int64)
        return rows, whole

    def check_take_over(self, had: int, whole: dict[str, np.ndarray] | None) -> None:
        """Before anything moves: rows of a step at another position than this server's (it holds
        ``had`` rows) are refused (the mover waits for one position; this guards its word)."""
        if whole is None or not had or self.policy is None:
            return
        theirs = [int(whole["iteration"][0]), *sorted(whole["accepted"].astype(int).tolist())]
        if theirs != self.position():
            raise ProtocolError(f"MOVE map: table {self.table.name!r}: rows of iteration {theirs[0]} with ranks "
                                f"{theirs[1:]} accepted would arrive at a server at iteration {self.iteration} with "
                                f"ranks {sorted(self.accepted)}: a backup step moves only between servers at the "
                                "same iteration with the same ranks accepted")

    def take_over(self, had: int, kept: np.ndarray, old: np.ndarray, came: np.ndarray,
                  rows: dict[str, np.ndarray] | None, whole: dict[str, np.ndarray] | None) -> None:
        """After ``create`` at the new size: the rows at ``kept`` were at ``old`` here (``had`` rows),
        those at ``came`` are ``rows`` (``hand_over``'s, already in ``came``'s order) from a server
        whose step was ``whole``. A server that had no rows takes that step over; one that had is at its
        position (``check_take_over``)."""
        if self.policy is None:
            return  # not started (a resume lays the rows out first): no step under way
        assert self.values is not None
        got = came.shape[0] > 0 and rows is not None
        if got and whole is not None and not had:
            self._adopt(whole)
        shape = self.values.shape

        def lay(mine: np.ndarray | None, arriving: np.ndarray | None) -> np.ndarray:
            like = mine if mine is not None else arriving
            assert like is not None
            out = np.zeros(shape[:1] + like.shape[1:], dtype=like.dtype)
            if mine is not None:
                out[kept] = mine[old]
            if arriving is not None and got:
                out[came] = arriving
            return out

        arriving = set(np.flatnonzero(rows["has"].any(axis=0)).tolist()) if got and rows is not None else set()
        # a rank's partial gradient: its rows here and those that came; a stale buffer (a rank not in
        # ``has``) is dropped, as its rank's next update would zero it
        where = np.full(max(had, int(old.max()) + 1 if old.size else 0), -1, dtype=np.int64)
        where[old] = kept  # a row that stays: its new local index (-1: it left)
        self.buffers = {r: Gradient.laid_out(self.buffers[r] if r in self.has else None, where,
                                             came if got else None,
                                             rows["buf"][:, r] if r in arriving and rows is not None else None,
                                             self.table.cols)
                        for r in sorted(self.has | arriving)}
        self.has |= arriving
        self.acc_rows = self.prev_rows = None  # laid out anew: any row may be non-zero
        if self.accepted:
            self.acc = lay(self.acc, rows["acc"] if got and rows is not None else None)
            self.sq = lay(self.sq, rows["sq"] if got and rows is not None else None)
        else:
            self.acc = self.sq = None
        mine_ok = self.prev_mean is not None or not had
        their_ok = not got or rows is None or bool(rows["prev_ok"].all())
        if mine_ok and their_ok and (self.prev_mean is not None or got):
            self.prev_mean = lay(self.prev_mean, rows["prev"] if got and rows is not None else None)
        else:
            self.prev_mean = None  # one ḡ_tᵀḡ_{t−1} is not known: the next L̂ sample is skipped

    def _adopt(self, whole: dict[str, np.ndarray]) -> None:
        """This server held none of the table's rows (it joined, or gave them all away before): it takes
        the giving server's step over, at its iteration with its ranks accepted, its estimator, k_t and
        history. Round trips of the iteration in progress are not timed here (its start is the giver's)."""
        self._take(whole)
        self.iteration = int(whole["iteration"][0])
        self.accepted = whole["accepted"].astype(int).tolist()
        self.has.clear()
        self.buffers.clear()
        self.acc = self.sq = self.prev_mean = None
        self.acc_rows = self.prev_rows = None
        self.starts.clear()
        self.arrivals.clear()
        log.info("table %s: takes over the backup step of the server its rows came from, at iteration %d",
                 self.table.name, self.iteration)

    def apply(self, values: np.ndarray, local_rows: np.ndarray, batch: UpdateBatch, client: int) -> None:
        """Buffer ``client``'s update: part of its gradient of the tick it is at."""
        import bosen.rowmath as rowmath

        self.values = values  # the shard's array (it may be replaced, e.g. by a partition move)
        if client not in self.has or client not in self.buffers:  # a new gradient
            self.buffers[client] = Gradient(values.shape[1])
            self.has.add(client)
        upd = batch.values.astype(np.float64)  # a copy: the batch's buffer is not kept
        if batch.sparse:
            block = np.zeros((local_rows.shape[0], values.shape[1]))
            rowmath.scatter_add_csr(block, np.arange(local_rows.shape[0], dtype=np.int64), batch.indptr,
                                    batch.cols, upd)
            upd = block
        self.buffers[client].add(local_rows, upd)

    def put(self, rank: int, gradient: np.ndarray) -> None:
        """``rank``'s whole gradient of the tick it is at, in one piece (what ``apply`` builds from
        batches; the virtual-clock bench hands it over directly)."""
        g = np.asarray(gradient, dtype=np.float64).reshape(-1, gradient.shape[-1])
        self.buffers[rank] = Gradient(g.shape[1])
        self.buffers[rank].add(np.arange(g.shape[0], dtype=np.int64), g.copy())
        self.has.add(rank)

    def resending(self, rank: int, until: int) -> None:
        """Rank ``rank`` rejoins this restored server having sent its lost predecessor clocks up to
        ``until``: it resends its gradients of ticks below that, then sends the one of the tick in
        flight, each of which may be ahead of the table."""
        self.resend_until[rank] = until

    def check_clock(self, rank: int, clock: int) -> None:
        """ProtocolError if ``rank``'s CLOCK(``clock``) completes a gradient ahead of the table that no
        correct worker sends: past what it resends (:meth:`resending`) a worker's gradient is of an
        iteration it has read, never a later one. Nothing changes (the server keeps serving; the
        rank's partial gradient stays until its next update replaces it)."""
        tick = clock - 1
        if rank not in self.has or tick <= self.iteration or rank in self.resend_until:
            return
        raise ProtocolError(f"CLOCK({clock}): rank {rank}'s gradient of iteration {tick} is ahead of table "
                            f"{self.table.name!r} (iteration {self.iteration}): a worker computes on the iteration "
                            "it has read, and only a resend to a restored server (the rank's gradients of ticks "
                            "before the clock it had sent the lost server, and of the tick then in flight) is "
                            "ahead; refused, not held")

    def clocked(self, rank: int, clock: int, now: float) -> bool:
        """Rank ``rank`` sent CLOCK(``clock``): its gradient of tick ``clock - 1``, if it sent one, is
        complete. Returns True if the table stepped (reads may be answered)."""
        if rank not in self.has:
            return False  # a clock with no gradient: the worker caught up with a newer iteration
        if self.resend_until.get(rank, clock) < clock:  # the gradient of the tick in flight: nothing more ahead
            del self.resend_until[rank]
        self.has.discard(rank)
        tick = clock - 1
        start = self.starts.get(tick)
        if start is not None and self.policy is not None:
            self.arrivals[tick] += 1
            self.policy.rtt.add(start[1], self.arrivals[tick], now - start[0])
        if tick < self.iteration:
            self.counts["dropped_late"] += 1
            return False
        if tick > self.iteration:  # a resend to a restored server: taken when the table gets there
            self.ahead.append((tick, rank, self.buffers.pop(rank)))
            self.counts["held_ahead"] += 1
            return False
        if rank in self.accepted:
            self.counts["dropped_repeat"] += 1
            return False
        self._add(rank, self.buffers[rank])
        return self._advance(now)

    def _add(self, rank: int, g: Gradient) -> None:
        """Accept ``rank``'s gradient ``g`` of the current iteration."""
        assert self.values is not None
        shape = (self.values.shape[0], self.table.cols)
        if self.acc is None or self.acc.shape != shape or self.sq is None or self.sq.shape != shape[:1]:
            self.acc, self.sq, self.acc_rows = np.zeros(shape), np.zeros(shape[0]), None
        if not self.accepted:  # the iteration's first: clear the rows the last sum touched
            _clear(self.acc_rows, self.acc, self.sq)
            self.acc_rows = np.zeros(shape[0], dtype=bool)
        at, gr = g.summed()
        self.acc[at] += gr
        self.sq[at] += np.einsum("ij,ij->i", gr, gr)
        if self.acc_rows is not None:
            self.acc_rows[at] = True
        self.accepted.append(rank)
        self.counts["accepted"] += 1

    def _advance(self, now: float) -> bool:
        """Step while the current iteration has its k_t gradients, each new iteration first taking the
        held gradients of it (in their arrival order); those of iterations passed without them are late.
        Returns whether the table stepped."""
        stepped = False
        while self.alive and self.accepted and len(self.accepted) >= self.k:
            self._step(now)
            stepped = True
            if not self.ahead:
                continue
            now_ahead = [h for h in self.ahead if h[0] == self.iteration]
            self.counts["dropped_late"] += sum(h[0] < self.iteration for h in self.ahead)
            self.ahead = [h for h in self.ahead if h[0] > self.iteration]
            for _, rank, g in now_ahead:
                if rank in self.accepted:
                    self.counts["dropped_repeat"] += 1
                else:
                    self._add(rank, g)
        return stepped

    def forget(self, rank: int) -> None:
        """Drop what ``rank`` sent of a gradient not yet complete (its process is gone; a replacement
        of the rank starts a gradient afresh)."""
        self.has.discard(rank)
        self.buffers.pop(rank, None)

    def joined(self, rank: int, at: int) -> None:
        """Rank ``rank`` joins the job at clock ``at`` (``bosen scale``; at most one iteration ahead of
        the table: every worker waits at ``at`` until the joiners joined): it counts from iteration
        ``at``, n one more."""
        if at <= self.iteration:
            self._resize({rank}, set())
        else:
            self.changes.setdefault(at, (set(), set()))[0].add(rank)

    def left(self, rank: int, now: float, at: int | None = None) -> bool:
        """Rank ``rank`` left the job: lost (``at`` None), k_t is at most the workers alive from now on;
        by BYE after its CLOCK(``at``), it is no more one of the job's n from iteration ``at`` (its
        gradient of ``at`` - 1 was its last; its "fc" says so before its BYE, which then changes nothing).
        Returns True if the table stepped with the gradients it already had."""
        self.forget(rank)
        if at is not None and rank not in self.members and not any(rank in gone for _, gone in self.changes.values()):
            return False  # it left already (its "fc")
        if at is not None and at > self.iteration:
            self.changes.setdefault(at, (set(), set()))[1].add(rank)
            return False
        if at is not None:
            self._resize(set(), {rank})
        self.alive.discard(rank)
        if self.alive and self.k > len(self.alive):
            self.k = len(self.alive)
        return self._advance(now)

    def _resize(self, joining: set[int], leaving: set[int]) -> None:
        """The job's workers change now (at the current iteration): n and k_t follow."""
        assert self.policy is not None
        self.members = (self.members | joining) - leaving
        self.alive = (self.alive | joining) - leaving
        if self.members:
            self.policy.resize(len(self.members))
        self.k = self.policy.choose(len(self.alive))

    def _step(self, now: float) -> None:
        assert self.acc is not None and self.sq is not None and self.values is not None and self.policy is not None
        k = len(self.accepted)
        # only the rows some accepted gradient touched: elsewhere the mean is zero
        at: Any = slice(None) if self.acc_rows is None else np.flatnonzero(self.acc_rows)
        mean = self.acc[at] / k
        lr = self.policy.lr(k)
        self.values[at] -= (lr * mean).astype(self.values.dtype, copy=False)
        total = float(np.vdot(mean, mean))
        cross = math.nan
        if self.prev_mean is not None and self.prev_mean.shape == self.acc.shape:
            cross = float(np.vdot(mean, self.prev_mean[at]))  # zero outside the last step's rows
            _clear(self.prev_rows, self.prev_mean)
        else:
            self.prev_mean = np.zeros_like(self.acc)
        self.prev_mean[at] = mean
        self.prev_rows = None if self.acc_rows is None else self.acc_rows.copy()
        self.policy.observe(Moments(k, float(self.sq[at].sum()) / k, total), cross)
        self.applied.append(list(self.accepted))
        del self.applied[:-HISTORY]
        self.k_history.append(k)
        del self.k_history[:-HISTORY]
        self.counts["steps"] += 1
        self.accepted = []
        self.iteration += 1
        self.starts[self.iteration] = (now, k)
        self.arrivals[self.iteration] = 0
        old = self.iteration - KEEP_STARTS
        self.starts.pop(old, None)
        self.arrivals.pop(old, None)
        self.k = self.policy.choose(len(self.alive))
        for b in sorted(a for a in self.changes if a <= self.iteration):
            self._resize(*self.changes.pop(b))

    def stats(self) -> dict[str, Any]:
        est = self.policy.state() if self.policy is not None else {}
        return {"backup": {"mode": self.backup.mode, "iteration": self.iteration, "k": self.k,
                           "n": self.policy.n if self.policy is not None else None,
                           "k_history": list(self.k_history), "applied": [list(a) for a in self.applied],
                           **self.counts, **{k: (None if math.isnan(v) else v) for k, v in est.items()}}}


def _clear(rows: np.ndarray | None, *arrays: np.ndarray) -> None:
    """Zero ``arrays`` at the rows of the mask ``rows`` (None: everywhere)."""
    at = slice(None) if rows is None else np.flatnonzero(rows)
    for a in arrays:
        a[at] = 0.0


class Gradient:
    """One rank's gradient of the tick in progress: the local rows its updates touched and their float64
    values, kept as the pieces they came in until a step (or a move) asks for them summed per row, so
    its memory and time follow the rows touched (a batch's rows of an embedding table), not the shard."""

    __slots__ = ("rows", "values", "pieces")

    def __init__(self, cols: int) -> None:
        self.rows = np.zeros(0, dtype=np.int64)  # sorted, distinct (once summed)
        self.values = np.zeros((0, cols))
        self.pieces: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, rows: np.ndarray, values: np.ndarray) -> None:
        """``values`` (float64, owned from now on) added at local ``rows`` (which may repeat)."""
        self.pieces.append((np.array(rows, dtype=np.int64), values))

    def summed(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows (sorted, distinct) and their values, each row's updates added in arrival order."""
        import bosen.rowmath as rowmath

        if len(self.pieces) == 1 and not self.rows.shape[0]:
            rows, values = self.pieces[0]
            if rows.shape[0] < 2 or bool((rows[1:] > rows[:-1]).all()):  # sorted, distinct: as it is
                self.rows, self.values, self.pieces = rows, values, []
        if self.pieces:
            rows = np.concatenate([self.rows, *(p[0] for p in self.pieces)])
            values = np.concatenate([self.values, *(p[1] for p in self.pieces)])
            self.rows, inverse = np.unique(rows, return_inverse=True)
            self.values = np.zeros((self.rows.shape[0], values.shape[1]))
            rowmath.scatter_add(self.values, inverse.astype(np.int64, copy=False), values)
            self.pieces = []
        return self.rows, self.values

    def at(self, local_rows: np.ndarray) -> np.ndarray:
        """The values at ``local_rows`` (zeros where it touched none), one row each."""
        rows, values = self.summed()
        out = np.zeros((local_rows.shape[0], values.shape[1]))
        if rows.shape[0]:
            pos = np.minimum(np.searchsorted(rows, local_rows), rows.shape[0] - 1)
            hit = rows[pos] == local_rows
            out[hit] = values[pos[hit]]
        return out

    @classmethod
    def laid_out(cls, mine: Gradient | None, where: np.ndarray, came: np.ndarray | None,
                 arriving: np.ndarray | None, cols: int) -> Gradient:
        """A partition move's new layout: ``mine``'s rows that stay at their new local index (``where``
        of the old one, -1 for rows that left), and the rows that came (local ``came``) with the values
        ``arriving`` (one row each, kept where non-zero)."""
        out = cls(cols)
        if mine is not None:
            rows, values = mine.summed()
            new = where[rows] if rows.shape[0] else rows
            stay = new >= 0
            out.add(new[stay], values[stay])
        if came is not None and arriving is not None:
            nz = np.flatnonzero(arriving.any(axis=1))
            out.add(came[nz], np.array(arriving[nz], dtype=np.float64))
        out.summed()
        return out
