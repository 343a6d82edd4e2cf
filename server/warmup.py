"""Load the numba kernels a server's first messages use before it answers anyone.

Every ``@njit(cache=True)`` kernel is loaded from numba's cache on its first call, per argument
types: the first call in a process also sets numba itself up (~0.2 s on an idle machine, most of it
numba's BLAS check importing scipy.linalg), each further kernel a few milliseconds. Without this the
first read or increment of a job paid for it, inside the workers' first clock. So the server, before
it binds, runs a tiny increment and a subscription through scratch shards shaped like its own tables
(the same code paths, on throwaway values).

Why not on a thread while the server already answers (overlapping the workers' start-up, since
``bosen launch`` starts them once every server answers): a first message that needs a kernel then
waits on numba's compiler lock, which the warm-up thread takes again for each kernel it loads; on a
loaded 2-core machine a first read waited for the whole warm-up and overran a 2 s read timeout.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from bosen.config import Config, InitConfig
from bosen.partition import Partition
from bosen.server import procedures
from bosen.server.shard import TableShard
from bosen.wire import UpdateBatch

log = logging.getLogger(__name__)


def _batches(rows: np.ndarray, cols: int, dtype: np.dtype, versioned: bool) -> list[UpdateBatch]:
    n = rows.shape[0]
    extra = {}
    if versioned:
        empty = np.empty(0, dtype=np.int64)
        extra = dict(tags=np.zeros(n, np.int64), eov=np.zeros(n, bool), rel_rows=empty, rel_tags=empty)
    return [UpdateBatch(rows, np.zeros((n, cols), dtype), **extra)]


def warm_up(config: Config, rank: int) -> float:
    """Run the kernels of a dense increment, a subscription and a partition move once per table on
    scratch shards of this server's rows; returns the seconds it took. A kernel that fails here is left to fail (or not)
    where it is really used: nothing in this function may keep a server from starting."""
    t0 = time.perf_counter()
    servers = len(config.cluster.servers)
    partition = Partition(servers)
    for i, t in enumerate(config.tables):
        try:
            small = dataclasses.replace(t, rows=2 * servers, init=InitConfig(zeros=True))
            shard = TableShard(i, small, partition, rank, 1, procedures.load(small, config.source), config.comm)
            # every row this server owns (a sparse shard stores them now, which loads the row map's kernels)
            rows = partition.global_rows(rank, small.rows)
            local, index = shard.local_rows(rows, "warm-up")
            shard.subscribe(local, 0, index)
            for batch in _batches(rows, t.cols, np.dtype(t.dtype), shard.versioned):
                shard.apply(batch, 0)
            shard.push_to(local, 0)
            if not shard.versioned:  # a partition move's layout copies (rowmath.copy_rows, per dtype)
                shard.relayout(partition.moved(partition.owner_of.copy()))
            if t.backup is not None and t.backup.mode != "static":  # the round-trip estimator's solver
                from bosen.backup import isotonic_grid

                isotonic_grid(np.zeros((2, 2)), np.ones((2, 2)), 1)
        except Exception as e:  # noqa: BLE001 - a warm-up is an optimization, never a failure
            log.debug("warm-up of table %s skipped: %s", t.name, e)
    return time.perf_counter() - t0

