"""Consistent checkpoints and resume (server/checkpoints.py, bosen/checkpoint.py), through real jobs."""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import checkpoint_job, descendants, launch_job, saved_table

from bosen import checkpoint


def job(tmp_path: Path, args: dict, staleness: int = 3, every: int = 2, comm: bool = False,
        storage: str = "dense", cache_rows: int | None = None, **ckpt: object) -> Path:
    return checkpoint_job(tmp_path, args, staleness, every, comm, storage, cache_rows, **ckpt)


def launch(*args: object, timeout: float = 90) -> tuple[int, str]:
    return launch_job(*args, timeout=timeout)


saved_sums = saved_table


def resumed_table(data: dict, tmp_path: Path, base: Path, clock: int) -> np.ndarray:
    """Table W as servers resumed from ``base`` (the job's config ``data``) hold it, read by a fresh
    client, which must start at ``clock``."""
    from bosen.client import Client
    from bosen.jobs.cluster import start_cluster
    from bosen.jobs.supervise import ProcessGroup

    with ProcessGroup(tmp_path / "logs2") as group:
        c = start_cluster(data, tmp_path / "again", group=group, server_args=["--resume", str(base)])
        client = Client.connect(c.path, rank=0)
        try:
            assert client.tick == clock
            return client.table("W").get_rows(np.arange(8))
        finally:
            client.abort()
            c.stop(check=False)


def tri(b: int) -> int:
    return b * (b + 1) // 2


@pytest.mark.slow
def test_checkpoint_holds_exactly_the_ticks_before_it_under_ssp(tmp_path: Path) -> None:
    """A fast and a slow worker (staleness 3, managed communication on): every checkpoint at clock B
    holds every update of ticks < B and none later, although the fast worker's later updates
    reached the servers before the slow worker's."""
    cfg = job(tmp_path, {"ticks": 12, "slow_rank": 1, "slow_s": 0.05}, comm=True)
    code, out = launch(cfg, "--run-dir", tmp_path / "run")
    assert code == 0, out
    base = tmp_path / "run" / "checkpoints"
    assert checkpoint.clocks(base) == [12, 10, 8, 6, 4, 2]
    for b in checkpoint.clocks(base):
        np.testing.assert_array_equal(saved_sums(base, b), tri(b), err_msg=f"checkpoint at clock {b}")
        for r in range(2):
            assert checkpoint.read_part(base / f"clock-{b:08d}" / f"worker-{r}").load()["tick"][0] == b
    servers = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
               if '"kind": "server"' in x]
    held = sum(s["checkpoints"]["held_msgs"] for s in servers)
    assert held > 0, "the fast worker never got past a boundary first: the test did not test holding"


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["dense", "sparse"])
def test_resume_is_exact_and_skips_a_corrupt_checkpoint(tmp_path: Path, storage: str) -> None:
    """A worker dies at tick 9, and each of its replacements too, so the job fails; the newest
    checkpoint (8) is then corrupted; ``--resume`` says so, takes the one at 6, and the job ends with
    exactly the sums of an uninterrupted run, its metrics one record per clock."""
    cfg = job(tmp_path, {"ticks": 12, "die_at": 9, "die_again": True}, staleness=1, storage=storage)
    run = tmp_path / "run"
    code, out = launch(cfg, "--run-dir", run, timeout=150)
    assert code == 1 and "worker-0.3 was killed by SIGKILL (replaced 3 times in a row, no newer checkpoint " \
        "between)" in out, out
    base = run / "checkpoints"
    assert checkpoint.newest_complete(base, 2, 2, None)[0] == 8  # parts of 10 may exist: the live worker's
    victim = base / "clock-00000008" / "server-1" / "t0.values.npy"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))

    resumed = job(tmp_path, {"ticks": 12}, staleness=1, storage=storage)  # the same job, nobody dies this time
    code, out = launch(resumed, "--resume", run)
    assert code == 0, out
    assert "skipping checkpoint clock 8" in out and "checksum mismatch" in out, out
    assert "resuming from the checkpoint at clock 6" in out, out
    np.testing.assert_array_equal(saved_sums(base, 12), tri(12))
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    clocks = [m["clock"] for m in metrics if m["kind"] == "clock"]
    assert clocks == list(range(12)), clocks


def test_a_torn_part_is_not_a_checkpoint(tmp_path: Path) -> None:
    """A part without its manifest (the writer died before the rename) is reported, never used."""
    fp = "f" * 16
    for r in range(2):
        checkpoint.write_part(tmp_path, 4, "server", r, {"x": np.arange(3)}, {}, fp)
        checkpoint.write_part(tmp_path, 4, "worker", r, {"tick": np.array([4])}, {}, fp)
        checkpoint.write_part(tmp_path, 8, "worker", r, {"tick": np.array([8])}, {}, fp)
    checkpoint.write_part(tmp_path, 8, "server", 0, {"x": np.arange(3)}, {}, fp)
    torn = tmp_path / "clock-00000008" / "server-1.partial"
    torn.mkdir()
    (torn / "x.npy").write_bytes(b"\x93NUMPY")
    clock, parts, skipped = checkpoint.newest_complete(tmp_path, 2, 2, fp)
    assert clock == 4 and len(parts) == 4
    assert len(skipped) == 1 and "server-1" in skipped[0] and "never finished" in skipped[0]


