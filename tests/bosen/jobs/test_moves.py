"""Moving partitions between the servers of a running job (bosen/jobs/moves.py, server/moves.py,
client/moves.py), through real processes: while the exactness workers of tests/client/test_exactness.py
run under managed communication (early sends and pushes), partitions move back and forth; every read
each worker checks stays exact, and so do the final tables."""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np
import pytest
from conftest import WORKERS, worker

from bosen.client import Client
from bosen.config import load
from bosen.errors import BosenError
from bosen.jobs.job import job_config
from bosen.jobs.moves import balanced, current_map, current_servers, move_partitions, scale_servers

sys.path.insert(0, str(WORKERS))
import exact_worker as ew  # noqa: E402  (tests/workers is not a package)

COMM = {"enabled": True, "client_bandwidth_mbps": 2000, "server_bandwidth_mbps": 2000, "client_send_rows": 2,
        "server_push_rows": 2, "wire_dtype": "float16", "priority": "relative"}


def _owners(partitions: int, servers: int, seed: int) -> list[np.ndarray]:
    """Maps to move through: a random one, another, and back to the one a job starts with."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, servers, partitions).astype(np.int32) for _ in range(2)] + \
        [np.arange(partitions, dtype=np.int32) % servers]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("storage", ["dense", "sparse"])
def test_partitions_move_while_workers_run_and_every_read_and_table_stays_exact(bosen_cluster, bosen_procs, tmp_path,
                                                                              storage):
    servers, procs, staleness, ticks = 2, 2, 1, 40
    c = bosen_cluster(servers, workers=procs + 1, staleness=staleness, comm=COMM, read_timeout_s=30,
                      tables={"I": {"rows": ew.ROWS, "cols": procs + 1, "dtype": "int64", "storage": storage},
                              "F": {"rows": ew.ROWS, "cols": procs + 1, "dtype": "float32", "storage": storage}},
                      partitions=8)
    cfg = load(c.path)
    reader = Client.connect(c.path, rank=procs)  # reads the final tables (test_exactness.py)
    reports, errors = [], []
    try:
        for _ in range(ticks + staleness + 1):
            reader.clock()
        done = tmp_path / "moved"  # partitions move only while every worker is in the job: they stay till then
        ws = [worker(bosen_procs, "exact_worker.py", c.path, "--procs", procs, "--ticks", ticks, "--seed", 5,
                     "--max-sleep-ms", 6.0, "--result", tmp_path / f"r-{i}.json", "--stay-until", done,
                     name=f"exact-{i}") for i in range(procs)]

        def mover() -> None:
            try:
                # every worker in, and rows written on every server (a sparse table stores none before)
                while not all(s["clients_joined"] == procs + 1 and s["rows_applied"] > 0 for s in c.status()):
                    time.sleep(0.02)
                for owner in _owners(8, servers, seed=3):
                    time.sleep(0.15)
                    reports.append(move_partitions(cfg, owner, timeout=30))
            except BosenError as e:
                errors.append(e)
            finally:
                done.touch()

        t = threading.Thread(target=mover)
        t.start()
        codes = bosen_procs.wait_all(ws, timeout=100)
        t.join(timeout=60)
        assert not errors, errors
        assert codes == [0] * procs, "\n".join(f"{p.name} exit {p.returncode}:\n{p.tail()}" for p in ws)
        assert len(reports) == 3
        assert all(r.moved > 0 for r in reports) and sum(r.bytes for r in reports) > 0
        results = [json.loads((tmp_path / f"r-{i}.json").read_text()) for i in range(procs)]
        for r in results:
            assert r["violation_count"] == 0, f"process {r['rank']}: {r['violations'][:10]}"
        version, owner = current_map(cfg)
        assert version == len(reports)
        for name in "IF":
            want = np.sum([np.array(r["totals"][name]) for r in results], axis=0)
            got = reader.table(name).get_rows(np.arange(ew.ROWS))
            np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=f"final table {name}")
        for s in c.status():
            assert s["errors"] == 0
            assert s["partitions"]["version"] == version and s["partitions"]["owner"] == owner.tolist()
    finally:
        reader.close()
    c.check()


def test_a_move_to_a_server_that_does_not_exist_is_refused(bosen_cluster):
    c = bosen_cluster(2, workers=1, tables={"W": {"rows": 10, "cols": 2}}, partitions=4)
    cfg = load(c.path)
    with Client.connect(c.path) as client:
        client.clock()
        with pytest.raises(ValueError, match=r"one server in \[0, 2\) for each of the 4 partitions"):
            move_partitions(cfg, np.array([0, 1, 2, 0]))
        with pytest.raises(ValueError, match="for each of the 4 partitions"):
            move_partitions(cfg, np.array([0, 1]))
        assert current_map(cfg)[0] == 0


def test_a_checkpoint_saved_after_a_move_resumes_under_the_moved_map(bosen_cluster, tmp_path):
    """Checkpoints keep the map their rows were saved under: resumed servers hold the partitions they
    held then, and a client joining them follows that map (WELCOME), reading every row exactly."""
    data = job_config([], 1, tables={"W": {"rows": 40, "cols": 2, "dtype": "int64"}}, partitions=8)
    data["checkpoint"] = {"every_clocks": 2, "dir": str(tmp_path / "ck"), "keep": 10}
    c = bosen_cluster(2, config=data)
    cfg = load(c.path)
    rows = np.arange(40, dtype=np.int64)
    owner = np.array([1, 1, 0, 0, 1, 0, 1, 1], dtype=np.int32)
    with Client.connect(c.path) as client:
        W = client.table("W")
        for t in range(6):
            if t == 3:  # the client's communication thread pauses, takes the map and goes on by itself
                report = move_partitions(cfg, owner)
                assert report.moved == 5 and report.bytes > 0 and report.tries == 1
            W.inc_rows(rows, np.full((40, 2), t + 1, dtype=np.int64))
            client.clock()
        np.testing.assert_array_equal(W.get_rows(rows), np.full((40, 2), 21))
    c.stop()
    again = bosen_cluster(2, config=data, server_args=["--resume", str(tmp_path / "ck")])
    version, now = current_map(load(again.path))
    assert version == 1 and (now == owner).all()
    with Client.connect(again.path) as client:
        np.testing.assert_array_equal(client.table("W").get_rows(rows), np.full((40, 2), 21))
        for s in again.status():
            assert s["partitions"]["owned"] == int(np.count_nonzero(owner == s["rank"]))


@pytest.mark.timeout(150)
def test_a_server_joins_and_another_leaves_while_workers_run_and_every_read_and_table_stays_exact(
        bosen_cluster, bosen_procs, tmp_path):
    """Servers join and leave a running job (bosen.jobs.moves.scale_servers): a third server started
    with --join takes a fair share of the partitions, then the last one hands everything back and exits,
    while the exactness workers run under managed communication; every read and the final tables stay
    exact, and a client joining afterwards with the job's original config finds the servers it has now."""
    procs, staleness, ticks = 2, 1, 40
    c = bosen_cluster(2, workers=procs + 1, staleness=staleness, comm=COMM, read_timeout_s=30,
                      tables={"I": {"rows": ew.ROWS, "cols": procs + 1, "dtype": "int64"},
                              "F": {"rows": ew.ROWS, "cols": procs + 1, "dtype": "float32", "storage": "sparse"}},
                      partitions=8)
    cfg = load(c.path)
    reader = Client.connect(c.path, rank=procs)
    reports, errors, seen = [], [], []
    try:
        for _ in range(ticks + staleness + 1):
            reader.clock()
        added = c.add_server()  # started before the workers (its start takes seconds), joining the job
        done = tmp_path / "scaled"
        ws = [worker(bosen_procs, "exact_worker.py", c.path, "--procs", procs, "--ticks", ticks, "--seed", 7,
                     "--max-sleep-ms", 6.0, "--result", tmp_path / f"r-{i}.json", "--stay-until", done,
                     name=f"exact-{i}") for i in range(procs)]

        def scaler() -> None:
            try:
                while not all(s["clients_joined"] == procs + 1 for s in c.status()[:2]):  # not the one joining
                    time.sleep(0.02)
                reports.append(scale_servers(cfg, [*cfg.cluster.servers, added], timeout=30))
                seen.append([s["partitions"]["owned"] for s in c.status()])
                time.sleep(0.1)
                reports.append(scale_servers(cfg, list(cfg.cluster.servers), timeout=30))
                c.retired(2)
            except BosenError as e:
                errors.append(e)
            finally:
                done.touch()

        t = threading.Thread(target=scaler)
        t.start()
        codes = bosen_procs.wait_all(ws, timeout=120)
        t.join(timeout=60)
        assert not errors, errors
        assert codes == [0] * procs, "\n".join(f"{p.name} exit {p.returncode}:\n{p.tail()}" for p in ws)
        assert len(reports) == 2 and seen == [[3, 3, 2]], (reports, seen)
        results = [json.loads((tmp_path / f"r-{i}.json").read_text()) for i in range(procs)]
        for r in results:
            assert r["violation_count"] == 0, f"process {r['rank']}: {r['violations'][:10]}"
        assert current_servers(cfg) == list(cfg.cluster.servers)
        for name in "IF":
            want = np.sum([np.array(r["totals"][name]) for r in results], axis=0)
            got = reader.table(name).get_rows(np.arange(ew.ROWS))
            np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=f"final table {name}")
        for s in c.status():
            assert s["errors"] == 0 and s["partitions"]["owned"] == 4
    finally:
        reader.close()
    c.check()


def test_balanced_maps_move_few_partitions():
    start = np.arange(8, dtype=np.int32) % 2
    three = balanced(start, 3)
    assert np.bincount(three).tolist() == [3, 3, 2] and int(np.count_nonzero(three != start)) == 2
    back = balanced(three, 2)
    assert np.bincount(back).tolist() == [4, 4] and int(np.count_nonzero(back != three)) == 2
    with pytest.raises(ValueError, match="9 servers for 8 partitions"):
        balanced(start, 9)
