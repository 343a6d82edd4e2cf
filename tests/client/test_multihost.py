"""The service across a real, bandwidth-limited link between two network namespaces.

Server and workers live in different namespaces joined by a veth pair shaped with ``tc tbf``: no
loopback anywhere on the path. Needs root (CAP_NET_ADMIN) and iproute2; skipped otherwise. The
addresses belong to these test namespaces only and never leave the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import yaml
from conftest import PY, WORKERS, tail

from bosen.security import make_keys

pytestmark = pytest.mark.timeout(180)

LINK_MBIT = 20
PORT = 9600


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=20)


@pytest.fixture
def link(tmp_path):
    """Namespaces S (server) and C (clients) on a veth pair shaped to LINK_MBIT in each direction."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("needs root and iproute2 (ip, tc) for network namespaces")
    tag = f"{os.getpid() % 100000}"
    ns_s, ns_c, v_s, v_c = f"bos{tag}", f"boc{tag}", f"vbs{tag}", f"vbc{tag}"
    net = f"10.231.{os.getpid() % 250}"
    try:
        _run("ip", "netns", "add", ns_s)
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"cannot create network namespaces here: {getattr(e, 'stderr', e)}")
    try:
        _run("ip", "netns", "add", ns_c)
        _run("ip", "link", "add", v_s, "type", "veth", "peer", "name", v_c)
        _run("ip", "link", "set", v_s, "netns", ns_s)
        _run("ip", "link", "set", v_c, "netns", ns_c)
        for ns, dev, host in ((ns_s, v_s, 1), (ns_c, v_c, 2)):
            _run("ip", "-n", ns, "addr", "add", f"{net}.{host}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                 f"{LINK_MBIT}mbit", "burst", "32kbit", "latency", "400ms")
        yield {"server_ns": ns_s, "client_ns": ns_c, "server_ip": f"{net}.1", "tmp": tmp_path}
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot set up a shaped veth link here: {e.stderr}")
    finally:
        for ns in (ns_s, ns_c):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _in_ns(ns: str, args: list[str], log, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(WORKERS), *sys.path]))
    return subprocess.Popen(["ip", "netns", "exec", ns, *args], stdout=subprocess.PIPE, stderr=log, text=True,
                            env=env, **kw)


def _start_job(link, workers: int, comm: dict | None, tables: dict, staleness: int = 1, curve: bool = True):
    """The job's server in the server namespace. Its address is not loopback, so the job runs with
    CURVE (keys made here), unless ``curve`` is off (security.mode: off: what the link alone does)."""
    cfg = {"cluster": {"servers": [f"{link['server_ip']}:{PORT}"], "workers": workers},
           "consistency": {"staleness": staleness, "read_timeout_s": 60}, "tables": tables}
    if curve:
        keys = link["tmp"] / "keys"
        if not keys.exists():
            make_keys(keys, clients=1)
        cfg["security"] = {"server_key": str(keys / "server.key"), "client_key": str(keys / "client-0.key_secret"),
                           "allowed_clients": [str(keys / "clients")]}
    else:
        cfg["security"] = {"mode": "off"}
    if comm:
        cfg["comm"] = comm
    path = link["tmp"] / f"job{workers}-{bool(comm)}-{len(list(link['tmp'].iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = open(path.with_suffix(".server.log"), "w")
    server = _in_ns(link["server_ns"], [PY, "-m", "bosen.server", "--config", str(path), "--rank", "0"], log)
    return path, server, log


def _workers(link, path, n: int, *args: str) -> list[dict]:
    logs = [open(path.with_suffix(f".w{i}.log"), "w") for i in range(n)]
    procs = [_in_ns(link["client_ns"], [PY, str(WORKERS / "link_worker.py"), "--config", str(path), *args], lg)
             for lg in logs]
    out = []
    for p, lg in zip(procs, logs, strict=True):
        try:
            stdout, _ = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail(f"worker on the shaped link did not finish; log:\n{tail(lg.name)}")
        assert p.returncode == 0, f"worker failed ({p.returncode}):\n{tail(lg.name)}"
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _stop(server, log) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def test_job_runs_across_a_shaped_link_with_exact_sums(link):
    path, server, log = _start_job(link, 2, {"client_bandwidth_mbps": LINK_MBIT / 2},
                                   {"W": {"rows": 64, "cols": 16, "dtype": "int64"}}, staleness=0)
    try:
        out = _workers(link, path, 2, "--mode", "sum", "--ticks", "6")
        assert [o["values"] for o in out] == [[6 * (1 + 2)], [6 * (1 + 2)]]  # every cell, both workers
        status = subprocess.run(["ip", "netns", "exec", link["client_ns"], PY, "-m", "bosen", "status", str(path),
                                 "--json"], capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        st = json.loads(status.stdout)[0]
        assert st["clock"] >= 6 and st["rows_applied"] > 0 and st["errors"] == 0
        assert st["security"]["curve"]  # across the link, encrypted
    finally:
        _stop(server, log)


@pytest.mark.slow
def test_budget_at_link_rate_bounds_update_latency_where_a_flood_queues(link):
    tables = {"W": {"rows": 512, "cols": 256}}  # 1 KiB rows: 100-row sends of ~100 KiB
    results = {}
    for name, mbps in (("managed", LINK_MBIT * 0.9), ("flood", 1000)):
        path, server, log = _start_job(link, 1, {"client_bandwidth_mbps": mbps, "client_send_rows": 100,
                                                 "priority": "relative"}, tables, staleness=1000, curve=False)
        try:
            results[name] = _workers(link, path, 1, "--mode", "flood", "--seconds", "4")[0]
        finally:
            _stop(server, log)
    managed, flood = results["managed"], results["flood"]
    # at the link rate the queue stays short: latency is about one send's transmission time
    assert managed["acks"] > 10, results
    assert managed["ack_latency_ms_mean"] < 500, results
    # above it, messages pile up in front of the link and wait for seconds
    assert flood["ack_latency_ms_mean"] > 3 * managed["ack_latency_ms_mean"], results
    assert flood["ack_latency_ms_max"] > 1000, results
    print(json.dumps(results))
