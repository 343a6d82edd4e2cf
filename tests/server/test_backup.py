"""Tables with backup workers (server/backup.py) in real jobs: servers and worker processes over
loopback, round trips injected (bosen.apps.delays). Which gradients a step applied is checked from the
values themselves (tests/workers/backup_worker.py): nothing twice, nothing of a past iteration."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_until, worker

from bosen import checkpoint
from bosen.config import BackupConfig, CommConfig, TableConfig, load
from bosen.errors import ProtocolError
from bosen.jobs.job import job_config
from bosen.jobs.moves import scale_servers
from bosen.jobs.status import query
from bosen.partition import Partition
from bosen.server import procedures
from bosen.server.backup import BackupStep
from bosen.server.shard import TableShard
from bosen.wire import UpdateBatch

LR = 0.5


def _job(bosen_cluster, n: int, backup: dict, servers: int = 1) -> object:
    return bosen_cluster(servers, n, tables={"G": {"rows": 2, "cols": n + 1, "dtype": "float64", "backup": backup}})


def _status(c, server: int = 0) -> dict:
    return query(c.config["cluster"]["servers"][server])["tables"]["G"]["backup"]


@pytest.mark.slow
@pytest.mark.parametrize("servers", [1, 2])
def test_static_k_applies_the_first_k_gradients_of_each_iteration_once(bosen_cluster, bosen_procs, tmp_path,
                                                                       servers):
    """With two servers each decides for its own row (docs/design.md, "Backup workers", limitations):
    row 0's values follow the ranks its server took, row 1's the iterations its server took them in."""
    n, k, iters = 3, 2, 20
    c = _job(bosen_cluster, n, {"mode": "static", "k": k, "lr": LR}, servers)
    out = tmp_path / "final.npy"
    ps = [worker(bosen_procs, "backup_worker.py", c.path, "--rank", r, "--iterations", iters, "--mean-s", 0.01,
                 "--alpha", 1.0, "--start-together", tmp_path / "joined", *(["--out", out] if r == 0 else []))
          for r in range(n)]
    assert bosen_procs.wait_all(ps, 60) == [0] * n
    owner = Partition(servers).owner(np.arange(2, dtype=np.int64))
    W = np.load(out)
    step = LR * k / n / k  # proportional rate, mean of k
    for server in range(servers):
        b = _status(c, server)
        assert b["iteration"] == iters and b["steps"] == iters and b["k_history"] == [k] * iters
        assert b["held_ahead"] == 0 and b["dropped_repeat"] == 0 and b["accepted"] == k * iters
        applied = b["applied"]
        assert all(len(a) == k and len(set(a)) == k for a in applied)
        if owner[0] == server:
            per_rank = [sum(r in a for a in applied) for r in range(n)]
            assert W[0, :n] == pytest.approx([-step * m for m in per_rank])  # each accepted gradient once
        if owner[1] == server:
            assert W[1, 0] == pytest.approx(-step * k * sum(range(iters)))  # each of the iteration it was taken in
    # every rank started together (a rank that started after the others had finished would drop nothing)
    assert sum(_status(c, s)["dropped_late"] for s in range(servers)) > 0


@pytest.mark.slow
def test_dynamic_k_falls_to_half_after_half_the_workers_slow_down(bosen_cluster, bosen_procs, tmp_path):
    n, slow, iters = 4, 6, 34
    start = tmp_path / "start"  # workers forked one after another begin together (else k_t < n before the slowdown)
    app = {"module": "bosen.apps.mlr", "args": {"data": "digits", "holdout": 0.0, "batch_size": 16,
                                                "epochs": iters, "eval_every": 0,
                                                "delay": {"mean_s": 0.05, "alpha": 0.0, "slow_from": slow,
                                                          "start_file": str(start)}}}
    c = bosen_cluster(1, n, tables={"W": {"rows": 10, "cols": 65, "dtype": "float64",
                                          "backup": {"mode": "dynamic", "lr": 1.0}}}, app=app)
    ps = [bosen_procs.python(f"mlr{r}", "-m", "bosen.apps.mlr", "--config", c.path, "--rank", r) for r in range(n)]
    assert wait_until(lambda: query(c.config["cluster"]["servers"][0])["clients_joined"] == n, 60, step=0.05)
    start.touch()
    assert bosen_procs.wait_all(ps, 90) == [0] * n
    b = query(c.config["cluster"]["servers"][0])["tables"]["W"]["backup"]
    k = b["k_history"]
    assert len(k) == iters and b["dropped_repeat"] == 0 and b["held_ahead"] == 0
    # within 20 iterations k_t is n/2, and the steps take the fast half's gradients only
    late = range(slow + 20, iters)
    assert np.mean([k[t] for t in late]) <= n / 2 + 0.5, k
    assert all(set(b["applied"][t]) <= {0, 1} for t in late if k[t] == n // 2), (k, b["applied"])
    assert k[:slow].count(n) >= slow - 1, k  # before: equal round trips, everyone (the warm-up at least)
    assert b["dropped_late"] > 0


def _mlr_backup(n: int, iters: int, backup: dict, partitions: int, ck: Path | None = None, **delay: float) -> dict:
    """Config data of an MLR job (digits) whose table W has backup workers, one step per iteration."""
    app = {"module": "bosen.apps.mlr", "args": {"data": "digits", "holdout": 0.2, "batch_size": 16, "epochs": iters,
                                                "eval_every": 0, "delay": {"mean_s": 0.01, "alpha": 0.0, **delay}}}
    data = job_config([], n, tables={"W": {"rows": 10, "cols": 65, "dtype": "float32", "init": "zeros",
                                           "backup": backup}}, app=app, partitions=partitions)
    if ck is not None:
        data["checkpoint"] = {"every_clocks": iters, "dir": str(ck)}  # one checkpoint: the final table
    return data


def _when(c, server: int, iteration: int) -> None:
    """Until the job's table W is at ``iteration`` on ``server``."""
    assert wait_until(lambda: query(c.addresses[server])["tables"]["W"]["backup"]["iteration"] >= iteration,
                      timeout=120, step=0.01), f"W never reached iteration {iteration}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mlr_job_scaled_2_3_2_servers_ends_with_the_unscaled_runs_parameters(bosen_cluster, bosen_procs, tmp_path):
    """A real MLR job (static k = n = 2) whose servers go 2 -> 3 -> 2 mid-run (``scale_servers``; 6
    partitions, so rows of W move to the third server and back to other places than they came from),
    beside the same job unscaled: the final tables are identical bit for bit (two gradients per step:
    their float64 sum does not depend on which arrives first), every server stepped every iteration
    with k = 2, and the joined server went on from the step it took over (its k_t history whole)."""
    n, iters = 2, 200
    static = {"mode": "static", "k": n, "lr": 1.0}
    jobs = [bosen_cluster(2, config=_mlr_backup(n, iters, static, 6, tmp_path / f"ck{i}"), name=f"job{i}")
            for i in range(2)]
    scaled, plain = jobs
    added = scaled.add_server()  # started before the workers (its start takes seconds)
    ps = [bosen_procs.python(f"mlr{i}-{r}", "-m", "bosen.apps.mlr", "--config", c.path, "--rank", r)
          for i, c in enumerate(jobs) for r in range(n)]
    cfg = load(scaled.path)
    seen: list[dict] = []
    errors: list[BaseException] = []

    def scaler() -> None:
        try:
            _when(scaled, 0, 20)
            scale_servers(cfg, [*cfg.cluster.servers, added], timeout=60)
            _when(scaled, 0, 60)
            seen.append(query(added))  # the joined server, before it leaves
            scale_servers(cfg, list(cfg.cluster.servers), timeout=60)
            scaled.retired(2)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    t = threading.Thread(target=scaler)
    t.start()
    assert bosen_procs.wait_all(ps, 240) == [0] * (2 * n)
    t.join(timeout=60)
    assert not errors, errors
    joined = seen[0]["tables"]["W"]["backup"]
    assert seen[0]["partitions"]["owned"] == 2 and 60 <= joined["iteration"] < iters, seen[0]["partitions"]
    assert joined["k_history"] == [n] * joined["iteration"] and joined["steps"] == joined["iteration"]
    for c in jobs:
        for server in range(2):
            b = query(c.addresses[server])["tables"]["W"]["backup"]
            assert b["iteration"] == iters and b["k_history"] == [n] * iters and b["accepted"] == n * iters
            assert b["dropped_late"] == b["dropped_repeat"] == b["held_ahead"] == 0
    assert [s["partitions"]["owned"] for s in scaled.status()] == [3, 3]

    def complete(c) -> dict | None:
        try:
            return checkpoint.check_complete(Path(c.config["checkpoint"]["dir"]), iters, 2, None, None)
        except checkpoint.CheckpointError:
            return None

    def final(c) -> np.ndarray:
        W = np.full((10, 65), np.nan, dtype=np.float32)
        # the servers write their parts of the last boundary after its clock, the workers may be gone by then
        assert wait_until(lambda: complete(c) is not None, 60), f"{c.name}: the checkpoint at {iters} never completed"
        parts = complete(c)
        assert parts is not None
        for name in ("server-0", "server-1"):
            arrays = parts[name].load()
            W[arrays["t0.rows"]] = arrays["t0.values"]
        return W

    got, want = final(scaled), final(plain)
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dynamic_k_job_keeps_its_k_history_through_servers_joining_and_leaving(bosen_cluster, bosen_procs,
                                                                                  tmp_path):
    """DBW (dynamic k_t) on 3 MLR workers with random round trips, servers 2 -> 3 -> 2 mid-run: each
    move waits until the servers holding rows agree on the step's position (they choose k_t each on
    its own), the joined server takes over the step of its first giver, server 0 (iteration, k_t
    history, estimates) and goes on from it, and the job ends with one k_t per iteration on every server.
    Its SCAR checkpoints (half the rows each) made by the 3 servers resume regrouped on the config's 2:
    each server takes the step of the old server giving it most rows (not a fresh estimator), so a
    resumed job's k_t goes on from its history."""
    from bosen.server.checkpoints import restore

    n, iters = 3, 120
    data = _mlr_backup(n, iters, {"mode": "dynamic", "lr": 1.0}, 6, alpha=1.0)
    base = tmp_path / "ck"
    data["checkpoint"] = {"every_clocks": 10, "dir": str(base), "keep": 100, "priority_fraction": 0.5,
                          "policy": "round_robin"}
    c = bosen_cluster(2, config=data)
    added = c.add_server()
    ps = [bosen_procs.python(f"mlr{r}", "-m", "bosen.apps.mlr", "--config", c.path, "--rank", r) for r in range(n)]
    cfg = load(c.path)
    seen: list[dict] = []
    reports: list = []
    errors: list[BaseException] = []

    def scaler() -> None:
        try:
            _when(c, 0, 15)
            reports.append(scale_servers(cfg, [*cfg.cluster.servers, added], timeout=60))
            seen.append(query(c.addresses[0])["tables"]["W"]["backup"])
            _when(c, 0, 40)
            seen.append(query(added)["tables"]["W"]["backup"])
            reports.append(scale_servers(cfg, list(cfg.cluster.servers), timeout=60))
            c.retired(2)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    t = threading.Thread(target=scaler)
    t.start()
    assert bosen_procs.wait_all(ps, 240) == [0] * n
    t.join(timeout=60)
    assert not errors, errors
    first, joined = seen
    # the third server took server 0's step over (the first giver's) at iteration 15 or later
    assert joined["k_history"][:15] == first["k_history"][:15], (joined, first)
    assert len(joined["k_history"]) == joined["iteration"] == joined["steps"] >= 40
    assert joined["variance"] is not None and set(joined["k_history"]) <= {2, 3}
    for server in range(2):
        b = query(c.addresses[server])["tables"]["W"]["backup"]
        assert b["iteration"] == iters and len(b["k_history"]) == iters == b["steps"], b
        assert b["held_ahead"] == 0 and set(b["k_history"]) <= {2, 3}
    assert len(reports) == 2
    by3 = [k for k in checkpoint.clocks(base) if checkpoint.recorded_servers(checkpoint.clock_dir(base, k)) == 3]
    assert by3, checkpoint.clocks(base)
    ck = checkpoint.clock_dir(base, max(by3))
    old = [checkpoint.read_part(ck / f"server-{j}").load() for j in range(3)]
    for r in range(2):
        shards = [TableShard(i, t, Partition(2, cfg.cluster.num_partitions), r, n, procedures.load(t, "job.yaml"),
                             cfg.comm) for i, t in enumerate(cfg.tables)]
        assert restore(cfg, r, shards, ck) == max(by3)
        step = shards[0].procedure
        assert isinstance(step, BackupStep) and step._resume is not None, "the estimator would start afresh"
        took = step._resume
        assert len(took["k_history"]) == int(took["iteration"][0]) > 0
        assert any(np.array_equal(took["k_history"], o["p0.k_history"]) and
                   np.array_equal(took["rtt_sums"], o["p0.rtt_sums"]) for o in old)
        assert took["prev_mean"].size == 0  # per row of the old layout: not carried


