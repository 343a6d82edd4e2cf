"""A worker process's side of checkpoints: its part of each one, and the wait at boundaries.

The client-side mirror of ``server/checkpoints.py``. Clocks that are multiples of
``checkpoint.every_clocks`` are boundaries (``bosen.checkpoint.is_boundary``, the one rule both sides
use). When the process clock reaches one, the app's state (``client.checkpoint_state(provider)``) is
copied and written in the background as this rank's part; rank 0 also decides, under a time rule,
whether the servers save there. A worker that enters a boundary tick waits until every server got
the process's CLOCK of that boundary, so no update of a later tick joins the checkpointed ones.
A resumed job gives each rank its part back (``restored_state``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from bosen import checkpoint
from bosen.client.lifecycle import Lifecycle
from bosen.client.link import ServerLink
from bosen.config import Config
from bosen.errors import BosenError

POLL_SLICE_S = 0.05  # a worker waiting at a boundary checks for close() and errors this often
StateProvider = Callable[[], Mapping[str, np.ndarray]]


class WorkerCheckpoints:
    """Boundaries, this rank's parts and rank 0's choice of where the servers save. ``every`` is 0
    without checkpoints (then nothing here does anything)."""

    def __init__(self, config: Config, links: Sequence[ServerLink], life: Lifecycle,
                 fresh: threading.Condition, skips: Callable[[int, int], bool] | None = None) -> None:
        self.config = config
        self._skips = skips  # a recovery test's fault (bosen/faults.py): (rank, clock) -> no part
        self._links = links
        self._life = life
        self._fresh = fresh
        ck = config.checkpoint
        self.every = ck.every_clocks if ck is not None else 0
        self.provider: StateProvider | None = None
        self._parts = checkpoint.PartWriter(checkpoint.root(config), checkpoint.model_fingerprint(config),
                                            config.cluster.workers) if ck is not None else None
        self.restored: dict[str, np.ndarray] | None = None
        self._last_choice = time.monotonic()  # rank 0: when it last chose a checkpoint (time rules)

    def at_process_clock(self, clock: int, rank: int, choose: Callable[[int], None]) -> None:
        """The process clock rose to ``clock``: at a boundary, this rank's part goes to the writer,
        and rank 0 asks the servers to save there if the rule says so (``choose(clock)``)."""
        if self._parts is None or not checkpoint.is_boundary(clock, self.every):
            return
        if self._skips is None or not self._skips(rank, clock):
            state = self.provider() if self.provider is not None else {}
            arrays = {k: np.array(v, copy=True) for k, v in state.items()}
            self._parts.submit(clock, "worker", rank, arrays, {"tick": clock})
        if rank == 0 and self._chooses():
            choose(clock)

    def after_tick(self, tick: int) -> None:
        """A worker entered tick ``tick``: at a boundary, wait until every server got this process's
        CLOCK(tick), so that no update of a later tick joins the updates before it (the servers'
        checkpoint at ``tick`` holds exactly the ticks below). With several workers, those that come
        first wait for the last."""
        if not checkpoint.is_boundary(tick, self.every):
            return
        with self._fresh:
            while min(link.window.clock_sent for link in self._links) < tick:
                self._life.check()
                self._fresh.wait(POLL_SLICE_S)

    def _chooses(self) -> bool:
        """Rank 0, at a boundary: whether the servers save there. Every boundary, or under a time
        rule the first one after its interval since the last save (Young's interval from the
        servers' measured save time). The other workers save their part at every boundary: the
        checkpoints the servers skip stay incomplete and are deleted."""
        ck = self.config.checkpoint
        assert ck is not None
        if ck.every_s is None and ck.mttf_s is None:
            return True
        processes = len(self.config.cluster.servers) + self.config.cluster.workers
        interval = ck.interval_s(max(link.save_s for link in self._links), processes)
        now = time.monotonic()
        if now - self._last_choice < interval:
            return False
        self._last_choice = now
        return True

    def load(self, path: Path, rank: int, clock: int) -> None:
        """This rank's part of checkpoint ``path`` (``$BOSEN_RESUME``), which must be at ``clock``,
        becomes ``restored``, with every other worker part's micro-task arrays (``task.*``): tasks
        may have moved (a job resumed with another worker count), and each worker picks its own. A
        rank the checkpoint has no part of (more workers now) gets its ``tick`` from worker 0's."""
        try:
            made_by = checkpoint.checkpoint_workers(path)
            ranks = checkpoint.checkpoint_ranks(path)  # 0..made_by-1, or those recorded after a scale
            fp = checkpoint.model_fingerprint(self.config, made_by)
            own = checkpoint.read_part(path / checkpoint.part_name("worker", rank if rank in ranks else ranks[0]), fp)
            others = [checkpoint.read_part(path / checkpoint.part_name("worker", r), fp, verify=False)
                      for r in ranks if r != own.meta["rank"]]
        except checkpoint.CheckpointError as e:
            raise BosenError(f"BOSEN_RESUME: {e}") from None
        if own.meta["clock"] != clock:
            raise BosenError(f"BOSEN_RESUME: {own.path} is at clock {own.meta['clock']}, the servers at {clock}")
        restored = own.load()
        if rank not in ranks:
            restored = {k: v for k, v in restored.items() if k.startswith("task.") or k == "tick"}
        for part in others:  # their tasks' arrays only (each rank's other state is its own)
            restored.update(part.load_matching("task."))
        self.restored = restored

    def close(self) -> None:
        """What was saved so far reaches the disk."""
        if self._parts is not None:
            self._parts.close()

    def raise_failure(self) -> None:
        if self._parts is not None and self._parts.error is not None:
            raise BosenError(f"cannot write this worker's checkpoint: {self._parts.error}")
