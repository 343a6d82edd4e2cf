"""``bosen launch --ray ADDRESS`` (bosen/jobs/ray.py) on Ray's own multi-node test cluster: real
server and worker processes in actors on two Ray nodes of this machine, against the plain launch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from conftest import PY, child_env, run_cmd, write_config
from test_scale import _final_counts, _lda_job, _log, _scale_thread, _took_effect_after_failing, _until, _wait_clock

import bosen
from bosen import checkpoint, security
from bosen.apps import microtasks as M
from bosen.apps.lda.worker import LDAArgs
from bosen.config import from_dict
from bosen.jobs.scale import ScaleError, launcher_status

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
from ray.cluster_utils import Cluster  # noqa: E402

# one Ray cluster for the file (``ray_cluster``): pytest-xdist runs all of its tests in one process
pytestmark = pytest.mark.xdist_group("ray")

TICKS = 6
ROLES = {"server_resources": {"ps": 1}, "worker_resources": {"trainer": 1}}  # servers and workers apart


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    """Two Ray nodes on this machine: the head holds the ``ps`` resource, the other ``trainer``."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"ps": 4},
                                                            "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2, resources={"trainer": 4})
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def job(tmp_path: Path, app: dict, name: str, ray_section: dict | None = None, ckpt: bool = True, every: int = 2,
        read_timeout_s: float = 30) -> Path:
    cfg: dict = {
        "cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": 2},
        "consistency": {"staleness": 2, "read_timeout_s": read_timeout_s},
        "tables": {"W": {"rows": 8, "cols": 2, "dtype": "int64"}},
        "app": app,
        # managed communication: budgeted sends and pushes mid-clock besides the end-of-tick flushes
        "comm": {"client_bandwidth_mbps": 1, "server_bandwidth_mbps": 1, "client_send_rows": 2,
                 "server_push_rows": 2},
    }
    if ckpt:
        cfg["checkpoint"] = {"every_clocks": every, "keep": 100}
    if ray_section is not None:
        cfg["ray"] = ray_section
    return write_config(tmp_path / name, cfg)