@pytest.mark.slow
def test_a_worker_that_dies_mid_iteration_does_not_hang_the_others(bosen_cluster, bosen_procs):
    n, iters = 3, 12
    c = _job(bosen_cluster, n, {"mode": "static", "k": n, "lr": LR})
    ps = [worker(bosen_procs, "backup_worker.py", c.path, "--rank", r, "--iterations", iters,
                 *(["--die-at", 4] if r == 2 else [])) for r in range(n)]
    assert bosen_procs.wait_all(ps, 60) == [0, 0, 3]
    b = _status(c)
    assert b["iteration"] == iters
    assert b["k_history"][:4] == [3] * 4 and b["k_history"][4:] == [2] * (iters - 4)  # k_t: the workers left


@pytest.mark.slow
def test_a_resumed_job_continues_the_backup_state(bosen_cluster, bosen_procs, tmp_path):
    """Through real processes: a job with checkpoints every 3 iterations stops at 6; servers resumed
    from its checkpoint go on with its iteration, k_t history and counters."""
    n = 2
    data = job_config([], n, tables={"G": {"rows": 2, "cols": n + 1, "dtype": "float64",
                                           "backup": {"mode": "dynamic", "lr": LR}}})
    data["checkpoint"] = {"every_clocks": 3, "dir": str(tmp_path / "ck")}

    def run(c, iters: int) -> dict:
        ps = [worker(bosen_procs, "backup_worker.py", c.path, "--rank", r, "--iterations", iters, "--mean-s", 0.005,
                     "--alpha", 1.0) for r in range(n)]
        assert bosen_procs.wait_all(ps, 60) == [0] * n
        return _status(c)

    first = run(bosen_cluster(1, config=data), 6)
    assert first["iteration"] == 6 and len(first["k_history"]) == 6

    def saved() -> bool:  # the server writes its part after the clock: wait for it before resuming
        try:
            checkpoint.check_complete(tmp_path / "ck", 6, 1, None, None)
            return True
        except checkpoint.CheckpointError:
            return False

    assert wait_until(saved, 60), "clock 6's checkpoint never completed"
    again = run(bosen_cluster(1, config=data, server_args=["--resume", str(tmp_path / "ck")]), 9)
    assert again["k_history"][:6] == first["k_history"] and len(again["k_history"]) == 9
    assert again["steps"] == 9 and again["accepted"] >= first["accepted"] + 6
    assert again["variance"] is not None  # the estimates came back: not a warm-up from nothing


