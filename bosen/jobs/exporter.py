"""The launcher's ``/metrics`` (``metrics.port``, on loopback): the job as a whole, its newest complete
clock record (what ``metrics.jsonl`` holds), each worker's newest record (its clock and blocked time,
``rank`` label) and every server's STATUS with a ``server`` label, asked
at scrape time from prometheus_client's HTTP thread (``bosen.prometheus``, docs/metrics.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from prometheus_client.core import Metric

from bosen import prometheus
from bosen.errors import BosenError
from bosen.jobs import status as status_mod
from bosen.jobs.job import MetricsMerger
from bosen.security import Security

HOST = "127.0.0.1"
STATUS_TIMEOUT_S = 2.0


def job_metrics(merger: MetricsMerger, workers: int, addresses: Callable[[], Sequence[str]],
                t0: float, security: Security | None = None) -> list[Metric]:
    """The families of one scrape: the job's, then each server's (down: ``bosen_server_up`` 0)."""
    done = merger.done  # appended to by the launcher's thread: the newest entry is a whole record
    out = prometheus.job_families(done[-1] if done else None, workers, time.time() - t0)
    out += prometheus.worker_families(dict(merger.latest))  # a copy: the launcher's thread adds to it
    for rank, addr in enumerate(list(addresses())):
        labels = {"server": str(rank)}
        try:
            stats = status_mod.query(addr, timeout=STATUS_TIMEOUT_S, security=security)
        except BosenError:
            out.append(prometheus.down_family(addr, labels))
            continue
        out += prometheus.server_families(stats, labels)
    return _merged(out)


def _merged(families: list[Metric]) -> list[Metric]:
    """Families of the same name from several servers as one family (the text format wants that)."""
    by_name: dict[str, Metric] = {}
    for f in families:
        if f.name in by_name:
            by_name[f.name].samples += f.samples
        else:
            by_name[f.name] = f
    return list(by_name.values())


@contextmanager
def serving(port: int, merger: MetricsMerger, workers: int, addresses: Callable[[], Sequence[str]],
            t0: float, security: Security | None = None) -> Iterator[prometheus.Endpoint | None]:
    """The launcher's endpoint while the job runs (None when ``metrics.port`` is 0)."""
    if not port:
        yield None
        return
    endpoint = prometheus.Endpoint(HOST, port, lambda: job_metrics(merger, workers, addresses, t0, security))
    try:
        yield endpoint
    finally:
        endpoint.close()