def test_a_checkpoint_a_take_back_made_stale_is_no_resume_point_and_does_not_count_towards_keep(tmp_path: Path) -> None:
    """Checkpoints 2-8, complete; 6 and 8 have corrections beside them (a lost worker's updates taken back
    after their server parts were saved, docs/recovery.md): a resume (``exact``) skips them, naming
    why, and takes 4; a replacement (not ``exact``) may take 8. Pruning with ``keep: 2`` keeps the two
    newest exact ones (4, 2) and the stale ones newer than them; with a newer exact one, 2 goes."""
    fp = "f" * 16

    def write(clock: int) -> None:
        for r in range(2):
            checkpoint.write_part(tmp_path, clock, "server", r, {"x": np.arange(3)}, {}, fp)
            checkpoint.write_part(tmp_path, clock, "worker", r, {"tick": np.array([clock])}, {}, fp)

    for c in (2, 4, 6, 8):
        write(c)
    for c in (6, 8):
        np.savez(checkpoint.clock_dir(tmp_path, c) / "redo.server-0.rank-1.npz", since=np.array([4]))
    assert checkpoint.taken_back(checkpoint.clock_dir(tmp_path, 8)) == ["redo.server-0.rank-1.npz"]
    assert checkpoint.newest_complete(tmp_path, 2, 2, fp)[0] == 8
    clock, _, skipped = checkpoint.newest_complete(tmp_path, 2, 2, fp, exact=True)
    assert clock == 4 and len(skipped) == 2
    assert skipped[0].startswith("clock 8: its server parts hold a lost worker's updates that were taken back")
    assert checkpoint.prune(tmp_path, 2, 2, 2) == []
    write(10)
    assert checkpoint.prune(tmp_path, 2, 2, 2) == [2]
    assert checkpoint.clocks(tmp_path) == [10, 8, 6, 4]


def test_a_whole_job_start_sets_the_newer_checkpoints_and_the_move_parts_aside(tmp_path: Path) -> None:
    """Checkpoints 2-8 and a move part; the job starts again from 4 (``bosen launch --resume``, a
    restart): 6 (with its correction) and 8 (torn) and the move part go into one superseded-<time>
    folder, which no checkpoint lookup sees; 2 and 4 stay. Twice within a second: two folders."""
    fp = "f" * 16
    for c in (2, 4, 6, 8):
        checkpoint.write_part(tmp_path, c, "server", 0, {"x": np.arange(3)}, {}, fp)
    np.savez(checkpoint.clock_dir(tmp_path, 6) / "redo.server-0.rank-1.npz", since=np.array([4]))
    checkpoint.write_part(tmp_path, 5, "server", 0, {"x": np.arange(3)}, {}, fp,
                          directory=checkpoint.move_dir(tmp_path, 5, 1))
    into, moved = checkpoint.set_aside(tmp_path, 4)
    assert into is not None and into.parent == tmp_path and into.name.startswith(checkpoint.SUPERSEDED)
    assert moved == ["clock-00000006", "clock-00000008", "move-00000005-00000001"]
    assert sorted(p.name for p in into.iterdir()) == moved
    assert (into / "clock-00000006" / "redo.server-0.rank-1.npz").exists()
    assert checkpoint.clocks(tmp_path) == [4, 2] and checkpoint.moves(tmp_path) == []
    assert checkpoint.set_aside(tmp_path, 4) == (None, [])
    checkpoint.write_part(tmp_path, 6, "server", 0, {"x": np.arange(3)}, {}, fp)
    again, moved = checkpoint.set_aside(tmp_path, 4)
    assert again is not None and again != into and moved == ["clock-00000006"]
    assert checkpoint.prune(tmp_path, 1, 1, 0) == [2] and into.is_dir() and again.is_dir()


def test_a_checkpoint_found_by_the_workers_that_made_it(tmp_path: Path) -> None:
    """``workers=None``: a checkpoint is complete with the parts of as many workers as its server parts
    say made it (the fingerprint is that count's), so a job with micro-tasks can resume with another
    count; a missing worker part still makes it incomplete. ``task_count`` reads the parts' manifests."""
    fps = {k: f"{k:016d}" for k in (2, 3)}
    for r in range(2):
        checkpoint.write_part(tmp_path, 4, "server", r, {"x": np.arange(3)}, {}, fps[3], workers=3)
    for r in range(3):
        arrays = {"tick": np.array([4]), f"task.{2 * r}.z": np.zeros(2), f"task.{2 * r + 1}.z": np.zeros(2)}
        checkpoint.write_part(tmp_path, 4, "worker", r, arrays, {}, fps[3], workers=3)
    clock, parts, _ = checkpoint.newest_complete(tmp_path, 2, None, lambda k: fps[k])
    assert clock == 4 and len(parts) == 5 and checkpoint.task_count(parts) == 6
    assert checkpoint.checkpoint_workers(tmp_path / "clock-00000004") == 3
    with pytest.raises(checkpoint.CheckpointError, match="made for another job"):
        checkpoint.check_complete(tmp_path, 4, 2, 2, fps[2])  # asked for 2 workers: 3 made it
    shutil.rmtree(tmp_path / "clock-00000004" / "worker-2")
    with pytest.raises(checkpoint.CheckpointError, match="worker-2"):
        checkpoint.check_complete(tmp_path, 4, 2, None, lambda k: fps[k])
    checkpoint.write_part(tmp_path, 8, "server", 0, {"x": np.arange(3)}, {}, fps[2])  # no count recorded
    with pytest.raises(checkpoint.CheckpointError, match="does not say how many workers"):
        checkpoint.checkpoint_workers(tmp_path / "clock-00000008")


@pytest.mark.slow
def test_time_rule_saves_at_the_boundaries_rank_0_chooses(tmp_path: Path) -> None:
    """``every_s``: the servers save at the first boundary after that many seconds, as client rank 0
    decides for all; those checkpoints are exact, the boundaries between them incomplete (workers
    save their part at every boundary) and deleted once a newer one is complete."""
    cfg = job(tmp_path, {"ticks": 16, "slow_rank": 0, "slow_s": 0.1}, staleness=1, every=1, every_s=0.35)
    code, out = launch(cfg, "--run-dir", tmp_path / "run")
    assert code == 0, out
    base = tmp_path / "run" / "checkpoints"
    complete = [c for c in checkpoint.clocks(base) if not _incomplete(base, c)]
    assert 2 <= len(complete) <= 8, complete  # about one per 4 ticks of >= 0.1 s
    for b in complete:
        np.testing.assert_array_equal(saved_sums(base, b), tri(b), err_msg=f"checkpoint at clock {b}")
    older = [c for c in checkpoint.clocks(base) if c < complete[0] and _incomplete(base, c)]
    assert older == [], f"incomplete checkpoints {older} left behind the newest complete one"


def _incomplete(base: Path, clock: int) -> bool:
    try:
        checkpoint.check_complete(base, clock, 2, 2, None)
        return False
    except checkpoint.CheckpointError:
        return True