def _step_shards(cfg: TableConfig, part: Partition, n: int) -> list[TableShard]:
    out = []
    for j in range(part.num_servers):
        s = TableShard(0, cfg, part, j, n, procedures.load(cfg, "t.yaml"), CommConfig(enabled=False))
        s.procedure.start(n, 0, 0.0)
        out.append(s)
    return out


def _move(ss: list[TableShard], owner: np.ndarray) -> None:
    """As the mover does: every shard that loses partitions exports, every shard checks, then lays
    out (the whole step goes to each server given rows, from the first giver)."""
    old, new = ss[0].partition, ss[0].partition.moved(owner, len(ss))
    exports = [s.export_partitions(np.flatnonzero((old.owner_of == j) & (owner != j))) for j, s in enumerate(ss)]
    gains = []
    for j in range(len(ss)):
        got: dict[str, np.ndarray] = {}
        for e in exports:
            mine = np.flatnonzero(owner[e["rows"] % old.partitions] == j)
            if not mine.shape[0]:
                continue
            for k, v in e.items():
                if k.startswith("whole."):
                    got.setdefault(k, v)
                else:
                    got[k] = v[mine] if k not in got else np.concatenate([got[k], v[mine]])
        gains.append(got or None)
    for s, got in zip(ss, gains, strict=True):
        whole = {k[6:]: v for k, v in (got or {}).items() if k.startswith("whole.")}
        s.procedure.check_take_over(s.stored, whole or None)
    for s, got in zip(ss, gains, strict=True):
        s.relayout(new, got)


