"""CURVE security (bosen/security.py, issue 32 points 1 and 4): key files, the ``security`` config
section, and real servers that admit only listed client keys.

On loopback a config can force CURVE on (``security.mode: on``), so everything here runs as it would
across machines: a listed client trains exactly, an unlisted one is refused at once with a message
naming the server, and hostile peers (wrong keys, plaintext, garbage bytes) change nothing.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import stat
import sys
import threading
import time

import numpy as np
import pytest
import zmq
from conftest import PY, WORKERS, job_config, launch_job, run_cmd, worker, write_config

from bosen import config as config_mod
from bosen import security, wire
from bosen.client import Client
from bosen.errors import ConfigError
from bosen.jobs import moves
from bosen.jobs import status as status_mod
from bosen.jobs.jobview import JobView
from bosen.security import KeyFileError, Refused, Security
from bosen.wire import Msg

sys.path.insert(0, str(WORKERS))
import exact_worker as ew  # noqa: E402  (tests/workers is not a package)


@pytest.fixture
def keys(tmp_path):
    """server.key(+_secret), client-0 (listed) and client-1 (made, but not listed)."""
    security.make_keys(tmp_path / "keys", clients=2)
    k = tmp_path / "keys"
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "client-0.key").write_text((k / "clients" / "client-0.key").read_text())
    return k, allowed


def secure(k, allowed, client: int = 0) -> dict:
    return {"mode": "on", "server_key": str(k / "server.key"), "client_key": str(k / f"client-{client}.key_secret"),
            "allowed_clients": [str(allowed)]}


# -- key files and the config section --------------------------------------------------------------


def test_bosen_keys_makes_loadable_pairs_with_private_secrets(tmp_path):
    files = security.make_keys(tmp_path / "k", clients=3)
    assert len(files) == 8
    for f in files:
        public, secret = security.load_key_file(f, secret=f.name.endswith("_secret"))
        if f.name.endswith("_secret"):
            assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
            assert secret is not None and zmq.curve_public(secret) == public
        # ZeroMQ's own reader agrees with ours (the format is ZeroMQ's certificate)
        assert zmq.auth.load_certificate(f)[0] == public
    assert len(security.load_allowed([str(tmp_path / "k" / "clients")])) == 3
    with pytest.raises(Exception, match="never overwritten"):
        security.make_keys(tmp_path / "k", clients=1)


def test_malformed_key_files_are_errors_naming_the_file(tmp_path):
    security.make_keys(tmp_path, clients=1)
    bad = tmp_path / "bad.key"
    cases = {
        "no public-key line": "hello\n",
        "not a 40-character Z85 key": 'curve\n    public-key = "abc"\n',
        "not valid Z85": 'curve\n    public-key = "' + "~" * 40 + '"\n',
    }
    for why, text in cases.items():
        bad.write_text(text)
        with pytest.raises(KeyFileError, match=f"{bad}: .*{why}"):
            security.load_key_file(bad, secret=False)
    with pytest.raises(KeyFileError, match="holds no secret-key"):
        security.load_key_file(tmp_path / "server.key", secret=True)
    other = (tmp_path / "clients" / "client-0.key").read_text().split('public-key = "')[1][:40]
    mixed = (tmp_path / "server.key_secret").read_text().replace(
        (tmp_path / "server.key").read_text().split('public-key = "')[1][:40], other)
    bad.write_text(mixed)
    with pytest.raises(KeyFileError, match="does not belong"):
        security.load_key_file(bad, secret=True)
    with pytest.raises(KeyFileError, match="cannot read key file"):
        security.load_key_file(tmp_path / "missing.key", secret=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(KeyFileError, match="no \\*.key files"):
        security.load_allowed([str(tmp_path / "empty")])


def test_security_section_defaults_paths_and_errors(tmp_path):
    loop = job_config(["127.0.0.1:9600"])
    cfg = config_mod.load(loop)
    assert not security.required(cfg) and Security.load(cfg, "client") is None
    assert security.describe(cfg) == "security: off (loopback only)"
    assert "security" not in cfg.to_dict()
    for host in ("127.0.0.1", "localhost", "[::1]", "127.0.1.1"):
        assert security.is_loopback(host), host
    for host in ("10.0.0.1", "example.org", "0.0.0.0"):
        assert not security.is_loopback(host), host

    far = job_config(["10.0.0.1:9600", "127.0.0.1:9601"])
    cfg = config_mod.load(far)
    assert security.required(cfg)
    for role, key in (("server", "server_key"), ("client", "server_key")):
        with pytest.raises(ConfigError, match=f"security.{key}: required.*bosen keys"):
            Security.load(cfg, role)
    security.make_keys(tmp_path / "keys", clients=1)
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({**far, "security": {"server_key": "keys/server.key",
                                                    "client_key": "keys/client-0.key_secret",
                                                    "allowed_clients": "keys/clients"}}))
    cfg = config_mod.load(path)
    assert cfg.security.server_key == str(tmp_path / "keys" / "server.key")  # relative to the config file
    assert cfg.security.allowed_clients == (str(tmp_path / "keys" / "clients"),)
    assert config_mod.load(cfg.to_dict()).security == cfg.security  # the run directory's copy
    srv, cli = Security.load(cfg, "server"), Security.load(cfg, "client")
    assert srv is not None and cli is not None and srv.server_public == cli.server_public
    assert cli.client_public in srv.allowed
    with pytest.raises(ConfigError, match=f"{path}: security: .*server.key_secret: cannot read"):
        Security.load(config_mod.load(path, [("security.server_key", str(tmp_path / "server.key"))]), "server")
    with pytest.raises(ConfigError, match="security.strength: unknown key"):
        config_mod.load({**far, "security": {"strength": 1}})
    with pytest.raises(ConfigError, match="security.mode: 'yes' is not one of"):
        config_mod.load({**far, "security": {"mode": "yes"}})
    assert not security.required(config_mod.load({**far, "security": {"mode": "off"}}))
    # a launcher that starts every process (bosen launch --ray) makes keys for a job that names none
    made = security.job_keys(config_mod.load(far), tmp_path / "run" / "keys")
    assert made.security.client_key == str(tmp_path / "run" / "keys" / "client-0.key_secret")
    assert Security.load(made, "client").client_public in Security.load(made, "server").allowed
    assert security.job_keys(cfg, tmp_path / "other") is cfg and not (tmp_path / "other").exists()
    loop_cfg = config_mod.load(loop)
    assert security.job_keys(loop_cfg, tmp_path / "other") is loop_cfg


# -- real servers ------------------------------------------------------------------------------------


class Tap:
    """A TCP relay between one client and a server that keeps what the client sent (to replay it)
    and, once ``tamper`` is set, flips a bit in every chunk it passes on to the server."""

    def __init__(self, server: str) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.server = server
        self.sent = bytearray()
        self.tamper = threading.Event()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        client, _ = self.listener.accept()
        host, port = self.server.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        pair = {client: upstream, upstream: client}
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select(list(pair), [], [], 0.05)
                for s in ready:
                    data = s.recv(1 << 16)
                    if not data:
                        return
                    if s is client:
                        self.sent += data
                        if self.tamper.is_set():
                            data = data[:-1] + bytes([data[-1] ^ 1])
                    pair[s].sendall(data)
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.listener.close()


def _status_via(ctx: zmq.Context, address: str, sec: Security, seq: int) -> zmq.Socket:
    """A CURVE DEALER at ``address`` that sent one STATUS (seq ``seq``)."""
    d = security.client_socket(ctx, zmq.DEALER, sec)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(f"tcp://{address}")
    d.send_multipart(wire.encode({"t": Msg.STATUS, "s": seq}))
    return d



def _refused_within(start: float, err: BaseException, addresses: list[str], limit: float = 1.0) -> None:
    """Refused within ``limit`` seconds, by a message that names the server (whichever refused first)."""
    took = time.monotonic() - start
    assert took < limit, f"refused after {took:.2f}s"
    assert any(f"server at {a}" in str(err) for a in addresses), err


@pytest.mark.timeout(90)
def test_listed_clients_train_exactly_and_everyone_else_is_refused(bosen_cluster, bosen_procs, tmp_path, keys):
    """One secure cluster: hostile peers first (each refused at once, naming the server, the refused
    key logged once), then a listed job of two worker processes whose final integer table is exactly
    the schedule's sums (what tests/client/test_exactness.py gets without security)."""
    k, allowed = keys
    procs, ticks, seed = 2, 4, 1
    data = job_config([], procs + 1, tables={"I": {"rows": ew.ROWS, "cols": procs + 1, "dtype": "int64"},
                                             "F": {"rows": ew.ROWS, "cols": procs + 1, "dtype": "float32"}},
                      staleness=1, read_timeout_s=30)
    data["security"] = secure(k, allowed)
    c = bosen_cluster(2, config=data)
    s0 = c.addresses[0]
    cfg = config_mod.load(c.path)
    before = c.status()
    assert all(s["security"] == {"curve": True, "refused": 0} for s in before)

    # an unlisted client key: Client.connect and a status query are refused at once, naming the server
    unlisted = [("security.client_key", str(k / "client-1.key_secret"))]
    for _ in range(2):
        t0 = time.monotonic()
        with pytest.raises(Refused, match="refused this client's public key") as e:
            Client.connect(c.path, overrides=unlisted, rank=procs)
        _refused_within(t0, e.value, c.addresses)
    t0 = time.monotonic()
    with pytest.raises(Refused, match="allowed_clients") as e:
        status_mod.query(s0, security=Security.load(config_mod.load(c.path, unlisted), "client"))
    _refused_within(t0, e.value, c.addresses)
    r = run_cmd([PY, "-m", "bosen", "status", c.path, "--set", f"security.client_key={k / 'client-1.key_secret'}"],
                timeout=30)
    assert r.returncode == 1 and "DOWN" in r.stdout and "refused this client's public key" in r.stdout, r.stdout
    # the wrong server key (the server cannot read our hello), and a plaintext client
    t0 = time.monotonic()
    with pytest.raises(Refused, match="server_key is not that server's public key") as e:
        Client.connect(c.path, overrides=[("security.server_key", str(k / "clients" / "client-1.key"))], rank=procs)
    _refused_within(t0, e.value, c.addresses)
    t0 = time.monotonic()
    with pytest.raises(Refused, match="CURVE and the other without|without CURVE") as e:
        Client.connect(c.path, overrides=[("security.mode", "off")], rank=procs)
    _refused_within(t0, e.value, c.addresses)
    # a plaintext DEALER's well-formed INC and raw garbage bytes: nothing reaches the server's handlers
    ctx = zmq.Context()
    try:
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(f"tcp://{s0}")
        raw.send_multipart(wire.encode({"t": Msg.HELLO, "rank": 0, "fp": cfg.fingerprint(), "s": 1}))
        raw.send_multipart(wire.encode({"t": Msg.INC, "tb": 0, "n": 1, "dt": "int64", "sp": False, "s": 2},
                                       np.array([0], np.int64), np.full((1, procs + 1), 1000, np.int64)))
        assert not raw.poll(300), "a plaintext peer got an answer"
        raw.close(0)
    finally:
        ctx.term()
    host, port = s0.rsplit(":", 1)
    for junk in (os.urandom(4096), b"\xff" + b"\x00" * 8 + b"\x7f" + os.urandom(64)):
        with socket.create_connection((host, int(port)), timeout=2) as tcp:
            tcp.sendall(junk)
            time.sleep(0.05)
    # an encrypted session recorded on the wire: replayed whole on a new connection it gets nowhere
    # (the server's cookie is new), and bits flipped in a live session end that session
    listed = Security.load(cfg, "client")
    assert listed is not None
    ctx = zmq.Context()
    tap = Tap(s0)
    try:
        d = _status_via(ctx, tap.address, listed, 1)
        assert d.poll(5000), "no STATUS reply through the tap"
        d.recv_multipart()
        recorded = bytes(tap.sent)
        tap.tamper.set()
        d.send_multipart(wire.encode({"t": Msg.STATUS, "s": 2}))
        assert not d.poll(300), "a tampered message was answered"
        d.close(0)
    finally:
        tap.close()
        ctx.term()
    with socket.create_connection((host, int(port)), timeout=2) as tcp:
        tcp.sendall(recorded)
        time.sleep(0.3)
    stats = c.status()
    # the messages it handled since: the tap's first STATUS and this one; nothing else reached it
    assert stats[0]["msgs_in"] == before[0]["msgs_in"] + 2, stats[0]
    assert stats[0]["errors"] == 0 and stats[0]["clients_joined"] == 0
    # two connects (each refused by one server at least: the first refusal ends it) and a query to server 0
    assert sum(x["security"]["refused"] for x in stats) >= 3 and stats[0]["security"]["refused"] >= 1
    refused_key = security.public_key_of(k / "client-1.key_secret")
    log = c.servers[0].output()
    assert log.count(refused_key) == 1, log[-3000:]

    # the listed workers: exact final tables, as without security
    reader = Client.connect(c.path, rank=procs)
    try:
        for _ in range(ticks + 2):
            reader.clock()
        ws = [worker(bosen_procs, "exact_worker.py", c.path, "--procs", procs, "--ticks", ticks, "--seed", seed,
                     "--max-sleep-ms", 2.0, "--result", tmp_path / f"r-{i}.json", name=f"exact-{i}")
              for i in range(procs)]
        codes = bosen_procs.wait_all(ws, timeout=60)
        assert codes == [0] * procs, "\n".join(f"{p.name} exit {p.returncode}:\n{p.tail()}" for p in ws)
        results = [json.loads((tmp_path / f"r-{i}.json").read_text()) for i in range(procs)]
        assert all(r["violation_count"] == 0 for r in results)
        want = np.zeros((ew.ROWS, procs + 1))
        for q in range(procs):
            for (tb, r, col), ups in ew.cell_updates(ew.schedule(seed, q, procs, ticks, 2.0), procs).items():
                if tb == "I":
                    want[r, col] += sum(v for _, v in ups)
        got = reader.table("I").get_rows(np.arange(ew.ROWS))
        np.testing.assert_array_equal(got, want.astype(np.int64))
        assert reader.stats()["direct_reads"] > 0  # the worker thread's own read sockets: CURVE clients too
        version, owner = moves.current_map(cfg)  # what a partition move asks first, with the job's keys
        assert version == 0 and sorted(set(owner.tolist())) == [0, 1]
        view = JobView(c.path)  # the dashboard's view of the job asks every server's STATUS with its keys
        try:
            snap = view.snapshot()
        finally:
            view.close()
        assert snap["down"] == [] and [s["live"] for s in snap["servers"]] == [True, True], snap["down"]
    finally:
        reader.close()
    assert all(s["errors"] == 0 for s in c.status())


