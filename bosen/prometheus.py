"""Prometheus ``/metrics``: a server's STATUS and the launcher's clock records as metric families,
served over HTTP by ``prometheus_client``'s own server in its own threads (docs/metrics.md).

Nothing is counted twice: every value is read, at scrape time, from what ``bosen status`` and
``metrics.jsonl`` already hold (``fetch`` builds the families on each scrape). A server's ``fetch``
runs its ``stats()`` on the event loop (:func:`on_loop`), as a STATUS message would; the HTTP
threads never touch the server's state themselves, and a request they cannot parse is answered
there (400) without reaching the loop. Ports: ``metrics.port`` P is the launcher's; server rank R
serves P + 1 + R (:func:`port_for`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector, CollectorRegistry

from bosen.errors import BosenError

log = logging.getLogger("bosen.metrics")

FETCH_TIMEOUT_S = 5.0

# STATUS counters that are not named by their unit: Prometheus names (without the ``bosen_server_``
# prefix and the ``_total`` suffix). Every other counter keeps its own name (``rows_applied``...).
COUNTER_NAMES = {"bytes_in": "received_bytes", "bytes_out": "sent_bytes", "msgs_in": "received_messages",
                 "msgs_out": "sent_messages", "window_paused_s": "window_paused_seconds"}
DURATIONS = {"apply_lag_ms": ("apply_lag_seconds", "an update's time from the socket to being applied"),
             "push_stall_ms": ("push_stall_seconds", "each push's time, during which the loop reads nothing")}


def port_for(port: int, server_rank: int | None) -> int:
    """The port of the launcher (``server_rank`` None) or of a server for ``metrics.port``; 0 = off."""
    if port == 0:
        return 0
    return port if server_rank is None else port + 1 + server_rank


def _unit_name(key: str) -> str:
    """A record's key as a Prometheus name: ``read_s`` -> ``read_seconds``, ``bytes_sent`` -> ``sent_bytes``."""
    if key.endswith("_s"):
        return key[:-2] + "_seconds"
    if key.startswith("bytes_"):
        return key[len("bytes_"):] + "_bytes"
    return key