def test_a_backup_table_moves_mid_iteration_with_its_step():
    """Partitions of a table with backup workers move between shards while an iteration is half
    collected (one rank's gradient accepted, another's partly sent): 2 shards -> 3 (the third takes the
    step over) -> 2. Every later gradient lands as on a shard that never moved: the values, iteration,
    k_t history and counters equal its exactly (static k = n, float64, the same order of arrival)."""
    n, iters, P = 3, 6, 8
    cfg = TableConfig(name="B", rows=21, cols=4, dtype="float64", backup=BackupConfig(mode="static", k=n, lr=0.5))
    ss = _step_shards(cfg, Partition(2, P), n)
    ss.append(_step_shards(cfg, Partition(3, P, Partition(2, P).owner_of), n)[2])  # joining: owns nothing
    ref = _step_shards(cfg, Partition(1, P), n)[0]
    rng = np.random.default_rng(3)
    rows = np.arange(cfg.rows, dtype=np.int64)

    def send(r: int, g: np.ndarray, which: np.ndarray) -> None:
        for s in ss:
            own = which[s.partition.owner(which) == s.rank]
            if own.shape[0]:
                s.apply(UpdateBatch(own, g[own]), r)

    def clock(r: int, c: int) -> None:
        for s in [*ss, ref]:
            s.procedure.clocked(r, c, 0.0)

    for t in range(iters):
        grads = [rng.normal(size=(cfg.rows, cfg.cols)) for _ in range(n)]
        for r in range(n):
            ref.apply(UpdateBatch(rows, grads[r]), r)
        send(0, grads[0], rows)
        clock(0, t + 1)
        half = rows[rows % 2 == 0]
        send(1, grads[1], half)  # rank 1's gradient partly sent: half of it on the servers
        if t in (1, 4):  # mid-iteration: to 3 servers (the third had none of the rows), then back to 2
            owner = np.arange(P) % 2 if t == 4 else np.array([0, 1, 0, 1, 2, 2, 0, 1])
            _move(ss, owner)
        send(1, grads[1], rows[rows % 2 == 1])
        clock(1, t + 1)
        send(2, grads[2], rows)
        clock(2, t + 1)
        if t == 2:
            joiner = ss[2].procedure
            assert ss[2].stored > 0 and joiner.k_history == ref.procedure.k_history  # took the step over
    got = np.zeros((cfg.rows, cfg.cols))
    for s in ss:
        got[s.global_rows[:s.stored]] = s.values[:s.stored]
        if s.stored:
            b = s.procedure
            assert b.iteration == iters and b.k_history == [n] * iters and b.counts == ref.procedure.counts
    assert ss[2].stored == 0
    np.testing.assert_array_equal(got, ref.values)