@pytest.mark.timeout(120)
def test_bosen_keys_then_a_launched_job_runs_with_curve(tmp_path, capsys):
    """The README's steps on one machine: `bosen keys`, the printed security section, `bosen launch`
    (servers, workers and the launcher's own STATUS queries all CURVE clients of CURVE servers)."""
    from bosen.jobs import cli

    assert cli.main(["keys", str(tmp_path / "keys"), "--clients", "2"]) == 0
    out = capsys.readouterr().out
    assert "security:" in out and "allowed_clients" in out and "client-1.key_secret" in out
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 2},
           "consistency": {"staleness": 0, "read_timeout_s": 20},
           "tables": {"W": {"rows": 6, "cols": 2, "dtype": "int64"}},
           "app": {"module": "launch_worker", "args": {"ticks": 3}},
           "security": {"mode": "on", "server_key": "keys/server.key", "client_key": "keys/client-1.key_secret",
                        "allowed_clients": ["keys/clients"]}}
    path = write_config(tmp_path / "job.yaml", cfg)
    code, out = launch_job(path, "--run-dir", tmp_path / "run", timeout=100)
    assert code == 0, out
    assert "security: CURVE" in out and "security: off" not in out
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    clocks = [x for x in recs if x["kind"] == "clock"]
    assert [x["clock"] for x in clocks] == [0, 1, 2] and all(x["own_ok"] == 2 for x in clocks)
    # without keys the same job does not start: the launcher names the missing key (before any process)
    del cfg["security"]["client_key"]
    assert cli.main(["launch", str(write_config(tmp_path / "nokey.yaml", cfg)), "--run-dir",
                     str(tmp_path / "run2")]) == 2
    err = capsys.readouterr().err
    assert "nokey.yaml: security.client_key: required" in err and "bosen keys" in err, err