def test_young_interval() -> None:
    from bosen.config import CheckpointConfig

    ck = CheckpointConfig(mttf_s=3600.0)
    assert ck.interval_s(2.0, 8) == pytest.approx((2 * 2.0 * 3600.0 / 8) ** 0.5)
    assert CheckpointConfig(every_s=5.0).interval_s(2.0, 8) == 5.0
    assert CheckpointConfig().interval_s(2.0, 8) == 0.0
    with pytest.raises(ValueError, match="every_s, mttf_s: choose at most one"):
        CheckpointConfig(every_s=1.0, mttf_s=1.0)


@pytest.mark.slow
@pytest.mark.parametrize("storage, cache_rows", [("dense", None), ("sparse", None), ("sparse", 2)])
def test_a_lost_server_is_replaced_from_its_checkpoint_and_no_update_is_lost(tmp_path: Path, storage: str,
                                                                             cache_rows: int | None) -> None:
    """SIGKILL of one of two servers mid-job: the launcher starts a replacement from that server's
    newest checkpoint part, the workers resend what they sent it since, the other server keeps its
    live values, and the job ends with exactly the sums of a run without the failure. Also where
    each worker caches at most 2 of the 8 rows (cache_rows: rows evicted and read again)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import child_env

    cfg = job(tmp_path, {"ticks": 40, "slow_rank": 1, "slow_s": 0.05}, staleness=2, every=4, storage=storage,
              cache_rows=cache_rows)
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(cfg), "--run-dir", str(run), "--no-plot"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(),
                         start_new_session=True)
    try:
        part = run / "checkpoints" / "clock-00000008" / "server-1" / "meta.json"
        deadline = time.monotonic() + 60
        while not part.exists():
            assert p.poll() is None and time.monotonic() < deadline, p.stdout.read() if p.stdout else ""
            time.sleep(0.02)
        time.sleep(0.3)  # a few clocks past the checkpoint: those updates are lost with the server
        victim = [c for c, cl in descendants(p.pid) if "bosen.server" in " ".join(cl) and "--rank 1" in " ".join(cl)]
        assert len(victim) == 1
        victim[0].send_signal(signal.SIGKILL)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 0, out
    assert "server-1 was killed by SIGKILL: starting a replacement" in out, out
    base = run / "checkpoints"
    np.testing.assert_array_equal(saved_sums(base, 40), tri(40))
    clients = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"kind": "client"' in x]
    # every client rejoined the replacement once; what each resent depends on when the kill came (all
    # it sent that server may be in the part the replacement restored: a kill just after a save), and
    # the exact sums above say nothing was lost or applied twice
    assert all(c["recoveries"] == 1 for c in clients), [c["recoveries"] for c in clients]


@pytest.mark.slow
def test_a_server_lost_before_its_first_checkpoint_restarts_from_the_initial_values(tmp_path: Path) -> None:
    """SIGKILL of a server before any part of its own is on disk: its replacement starts from the
    initial values at clock 0 and the workers resend everything they sent it; the job ends exact."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import child_env

    cfg = job(tmp_path, {"ticks": 40, "slow_rank": 1, "slow_s": 0.05}, staleness=2, every=40)
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(cfg), "--run-dir", str(run), "--no-plot"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(),
                         start_new_session=True)
    try:
        record = run / "workers" / "1.jsonl"
        deadline = time.monotonic() + 60
        while not (record.exists() and record.read_text().count('"clock": ') >= 5):
            assert p.poll() is None and time.monotonic() < deadline, p.stdout.read() if p.stdout else ""
            time.sleep(0.02)
        victim = [c for c, cl in descendants(p.pid) if "bosen.server" in " ".join(cl) and "--rank 1" in " ".join(cl)]
        assert len(victim) == 1
        victim[0].send_signal(signal.SIGKILL)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 0, out
    assert "server-1 was killed by SIGKILL: starting a replacement" in out, out
    assert "no checkpoint part of its own yet" in (run / "logs" / "server-1.1.log").read_text()
    np.testing.assert_array_equal(saved_sums(run / "checkpoints", 40), tri(40))


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["dense", "sparse"])
def test_priority_checkpoints_save_a_fraction_of_rows_and_resume_puts_them_together(tmp_path: Path,
                                                                                   storage: str) -> None:
    """``priority_fraction: 0.5`` (round robin): each save holds half of every shard's rows, exactly as
    of its clock, but every fifth (after partial saves worth 2 full ones), the base, holds all; a
    server resumed from them holds every row as of the last save that held it (a sparse table's by
    id: the same values as the dense table's)."""

    cfg_path = job(tmp_path, {"ticks": 12}, staleness=1, every=2, storage=storage, priority_fraction=0.5,
                   policy="round_robin")
    code, out = launch(cfg_path, "--run-dir", tmp_path / "run")
    assert code == 0, out
    base = tmp_path / "run" / "checkpoints"
    last_save = {}
    for b in sorted(checkpoint.clocks(base)):
        parts = checkpoint.check_complete(base, b, 2, 2, None)
        for j in range(2):
            arrays = parts[f"server-{j}"].load()
            if b == 10:  # the base
                assert parts[f"server-{j}"].info.get("base") is True and "partial" not in parts[f"server-{j}"].info
                assert arrays["t0.rows"].shape == (4,)
            else:
                assert parts[f"server-{j}"].info["partial"] == 0.5
                assert arrays["t0.rows"].shape == (2,)  # half of the server's 4 rows
            np.testing.assert_array_equal(arrays["t0.values"], tri(b))
            last_save.update(dict.fromkeys(arrays["t0.rows"].tolist(), b))
    assert sorted(last_save) == list(range(8)) and set(last_save.values()) == {10, 12}

    data = yaml.safe_load(cfg_path.read_text())
    got = resumed_table(data, tmp_path, base, 12)
    want = np.array([[tri(last_save[r])] * 2 for r in range(8)])
    np.testing.assert_array_equal(got, want)