def test_rows_of_another_step_position_are_refused_before_anything_changes():
    n, P = 2, 4
    cfg = TableConfig(name="B", rows=8, cols=2, dtype="float64", backup=BackupConfig(mode="static", k=n, lr=0.5))
    ss = _step_shards(cfg, Partition(2, P), n)
    g = np.ones((4, 2))
    ss[0].apply(UpdateBatch(ss[0].global_rows[:4], g), 0)
    ss[0].procedure.clocked(0, 1, 0.0)  # rank 0's gradient accepted on server 0 only
    before = ss[1].values.copy()
    with pytest.raises(ProtocolError, match="iteration 0 with ranks \\[0\\] accepted would arrive at a server at "
                                            "iteration 0 with ranks \\[\\]"):
        _move(ss, np.array([1, 1, 1, 1]))
    np.testing.assert_array_equal(ss[1].values, before)
    assert ss[1].partition.version == 0 and ss[0].partition.version == 0


def _dbw_run(n: int, iters: int, boundary: int, resume: str | None) -> tuple[list[int], np.ndarray]:
    """A dynamic-k job on a virtual clock (noisy gradients of a quadratic, the paper's round trips
    1 - α + α·Exp(1) with α = 0.5, the upper half of the ranks 5x slower from iteration 6; all drawn
    per (rank, iteration), so a recomputed gradient is the same). At ``boundary`` the job checkpoints
    as servers do: the gradients of earlier iterations still out arrive first (their clocks come
    before the boundary's), the step's state is saved, and every worker starts the boundary's
    iteration when it began. ``resume``: None goes on with the same step; "state" goes on with a new
    one loaded from the saved arrays (through an .npz file, as a checkpoint part); "fresh" with a new
    one without them (the estimator afresh, as before). Returns k_t's history and the final values."""
    import heapq
    import io

    cfg = TableConfig(name="G", rows=4, cols=8, dtype="float64", backup=BackupConfig(mode="dynamic", lr=0.2))
    curv = np.linspace(0.5, 2.0, 32).reshape(4, 8)
    W = np.ones((4, 8))
    step = BackupStep(cfg)
    step.create(np.arange(4, dtype=np.int64), W)
    step.start(n, 0, 0.0)
    events: list[tuple[float, int, int, np.ndarray]] = []

    def begin(r: int, now: float) -> None:
        it = step.iteration
        rng = np.random.default_rng([7, r, it])
        rtt = 0.5 + 0.5 * rng.exponential() * (5.0 if r >= n // 2 and it >= 6 else 1.0)
        heapq.heappush(events, (now + rtt, r, it, curv * W + rng.normal(0.0, 0.5, W.shape)))

    def arrive(now: float, r: int, it: int, g: np.ndarray) -> bool:
        step.put(r, g)
        return step.clocked(r, it + 1, now)

    for r in range(n):
        begin(r, 0.0)
    waiting: list[int] = []
    while step.iteration < iters:
        now, r, it, g = heapq.heappop(events)
        if arrive(now, r, it, g):
            if step.iteration == boundary:
                while events:  # late gradients of earlier iterations: in before the boundary's clocks
                    arrive(*heapq.heappop(events))
                if resume is not None:
                    f = io.BytesIO()
                    np.savez(f, **step.table_state())
                    f.seek(0)
                    W = W.copy()
                    step = BackupStep(cfg)
                    step.create(np.arange(4, dtype=np.int64), W)
                    if resume == "state":
                        with np.load(f, allow_pickle=False) as z:
                            step.load_table_state({k: z[k] for k in z.files})
                    step.start(n, boundary, now)
                waiting, r = list(range(n - 1)), n - 1
            for q in [*waiting, r]:
                begin(q, now)
            waiting = []
        elif step.iteration > it:
            begin(r, now)
        else:
            waiting.append(r)
    return step.k_history, W


def test_a_resumed_dbw_step_chooses_k_as_the_uninterrupted_one():
    """The estimator's state (round-trip samples, windows, last moments, k_t) goes into the
    checkpoint: k_t after a resume is what it would have been; started afresh it is not."""
    n, iters, boundary = 6, 40, 20
    k, W = _dbw_run(n, iters, boundary, None)
    assert n not in k[boundary - 2:boundary] and len(set(k[boundary:])) > 2, k  # a fresh start differs; k_t moves
    k_res, W_res = _dbw_run(n, iters, boundary, "state")
    assert k_res == k, (k_res, k)
    np.testing.assert_array_equal(W_res, W)
    k_fresh, _ = _dbw_run(n, iters, boundary, "fresh")
    assert k_fresh != k[boundary:]  # its history starts at the resume
    assert k_fresh[:2] == [n, n]  # warm-up again


def test_workers_joining_and_leaving_count_from_their_iteration_whenever_their_messages_come():
    """Static k = the workers (2): rank 2 joins at clock 2 while the table is at iteration 1, so
    iteration 1 still steps on ranks 0 and 1, iteration 2 waits for all three at the rate lr (k follows
    n); rank 2's BYE after its CLOCK(4) arrives while iteration 3 waits for rank 1, so iteration 3 still
    takes rank 1's gradient and iteration 4 steps on two (the "fc" that ends rank 2's clocks says the
    same before its BYE, and the BYE, however late, changes nothing). A lost rank (no BYE) leaves at once: k_t
    drops and n stays (DBW), so the rate is lr·k/n."""
    cfg = TableConfig(name="G", rows=1, cols=1, dtype="float64", backup=BackupConfig(mode="static", k=2, lr=1.0))
    W = np.zeros((1, 1))
    step = BackupStep(cfg)
    step.create(np.arange(1, dtype=np.int64), W)
    step.start(2, 0, 0.0)

    def grad(r: int, it: int, value: float) -> bool:
        step.put(r, np.full((1, 1), value))
        return step.clocked(r, it + 1, 0.0)

    assert not grad(0, 0, 1.0) and grad(1, 0, 3.0) and W[0, 0] == -2.0  # mean of 2
    step.joined(2, 2)  # announced a step early
    assert (step.k, step.policy.n) == (2, 2)
    assert not grad(0, 1, 1.0) and grad(1, 1, 1.0) and (step.k, step.policy.n, step.iteration) == (3, 3, 2)
    assert not grad(0, 2, 3.0) and not grad(1, 2, 3.0) and grad(2, 2, 6.0) and W[0, 0] == pytest.approx(-7.0)
    assert not grad(0, 3, 1.0) and not grad(2, 3, 1.0)
    assert not step.left(2, 0.0, at=4)  # its "fc" after its CLOCK(4): iteration 3 still waits for rank 1
    assert not step.left(2, 0.0, at=4)  # its BYE (released) before iteration 3 stepped: nothing more
    assert grad(1, 3, 4.0) and W[0, 0] == pytest.approx(-9.0) and (step.k, step.policy.n) == (2, 2)
    assert not grad(0, 4, 1.0)
    assert not step.left(2, 0.0, at=4) and (step.k, step.policy.n, step.members) == (2, 2, {0, 1})  # a late BYE
    assert grad(1, 4, 1.0) and W[0, 0] == pytest.approx(-10.0)
    assert step.applied[-3:] == [[0, 1, 2], [0, 2, 1], [0, 1]] and step.counts["dropped_late"] == 0
    assert not grad(0, 5, 2.0) and step.left(1, 0.0)  # lost: iteration 5 steps on rank 0's alone
    assert W[0, 0] == pytest.approx(-11.0) and (step.k, step.policy.n) == (1, 2)  # rate lr·1/2


def test_a_restored_step_holds_resent_gradients_of_later_iterations_until_it_gets_there():
    """A lost server's replacement, restored at iteration 0, gets each worker's resend in one run:
    rank 0's gradients of 0, 1 and 2 before rank 1's of 0. The later ones are held (not dropped) and
    taken, in order, as the table reaches their iteration, so the values equal the in-order run's; a
    rank that joined at 2 (after the part) is counted from there, whenever its resend comes."""
    cfg = TableConfig(name="G", rows=1, cols=1, dtype="float64", backup=BackupConfig(mode="static", k=2, lr=1.0))
    W = np.zeros((1, 1))
    step = BackupStep(cfg)
    step.create(np.arange(1, dtype=np.int64), W)
    step.start(2, 0, 0.0, members=[0, 1])
    step.joined(2, 2)

    def grad(r: int, it: int, value: float) -> bool:
        step.put(r, np.full((1, 1), value))
        return step.clocked(r, it + 1, 0.0)

    assert not any(grad(0, it, v) for it, v in ((0, 1.0), (1, 2.0), (2, 3.0)))
    assert not grad(2, 2, 6.0) and step.counts["held_ahead"] == 3 and W[0, 0] == 0.0
    assert grad(1, 0, 3.0) and step.iteration == 1 and W[0, 0] == -2.0  # iteration 1 waits for rank 1 still
    assert grad(1, 1, 4.0) and step.iteration == 2 and W[0, 0] == -5.0
    assert grad(1, 2, 3.0) and step.iteration == 3 and W[0, 0] == pytest.approx(-9.0)  # (3 + 6 + 3) / 3
    assert step.k_history == [2, 2, 3] and step.applied == [[0, 1], [0, 1], [0, 2, 1]] and not step.ahead
    assert step.counts["dropped_late"] == step.counts["dropped_repeat"] == 0


def test_a_gradient_ahead_of_the_table_is_refused_unless_a_resend_brings_it():
    """Only a resend to a restored server is ahead of the table (a worker computes on the iteration
    it read): a rank's gradients of ticks below the clock it had sent the lost server (HELLO "cs",
    ``resending``), however far ahead, then the one of its tick in flight (w_t read from the lost
    server, a catch-up past "cs" included); after that its reads wait for this server. Those are held;
    a gradient ahead on a server that was not restored, or after the rank's resend and tick in flight,
    is refused (ProtocolError), nothing held, so a buggy worker cannot grow what the server holds."""
    cfg = TableConfig(name="G", rows=1, cols=1, dtype="float64", backup=BackupConfig(mode="static", k=2, lr=1.0))
    W = np.zeros((1, 1))
    step = BackupStep(cfg)
    step.create(np.arange(1, dtype=np.int64), W)
    step.start(2, 0, 0.0)

    def grad(r: int, it: int, value: float) -> bool:
        step.put(r, np.full((1, 1), value))
        step.check_clock(r, it + 1)
        return step.clocked(r, it + 1, 0.0)

    with pytest.raises(ProtocolError, match=r"rank 0's gradient of iteration 1 is ahead of table 'G' \(iteration 0\)"
                                            r".*; refused, not held"):
        grad(0, 1, 1.0)
    assert not step.ahead and step.counts["held_ahead"] == 0
    step.resending(0, 40)  # a restored server: rank 0 had sent its predecessor CLOCK(40)
    step.resending(1, 1)  # rank 1 had sent CLOCK(1)
    assert not any(grad(0, it, 1.0) for it in range(40))  # ticks 0..39: 39 held, however far ahead
    assert step.counts["held_ahead"] == 39
    assert not step.clocked(0, 45, 0.0)  # catch-up clocks, no gradient (it had read w_45 from the lost server)
    assert not grad(0, 45, 1.0) and step.counts["held_ahead"] == 40  # its tick in flight
    with pytest.raises(ProtocolError, match="rank 0's gradient of iteration 46 is ahead"):
        grad(0, 46, 1.0)  # its reads wait for this server now: nothing more can be ahead
    assert not grad(1, 1, 1.0) and step.counts["held_ahead"] == 41  # rank 1's tick in flight
    with pytest.raises(ProtocolError, match="rank 1's gradient of iteration 2 is ahead"):
        grad(1, 2, 1.0)
    assert step.counts["held_ahead"] == 41 and len(step.ahead) == 41 and step.iteration == 0
    assert grad(1, 0, 3.0) and step.iteration == 2 and W[0, 0] == -3.0  # the held ones go on as before


def test_gradients_of_a_few_rows_step_as_the_whole_tables_would():
    """An embedding table's gradients touch a few rows each (``apply`` of those rows, several updates a
    tick, a rank whose rows change between iterations): the step and its estimates cost those rows only
    (``touched``, ``acc_rows``, ``prev_rows``), and equal a step fed the same gradients as whole arrays
    (``put``, zero elsewhere): the values, the k_t sequence and the estimator's state, over iterations
    with drops (dynamic k_t of 3 workers: each round every worker sends a gradient of the iteration the
    round began at, those past k_t are late)."""
    rows, cols, n = 40, 3, 3
    cfg = TableConfig(name="E", rows=rows, cols=cols, dtype="float64", backup=BackupConfig(mode="dynamic", lr=0.3))
    W1, W2 = np.ones((rows, cols)), np.ones((rows, cols))
    sparse, whole = BackupStep(cfg), BackupStep(cfg)
    for s, W in ((sparse, W1), (whole, W2)):
        s.create(np.arange(rows, dtype=np.int64), W)
        s.start(n, 0, 0.0)
    rng = np.random.default_rng(3)
    for it in range(30):
        order, tick = rng.permutation(n), sparse.iteration
        for r in order:
            full = np.zeros((rows, cols))
            for _ in range(2):  # two updates in the tick, rows may repeat
                at = np.unique(rng.integers(0, rows, 5)).astype(np.int64)
                g = rng.normal(size=(at.size, cols)) * W1[at]
                sparse.apply(W1, at, UpdateBatch(rows=at, values=g), int(r))
                full[at] += g
            whole.put(int(r), full)
            a, b = sparse.clocked(int(r), tick + 1, it + 0.1 * r), whole.clocked(int(r), tick + 1, it + 0.1 * r)
            assert a == b
        assert sparse.iteration == whole.iteration
    np.testing.assert_array_equal(W1, W2)
    assert sparse.k_history == whole.k_history and len(set(sparse.k_history)) > 1 and sparse.counts == whole.counts
    assert sparse.counts["dropped_late"] > 0
    got, want = sparse.table_state(), whole.table_state()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-15, err_msg=k)