def test_a_loopback_job_bound_beyond_loopback_needs_a_security_decision():
    """``bosen-server --bind 0.0.0.0`` exposes a server whose config says loopback (security auto: off)."""
    from bosen.server.daemon import Server

    data = job_config(["127.0.0.1:9600"])
    with pytest.raises(ConfigError, match="--bind 0.0.0.0 listens beyond loopback.*security.mode: on"):
        Server(config_mod.load(data), 0, bind="0.0.0.0")
    Server(config_mod.load({**data, "security": {"mode": "off"}}), 0, bind="0.0.0.0")  # the user's choice
    Server(config_mod.load(data), 0, bind="127.0.0.1")


def _wait_log(proc, text: str, after: int, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        log = proc.output()[after:]
        if text in log:
            return log
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{log[-2000:]}"
        time.sleep(0.05)


def test_sighup_reloads_the_allowed_clients_and_a_bad_list_keeps_the_old(bosen_cluster, tmp_path, keys):
    """Clients added and revoked without a restart: after SIGHUP the server admits a newly listed key
    and refuses a removed one; a list that cannot be read is logged and the keys in use stay."""
    k, allowed = keys
    data = job_config([], 1, tables={"W": {"rows": 4, "cols": 2, "dtype": "int64"}})
    data["security"] = secure(k, allowed)
    c = bosen_cluster(1, config=data)
    proc, s0 = c.servers[0], c.addresses[0]
    as_client = {i: Security.load(config_mod.load(c.path, [("security.client_key", str(k / f"client-{i}.key_secret"))]),
                                   "client") for i in (0, 1)}
    with pytest.raises(Refused, match="allowed_clients"):
        status_mod.query(s0, security=as_client[1])
    # a malformed file in the list: the reload is refused and client-0 is still admitted
    (allowed / "bad.key").write_text("not a certificate\n")
    mark = len(proc.output())
    os.kill(proc.pid, signal.SIGHUP)
    _wait_log(proc, "not reloaded, the 1 keys in use stay", mark)
    assert status_mod.query(s0, security=as_client[0])["security"]["curve"]
    # client-1 listed, client-0 removed: SIGHUP turns them around
    (allowed / "bad.key").unlink()
    (allowed / "client-1.key").write_text((k / "clients" / "client-1.key").read_text())
    (allowed / "client-0.key").unlink()
    mark = len(proc.output())
    os.kill(proc.pid, signal.SIGHUP)
    _wait_log(proc, "1 keys (1 added, 1 removed", mark)
    client = Client.connect(c.path, overrides=[("security.client_key", str(k / "client-1.key_secret"))], rank=0)
    try:
        client.table("W").inc(0, 0, 5)
        client.clock()
        assert client.table("W").get(0, 0) == 5
    finally:
        client.close()
    with pytest.raises(Refused, match="allowed_clients"):
        status_mod.query(s0, security=as_client[0])
    assert proc.alive  # it served through every reload