def test_pruning_keeps_the_bases_of_a_server_that_joined(tmp_path: Path) -> None:
    """A job of 2 configured servers runs on 3 (``bosen scale --servers``): its checkpoints record the
    three (server 0's part info ``servers``), and server 2, replaced on its own, has its base at clock 2
    while servers 0 and 1 have theirs at 4. With ``keep: 1`` pruning keeps server 2's base too (its
    parts of clocks 3-6 chain from it), so clocks 2-6 stay; a checkpoint of the config's servers alone
    keeps only theirs."""
    three = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]

    def write(clock: int, servers: int, bases: dict[int, int]) -> None:
        for r in range(servers):
            info: dict = {"servers": three} if servers == 3 and r == 0 else {}
            if clock != bases[r]:
                info["partial"] = 0.5
            checkpoint.write_part(tmp_path, clock, "server", r, {"x": np.arange(3)}, info, "fp")
        checkpoint.write_part(tmp_path, clock, "worker", 0, {"tick": np.array([clock])}, {}, "fp")

    for c in range(1, 7):
        write(c, 3, {0: 4, 1: 4, 2: 2})
    assert checkpoint.prune_bases(tmp_path, 1, 2, 1) == [1]
    assert checkpoint.clocks(tmp_path) == [6, 5, 4, 3, 2]
    shutil.rmtree(tmp_path)
    for c in range(1, 7):  # the same bases, made by the config's two servers: server 2 is none of theirs
        write(c, 2, {0: 4, 1: 4})
    assert checkpoint.prune_bases(tmp_path, 1, 2, 1) == [3, 2, 1]
    assert checkpoint.clocks(tmp_path) == [6, 5, 4]


@pytest.mark.slow
def test_priority_checkpoints_are_compacted_to_keep_bases(tmp_path: Path) -> None:
    """``priority_fraction: 0.5`` at every clock, ``keep: 2``, 24 clocks: bases at clocks 5, 10, 15,
    20; the launcher deletes what is older than the second newest base, so 10 checkpoints are left of
    24, and a server resumed from them holds every row as of the last save that held it."""

    cfg_path = job(tmp_path, {"ticks": 24}, staleness=1, every=1, priority_fraction=0.5, policy="round_robin")
    data = yaml.safe_load(cfg_path.read_text())
    data["checkpoint"]["keep"] = 2
    cfg_path.write_text(yaml.safe_dump(data))
    code, out = launch(cfg_path, "--run-dir", tmp_path / "run")
    assert code == 0, out
    base = tmp_path / "run" / "checkpoints"
    assert checkpoint.clocks(base) == list(range(24, 14, -1))
    last_save = {}
    for b in sorted(checkpoint.clocks(base)):
        parts = checkpoint.check_complete(base, b, 2, 2, None)
        for j in range(2):
            assert ("partial" not in parts[f"server-{j}"].info) == (b in (15, 20)), (b, parts[f"server-{j}"].info)
            arrays = parts[f"server-{j}"].load()
            last_save.update(dict.fromkeys(arrays["t0.rows"].tolist(), b))
    assert set(last_save.values()) == {23, 24}
    got = resumed_table(data, tmp_path, base, 24)
    np.testing.assert_array_equal(got, np.array([[tri(last_save[r])] * 2 for r in range(8)]))


def _shards(cfg, rank: int) -> list:
    from bosen.partition import Partition
    from bosen.server import procedures
    from bosen.server.shard import TableShard

    return [TableShard(i, t, Partition(len(cfg.cluster.servers)), rank, 1, procedures.load(t, "job.yaml"), cfg.comm)
            for i, t in enumerate(cfg.tables)]


