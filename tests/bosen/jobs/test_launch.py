"""``bosen launch`` and ``bosen status`` as a user runs them: real subprocesses end to end."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import PY, child_env, run_cmd, write_config

REPO = Path(__file__).resolve().parents[3]


def launch_config(tmp_path: Path, args: dict | None = None, workers: int = 2, staleness: int = 0,
                  name: str = "job.yaml") -> Path:
    cfg = {
        "cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": workers},
        "consistency": {"staleness": staleness, "read_timeout_s": 20},
        "tables": {"W": {"rows": 6, "cols": workers, "dtype": "int64"}},
        "app": {"module": "launch_worker", "args": args or {}},
    }
    return write_config(tmp_path / name, cfg)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


class Tracked:
    """``bosen launch`` in the background, remembering every descendant process it ever had."""

    def __init__(self, args: list, tmp_path: Path) -> None:
        self.out = open(tmp_path / "launch.out", "w+")
        self.err = open(tmp_path / "launch.err", "w+")
        self.popen = subprocess.Popen([PY, "-m", "bosen", "launch", *map(str, args)], stdout=self.out,
                                      stderr=self.err, env=child_env(), cwd=str(REPO), start_new_session=True)
        self.seen: dict[int, tuple[float, str]] = {}  # every descendant: pid -> (created, command line)
        self.direct: set[int] = set()  # the launcher's own children
        self.ended: float | None = None

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def poll_tree(self) -> None:
        for ch in self.children():
            try:
                cmd = " ".join(ch.cmdline())
                if cmd or ch.pid not in self.seen:  # keep the latest real command line (after exec)
                    self.seen[ch.pid] = (ch.create_time(), cmd)
                if ch.ppid() == self.popen.pid:
                    self.direct.add(ch.pid)
            except psutil.Error:
                pass

    def wait(self, timeout: float, during=None) -> int:
        deadline = time.monotonic() + timeout
        while self.popen.poll() is None:
            self.poll_tree()
            if during is not None:
                during(self)
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"bosen launch did not finish within {timeout:g}s:\n{self.stderr()}")
            time.sleep(0.05)
        self.ended = time.time()
        return self.popen.returncode

    def survivors(self) -> list[str]:
        left = []
        for pid, (created, cmd) in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{pid}: {cmd}")
            except psutil.NoSuchProcess:
                pass
        return left

    def stdout(self) -> str:
        self.out.seek(0)
        return self.out.read()

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read()

    def kill(self) -> None:
        for p in [*self.children(), psutil.Process(self.popen.pid)] if self.popen.poll() is None else self.children():
            try:
                p.kill()
            except psutil.Error:
                pass
        for pid, (created, _) in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created:
                    p.kill()
            except psutil.Error:
                pass
        if self.popen.poll() is None:
            self.popen.wait(10)

    def close(self) -> None:
        self.kill()
        self.out.close()
        self.err.close()


@pytest.fixture
def tracked(tmp_path):
    made: list[Tracked] = []

    def start(args: list) -> Tracked:
        t = Tracked(args, tmp_path)
        made.append(t)
        return t

    try:
        yield start
    finally:
        for t in made:
            t.close()


# ------------------------------------------------------------------------------------------------
# a successful job


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_launch_runs_a_job_and_writes_metrics(tmp_path, tracked):
    ticks = 4
    cfg = launch_config(tmp_path, {"ticks": ticks})
    run_dir = tmp_path / "run"
    t = tracked([cfg, "--run-dir", run_dir, "--timeout", 100])
    rc = t.wait(120)
    assert rc == 0, f"stdout:\n{t.stdout()}\nstderr:\n{t.stderr()}"
    assert t.stdout().count("security: off (loopback only)") == 1  # said once, at start
    assert not t.survivors(), t.survivors()
    seen = "\n".join(f"{pid}: {cmd}" for pid, (_, cmd) in t.seen.items())
    direct = [t.seen[pid][1] for pid in t.direct]  # (grandchildren may be short-lived helpers)
    assert sum("-m bosen.server" in cmd for cmd in direct) == 2, seen
    assert sum(cmd.endswith("-m launch_worker") for cmd in direct) == 2, seen

    recs = read_metrics(run_dir)
    clocks = [r for r in recs if r["kind"] == "clock"]
    assert [r["clock"] for r in clocks] == list(range(ticks))
    for r in clocks:
        assert r["workers"] == 2
        assert r["objective"] == 1.0 + 2.0  # summed over the workers of that clock
        assert r["samples"] == 20
        assert r["own_ok"] == 2  # both workers read their own writes exactly
        assert r["bytes_sent"] > 0
    workers = [r for r in recs if r["kind"] == "worker"]
    assert len(workers) == 2 * ticks
    assert sorted({r["rank"] for r in workers}) == [0, 1]
    clients = [r for r in recs if r["kind"] == "client"]  # each worker's final client.stats()
    assert sorted(c["rank"] for c in clients) == [0, 1]
    for c in clients:
        assert c["bytes_sent"] > 0 and c["server_errors"] == 0
        assert all(sum(t["send_count_hist"].values()) > 0 for t in c["tables"].values())
    servers = [r for r in recs if r["kind"] == "server"]
    assert sorted(s["rank"] for s in servers) == [0, 1]
    for s in servers:
        assert s["clock"] == ticks and s["errors"] == 0 and s["rows_applied"] > 0
        assert s["client_clocks"] == ["left", "left"]
    (summary,) = [r for r in recs if r["kind"] == "summary"]
    assert summary["clocks"] == ticks and summary["workers"] == 2
    assert summary["final"]["clock"] == ticks - 1
    assert recs[-1]["kind"] == "summary"

    # the run directory holds the resolved config (real ports), logs and the plot
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert all(not a.endswith(":0") for a in resolved["cluster"]["servers"])
    for name in ("server-0", "server-1", "worker-0", "worker-1"):
        assert (run_dir / "logs" / f"{name}.log").exists()
    names = sorted(p.name for p in (run_dir / "workers").iterdir())
    assert names == ["0.jsonl", "0.stats.json", "1.jsonl", "1.stats.json"]
    assert (run_dir / "objective.png").stat().st_size > 0
    out = t.stdout()
    assert "clock    3" in out and "objective 3" in out and "done in" in out


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_launch_workers_and_set_overrides(tmp_path):
    cfg = launch_config(tmp_path, {"ticks": 2}, workers=2)
    run_dir = tmp_path / "run"
    r = run_cmd([PY, "-m", "bosen", "launch", cfg, "--workers", 3, "--servers", 3, "--set", "tables.W.cols=3",
                 "--set", "app.args.ticks=3", "--run-dir", run_dir, "--quiet", "--no-plot"], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == ""  # --quiet
    recs = read_metrics(run_dir)
    clocks = [x for x in recs if x["kind"] == "clock"]
    assert [x["clock"] for x in clocks] == [0, 1, 2]
    assert all(x["workers"] == 3 and x["objective"] == 6.0 for x in clocks)
    assert not (run_dir / "objective.png").exists()
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["cluster"]["workers"] == 3 and resolved["app"]["args"]["ticks"] == 3
    assert len(resolved["cluster"]["servers"]) == 3  # --servers: three local servers on free ports
    assert len(set(resolved["cluster"]["servers"])) == 3
    assert sorted(p.name for p in (run_dir / "logs").glob("server-*.log")) == [f"server-{i}.log" for i in range(3)]


def test_launch_warns_when_managed_communication_has_too_few_servers(tmp_path):
    cfg = launch_config(tmp_path, {"ticks": 1}, workers=5)
    run_dir = tmp_path / "run"
    r = run_cmd([PY, "-m", "bosen", "launch", cfg, "--servers", 1, "--set", "comm.enabled=true", "--run-dir",
                 run_dir, "--quiet", "--no-plot"], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "5 workers on 1 server(s)" in r.stderr and "--servers 2" in r.stderr
    r = run_cmd([PY, "-m", "bosen", "launch", cfg, "--servers", 2, "--set", "comm.enabled=true", "--run-dir",
                 run_dir, "--quiet", "--no-plot"], timeout=120)
    assert r.returncode == 0 and "--servers" not in r.stderr, r.stderr


# ------------------------------------------------------------------------------------------------
# failures


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_worker_killed_by_sigkill_stops_the_job(tmp_path, tracked):
    marker = tmp_path / "died"
    cfg = launch_config(tmp_path, {"ticks": 400, "die_at": 2, "die_rank": 1, "marker": str(marker),
                                   "sleep_s": 0.01}, workers=3)
    run_dir = tmp_path / "run"
    t = tracked([cfg, "--run-dir", run_dir, "--no-plot"])
    rc = t.wait(120)
    err = t.stderr()
    assert rc == 1, f"rc {rc}\n{err}"
    assert marker.exists(), "the worker never reached its death tick"
    died = float(marker.read_text())
    assert t.ended - died < 15, f"launcher took {t.ended - died:.1f}s to notice"
    assert "worker-1 was killed by SIGKILL" in err, err
    assert str(run_dir / "logs") in err
    assert len(t.seen) >= 5, t.seen  # 2 servers + 3 workers were seen
    assert not t.survivors(), t.survivors()


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_server_killed_stops_the_job(tmp_path, tracked):
    cfg = launch_config(tmp_path, {"ticks": 2000, "sleep_s": 0.01})
    run_dir = tmp_path / "run"
    killed = {}

    def kill_server_1(tr: Tracked) -> None:
        if killed or not (run_dir / "workers").exists():
            return  # wait until workers report
        for ch in tr.children():
            try:
                cmd = ch.cmdline()
            except psutil.Error:
                continue
            if "bosen.server" in cmd and cmd[-1] == "1":
                ch.send_signal(signal.SIGKILL)
                killed["t"] = time.time()
                return

    t = tracked([cfg, "--run-dir", run_dir, "--no-plot"])
    rc = t.wait(120, during=kill_server_1)
    err = t.stderr()
    assert killed, "server 1 was never found"
    assert rc == 1, err
    assert "server-1 was killed by SIGKILL" in err, err
    assert t.ended - killed["t"] < 15
    assert not t.survivors(), t.survivors()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.slow
def test_launcher_stopped_by_a_signal_leaves_no_process(tmp_path, tracked, sig):
    """SIGTERM: the launcher stops the job and says so; SIGKILL: its children still die with it."""
    cfg = launch_config(tmp_path, {"ticks": 5000, "sleep_s": 0.01})
    run_dir = tmp_path / "run"
    sent = {}

    def stop_launcher(tr: Tracked) -> None:
        if not sent and (run_dir / "workers").exists() and len(tr.seen) >= 4:
            tr.popen.send_signal(sig)
            sent["t"] = time.time()

    t = tracked([cfg, "--run-dir", run_dir, "--no-plot"])
    rc = t.wait(120, during=stop_launcher)
    assert sent, "the job never started"
    if sig == signal.SIGTERM:
        assert rc == 130, t.stderr()
        assert "SIGTERM: stopped the job" in t.stderr()
    else:
        assert rc == -signal.SIGKILL
    deadline = time.time() + 15
    while t.survivors() and time.time() < deadline:
        time.sleep(0.2)
    assert not t.survivors(), t.survivors()


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_worker_config_error_is_shown_by_the_launcher(tmp_path, tracked):
    cfg = launch_config(tmp_path, {"ticks": 2, "bogus": 1})
    t = tracked([cfg, "--run-dir", tmp_path / "run", "--no-plot"])
    rc = t.wait(120)
    err = t.stderr()
    assert rc == 1, err
    assert "app.args.bogus: unknown key" in err, err
    assert "worker-" in err and "exited with status 2" in err, err
    assert "Traceback" not in err
    assert not t.survivors(), t.survivors()


@pytest.mark.timeout(60)
def test_launch_rejects_bad_configs(tmp_path):
    cfg = launch_config(tmp_path)
    r = run_cmd([PY, "-m", "bosen", "launch", cfg, "--set", "consistency.staleness=-1"], timeout=30)
    assert r.returncode == 2 and str(cfg) in r.stderr and "consistency.staleness" in r.stderr
    d = yaml.safe_load(cfg.read_text())
    del d["app"]
    nomod = write_config(tmp_path / "noapp.yaml", d)
    r = run_cmd([PY, "-m", "bosen", "launch", nomod], timeout=30)
    assert r.returncode == 2 and "app.module" in r.stderr and str(nomod) in r.stderr
    r = run_cmd([PY, "-m", "bosen", "launch", tmp_path / "absent.yaml"], timeout=30)
    assert r.returncode == 2 and "absent.yaml" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_cmd([PY, "-m", "bosen", "launch", cfg, "--servers", "0"], timeout=30)
    assert r.returncode == 2 and "--servers 0" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------------------
# bosen status


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_status_lists_servers_and_fails_when_one_is_down(bosen_cluster):
    c = bosen_cluster(2, workers=1, tables={"W": {"rows": 10, "cols": 4, "dtype": "int64"},
                                            "V": {"rows": 3, "cols": 1, "dtype": "float32"}})
    r = run_cmd([PY, "-m", "bosen", "status", c.path], timeout=30)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    assert len(lines) == 3 and "clock" in lines[0] and "rows" in lines[0]
    for i, (line, addr) in enumerate(zip(lines[1:], c.addresses, strict=True)):
        f = line.split()
        assert f[0] == str(i) and f[1] == addr
        assert f[2] == "0"  # clock
        assert f[3] == "128/256v0"  # partitions held / of all, the map's version
        assert f[4] == str(5 + (2 if i == 0 else 1))  # rows of W (10 split 5/5) plus V (3 split 2/1)

    r = run_cmd([PY, "-m", "bosen", "status", c.path, "--json"], timeout=30)
    assert r.returncode == 0
    stats = json.loads(r.stdout)
    assert [s["address"] for s in stats] == c.addresses
    assert stats[0]["tables"]["W"]["rows"] == 5 and stats[1]["tables"]["V"]["rows"] == 1

    c.stop_server(1)
    t0 = time.monotonic()
    r = run_cmd([PY, "-m", "bosen", "status", c.path, "--timeout", "1"], timeout=30)
    assert r.returncode == 1
    assert time.monotonic() - t0 < 20
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    assert len(lines) == 3
    assert lines[1].split()[1] == c.addresses[0]
    assert c.addresses[1] in lines[2] and "DOWN" in lines[2]

    r = run_cmd([PY, "-m", "bosen", "status", c.path, "--set", "cluster.workers=0"], timeout=30)
    assert r.returncode == 2 and "cluster.workers" in r.stderr
