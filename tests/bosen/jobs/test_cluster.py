"""Local clusters (bosen.jobs.cluster): free ports, servers that answer STATUS, failures that name the server."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import psutil
import pytest

from bosen import config as config_mod
from bosen.errors import BosenError, ConfigError
from bosen.jobs.cluster import (
    PORTS_ENV,
    PORTS_FROM,
    free_ports,
    local_addresses,
    port_range,
    resolve_ports,
    start_cluster,
)
from bosen.jobs.job import job_config
from bosen.jobs.supervise import ProcessFailed, ProcessGroup


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    for p in ports[:3]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
    # below the kernel's ephemeral range, where outgoing connections never take them (a test's server
    # once lost its port that way under load)
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first, end = port_range()
    if low >= 11000:
        assert all(PORTS_FROM <= first <= p < end <= low for p in ports), ports


def test_bosen_ports_sets_where_free_ports_are_drawn_and_a_bad_range_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORTS_ENV, "23000-24500")
    assert port_range() == (23000, 24500)
    assert all(23000 <= p < 24500 for p in free_ports(30))
    for bad in ("23000", "24500-23000", "a-b", "80-2000"):
        monkeypatch.setenv(PORTS_ENV, bad)
        with pytest.raises(BosenError, match=r"\$BOSEN_PORTS: .*" + bad):
            free_ports(1)


def test_port_zero_becomes_free_local_ports_and_only_for_local_hosts() -> None:
    got = local_addresses(["127.0.0.1:0", "localhost:0", "127.0.0.1:0", "10.0.0.5:7000"])
    assert got[3] == "10.0.0.5:7000" and got[1].startswith("localhost:")
    assert len({a for a in got}) == 4 and not any(a.endswith(":0") for a in got)
    with pytest.raises(BosenError, match=r"cluster.servers: port 0 .* only works for local hosts, not 10.0.0.5"):
        local_addresses(["10.0.0.5:0"])
    cfg = resolve_ports(config_mod.load(job_config(["127.0.0.1:0", "127.0.0.1:0"])))
    assert len(set(cfg.cluster.servers)) == 2 and not any(a.endswith(":0") for a in cfg.cluster.servers)


def test_a_started_cluster_answers_and_is_gone_after_stop(tmp_path: Path) -> None:
    with start_cluster(job_config([], workers=1), tmp_path, 2, name="c") as c:
        assert [s["address"] for s in c.status()] == c.addresses
        assert [p.name for p in c.servers] == ["c-server-0", "c-server-1"]
        assert c.path == tmp_path / "c.yaml" and config_mod.load(c.path).cluster.servers == tuple(c.addresses)
        pids = [p.pid for p in c.servers]
    assert all(gone(pid) for pid in pids)
    assert (tmp_path / "logs" / "c-server-0.log").exists()


@pytest.mark.slow
def test_a_server_that_cannot_start_is_named_with_its_log_and_nothing_is_left(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    group = ProcessGroup(tmp_path / "logs")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        job = job_config(["127.0.0.1:0", f"127.0.0.1:{port}"])
        with pytest.raises(ProcessFailed, match=r"job-server-1 exited with status 1 while starting\. Last log lines:"
                                                r"(.|\n)*Address already in use"):
            start_cluster(job, tmp_path, group=group, ready_timeout=30)
    assert len(group) == 2 and not any(p.alive() for p in group)


def test_a_bad_config_fails_before_any_server_starts(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path / "logs")
    with pytest.raises(ConfigError, match="consistency.staleness"):
        start_cluster(job_config([], staleness=-1), tmp_path, 1, group=group)
    assert len(group) == 0


@pytest.mark.slow
def test_stop_reports_a_server_that_died_but_not_one_stopped_on_purpose(tmp_path: Path) -> None:
    c = start_cluster(job_config([]), tmp_path, 3)
    try:
        assert c.stop_server(0) == 0
        assert c.stop_server(1, signal.SIGKILL) == -signal.SIGKILL
        c.check()  # both on purpose
        os.kill(c.servers[2].pid, signal.SIGKILL)
        c.servers[2].wait(10)
        with pytest.raises(ProcessFailed, match="job-server-2 was killed by SIGKILL while its cluster was running"):
            c.check()
    finally:
        with pytest.raises(ProcessFailed) as e:
            c.stop()
    assert "job-server-2 was killed by SIGKILL" in str(e.value) and "server-0" not in str(e.value)
    assert "server-1" not in str(e.value)


def test_a_server_that_ignores_sigterm_is_killed_and_reported(tmp_path: Path) -> None:
    c = start_cluster(job_config([]), tmp_path, 1)
    server = psutil.Process(c.servers[0].pid)
    server.suspend()  # a stopped process cannot act on SIGTERM
    with pytest.raises(ProcessFailed, match=r"job-server-0 did not exit within 0.5s of SIGTERM and was killed"):
        c.stop(grace=0.5)
    assert c.servers[0].returncode == -signal.SIGKILL