def server_families(stats: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> list[Metric]:
    """One server's STATUS (``Server.stats()``, ``bosen status --json``) as metric families; ``labels``
    are added to every sample (the launcher's endpoint adds ``server``)."""
    lab = dict(labels or {})
    names, values = list(lab), list(lab.values())
    out: list[Metric] = []

    def gauge(name: str, doc: str, value: float, **extra: str) -> None:
        g = GaugeMetricFamily(f"bosen_server_{name}", doc, labels=[*names, *extra])
        g.add_metric([*values, *extra.values()], float(value))
        out.append(g)

    gauge("up", "1: the server answered", 1)
    gauge("clock", "the server's clock: the slowest client's", stats["clock"])
    clocks = stats.get("client_clocks", [])
    cc = GaugeMetricFamily("bosen_server_client_clock", "each client's clock (clients that left: none)",
                           labels=[*names, "client"])
    for r, c in enumerate(clocks):
        if isinstance(c, int):
            cc.add_metric([*values, str(r)], c)
    out.append(cc)
    gauge("clients_joined", "clients that joined", stats.get("clients_joined", 0))
    gauge("clients_left", "clients that left the job (BYE)", sum(1 for c in clocks if c == "left"))
    gauge("read_connections", "the workers' read sockets", stats.get("read_connections", 0))
    parts = stats.get("partitions", {})
    gauge("partitions_owned", "partitions this server holds", parts.get("owned", 0))
    gauge("partitions", "partitions of the job", parts.get("count", 0))
    gauge("partition_map_version", "the version of the partition map the server follows", parts.get("version", 0))
    gauge("uptime_seconds", "since the server started", stats.get("uptime_s", 0.0))
    if isinstance(stats.get("take_back_from"), int):  # a clock, not a count (None: no take-back)
        gauge("take_back_from", "the oldest clock a lost worker's replacement is taken back whole from",
              stats["take_back_from"])
    cpu = CounterMetricFamily("bosen_server_cpu_seconds", "CPU time of the process since it served", labels=names)
    cpu.add_metric(values, stats.get("cpu_s", 0.0))
    out.append(cpu)
    rows = GaugeMetricFamily("bosen_server_table_rows", "rows stored (a sparse table's touched rows)",
                             labels=[*names, "table"])
    size = GaugeMetricFamily("bosen_server_table_bytes", "bytes of the rows stored, per-row metadata included",
                             labels=[*names, "table"])
    for t, s in stats.get("tables", {}).items():
        rows.add_metric([*values, t], s.get("rows", 0))
        size.add_metric([*values, t], s.get("bytes", 0))
    out += [rows, size]
    for key, value in stats.items():  # the plain counters, whatever STATUS holds
        if key in ("clock", "rank", "clients_joined", "read_connections", "take_back_from") \
                or isinstance(value, bool) or not isinstance(value, (int, float)) or key.endswith("_mbps") \
                or key in ("uptime_s", "cpu_s"):
            continue
        c = CounterMetricFamily(f"bosen_server_{COUNTER_NAMES.get(key, key)}", f"STATUS {key}", labels=names)
        c.add_metric(values, value)
        out.append(c)
    for key, (name, doc) in DURATIONS.items():
        d = stats.get(key)
        if isinstance(d, dict):
            s = SummaryMetricFamily(f"bosen_server_{name}", doc, labels=names)
            s.add_metric(values, d.get("n", 0), d.get("total_s", 0.0))
            out.append(s)
            gauge(name.replace("_seconds", "_max_seconds"), f"the longest: {doc}", d.get("max_ms", 0.0) / 1e3)
    if "budget_mbps" in stats:  # managed communication: the send budget and how much of it was used
        budget = stats["budget_mbps"] * 1e6 / 8
        gauge("send_budget_bytes_per_second", "comm.server_bandwidth_mbps", budget)
        gauge("budget_use_ratio", "bytes sent per second since start, over the budget",
              stats.get("egress_mbps", 0.0) * 1e6 / 8 / budget if budget > 0 else 0.0)
    ck = stats.get("checkpoints")
    if isinstance(ck, dict):
        for key, name, doc in (("written", "checkpoint_parts_written", "checkpoint parts written"),
                               ("write_s", "checkpoint_write_seconds", "time writing checkpoint parts"),
                               ("snapshot_s", "checkpoint_snapshot_seconds", "time copying rows at boundaries")):
            c = CounterMetricFamily(f"bosen_server_{name}", doc, labels=names)
            c.add_metric(values, ck.get(key, 0))
            out.append(c)
        saved = ck.get("saved") or []
        gauge("checkpoint_last_clock", "the clock of the newest checkpoint part saved (-1: none)",
              max((int(x) for x in saved if isinstance(x, int)), default=-1))
        gauge("checkpoint_writer_failed", "1: the checkpoint writer failed", 1 if ck.get("error") else 0)
    sec = stats.get("security")
    if isinstance(sec, dict):  # bosen.security: CURVE on, and handshakes refused (a key not allowed)
        gauge("curve", "1: connections are CURVE-encrypted and clients authenticated", 1 if sec.get("curve") else 0)
        c = CounterMetricFamily("bosen_server_handshakes_refused", "security handshakes refused: a client public "
                                "key not in security.allowed_clients", labels=names)
        c.add_metric(values, sec.get("refused", 0))
        out.append(c)
    return out


def job_families(record: Mapping[str, Any] | None, workers: int, elapsed_s: float) -> list[Metric]:
    """The launcher's job: its newest complete clock record (``metrics.jsonl``, summed over workers)."""
    out: list[Metric] = []
    for name, doc, value in (("workers", "worker processes of the job", workers),
                             ("elapsed_seconds", "since the launcher started the job", elapsed_s)):
        g = GaugeMetricFamily(f"bosen_job_{name}", doc)
        g.add_metric([], value)
        out.append(g)
    if record is None:
        return out
    for key, value in record.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or key == "workers":
            continue
        doc = "the newest complete clock" if key == "clock" else f"{key} at the newest complete clock, over workers"
        g = GaugeMetricFamily(f"bosen_job_{_unit_name(key)}", doc)
        g.add_metric([], value)
        out.append(g)
    return out


# a worker's record (metrics.jsonl): its key, the Prometheus name (``bosen_worker_`` + it) and help
WORKER_COUNTERS = (("blocked_s", "blocked_seconds", "time the worker's reads waited for fresher rows since it started"),
                   ("blocked_reads", "blocked_reads", "reads that waited for fresher rows since the worker started"))


def worker_families(latest: Mapping[int, Mapping[str, Any]]) -> list[Metric]:
    """Each worker's newest record, labelled ``rank``: its clock and blocked time (who holds the job
    back: the others block on the slowest). A replacement's counters start again from 0 (a reset)."""
    clock = GaugeMetricFamily("bosen_worker_clock", "the newest clock the worker reported", labels=["rank"])
    counters = {key: CounterMetricFamily(f"bosen_worker_{name}", doc, labels=["rank"])
                for key, name, doc in WORKER_COUNTERS}
    for rank, rec in sorted(latest.items()):
        if isinstance(rec.get("clock"), int):
            clock.add_metric([str(rank)], rec["clock"])
        for key, family in counters.items():
            value = rec.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                family.add_metric([str(rank)], value)
    return [clock, *counters.values()]


def down_family(address: str, labels: Mapping[str, str]) -> Metric:
    g = GaugeMetricFamily("bosen_server_up", "1: the server answered", labels=[*labels, "address"])
    g.add_metric([*labels.values(), address], 0)
    return g


class _Families(Collector):
    def __init__(self, fetch: Callable[[], Iterable[Metric]]) -> None:
        self.fetch = fetch

    def collect(self) -> Iterable[Metric]:
        return self.fetch()


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any], timeout: float = FETCH_TIMEOUT_S) -> Any:
    """``fn()`` run on ``loop``'s thread, waited for from another thread (the HTTP server's)."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def call() -> None:
        try:
            done.set_result(fn())
        except BaseException as e:  # handed to the waiting thread
            done.set_exception(e)

    loop.call_soon_threadsafe(call)
    return done.result(timeout)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a scrape is no news
        pass


class _Server(ThreadingWSGIServer):
    """prometheus_client's threaded WSGI server (a thread per request, daemon threads), with a
    request that fails (a peer that hung up, garbage) one log line, not a traceback on stderr."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("metrics: a request from %s failed: %s", client_address[0], sys.exc_info()[1])


class _Server6(_Server):
    address_family = socket.AF_INET6


class Endpoint:
    """``/metrics`` on ``host:port`` in prometheus_client's HTTP server threads; ``close()`` stops them."""

    def __init__(self, host: str, port: int, fetch: Callable[[], Iterable[Metric]]) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(fetch))
        try:
            self._httpd = make_server(host, port, make_wsgi_app(registry), _Server6 if ":" in host else _Server,
                                      handler_class=_QuietHandler)
        except OSError as e:
            raise BosenError(f"metrics: cannot serve /metrics on {host}:{port}: {e.strerror or e}") from None
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)