@pytest.mark.parametrize("policy", ["priority", "round_robin", "random"])
def test_priority_checkpoints_of_sparse_shards_save_stored_rows_by_id_and_restore_them(tmp_path: Path,
                                                                                      policy: str) -> None:
    """Sparse shards (a float table, an AdaRevision table, a counts table) that store more rows
    clock by clock: each priority save holds the fraction of the rows stored then, with their ids
    (``priority``: the rows farthest from their saved copy, a row stored since the last save counted
    from its initial value); a server restored from the saves holds exactly the rows some save
    held, each as of the last save that held it, with its procedure state, and a row no save held
    starts at its initial value on first touch."""
    from bosen import config as config_mod
    from bosen import scar
    from bosen.server.checkpoints import ServerCheckpoints, restore
    from bosen.wire import UpdateBatch

    rows, rank, fraction = 400, 1, 0.25
    sparse = {"rows": rows, "storage": "sparse"}
    cfg = config_mod.load({
        "cluster": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "workers": 1},
        "tables": {"W": {**sparse, "cols": 3, "dtype": "float64", "init": {"normal": 1.0, "seed": 2}},
                   "V": {**sparse, "cols": 2, "dtype": "float64", "update": "adarevision"},
                   "C": {**sparse, "cols": 4, "dtype": "int64"}},
        "checkpoint": {"every_clocks": 1, "dir": str(tmp_path), "priority_fraction": fraction, "policy": policy}})
    shards = _shards(cfg, rank)
    ck = ServerCheckpoints(cfg, rank)
    ck.start_running(shards)  # nothing stored yet
    rng = np.random.default_rng(4)
    mine = np.arange(rank, rows, 2)
    saved_copy: list[dict[int, np.ndarray]] = [{} for _ in shards]  # id -> the row as last saved
    # id -> the clock, row and procedure state of the last save that held it
    last: list[dict[int, tuple[int, np.ndarray, dict[str, np.ndarray]]]] = [{} for _ in shards]
    picked: dict[tuple[int, int], np.ndarray] = {}  # (clock, table) -> the ids its save took
    for clock in range(1, 9):
        for s in shards:
            ids = rng.choice(mine[:25 * clock], size=30)  # more rows each clock, some of them new
            n = ids.shape[0]
            if s.versioned:
                empty = np.empty(0, np.int64)
                s.apply(UpdateBatch(ids, rng.normal(size=(n, 2)), tags=np.zeros(n, np.int64),
                                    eov=np.zeros(n, bool), rel_rows=empty, rel_tags=empty), 0)
            elif s.dtype.kind == "i":
                s.apply(UpdateBatch(ids, rng.integers(0, 5, size=(n, 4))), 0)
            else:
                s.apply(UpdateBatch(ids, rng.normal(size=(n, 3))), 0)
        want = []
        for i, s in enumerate(shards):  # what the policy must pick, from a model of the running checkpoint
            n, ids = s.stored, s.global_rows
            ref = np.stack([saved_copy[i].get(int(r), s.initial(ids[k:k + 1])[0]) for k, r in enumerate(ids)])
            dist = scar.row_distance(s.values[:n], ref, "tv" if s.dtype.kind == "i" else "l2")
            want.append(ids[scar.choose("priority", n, fraction, distance=dist)])
        ck.save(clock, shards, {})
        for i, s in enumerate(shards):
            run = ck.running[i]
            assert run.n_rows == s.stored
            slots = np.flatnonzero(run.saved_clock == clock)  # the rows this save took
            assert slots.shape[0] == scar.rows_for(fraction, s.stored) < s.stored
            ids = s.global_rows[slots]
            picked[clock, i] = ids
            if policy == "priority":
                np.testing.assert_array_equal(ids, want[i])
            for k, r in zip(slots.tolist(), ids.tolist(), strict=True):
                saved_copy[i][r] = s.values[k].copy()
                last[i][r] = (clock, s.values[k].copy(), {n: v[k].copy() for n, v in s.procedure.state().items()})
    ck.close()
    assert all(s.stored < mine.shape[0] for s in shards)
    for clock in range(1, 9):  # on disk: the rows each save took, by id, with their values and state
        arrays = checkpoint.read_part(checkpoint.clock_dir(tmp_path, clock) / "server-1").load()
        for i in range(len(shards)):
            ids = arrays[f"t{i}.rows"]
            np.testing.assert_array_equal(ids, picked[clock, i])
            for k, r in enumerate(ids.tolist()):
                if last[i][r][0] == clock:
                    np.testing.assert_array_equal(arrays[f"t{i}.values"][k], last[i][r][1])
                    for name, v in last[i][r][2].items():
                        np.testing.assert_array_equal(arrays[f"t{i}.{name}"][k], v)

    fresh = _shards(cfg, rank)
    assert restore(cfg, rank, fresh, checkpoint.clock_dir(tmp_path, 8)) == 8
    for i, (s, old) in enumerate(zip(fresh, shards, strict=True)):
        assert sorted(s.global_rows.tolist()) == sorted(last[i]) and s.stored < old.stored
        for r, (_, values, state) in last[i].items():
            local, _ = s.local_rows(np.array([r]), "test")
            np.testing.assert_array_equal(s.values[local[0]], values)
            for name, v in s.procedure.state().items():
                np.testing.assert_array_equal(v[local[0]], state[name], err_msg=name)
        never = np.setdiff1d(mine, list(last[i]))[:10]  # touched or not before, no save held them
        local, _ = s.local_rows(never, "test")
        np.testing.assert_array_equal(s.values[local], s.initial(never))
        if s.versioned:
            assert (s.procedure.versions[local] == 0).all() and (s.procedure.z[local] == 1.0).all()


def test_a_lost_servers_replacement_restores_its_part_made_by_another_worker_count(tmp_path: Path) -> None:
    """A job that resumed with 3 workers from a checkpoint 2 made: a server lost before the next
    checkpoint restores the part the job resumed from (its manifest says 2 workers made it); a part of
    another model is still refused."""
    from bosen.config import build as config_from_dict
    from bosen.errors import ConfigError
    from bosen.server.checkpoints import restore

    data = {"cluster": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "workers": 2},
            "tables": {"W": {"rows": 8, "cols": 2, "dtype": "int64"}}}
    two = config_from_dict(data)
    three = config_from_dict({**data, "cluster": {**data["cluster"], "workers": 3}})
    rows = np.arange(1, 8, 2)
    base = tmp_path / "checkpoints"
    checkpoint.write_part(base, 6, "server", 1, {"t0.values": np.full((4, 2), 21, np.int64), "t0.rows": rows},
                          {"tables": {"t0": {"name": "W"}}}, checkpoint.model_fingerprint(two), workers=2)
    shards = _shards(three, 1)
    assert restore(three, 1, shards, base, own=True) == 6
    np.testing.assert_array_equal(shards[0].values, np.full((4, 2), 21))
    other = config_from_dict({**data, "tables": {"W": {"rows": 8, "cols": 3, "dtype": "int64"}}})
    with pytest.raises(ConfigError, match="no valid part server-1"):
        restore(other, 1, _shards(other, 1), base, own=True)


def test_a_checkpoint_made_by_three_servers_resumes_on_the_configs_two(tmp_path: Path) -> None:
    """Parts of three servers (servers joined the job) hold rows by global id: each of the config's two
    servers takes the rows its map gives it from all three, with their procedure state; priority
    (SCAR) parts are put together per old server first (here each the first of its chain, over the
    initial values: the same rows)."""
    from bosen.config import build as config_from_dict
    from bosen.server.checkpoints import restore

    data = {"cluster": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "workers": 2},
            "tables": {"W": {"rows": 40, "cols": 2, "dtype": "float64", "update": "adagrad"}}}
    cfg = config_from_dict(data)
    three = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    base = tmp_path / "checkpoints"
    fp = checkpoint.model_fingerprint(cfg)

    def write(partial: bool) -> None:
        for r in range(3):
            rows = np.arange(r, 40, 3)
            info = {"tables": {"t0": {"name": "W"}}, "servers": three, **({"partial": 0.5} if partial else {})}
            checkpoint.write_part(base, 6, "server", r, {"t0.values": np.stack([rows * 10.0, -rows]).T,
                                                         "t0.rows": rows, "t0.z": rows[:, None] + 0.5 * np.ones(2)},
                                  info, fp, workers=2)

    for partial in (False, True):
        shutil.rmtree(base, ignore_errors=True)
        write(partial)
        got = 0
        for rank in (0, 1):
            shards = _shards(cfg, rank)
            assert restore(cfg, rank, shards, checkpoint.clock_dir(base, 6)) == 6
            s = shards[0]
            ids = s.global_rows[:s.stored]
            local, _ = s.local_rows(ids, "test")
            np.testing.assert_array_equal(s.values[local], np.stack([ids * 10.0, -ids]).T)
            state = s.procedure.state()
            assert set(state) == {"z"}, state.keys()
            np.testing.assert_array_equal(state["z"][local], ids[:, None] + 0.5 * np.ones(2))
            got += ids.shape[0]
        assert got == 40


