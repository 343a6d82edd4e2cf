"""The CPU scheduling policy of a server process (Linux).

A server is a throughput service: it moves megabytes of updates and rows, and nobody waits on any one
of its wake-ups the way a user waits on a keystroke. Under Linux's default policy every time the
client's bytes arrive, the woken server thread (the ZeroMQ I/O thread first) preempts whatever runs
on that core, often the client's own I/O thread that is sending those bytes, and then reads the
little that has arrived so far. Under SCHED_BATCH a woken thread waits for the running one's turn to
end (or runs at once on an idle core): it finds more bytes per wake-up and interrupts the sender
less. Measured on a 2-core machine (docs/design.md, "SCHED_BATCH on servers"): the server's I/O thread
went from ~100 to ~69 us of CPU per MiB ingested and 1 MiB ingest got 10-17% faster. The price is
latency: a 1 KiB read round trip took 2-12% longer; 1 MiB reads and the MF job did not change beyond
the noise. ``cluster.server_sched: normal`` keeps the OS default.

The policy is set on every thread the process has (numpy's BLAS starts one at import) before ZeroMQ
starts its own, which inherit it from the main thread. Changing between SCHED_OTHER and SCHED_BATCH
needs no privilege, and nice values stay as they were.
"""

from __future__ import annotations

import os

POLICIES = {"batch": "SCHED_BATCH", "normal": "SCHED_OTHER"}


def apply_policy(name: str) -> str:
    """Switch this process's threads, and those its threads start later, to policy ``name``
    ("batch" or "normal"). Returns a line for the log: what was set, or why nothing was (not Linux,
    refused)."""
    attr = POLICIES[name]
    policy = getattr(os, attr, None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return f"scheduling policy {name!r} not available on this platform; left as it is"
    try:
        for tid in _threads():
            try:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
            except ProcessLookupError:  # the thread ended meanwhile
                pass
    except OSError as e:  # e.g. a seccomp filter in a container
        return f"scheduling policy {name!r} ({attr}) refused: {e.strerror}; left as it is"
    return f"scheduling policy {name!r} ({attr})"


def _threads() -> list[int]:
    """This process's thread ids ([0], the calling thread, where /proc is missing)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]
