"""AdaRevision and versioning end to end: real server processes, real clients.

- No delay: adarevision equals adagrad bit for bit (float64), and both equal numpy AdaGrad.
- Controlled delays: two clients interleave reads, updates and clocks in a fixed order; the
  servers' state equals a plain numpy model of the rule (reference/adarevision.md) fed the same
  events, including updates retired by a newer version arriving while they were buffered.
- Snapshots do not leak: three clients with early pushes over many clocks; at every quiescent point
  the live snapshot count is back at its floor (0) and every held version is released at the end.
- Servers join and leave mid-job (partitions move): the same controlled schedule stays equal to the
  model, with updates tagged with versions read from a row's old server applied on its new one.
- The cap: above max_snapshots the server holds budgeted pushes back and resumes once freed.
- A user-defined procedure loaded by import path from the YAML; MF with AdaRevision from its YAML.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from conftest import PY, REPO, TESTS, run_cmd, wait_until

from bosen.client import Client
from bosen.config import load
from bosen.jobs import moves

pytestmark = pytest.mark.timeout(300)



class Ref:
    """reference/adarevision.md in numpy, row by row."""

    def __init__(self, x0: np.ndarray, alpha: float) -> None:
        self.alpha = alpha
        self.x = x0.astype(np.float64).copy()
        self.z = np.ones_like(self.x)
        self.zmax = np.ones_like(self.x)
        self.gsum = np.zeros_like(self.x)
        self.delayed = 0  # updates applied with a non-zero backlog

    def apply(self, r: int, g: np.ndarray, gsum_old: np.ndarray) -> None:
        g_bck = self.gsum[r] - gsum_old
        self.delayed += bool(np.any(g_bck != 0))
        eta_old = self.alpha / np.sqrt(self.zmax[r])
        self.z[r] = self.z[r] + g * g + 2.0 * g * g_bck
        self.zmax[r] = np.maximum(self.z[r], self.zmax[r])
        eta = self.alpha / np.sqrt(self.zmax[r])
        self.x[r] = self.x[r] - eta * g + (eta_old - eta) * g_bck
        self.gsum[r] = self.gsum[r] + g


def table_stats(c, name: str) -> list[dict]:
    return [s["tables"][name] for s in c.status(timeout=30)]


# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_no_delay_adarevision_equals_adagrad_exactly(bosen_cluster):
    rows, cols, alpha = 9, 5, 0.3
    t = {"rows": rows, "cols": cols, "dtype": "float64", "init": {"normal": 0.5, "seed": 4}}
    c = bosen_cluster(2, 1, staleness=0, read_timeout_s=60, tables={
        "A": {**t, "update": "adarevision", "update_args": {"alpha": alpha}},
        "G": {**t, "update": "adagrad", "update_args": {"alpha": alpha}}})
    client = Client.connect(c.path)
    rng = np.random.default_rng(1)
    try:
        A, G = client.table("A"), client.table("G")
        everything = np.arange(rows)
        x, xg = A.get_rows(everything), G.get_rows(everything)  # (initial values differ per table)
        z = np.ones_like(x)
        for step in range(40):
            xa = A.get_rows(everything)  # BSP: the fresh value, at the row's current version
            np.testing.assert_array_equal(xa, x)
            np.testing.assert_array_equal(G.get_rows(everything), xg)
            g = np.zeros_like(x)  # what the client's buffer holds at the end of the tick
            if step % 2:  # dense gradients of a quadratic, on some rows
                sel = np.sort(rng.choice(rows, size=4, replace=False))
                gs = xa[sel] - 1.0 + 0.1 * rng.standard_normal((4, cols))
                A.inc_rows(sel, gs)
                G.inc_rows(sel, gs)
                g[sel] = gs
            else:  # single coordinates (sent as CSR), with repeats that the buffer coalesces
                sel = rng.choice(rows, size=3)
                cc = rng.choice(cols, size=3)
                gs = rng.standard_normal(3) * 10
                A.inc_rows(sel, gs, cols=cc)
                G.inc_rows(sel, gs, cols=cc)
                np.add.at(g, (sel, cc), gs)
            client.clock()
            z = z + g * g
            x = x - alpha / np.sqrt(z) * g
            xg = xg - alpha / np.sqrt(z) * g
        np.testing.assert_array_equal(A.get_rows(everything), x)
        np.testing.assert_array_equal(G.get_rows(everything), xg)
        assert all(s["errors"] == 0 for s in client.server_status())
    finally:
        client.close()
    for s in table_stats(c, "A"):
        assert (s["snapshots"], s["versions_held"], s["release_errors"]) == (0, 0, 0)


class TwoClients:
    """Clients 0 and 1 on one AdaRevision table, driven one event at a time, beside a model.

    The model knows what each client holds (x and ḡ of the version it last received), what each
    has buffered (summed gradient and the ḡ of the version it is tagged with), and the servers'
    clock. Pushes happen when the slower client clocks; a client that is ahead and has buffered
    updates then gets a newer version and must send them at once (retired, end-of-version): the
    model applies them right after the push, as the servers do. After every event the test waits
    until the servers have applied it, so the order is fixed.
    """

    def __init__(self, cluster_, rows: int, cols: int, alpha: float, n_servers: int = 2,
                 storage: str = "dense", **job) -> None:
        self.c = cluster_(n_servers, 2, staleness=1000, read_timeout_s=60, **job, tables={"V": {
            "rows": rows, "cols": cols, "dtype": "float64", "init": {"normal": 1.0, "seed": 9},
            "update": "adarevision", "update_args": {"alpha": alpha}, "storage": storage}})
        self.clients = [Client.connect(self.c.path, rank=i) for i in range(2)]
        self.T = [cl.table("V") for cl in self.clients]
        self.rows, self.cols = rows, cols
        everything = np.arange(rows)
        x0 = self.T[0].get_rows(everything)
        np.testing.assert_array_equal(self.T[1].get_rows(everything), x0)
        self.ref = Ref(x0, alpha)
        self.held_x = [x0.copy(), x0.copy()]
        self.held_g = [np.zeros((rows, cols)), np.zeros((rows, cols))]
        self.buffered: list[dict[int, list[np.ndarray]]] = [{}, {}]
        self.tick = [0, 0]
        self.clock = 0
        self.dirty: set[int] = set()

    def inc(self, k: int, rows: np.ndarray, rng: np.random.Generator) -> None:
        vals = self.T[k].get_rows(rows)
        np.testing.assert_array_equal(vals, self.held_x[k][rows])  # the client sees what the model says
        g = np.sin(3.0 * vals) + 0.5 * rng.standard_normal(vals.shape)  # a "gradient" at what it read
        self.T[k].inc_rows(rows, g)
        for i, r in enumerate(rows):
            if r in self.buffered[k]:
                self.buffered[k][r][0] = self.buffered[k][r][0] + g[i]
            else:
                self.buffered[k][r] = [g[i].copy(), self.held_g[k][r].copy()]

    def do_clock(self, k: int) -> None:
        cl = self.clients[k]
        cl.clock()
        cl.server_status()  # its INC and CLOCK have been applied by every server
        for r in sorted(self.buffered[k]):
            self.ref.apply(r, *self.buffered[k][r])
            self.dirty.add(r)
        self.buffered[k] = {}
        self.tick[k] += 1
        if min(self.tick) > self.clock:  # the servers' clock moves: changed rows go to both clients
            self.clock = min(self.tick)
            pushed, self.dirty = sorted(self.dirty), set()
            for j in range(2):
                for r in pushed:
                    self.held_x[j][r] = self.ref.x[r]
                    self.held_g[j][r] = self.ref.gsum[r]
            for j in range(2):  # buffered updates of a row that moved are retired, in push order
                for r in pushed:
                    if r in self.buffered[j]:
                        self.ref.apply(r, *self.buffered[j].pop(r))
                        self.dirty.add(r)
            for cl in self.clients:
                assert wait_until(lambda cl=cl: min(cl.stats()["server_clocks"]) >= self.clock, timeout=30)
            for cl in self.clients:
                cl.server_status()  # retired updates and releases have been applied

    def close(self) -> None:
        for cl in self.clients:
            cl.close()


@pytest.mark.parametrize("seed, one_row_messages, storage", [(0, False, "dense"), (1, True, "dense"),
                                                            (0, False, "sparse")])
@pytest.mark.slow
def test_controlled_delays_match_the_numpy_rule(bosen_cluster, monkeypatch, seed, one_row_messages, storage):
    """(Also on a sparse table: the servers store the rows as the clients first touch them.)"""
    if one_row_messages:  # every update message carries one row: order across messages matters
        monkeypatch.setattr("bosen.client.oplog.CHUNK_BYTES", 8)
    rng = np.random.default_rng(seed)
    m = TwoClients(bosen_cluster, rows=5, cols=3, alpha=0.3, storage=storage)
    try:
        for step in range(60):
            k = int(rng.integers(2)) if step % 7 else int(np.argmax(m.tick))  # the faster one, now and then
            if rng.random() < 0.55:
                m.inc(k, np.sort(rng.choice(5, size=int(rng.integers(1, 6)), replace=False)), rng)
            else:
                m.do_clock(k)
        # drain: both flush and catch up; then a clock each pushes the last changes to both
        while m.tick[0] != m.tick[1] or m.buffered[0] or m.buffered[1]:
            m.do_clock(int(np.argmin(m.tick)))
        while m.dirty:
            m.do_clock(0)
            m.do_clock(1)
        retired = sum(cl._state("V").vlog.retired_rows for cl in m.clients)
        print(f"retired rows {retired}, delayed updates {m.ref.delayed}, clocks {m.clock}")
        assert retired > 0 and m.ref.delayed > 10  # the schedule did exercise delays and retirement
        for k in range(2):
            np.testing.assert_array_equal(m.T[k].get_rows(np.arange(5)), m.ref.x)
        tabs = table_stats(m.c, "V")
        assert sum(t["snapshots"] for t in tabs) == 0 and sum(t["snapshots_peak"] for t in tabs) > 0
    finally:
        m.close()
    for t in table_stats(m.c, "V"):
        assert (t["snapshots"], t["versions_held"], t["release_errors"]) == (0, 0, 0)


@pytest.mark.timeout(120)
def test_servers_join_and_leave_mid_job_and_the_table_equals_the_numpy_rule(bosen_cluster, monkeypatch):
    """The controlled schedule above while a third server joins (taking partitions from both) and later
    leaves again (handing them back), each at a point where clients hold versions that rows have since
    moved past (live snapshots) and have updates buffered against them: those updates, sent after the
    move, reach the rows' new servers, which find the old versions' ḡ there. During the join one client
    clocks (after the old owners exported their rows, before the new map): its tagged updates wait for
    the new map. The table stays equal to the numpy model bit for bit (events apply in the model's order)."""
    rng = np.random.default_rng(4)
    m = TwoClients(bosen_cluster, rows=12, cols=3, alpha=0.3, partitions=8)
    cfg = load(m.c.path)
    servers = list(cfg.cluster.servers)
    moved, during = [], []
    start = np.arange(8) % 2
    joining = {r for r in range(12) if moves.balanced(start, 3)[r % 8] != start[r % 8]}

    def clock_while_paused() -> None:  # the ahead client: the servers' clock stays where it is
        k = int(np.argmax(m.tick))
        sender = m.clients[k]._comm.sender
        during.append(threading.Thread(target=m.clients[k].clock))
        during[0].start()
        assert wait_until(lambda: sender._versioned_held, timeout=10)  # kept back, not sent to the old owner
        for r in sorted(m.buffered[k]):
            m.ref.apply(r, *m.buffered[k][r])
            m.dirty.add(r)
        m.buffered[k] = {}
        m.tick[k] += 1

    send = moves._Mover.send

    def send_hooked(self, j, op, *args, **kwargs):
        if op == "map" and not moved and not during:
            clock_while_paused()
        return send(self, j, op, *args, **kwargs)

    monkeypatch.setattr(moves._Mover, "send", send_hooked)
    try:
        added = m.c.add_server()
        step = 0
        while len(moved) < 2 or step < 36:
            k = int(rng.integers(2)) if step % 7 else int(np.argmax(m.tick))
            if rng.random() < 0.55:
                m.inc(k, np.sort(rng.choice(12, size=int(rng.integers(1, 8)), replace=False)), rng)
            else:
                m.do_clock(k)
            step += 1
            ahead = set(m.buffered[int(np.argmax(m.tick))])  # its rows of partitions that move, if it joins
            if step >= 10 * (len(moved) + 1) and len(moved) < 2 and (moved or ahead & joining) \
                    and sum(t["snapshots"] for t in table_stats(m.c, "V")) > 0:
                moved.append(moves.scale_servers(cfg, [*servers, added] if not moved else servers, timeout=30))
                if len(moved) == 1:
                    during[0].join(timeout=10)
                    for cl in m.clients:
                        cl.server_status()
                else:
                    m.c.retired(2)
        while m.tick[0] != m.tick[1] or m.buffered[0] or m.buffered[1]:
            m.do_clock(int(np.argmin(m.tick)))
        while m.dirty:
            m.do_clock(0)
            m.do_clock(1)
        assert [r.moved for r in moved] == [2, 2] and m.ref.delayed > 10
        for k in range(2):
            np.testing.assert_array_equal(m.T[k].get_rows(np.arange(12)), m.ref.x)
    finally:
        m.close()
    for s in m.c.status(timeout=30):
        t = s["tables"]["V"]
        assert (t["snapshots"], t["versions_held"], t["release_errors"], s["errors"]) == (0, 0, 0, 0)
        assert s["partitions"]["owned"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["dense", "sparse"])
def test_snapshots_return_to_their_floor_over_many_clocks_with_several_clients(bosen_cluster, storage):
    """Three clients read, update and clock in rounds, with early (budgeted) pushes on both sides,
    so versions move mid-tick and buffered updates get retired. Whenever every client has clocked
    and the pushes and releases have landed, no snapshot copy is live; at the end none is held.
    (A sparse table's servers grow their shards as rows are first touched, snapshots live.)"""
    n, rows, cols = 3, 40, 4
    c = bosen_cluster(2, n, staleness=2, read_timeout_s=60,
                      comm={"client_bandwidth_mbps": 50, "server_bandwidth_mbps": 50, "client_send_rows": 5,
                      "server_push_rows": 5, "priority": "random"},
                tables={"V": {"rows": rows, "cols": cols, "dtype": "float32", "init": {"normal": 1.0},
                              "update": "adarevision", "update_args": {"alpha": 0.1}, "storage": storage}})
    clients = [Client.connect(c.path, rank=i) for i in range(n)]
    rng = np.random.default_rng(3)
    floors, peaks = [], 0
    try:
        T = [cl.table("V") for cl in clients]
        for t in range(40):
            for k in range(n):
                sel = np.sort(rng.choice(rows, size=12, replace=False))
                x = T[k].get_rows(sel)
                T[k].inc_rows(sel, (x - 0.5).astype(np.float32))
                time.sleep(0.002)  # let early sends and pushes interleave
            for cl in clients:
                cl.clock()
            for cl in clients:
                assert wait_until(lambda cl=cl, t=t: min(cl.stats()["server_clocks"]) >= t + 1, timeout=30)
            for cl in clients:
                cl.server_status()  # everything each client sent (updates, releases) is applied
            tabs = table_stats(c, "V")
            floors.append(sum(s["snapshots"] for s in tabs))
            peaks = max(peaks, sum(s["snapshots_peak"] for s in tabs))
            held = sum(s["versions_held"] for s in tabs)
            assert held <= n * rows  # one version per client and row at most
        retired = sum(cl._state("V").vlog.retired_rows for cl in clients)
        early = sum(s["rows_pushed_budgeted"] for s in c.status(timeout=30))
    finally:
        for cl in clients:
            cl.close()
    assert floors == [0] * len(floors), floors
    assert peaks > 0 and early > 0, (peaks, early)
    print(f"peak snapshots {peaks}, rows retired {retired}, rows pushed early {early}")
    for s in c.status(timeout=30):
        t = s["tables"]["V"]
        assert (t["snapshots"], t["versions_held"], t["release_errors"], s["errors"]) == (0, 0, 0, 0)


@pytest.mark.slow
def test_snapshot_cap_pauses_budgeted_pushes_and_resumes_them(bosen_cluster):
    rows = 6
    c = bosen_cluster(1, 2, staleness=10, read_timeout_s=60,
                      comm={"client_bandwidth_mbps": 100, "server_bandwidth_mbps": 100},
                      tables={"V": {"rows": rows, "cols": 2, "dtype": "float32", "update": "adarevision",
                              "update_args": {"alpha": 0.1, "max_snapshots": 2}}})
    a, b = Client.connect(c.path, rank=0), Client.connect(c.path, rank=1)
    try:
        A, B = a.table("V"), b.table("V")
        va = a._state("V").vlog
        everything = np.arange(rows)
        A.get_rows(everything)
        B.get_rows(everything)
        A.inc_rows(everything, np.ones((rows, 2)))
        a.clock()
        b.clock()
        assert wait_until(lambda: (va.version == 1).all() and (b._state("V").vlog.version == 1).all(), timeout=30)
        b.server_status()
        a.server_status()
        s0 = c.status()[0]
        assert s0["tables"]["V"]["snapshots"] == 0
        # B (ahead) changes every row both clients hold at version 1: 6 copies > cap 2
        B.inc_rows(everything, np.ones((rows, 2)))
        b.clock()
        b.server_status()
        s1 = c.status()[0]
        assert s1["tables"]["V"]["snapshots"] == rows
        time.sleep(0.5)  # budgeted pushes would have gone out by now
        s2 = c.status()[0]
        assert s2["push_holds"] > s1["push_holds"]
        assert s2["rows_pushed_budgeted"] == s1["rows_pushed_budgeted"]
        assert (va.version == 1).all()  # A still holds the old version: nothing was pushed early
        # A's clock moves the servers' clock: the clock push (never held back) brings version 2,
        # both clients release version 1, the copies are freed and budgeted pushes resume
        a.clock()
        assert wait_until(lambda: (va.version == 2).all(), timeout=30)
        a.server_status()
        b.server_status()
        assert c.status()[0]["tables"]["V"]["snapshots"] == 0
        B.inc_rows(everything[:1], np.ones((1, 2)))  # one held row changes: 1 copy, within the cap
        b.clock()  # b is ahead: no clock push; only a budgeted push can bring row 0 to A
        assert wait_until(lambda: va.version[0] == 3, timeout=10)
        s3 = c.status()[0]
        assert s3["rows_pushed_budgeted"] > s2["rows_pushed_budgeted"]
        assert a._comm.counters["rows_pushed_early_to_us"] >= 1
    finally:
        a.close()
        b.close()
    t = c.status()[0]["tables"]["V"]
    assert (t["snapshots"], t["versions_held"], t["release_errors"]) == (0, 0, 0)


@pytest.mark.slow
def test_user_procedure_from_an_import_path_in_the_yaml(bosen_cluster, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TESTS / "procs"))  # the servers import userprocs from here
    c = bosen_cluster(2, 1, staleness=0, read_timeout_s=60, tables={
        "W": {"rows": 5, "cols": 3, "dtype": "float32", "update": "userprocs:ScaledAdd",
              "update_args": {"scale": 3.0}}})
    client = Client.connect(c.path)
    try:
        W = client.table("W")
        assert (W.update, W.read_my_writes, W.versioned) == ("userprocs:ScaledAdd", False, False)
        W.get_rows(np.arange(5))
        W.inc_rows(np.array([0, 3]), np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32))
        W.inc(4, 1, 0.5)
        assert W.get_row(0).tolist() == [0, 0, 0]  # the cache does not show its own writes
        client.clock()
        got = W.get_rows(np.arange(5))
        np.testing.assert_array_equal(got, [[3, 6, 9], [0, 0, 0], [0, 0, 0], [12, 15, 18], [0, 1.5, 0]])
        stats = client.server_status()
        assert [s["tables"]["W"]["procedure"] for s in stats] == ["ScaledAdd"] * 2
        assert sum(s["tables"]["W"]["applied_rows"] for s in stats) == 3
    finally:
        client.close()