def test_a_server_lost_after_a_partition_move_is_replaced_from_its_move_part(bosen_cluster, tmp_path, caplog):
    """A server lost after partitions moved and before its next checkpoint part (docs/recovery.md): each
    server wrote a part as the partitions moved (its rows under the new map: what each client sent before
    it paused, client 0 one tick ahead of client 1), the replacement (``--recover --shape-from``) restores
    it, and each client resends what followed its PAUSED, not all since the part's clock (client 0's
    tick 4 went before; each says what it resent, client 0 nothing): every read, the replacement's next
    checkpoint part and the final sums stay exact. Without that part (a server lost during the move)
    the replacement refuses, naming both maps; and ``--shape-from`` without ``--recover`` is refused."""
    import signal

    from conftest import PY, run_cmd, wait_until

    from bosen.client import Client
    from bosen.config import load
    from bosen.jobs import status as status_mod
    from bosen.jobs.job import job_config
    from bosen.jobs.moves import move_partitions

    data = job_config([], 2, tables={"W": {"rows": 40, "cols": 2, "dtype": "int64"}}, partitions=8)
    base = tmp_path / "ck"
    data["checkpoint"] = {"every_clocks": 3, "dir": str(base), "keep": 10}
    c = bosen_cluster(2, config=data)
    cfg = load(c.path)
    rows, ones = np.arange(40, dtype=np.int64), np.ones((40, 2), dtype=np.int64)

    def table(clock: int) -> np.ndarray:  # both servers' parts of checkpoint ``clock``
        full = np.zeros((40, 2), dtype=np.int64)
        for j in range(2):
            arrays = checkpoint.read_part(checkpoint.clock_dir(base, clock) / f"server-{j}").load()
            full[arrays["t0.rows"]] = arrays["t0.values"]
        return full

    def ticks(client: Client, n: int, which: np.ndarray = rows) -> None:
        for _ in range(n):
            client.table("W").inc_rows(which, ones[:which.shape[0]])
            client.clock()

    kept = rows[np.isin(rows % 8, [1, 7])]  # server 1's partitions before the move and after
    with Client.connect(c.path, rank=0) as a, Client.connect(c.path, rank=1) as b:
        ticks(a, 4)  # the servers' parts of clock 3 under map 0
        ticks(b, 4)
        ticks(a, 1, kept)  # client 0's tick 4 (only rows server 1 keeps), before the move: in its move part
        assert move_partitions(cfg, np.array([1, 1, 0, 0, 1, 0, 1, 1], dtype=np.int32)).version == 1
        deadline = time.monotonic() + 30  # each server's move part is written in the background
        while not all((checkpoint.move_dir(base, 4, 1) / f"server-{j}" / "meta.json").is_file() for j in (0, 1)):
            assert time.monotonic() < deadline, "the move parts were not written"
            time.sleep(0.02)
        assert checkpoint.moves(base) == [(4, 1)] and checkpoint.clocks(base) == [3]
        ticks(b, 1)  # under map 1: in no checkpoint part
        server = [PY, "-m", "bosen.server", "--config", c.path, "--rank", 1, "--resume", base]
        moved = checkpoint.move_dir(base, 4, 1) / "server-1"
        moved.rename(moved.with_name("away"))  # as if lost during the move: its part under map 0 is older
        r = run_cmd([*server, "--recover", "--shape-from", c.addresses[0]])
        assert r.returncode == 2, r.stdout + r.stderr
        assert "server 1's newest checkpoint part was saved under partition map 0, but the job follows map 1" \
               in r.stderr, r.stderr
        moved.with_name("away").rename(moved)
        r = run_cmd([*server, "--shape-from", c.addresses[0]])
        assert r.returncode == 2 and "--shape-from goes with --recover --rank N" in r.stderr, r.stderr
        c.stop_server(1, signal.SIGKILL)
        caplog.set_level(logging.WARNING, logger="bosen.client")
        new = c.replace_server(1, ["--resume", str(base), "--recover", "--shape-from", c.addresses[0],
                                   "--hold-lost"])
        # its values hold every update of ticks up to each client's clock at the move (5 and 4), none in
        # its take-back log: a lost worker is taken back whole here only from 6 on (server/undo.py)
        assert status_mod.query(c.addresses[1], timeout=10.0)["take_back_from"] == 6
        ticks(a, 4)  # to clock 9 each, through the replacement's part of clock 6 (under map 1)
        ticks(b, 4)
        extra = np.isin(rows % 8, [1, 7])[:, None] * ones  # client 0's tick 4
        np.testing.assert_array_equal(a.table("W").get_rows(rows), 17 + extra)
    # what each client resent, not what its log keeps: client 0 sent nothing after its PAUSED
    resent = sorted(int(m.group(1)) for r in caplog.records
                    if (m := re.search(r"part of the move to partition map 1 \(clock 4\): resent (\d+) messages",
                                       r.getMessage())))
    assert len(resent) == 2 and resent[0] == 0 < resent[1], resent
    assert f"resumed from {moved} at clock 4" in new.tail(60), new.tail(60)
    assert wait_until(lambda: all((checkpoint.clock_dir(base, k) / f"server-{j}" / checkpoint.META).exists()
                                  for k in (6, 9) for j in range(2)))  # written in the background
    np.testing.assert_array_equal(table(3), np.full((40, 2), 6))
    np.testing.assert_array_equal(table(6), 11 + extra)
    checkpoint.prune(base, 10, 2, 2)  # a complete checkpoint after it: every server has a newer part
    assert checkpoint.moves(base) == [] and checkpoint.clocks(base) == [9, 6, 3]
    assert checkpoint.read_part(checkpoint.clock_dir(base, 6) / "server-1").info["map"]["version"] == 1


