"""Prometheus ``/metrics`` (bosen/prometheus.py): real servers serve their STATUS on metrics.port + 1 +
rank, parsed by prometheus_client's own text parser and checked against ``bosen status``; bad HTTP
requests are answered and change nothing; the launcher's endpoint (bosen/jobs/exporter.py) serves
the job's newest clock record and every server's numbers."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import free_port_run, scrape

from bosen import config as config_mod
from bosen import prometheus
from bosen.client import Client
from bosen.jobs import exporter
from bosen.jobs import status as status_mod
from bosen.jobs.job import WORKER_RECORDS, MetricsMerger, job_config

TABLES = {"W": {"rows": 40, "cols": 3, "dtype": "int64"}}


def one(samples: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


@pytest.mark.timeout(120)
def test_each_server_serves_its_status_and_bad_requests_change_nothing(bosen_cluster, tmp_path):
    base = free_port_run(3)
    cfg = job_config([], 1, tables=TABLES)
    cfg["metrics"] = {"port": base}
    c = bosen_cluster(2, config={**cfg, "cluster": {"servers": ["127.0.0.1:0"] * 2, "workers": 1}})
    with Client.connect(c.path, rank=0) as client:
        w = client.table("W")
        for tick in range(3):
            w.inc_rows(np.arange(40), np.full((40, 3), tick + 1, np.int64))
            client.clock()
        np.testing.assert_array_equal(w.get_rows(np.arange(40)), np.full((40, 3), 6))
    time.sleep(0.3)  # BYE reached both servers
    for rank, addr in enumerate(c.addresses):
        port = prometheus.port_for(base, rank)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:  # garbage, then hang up
            s.sendall(b"\x00\xff not http at all\r\n\r\n")
            reply = s.recv(2000)
            assert reply == b"" or b"400" in reply, reply  # refused (an HTTP/0.9 line: the page alone), or dropped
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:  # a request cut off mid-header
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 70000)
        with pytest.raises(urllib.error.HTTPError) as e:  # only GET
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x" * 1000,
                                                          method="POST"), timeout=5)
        assert e.value.code == 405
        got = scrape(port)
        st = status_mod.query(addr)  # after the scrape: its own STATUS message is one more in
        lab = {"server": str(rank)}
        assert one(got, "bosen_server_up", **lab) == 1
        assert one(got, "bosen_server_clock", **lab) == st["clock"] >= 3
        assert one(got, "bosen_server_clients_left", **lab) == 1 and st["client_clocks"] == ["left"]
        assert one(got, "bosen_server_table_rows", table="W", **lab) == st["tables"]["W"]["rows"] == 20
        assert one(got, "bosen_server_table_bytes", table="W", **lab) == st["tables"]["W"]["bytes"]
        assert one(got, "bosen_server_rows_applied_total", **lab) == st["rows_applied"] > 0
        assert one(got, "bosen_server_sent_bytes_total", **lab) == st["bytes_out"] > 0
        assert one(got, "bosen_server_received_messages_total", **lab) == st["msgs_in"] - 1
        assert one(got, "bosen_server_errors_total", **lab) == st["errors"] == 0  # HTTP never reached the loop
        assert one(got, "bosen_server_apply_lag_seconds_count", **lab) == st["apply_lag_ms"]["n"] > 0
        assert one(got, "bosen_server_partitions_owned", **lab) == st["partitions"]["owned"]
    assert config_mod.load(c.path).metrics.port == base
    for server in c.servers:  # a bad request is a log line at most
        assert "Traceback" not in server.tail(200), server.tail(200)


@pytest.mark.timeout(120)
def test_the_launcher_serves_the_job_and_every_server(bosen_cluster, tmp_path):
    c = bosen_cluster(2, workers=1, tables=TABLES)
    run_dir = tmp_path / "run"
    (run_dir / WORKER_RECORDS).mkdir(parents=True)
    (run_dir / WORKER_RECORDS / "0.jsonl").write_text("".join(
        json.dumps({"rank": 0, "clock": k, "time": 1.0 + k, "objective": 10.0 - k, "read_s": 0.25 * k,
                    "bytes_sent": 100 * k, "blocked_s": 0.5 * k, "blocked_reads": 2 * k}) + "\n" for k in range(3)))
    with (tmp_path / "metrics.jsonl").open("w") as out:
        merger = MetricsMerger(run_dir, 1, out)
        assert len(merger.poll()) == 3
        addresses = [*c.addresses, "127.0.0.1:1"]  # a third that nobody serves: reported down
        with exporter.serving(free_port_run(1), merger, 1, lambda: addresses, time.time() - 5) as endpoint:
            assert endpoint is not None
            got = scrape(endpoint.port)
    assert one(got, "bosen_job_clock") == 2 and one(got, "bosen_job_objective") == 8.0
    assert one(got, "bosen_job_read_seconds") == 0.5 and one(got, "bosen_job_sent_bytes") == 200
    assert one(got, "bosen_job_workers") == 1 and one(got, "bosen_job_elapsed_seconds") >= 5
    # per worker, its newest record: who holds the job back
    assert one(got, "bosen_worker_clock", rank="0") == 2
    assert one(got, "bosen_worker_blocked_seconds_total", rank="0") == 1.0
    assert one(got, "bosen_worker_blocked_reads_total", rank="0") == 4
    for rank in (0, 1):
        assert one(got, "bosen_server_up", server=str(rank)) == 1
        assert one(got, "bosen_server_table_rows", server=str(rank), table="W") == 20
    assert one(got, "bosen_server_up", server="2", address="127.0.0.1:1") == 0
    with exporter.serving(0, merger, 1, lambda: addresses, 0.0) as off:
        assert off is None


def test_take_back_from_is_a_gauge_where_the_server_takes_back_and_absent_where_it_does_not():
    """STATUS ``take_back_from`` is a clock: a gauge, never a counter; a server without a take-back log
    (None) exports none."""
    names = {m.name: m for m in prometheus.server_families({"clock": 25, "take_back_from": 20})}
    assert names["bosen_server_take_back_from"].type == "gauge"
    assert names["bosen_server_take_back_from"].samples[0].value == 20
    assert not [n for n in names if "take_back" in n and n != "bosen_server_take_back_from"]
    assert not [n for n in prometheus.server_families({"clock": 25, "take_back_from": None}) if "take_back" in n.name]