@pytest.mark.slow
def test_mf_runs_with_adarevision_on_L_and_R_from_its_yaml(tmp_path):
    run_dir = tmp_path / "run"
    sets = ["tables.L.rows=1500", "tables.R.rows=400", "tables.L.cols=8", "tables.R.cols=8",
            "app.args.nnz=30000", "app.args.epochs=8", "app.args.clocks_per_epoch=4"]
    cmd = [PY, "-m", "bosen", "launch", REPO / "configs" / "mf-adarev.yaml", "--run-dir", run_dir, "--quiet",
           "--no-plot", "--timeout", "200"]
    for s in sets:
        cmd += ["--set", s]
    r = run_cmd(cmd, timeout=260)
    assert r.returncode == 0, r.stdout + r.stderr
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    clocks = sorted((x for x in recs if x["kind"] == "clock"), key=lambda x: x["clock"])
    assert len(clocks) == 32
    epochs = [sum(x["objective"] for x in clocks[e * 4:(e + 1) * 4]) for e in range(8)]
    assert epochs[-1] < 0.2 * epochs[0], epochs
    servers = [x for x in recs if x["kind"] == "server"]
    assert len(servers) == 2
    for s in servers:
        assert s["errors"] == 0
        for name in ("L", "R"):
            t = s["tables"][name]
            assert t["procedure"] == "adarevision"
            assert (t["snapshots"], t["versions_held"], t["release_errors"]) == (0, 0, 0)


def test_mf_gradient_kernel_matches_numpy():
    from bosen.apps.mf.kernels import grad_pass

    rng = np.random.default_rng(0)
    nu, ni, k, n, reg = 7, 5, 4, 40, 0.05
    u, i = rng.integers(nu, size=n), rng.integers(ni, size=n)
    r = rng.standard_normal(n).astype(np.float32)
    L = rng.standard_normal((nu, k)).astype(np.float32)
    R = rng.standard_normal((ni, k)).astype(np.float32)
    gL, gR = np.zeros_like(L), np.zeros_like(R)
    loss = grad_pass(u, i, r, L, R, reg, gL, gR)
    e = r.astype(np.float64) - np.einsum("ij,ij->i", L[u], R[i]).astype(np.float64)
    wL, wR = np.zeros((nu, k)), np.zeros((ni, k))
    np.add.at(wL, u, reg * L[u] - e[:, None] * R[i])
    np.add.at(wR, i, reg * R[i] - e[:, None] * L[u])
    np.testing.assert_allclose(loss, (e ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(gL, wL, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gR, wR, rtol=1e-4, atol=1e-4)