def test_partitions_move_in_a_job_with_priority_checkpoints_and_restore_exactly(bosen_cluster, tmp_path):
    """SCAR priority checkpoints (``priority_fraction: 0.5``) and a partition move (docs/recovery.md):
    the parts before the move hold half the rows each, under map 0; after the move each server's next
    part is a base (every row, under map 1), so a server lost after it is replaced exactly (its base,
    then the clients' resend), the replacement's own next part is a base too, and the whole job
    resumed from the base holds exactly its sums; restored from the next checkpoint (server 0's part
    there of half its rows), each row is as of the last save under map 1 that held it, and without
    that base the parts saved under map 0 are not chained in: refused."""
    import signal

    from conftest import wait_until

    from bosen.client import Client
    from bosen.config import load
    from bosen.errors import ConfigError
    from bosen.jobs.job import job_config
    from bosen.jobs.moves import move_partitions
    from bosen.server.checkpoints import restore

    # staleness 0: a read at tick 10 holds both clients' 10 ticks (at 1 it may miss the other's last)
    data = job_config([], 2, tables={"W": {"rows": 40, "cols": 2, "dtype": "int64"}}, partitions=8, staleness=0)
    base = tmp_path / "ck"
    data["checkpoint"] = {"every_clocks": 3, "dir": str(base), "keep": 10, "priority_fraction": 0.5,
                          "policy": "round_robin"}
    c = bosen_cluster(2, config=data)
    rows, ones = np.arange(40, dtype=np.int64), np.ones((40, 2), dtype=np.int64)

    def ticks(*clients: Client, n: int) -> None:
        for client in clients:
            for _ in range(n):
                client.table("W").inc_rows(rows, ones)
                client.clock()

    def parts(clock: int) -> list[checkpoint.Part]:
        where = checkpoint.clock_dir(base, clock)
        assert wait_until(lambda: all((where / f"server-{j}" / checkpoint.META).exists() for j in (0, 1)))
        return [checkpoint.read_part(where / f"server-{j}") for j in (0, 1)]

    def resumed(clock: int) -> np.ndarray:
        again = bosen_cluster(2, config=data, server_args=["--resume", str(checkpoint.clock_dir(base, clock))])
        with Client.connect(again.path, rank=0) as client:
            assert client.tick == clock
            got = client.table("W").get_rows(rows)
        again.stop()
        return got

    with Client.connect(c.path, rank=0) as a, Client.connect(c.path, rank=1) as b:
        ticks(a, b, n=4)
        assert all(p.info["partial"] == 0.5 and p.load()["t0.rows"].shape == (10,) for p in parts(3))
        assert move_partitions(load(c.path), np.array([1, 1, 0, 0, 1, 0, 1, 1], dtype=np.int32)).version == 1
        ticks(a, b, n=3)
        six = parts(6)  # bases under map 1: every row of the partitions each server owns now
        assert [p.info.get("base") for p in six] == [True, True] and [p.info["map"]["version"] for p in six] == [1, 1]
        assert [p.load()["t0.rows"].shape[0] for p in six] == [15, 25]
        c.stop_server(1, signal.SIGKILL)
        new = c.replace_server(1, ["--resume", str(base), "--recover", "--shape-from", c.addresses[0]])
        ticks(a, b, n=3)
        np.testing.assert_array_equal(a.table("W").get_rows(rows), np.full((40, 2), 20))  # 10 ticks each
    assert f"resumed from {checkpoint.clock_dir(base, 6) / 'server-1'} at clock 6 (1 part)" in new.tail(80)
    nine = parts(9)
    assert "partial" in nine[0].info and nine[1].info.get("base") is True  # the replacement restarted: a base
    np.testing.assert_array_equal(resumed(6), np.full((40, 2), 12))
    cfg = load(c.path)
    got = np.zeros((40, 2), dtype=np.int64)
    for rank in (0, 1):  # in this process: server 0 chains its base of 6 and its part of 9, server 1 its base of 9
        shards = _shards(cfg, rank)
        assert restore(cfg, rank, shards, checkpoint.clock_dir(base, 9)) == 9
        ids = shards[0].global_rows[:shards[0].stored]
        got[ids] = shards[0].values[shards[0].local_rows(ids, "test")[0]]
    want = np.full((40, 2), 18)
    want[np.setdiff1d(six[0].load()["t0.rows"], nine[0].load()["t0.rows"])] = 12
    np.testing.assert_array_equal(got, want)
    six[0].path.rename(six[0].path.with_name("away"))  # no base under map 1 before it: the parts of map 0 do not do
    with pytest.raises(ConfigError, match="saved under partition map 1, but no valid base"):
        restore(cfg, 0, _shards(cfg, 0), checkpoint.clock_dir(base, 9))