def launch(*args: object, timeout: float = 90) -> tuple[int, str]:
    r = run_cmd([PY, "-m", "bosen", "launch", *args, "--no-plot"], timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def tables_at(run: Path, clock: int) -> np.ndarray:
    """Table W as the run's checkpoint at ``clock`` holds it (both servers' parts put together)."""
    parts = checkpoint.check_complete(run / "checkpoints", clock, 2, 2, None)
    full = np.zeros((8, 2), dtype=np.int64)
    for j in range(2):
        arrays = parts[f"server-{j}"].load()
        full[arrays["t0.rows"]] = arrays["t0.values"]
    return full


def clock_records(run: Path) -> list[tuple[int, int]]:
    """(clock, workers) of each merged clock record in the run's metrics.jsonl."""
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [(r["clock"], r["workers"]) for r in recs if r["kind"] == "clock"]


def left_running(run: Path) -> list[str]:
    """Processes of the job (actors and their children) still alive after the launcher returned."""
    placed = json.loads((run / "ray.json").read_text())["processes"]
    return [f"{name} pid {p[key]}" for name, p in placed.items() for key in ("pid", "actor_pid")
            if psutil.pid_exists(p[key]) and psutil.Process(p[key]).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_a_job_on_two_ray_nodes_ends_with_the_tables_of_the_plain_launch(tmp_path: Path, ray_cluster: Cluster) -> None:
    """Servers on one Ray node, workers on the other, ZeroMQ over TCP between them: integer
    addition under SSP and managed communication ends with exactly the plain launch's tables."""
    app = {"module": "checkpoint_worker", "args": {"ticks": TICKS}}
    code, out = launch(job(tmp_path, app, "plain.yaml"), "--run-dir", tmp_path / "plain")
    assert code == 0, out
    code, out = launch(job(tmp_path, app, "ray.yaml", ROLES), "--run-dir", tmp_path / "ray",
                       "--ray", ray_cluster.address)
    assert code == 0, out
    assert "Ray: 4 actors on 2 node(s)" in out, out
    # servers on a node's address: CURVE, with keys the launcher made for the job (bosen.security.job_keys)
    on_loopback = all(security.is_loopback(n["node_ip"]) for n in json.loads(
        (tmp_path / "ray" / "ray.json").read_text())["processes"].values())
    assert ("security: CURVE" in out) == (not on_loopback), out
    assert on_loopback or (tmp_path / "ray" / "keys" / "server.key_secret").stat().st_mode & 0o077 == 0

    placed = json.loads((tmp_path / "ray" / "ray.json").read_text())["processes"]
    head = ray_cluster.head_node.node_id
    assert {placed[f"server-{i}"]["node_id"] for i in range(2)} == {head}
    assert {placed[f"worker-{r}"]["node_id"] for r in range(2)} == {ray_cluster.list_all_nodes()[1].node_id}
    servers = yaml.safe_load((tmp_path / "ray" / "config.yaml").read_text())["cluster"]["servers"]
    assert [s.rpartition(":")[0] for s in servers] == [placed[f"server-{i}"]["node_ip"] for i in range(2)]

    assert checkpoint.clocks(tmp_path / "ray" / "checkpoints") == checkpoint.clocks(tmp_path / "plain" / "checkpoints")
    for b in checkpoint.clocks(tmp_path / "ray" / "checkpoints"):
        np.testing.assert_array_equal(tables_at(tmp_path / "ray", b), tables_at(tmp_path / "plain", b))
    np.testing.assert_array_equal(tables_at(tmp_path / "ray", TICKS), TICKS * (TICKS + 1) // 2)
    assert (tmp_path / "ray" / "logs" / "worker-1.log").exists()
    assert clock_records(tmp_path / "ray") == clock_records(tmp_path / "plain")
    assert left_running(tmp_path / "ray") == []


@pytest.mark.slow
def test_a_worker_that_dies_in_its_actor_fails_the_job_and_nothing_is_left(tmp_path: Path,
                                                                          ray_cluster: Cluster) -> None:
    app = {"module": "launch_worker", "args": {"ticks": 50, "die_at": 2, "die_rank": 1, "sleep_s": 0.05}}
    code, out = launch(job(tmp_path, app, "die.yaml", ROLES, ckpt=False), "--run-dir", tmp_path / "run",
                       "--ray", ray_cluster.address)
    assert code == 1, out
    # no checkpoints: the lost worker is not replaced (docs/recovery.md), the job stops
    assert "job failed: worker-1 was killed by SIGKILL (a lost worker is replaced only in a job that makes " \
           "checkpoints" in out, out
    assert left_running(tmp_path / "run") == []


@pytest.mark.slow  # starts the module's Ray cluster (4 s)
def test_an_impossible_placement_is_a_clear_error(tmp_path: Path, ray_cluster: Cluster) -> None:
    app = {"module": "launch_worker", "args": {}}
    cfg = job(tmp_path, app, "big.yaml", {"server_resources": {"ps": 1}, "worker_resources": {"nowhere": 1}},
              ckpt=False)
    code, out = launch(cfg, "--run-dir", tmp_path / "run", "--ray", ray_cluster.address, "--set",
                       "ray.worker_cpus=0")
    assert code != 0, out
    assert "cannot place the job" in out and "'nowhere': 2.0" in out, out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bosen_scale_asks_ray_for_actors_and_releases_them(tmp_path: Path, ray_cluster: Cluster) -> None:
    """An LDA job (8 micro-tasks, managed communication, integer counts) launched on the two Ray nodes,
    scaled to 3 workers and 3 servers and back: the new worker's actor lands on the ``trainer`` node and
    the new server's on the ``ps`` node, listening on that node's IP, each from a placement group of
    its step that is removed when it leaves; a request the cluster cannot hold is refused at once and
    changes nothing; the job ends with the word-topic table exactly the counts of its final assignments."""
    iterations = 1200  # long enough for joiners started ahead (Ray actors, imports, data) to be ready
    path, cfg = _lda_job(tmp_path, iterations)
    cfg["ray"] = {**ROLES, "server_cpus": 0.5, "worker_cpus": 0.5}  # the nodes' 2 CPUs hold 3 of each
    path.write_text(json.dumps(cfg))
    run = (tmp_path / "run").resolve()
    p = subprocess.Popen([PY, "-m", "bosen", "launch", str(path), "--run-dir", str(run), "--no-plot",
                          "--ray", ray_cluster.address], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    head, other = ray_cluster.head_node.node_id, ray_cluster.list_all_nodes()[1].node_id
    try:
        _wait_clock(p, run, 3)
        with pytest.raises(ScaleError, match=r"--workers 5: --ray: cannot place worker-2, worker-3, worker-4: .*"
                                             r"'trainer': 2\.0"):
            bosen.scale(run, workers=5)  # the trainer node holds 4 workers
        lines: list[str] = []
        bosen.scale(run, workers=3, servers=3, out=lines.append)
        assert any("Ray placed actors for server-2" in x for x in lines), lines
        assert "the job runs with 3 workers (ranks [0, 1, 2])" in lines[-1], lines
        placed = json.loads((run / "ray.json").read_text())
        procs = placed["processes"]
        assert procs["worker-2"]["node_id"] == other and procs["server-2"]["node_id"] == head, procs
        assert len(placed["placement_groups"]) == 3, placed["placement_groups"]  # the launch's and one per step
        r = subprocess.run([PY, "-m", "bosen", "scale", str(run), "--workers", "2", "--servers", "2"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "the job runs on 2 servers" in r.stdout and "the job runs with 2 workers" in r.stdout, r.stdout
        deadline = time.monotonic() + 30
        while "released" not in json.loads((run / "ray.json").read_text())["processes"]["worker-2"]:
            assert time.monotonic() < deadline, (run / "ray.json").read_text()
            time.sleep(0.1)
        placed = json.loads((run / "ray.json").read_text())
        assert placed["processes"]["server-2"].get("released") and len(placed["placement_groups"]) == 1, placed
        gone = {k: placed["processes"][k]["actor_pid"] for k in ("worker-2", "server-2")}
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 0, out[-3000:]
    assert not [k for k, pid in gone.items() if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE], gone
    servers = yaml.safe_load((run / "config.yaml").read_text())["cluster"]["servers"]
    assert [s.rpartition(":")[0] for s in servers] == [procs[f"server-{i}"]["node_ip"] for i in range(2)]
    last = checkpoint.clocks(run / "checkpoints")[0]
    final, counts, states = _final_counts(run, cfg, checkpoint.check_complete(run / "checkpoints", last, 2, 2, None))
    np.testing.assert_array_equal(final, counts)
    batches = from_dict(LDAArgs, cfg["app"]["args"], "app.args").batches(2)
    assert [int(states[M.key(t, "sweeps")][0]) for t in range(8)] == [iterations * batches] * 8
    assert left_running(run) == []


def alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def placed(run: Path) -> dict:
    return json.loads((run / "ray.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_failed_servers_step_on_ray_releases_or_keeps_the_joined_actors_and_the_tables_stay_exact(
        tmp_path: Path, ray_cluster: Cluster) -> None:
    """Servers 2 -> 3 on the two Ray nodes whose partition move fails before its plan ($BOSEN_FAULT
    hold-move, its file saying ``fail``; worker 0 held before clock 13 meanwhile): the joined server
    stops, its actor is killed and its step's placement group removed, and the job runs on with its 2
    servers. A second step 2 -> 3 fails after every server took the new map (``fail-after-map``): the
    joined server's actor is kept and recorded, in a new group of its step on the ``ps`` node. Its
    server process killed once a checkpoint holds its part (worker 0 held before clock 21), the
    replacement starts in that same actor under the job's 3 servers and new map. Integer addition
    under SSP and managed communication: every checkpoint's W, and the final one, is exactly the plain
    launch's (B(B+1)/2 in every cell at clock B), and nothing is left running. Worker 0 holds just
    past a checkpoint boundary (every 4 clocks), so worker 1, up to 2 clocks ahead, crosses none: a
    move meeting clients on both sides of one is refused until they are not (server/moves.py)."""
    ticks = 28
    app = {"module": "checkpoint_worker", "args": {"ticks": ticks}}
    # worker 1 waits in a read while worker 0 holds: longer than the default 30 s under load
    path = job(tmp_path, app, "job.yaml", {**ROLES, "server_cpus": 0.5, "worker_cpus": 0.5}, every=4,
               read_timeout_s=120)
    run = (tmp_path / "run").resolve()
    go, go2, move = tmp_path / "go", tmp_path / "go2", tmp_path / "move"
    fault = f"hold-before-clock:0:13:{go};hold-before-clock:0:21:{go2};hold-move:{move}"
    p = subprocess.Popen([PY, "-m", "bosen", "launch", str(path), "--run-dir", str(run), "--no-plot",
                          "--ray", ray_cluster.address], stdout=_log(run).open("w"), stderr=subprocess.STDOUT,
                         text=True, start_new_session=True, env=child_env({"BOSEN_FAULT": fault}))
    head = ray_cluster.head_node.node_id
    try:
        _until(p, run, (tmp_path / "go.held").exists, "worker 0 (in its Ray actor) did not hold before clock 13")
        lines, failed, step = _scale_thread(run, servers=3)
        step.start()
        _until(p, run, (tmp_path / "move.held").exists, "the partition move did not hold before its plan")
        joined = placed(run)["processes"]["server-2"]
        assert joined["node_id"] == head and alive(joined["actor_pid"]) and alive(joined["pid"]), joined
        assert len(placed(run)["placement_groups"]) == 2  # the launch's and the step's
        move.write_text("fail")
        step.join(timeout=60)
        assert not step.is_alive() and len(failed) == 1, (failed, lines)
        assert re.search(r"failed on purpose.*server-2 stopped and their Ray actors released, back to 2 servers",
                         str(failed[0])), failed
        assert launcher_status(run)["servers"] == 2
        now = placed(run)
        assert now["processes"]["server-2"].get("released") and len(now["placement_groups"]) == 1, now
        _until(p, run, lambda: not alive(joined["actor_pid"]) and not alive(joined["pid"]),
               "the dropped server's actor or process still runs", timeout=30)

        _took_effect_after_failing(run, move, 3)
        assert launcher_status(run)["servers"] == 3
        now = placed(run)
        kept = now["processes"]["server-2.1"]
        assert kept["node_id"] == head and not kept.get("released") and alive(kept["actor_pid"]), now
        groups = now["placement_groups"]
        assert len(groups) == 2 and list(groups[1]["members"].values()) == ["server-2"], groups

        go.write_text("go")
        ck = run / "checkpoints"
        _until(p, run, lambda: (checkpoint.clock_dir(ck, 20) / checkpoint.part_name("server", 2) / checkpoint.META)
               .exists() and 20 in checkpoint.clocks(ck), "no checkpoint at clock 20 with the joined server's part")
        os.kill(kept["pid"], signal.SIGKILL)
        _until(p, run, lambda: "replaces server-2.1" in _log(run).read_text(), "the joined server was not replaced")
        new = placed(run)["processes"]["server-2.2"]  # in the joined server's actor, on the ps node
        assert (new["actor_pid"], new["node_id"]) == (kept["actor_pid"], head) and alive(new["pid"]), new
        go2.write_text("go")
        p.wait(timeout=90)
        out = _log(run).read_text()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 0, out[-3000:]
    clocks = checkpoint.clocks(ck)
    assert clocks[0] == ticks, clocks
    for b in clocks:
        parts = checkpoint.check_complete(ck, b, 2, 2, None)
        full = np.zeros((8, 2), dtype=np.int64)
        for name, part in parts.items():
            if name.startswith("server-"):
                arrays = part.load()
                full[arrays["t0.rows"]] = arrays["t0.values"]
        np.testing.assert_array_equal(full, b * (b + 1) // 2, err_msg=f"checkpoint at clock {b}")
    assert checkpoint.recorded_servers(checkpoint.clock_dir(ck, ticks)) == 3
    assert left_running(run) == []
