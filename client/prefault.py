"""Touch a table's process-local buffers once, up front, so their pages are not faulted in mid-run.

The cache and the update buffer are full-size ``np.zeros`` arrays, whose pages the kernel maps on
first write. A table read and written at scattered rows (a large sparse embedding) faults a fresh
page with nearly every row of its first steps; on the virtual machines the benchmarks run on, a
first touch of memory the guest never used costs a host fault too (about 2.8 ms per MiB, see
bench/common.py ``prewarm_memory``), which put over a second into a job's first step. Faulting them
in before training moves that cost to start-up, where a torch model's own weights and optimizer
state pay theirs.
"""

from __future__ import annotations

import time

import numpy as np

from bosen.client.state import TableState

PAGE = 4096


def _touch(a: np.ndarray | None) -> int:
    """Write every page of ``a`` with the byte it holds (values unchanged); bytes covered."""
    if a is None or a.nbytes == 0 or not a.flags.c_contiguous:
        return 0
    pages = a.reshape(-1).view(np.uint8)[::PAGE]
    pages += 0  # a write per page (an assignment of a view to itself is skipped)
    return int(a.nbytes)


def prefault(st: TableState) -> tuple[int, float]:
    """Fault in ``st``'s cache, update buffer and per-row counters (under its lock, so no value
    changes meanwhile); returns (bytes covered, seconds taken)."""
    t0 = time.perf_counter()
    c, o = st.cache, st.oplog
    with st.lock:
        n = sum(_touch(a) for a in (c.values, c.clock, c.requested, c.ss, c.early,
                                    o.delta, o.dirty, o.staged, st.send_count, st.importance))
    return n, time.perf_counter() - t0