def test_priority_checkpoints_made_by_3_servers_resume_on_the_configs_2_exactly(bosen_cluster, tmp_path):
    """SCAR priority checkpoints (``priority_fraction: 0.5``) of a job whose third server joined
    (``scale_servers``): its parts after the move are bases under the 3-server map, the next ones
    hold half of each server's rows. Resumed from the newest with the config's 2 servers, each server
    replays every old server's chain (base, then the partial part on top) and keeps the rows the
    config's map gives it: each row is exactly as of the last save that held it, read by a client of
    the resumed job. Without the third server's base its chain cannot be put together: refused."""
    from conftest import wait_until

    from bosen.client import Client
    from bosen.config import load
    from bosen.errors import ConfigError
    from bosen.jobs.job import job_config
    from bosen.jobs.moves import scale_servers
    from bosen.partition import Partition
    from bosen.server import procedures
    from bosen.server.checkpoints import restore
    from bosen.server.shard import TableShard

    data = job_config([], 2, tables={"W": {"rows": 40, "cols": 2, "dtype": "int64"}}, partitions=6, staleness=0)
    base = tmp_path / "ck"
    data["checkpoint"] = {"every_clocks": 3, "dir": str(base), "keep": 10, "priority_fraction": 0.5,
                          "policy": "round_robin"}
    c = bosen_cluster(2, config=data)
    added = c.add_server()
    cfg = load(c.path)
    rows, ones = np.arange(40, dtype=np.int64), np.ones((40, 2), dtype=np.int64)

    def ticks(*clients: Client, n: int) -> None:
        for client in clients:
            for _ in range(n):
                client.table("W").inc_rows(rows, ones)
                client.clock()

    def parts(clock: int) -> list[checkpoint.Part]:
        where = checkpoint.clock_dir(base, clock)
        assert wait_until(lambda: all((where / f"server-{j}" / checkpoint.META).exists() for j in range(3)), 30)
        return [checkpoint.read_part(where / f"server-{j}") for j in range(3)]

    with Client.connect(c.path, rank=0) as a, Client.connect(c.path, rank=1) as b:
        ticks(a, b, n=4)
        scale_servers(cfg, [*cfg.cluster.servers, added])
        ticks(a, b, n=6)
        six, nine = parts(6), parts(9)
    assert [p.info.get("base") for p in six] == [True] * 3 and [p.info["map"]["version"] for p in six] == [1] * 3
    assert all(p.info["partial"] == 0.5 and p.info["map"]["version"] == 1 for p in nine)
    assert checkpoint.recorded_servers(checkpoint.clock_dir(base, 9)) == 3
    want = np.full((40, 2), 12)  # each row as of the last save that held it: clock 6 (every row), or 9
    want[np.concatenate([p.load()["t0.rows"] for p in nine])] = 18
    assert (want == 18).sum() == 40 and (want == 12).sum() == 40  # half of the rows each
    again = bosen_cluster(2, config=data, server_args=["--resume", str(checkpoint.clock_dir(base, 9))])
    with Client.connect(again.path, rank=0) as client:
        assert client.tick == 9
        np.testing.assert_array_equal(client.table("W").get_rows(rows), want)
    again.stop()
    assert "from the parts of the 3 servers that made it (6 parts)" in again.servers[0].tail(40)
    (six[2].path / checkpoint.META).unlink()  # the third server's base gone: its partial part has nothing under it
    shards = [TableShard(i, t, Partition(2, cfg.cluster.num_partitions), 0, 2, procedures.load(t, "job.yaml"),
                         cfg.comm) for i, t in enumerate(cfg.tables)]
    with pytest.raises(ConfigError, match="server-2: a priority .SCAR. part saved under partition map 1, but no "
                                          "valid base"):
        restore(cfg, 0, shards, checkpoint.clock_dir(base, 9))


def test_a_replacement_takes_the_jobs_worker_ranks_and_refuses_one_that_left_after_its_part(tmp_path: Path) -> None:
    """``--recover --shape-from`` in a job whose workers joined or left (docs/recovery.md): the replacement
    counts the job's ranks now; those in the job at its part's clock C count from C, a rank that joined
    since from the clock it joined at, a rank kept for a joiner and one that left before C hold nobody
    back. A rank that left (bosen scale) after C took the updates it sent since with it: refused, unless
    the launcher names it as finished (``gone``); a rank that joined before C which the part does not
    record means the part is not this job's."""
    from bosen.config import build as config_from_dict
    from bosen.server.daemon import GONE, Server
    from bosen.server.moves import Joining

    base = tmp_path / "ck"
    cfg = config_from_dict({"cluster": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "workers": 2},
                            "tables": {"W": {"rows": 8, "cols": 2, "dtype": "int64"}},
                            "checkpoint": {"every_clocks": 3, "dir": str(base)}})
    checkpoint.write_part(base, 6, "server", 1,
                          {"t0.values": np.full((4, 2), 5, np.int64), "t0.rows": np.arange(1, 8, 2)},
                          {"tables": {"t0": {"name": "W"}}, "client_clocks": [6, 7, 6]},
                          checkpoint.model_fingerprint(cfg), workers=2)
    owner = np.arange(cfg.cluster.num_partitions, dtype=np.int32) % 2

    def replacement(clocks: list, joined: list, left: list, gone: tuple[int, ...] = (),
                    hold_lost: bool = True) -> Server:
        shape = Joining("", list(cfg.cluster.servers), 9, clocks, owner, 0, joined, left)
        return Server(cfg, 1, resume=base, recover=True, gone=gone, hold_lost=hold_lost, shape=shape)

    # ranks 0, 1 from the start, 2 joined at 4 (before the part), 3 at 8 (after), 4 kept for a joiner,
    # 5 joined at 1 and left at 5 (before the part)
    s = replacement([9, 9, 10, 9, "left", "left"], [0, 0, 4, 8, None, 1], [None] * 5 + [5])
    try:
        assert s.clock == 6 and s.num_clients == 6
        assert s.client_clock.tolist() == [6, 6, 6, 8, GONE, GONE]
        assert s.joined_at == [0, 0, 4, 8, GONE, 1] and s.left_at == {5: 5}
        assert s.stats()["joined_at"] == [0, 0, 4, 8, None, 1]
    finally:
        s.close()
    left_after = ([9, 9, "left"], [0, 0, 4], [None, None, 8])
    with pytest.raises(ValueError, match="worker rank 2 left the job at clock 8 .* after this server's newest "
                                         "checkpoint part \\(clock 6\\)"):
        replacement(*left_after)
    s = replacement(*left_after, gone=(2,))  # it ended its clocks: accepted as in a job that never scaled
    try:
        assert s.client_clock.tolist() == [6, 6, GONE]
    finally:
        s.close()
    with pytest.raises(ValueError, match="worker rank 3 joined the job at clock 2, before this server's part of "
                                         "clock 6, which does not record it"):
        # (without --hold-lost: with it, no checkpoint being complete, it starts from the initial values)
        replacement([9, 9, 9, 9], [0, 0, 4, 2], [None] * 4, hold_lost=False)
    # a server joining the job (bosen scale --servers) knows the ranks as server 0 does, so its STATUS
    # serves a later replacement as well
    joined = Server(cfg, -1, join=Joining("127.0.0.1:3", list(cfg.cluster.servers), 9, [9, "left", 9, "left"],
                                          owner, 0, [0, 0, 4, None], [None, 5, None, None]))
    try:
        assert joined.rank == 2 and joined.joined_at == [0, 0, 4, GONE] and joined.left_at == {1: 5}
        assert joined.stats()["left_at"] == [None, 5, None, None]
    finally:
        joined.close()
