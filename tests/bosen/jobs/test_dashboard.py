"""``bosen dashboard`` (bosen/jobs/dashboard.py, bosen/jobs/jobview.py): headless Chromium renders the
page of a running MF job with 2 servers and 4 workers, one of them lost and replaced; its JSON is
checked against the servers' STATUS and the run directory, live and after the job ended; bad HTTP
requests get a 4xx and the dashboard keeps serving; it never writes into the run directory."""

from __future__ import annotations

import json
import re
import shutil
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import free_port_run, run_cmd, scrape, wait_until

from bosen import checkpoint
from bosen.jobs import status as status_mod
from bosen.jobs.cli import main as bosen_main
from bosen.jobs.dashboard import Dashboard
from bosen.jobs.job import run_job
from bosen.jobs.jobview import JobView, holding_back

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# a small MF job: 2 servers, 4 workers, a held-out share, checkpoints every 5 clocks
MF = ["tables.L.rows=2000", "tables.R.rows=500", "app.args.nnz=20000", "app.args.lr=0.02",
      "app.args.holdout=0.1", "checkpoint.every_clocks=5"]


def get(url: str) -> Any:
    return json.loads(urllib.request.urlopen(url, timeout=15).read())


def clock_records(run_dir: Path) -> int:
    try:
        return (run_dir / "metrics.jsonl").read_text().count('"kind": "clock"')
    except OSError:
        return 0


def files(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.rglob("*")}


def kill_worker(launcher_pid: int, rank: int) -> None:
    """SIGKILL the launcher's worker process of ``rank`` (the launcher replaces it from a checkpoint)."""
    for p in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if p.environ().get("BOSEN_RANK") == str(rank) and "bosen.apps.mf" in p.cmdline():
                p.kill()
                return
        except psutil.Error:
            continue
    raise AssertionError(f"no worker process of rank {rank}")


def raw(port: int, data: bytes) -> bytes:
    """Send ``data`` as it is, return what comes back (b"" when the dashboard just hangs up)."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian package chromium; .ci/run installs it)")
def test_chromium_shows_a_running_job_and_its_recovery_and_bad_requests_change_nothing(bosen_procs, tmp_path):
    run_dir = tmp_path / "run"
    metrics_port, port = free_port_run(3), free_port_run(1)
    sets = [a for s in [*MF, "app.args.epochs=100000", f"metrics.port={metrics_port}"] for a in ("--set", s)]
    job = bosen_procs.python("launch", "-m", "bosen", "launch", "mf", "--servers", 2, "--workers", 4, "--run-dir",
                             run_dir, "--quiet", "--no-plot", *sets)
    assert wait_until(lambda: clock_records(run_dir) >= 12 or not job.alive(), timeout=90, step=0.2), job.tail()
    assert job.alive(), job.tail()
    board = bosen_procs.python("dashboard", "-m", "bosen", "dashboard", run_dir, "--port", port)
    url = f"http://127.0.0.1:{port}/"

    def up() -> bool:
        try:
            return urllib.request.urlopen(url, timeout=2).status == 200
        except OSError:
            return False
    assert wait_until(up, timeout=30, step=0.1), board.tail()

    # a worker lost and replaced from its checkpoint: a recovery the page shows
    kill_worker(job.pid, 1)
    assert wait_until(lambda: get(url + "api/job")["recoveries"] and clock_records(run_dir) >= 20, timeout=90,
                      step=0.3), job.tail()
    (recovery,) = get(url + "api/job")["recoveries"]
    assert recovery["process"] == "worker-1.1" and recovery["kind"] == "worker" and recovery["rank"] == 1

    # the page in a browser: what it shows after its first polls
    out = run_cmd([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=3000", "--dump-dom", url],
                  timeout=90)
    assert job.alive(), job.tail()  # the DOM is of a running job
    dom = out.stdout
    assert re.search(r'id="state" class="badge running">running<', dom), dom[:3000]
    workers = re.findall(r'<tr class="worker[^"]*" data-rank="(\d+)">.*?<td class="clock">(\d+)</td>', dom)
    assert [r for r, _ in workers] == ["0", "1", "2", "3"] and all(int(c) >= 19 for _, c in workers), workers
    assert len(re.findall(r'<td class="blocked">\d+\.\d{3}</td>', dom)) == 4
    assert len(re.findall(r'<td class="l share">.*?\d+\.\d%', dom)) == 4  # the meters' labels
    assert len(re.findall(r'<tr class="server" data-rank="\d">', dom)) == 2
    for chart in ("objective", "heldout"):  # each curve drawn with a point per clock so far
        points = re.search(rf'<svg id="{chart}"[^>]*>.*?data-points="(\d+)"', dom)
        assert points and int(points.group(1)) >= 20, chart
    owners = re.findall(r'class="pcell" data-owner="(\d)"', dom)
    assert len(owners) == 256 and owners.count("0") == owners.count("1") == 128
    assert re.search(r'class="checkpoint" data-clock="\d+"', dom)
    assert "heldout_rmse" in dom and re.search(r'class="recovery">worker-1.1 replaced a lost worker 1', dom)

    # the JSON the page polls, against the servers' STATUS asked just after
    snap = get(url + "api/job")
    addresses = [s["address"] for s in snap["servers"]]
    statuses = [status_mod.query(a) for a in addresses]
    assert snap["state"] == "running" and len(addresses) == 2
    for row, st in zip(snap["servers"], statuses, strict=True):
        assert row["live"] and row["rank"] == st["rank"] and 0 < row["clock"] <= st["clock"]
        assert 0 < row["bytes_out"] <= st["bytes_out"] and row["budget_mbps"] is None  # plain SSP: no budget
    assert snap["partitions"]["owner"] == statuses[0]["partitions"]["owner"]
    assert [w["rank"] for w in snap["workers"]] == [0, 1, 2, 3]
    for w in snap["workers"]:  # a worker's clock record may be written before the server has its CLOCK
        assert isinstance(w["server_clock"], int) and w["clock"] <= w["server_clock"] + 1 <= statuses[0]["clock"] + 4
        assert w["blocked_s"] >= 0 and 0 <= w["blocked_fraction"] <= 1 and 0 <= w["recent_blocked_fraction"] <= 1
    assert snap["heldout_name"] == "heldout_rmse" and snap["checkpoints"]["complete"]
    # the same blocked time in the launcher's Prometheus metrics, per worker
    prom = scrape(metrics_port)
    for r in range(4):
        assert prom["bosen_worker_blocked_seconds_total"][(("rank", str(r)),)] >= 0
        assert prom["bosen_worker_clock"][(("rank", str(r)),)] >= snap["workers"][r]["clock"]

    # bad requests: each a 4xx, and the dashboard goes on
    assert raw(port, b"\x00\xff not http at all\r\n\r\n").startswith(b"HTTP/1.0 400")
    assert raw(port, b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 414")
    assert raw(port, b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n").startswith(b"HTTP/1.0 431")
    assert raw(port, b"BREW /api/job HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 405")
    for path, method, code in (("nope", "GET", 404), ("api/job/../../etc/passwd", "GET", 404),
                               ("api/job", "POST", 405), ("", "DELETE", 405)):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url + path, data=b"x" * 100_000 if method == "POST" else None,
                                                          method=method), timeout=15)
        assert e.value.code == code, (path, method)
    with socket.create_connection(("127.0.0.1", port), timeout=15):  # a peer that sends nothing: others go on
        assert get(url + "api/job?x=1")["state"] == "running"

    # the job stopped (no summary, no server left): the run directory's records are still shown
    job.stop()
    before = files(run_dir)
    time.sleep(0.6)  # past the cached snapshot
    snap = get(url + "api/job")
    assert snap["state"] == "no server answers" and [s["up"] for s in snap["servers"]] == [False, False]
    assert all(w["clock"] >= 11 for w in snap["workers"]) and len(snap["clocks"]) >= 12
    assert files(run_dir) == before  # nothing written into the run directory
    assert board.alive() and "Traceback" not in board.tail(200), board.tail(200)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_json_of_a_job_that_ended_comes_from_its_run_dir(tmp_path):
    run = run_job("mf", tmp_path / "run", sets=[*MF, "app.args.epochs=12"], workers=2, timeout=90).check()
    final = {r["rank"]: r for r in run.kind("server")}
    records = run.kind("worker")
    before = files(run.run_dir)
    view = JobView(run.run_dir)
    with Dashboard(view, port=0) as board:
        snap = get(board.url + "api/job")
        assert urllib.request.urlopen(board.url, timeout=15).read().startswith(b"<!doctype html>")
    view.close()
    assert snap["state"] == "ended" and snap["summary"]["clocks"] == 12 and not snap["down"]
    assert [c["clock"] for c in snap["clocks"]] == list(range(12))
    assert snap["heldout_name"] == "heldout_rmse" and all(c["heldout"] > 0 for c in snap["clocks"])
    assert [s["rank"] for s in snap["servers"]] == [0, 1]
    for s in snap["servers"]:  # the final STATUS the launcher wrote
        f = final[s["rank"]]
        assert not s["live"] and s["clock"] == f["clock"] and s["bytes_out"] == f["bytes_out"] > 0
    assert snap["partitions"]["owner"] == final[0]["partitions"]["owner"]
    assert [w["rank"] for w in snap["workers"]] == [0, 1]
    for w in snap["workers"]:  # each worker's newest record: clock 11 and its blocked time
        last = max((r for r in records if r["rank"] == w["rank"]), key=lambda r: r["clock"])
        assert w["clock"] == 11 and w["blocked_s"] == last["blocked_s"] and w["blocked_reads"] == last["blocked_reads"]
    assert snap["holding_back"] is None  # an ended job holds nobody back
    base = run.run_dir / "checkpoints"
    assert snap["checkpoints"]["complete"] == [c for c in checkpoint.clocks(base)] and snap["checkpoints"]["complete"]
    assert files(run.run_dir) == before  # read only

    # given the config, the dashboard shows what STATUS gives: no server answers now
    view = JobView(run.run_dir / "config.yaml", status_timeout=0.3)
    t0 = time.monotonic()
    snap = view.snapshot()
    view.close()
    assert snap["source"] == "config" and snap["state"] == "no server answers" and len(snap["down"]) == 2
    assert time.monotonic() - t0 < 3 and snap["clocks"] == [] and snap["checkpoints"]["complete"]
    # a target that is neither: a clear error, exit status 2
    assert bosen_main(["dashboard", str(tmp_path / "missing")]) == 2
    assert bosen_main(["dashboard", "mf"]) == 2  # an example's servers are on port 0: its run directory is needed


@pytest.mark.parametrize(("shares", "clocks", "rank"), [
    ([0.40, 0.45, 0.02, 0.50], [9, 9, 8, 10], 2),  # a straggler: behind, and not blocked while the others are
    ([0.40, 0.45, 0.02, 0.50], [9, 9, 9, 9], 2),  # the same, the records' clocks tied
    ([0.20, 0.22, 0.18, 0.21], [9, 9, 9, 9], None),  # balanced: nobody in particular
    ([0.70, 0.69, 0.77, 0.47], [434] * 4, 3),  # a straggler on a crowded machine: everyone waits longer (measured)
    ([0.61, 0.51, 0.72, 0.58], [98] * 4, None),  # a balanced job on a crowded machine (measured)
    ([0.92, 0.75, 0.68, 0.92], [166, 166, 166, 164], None),  # the least blocked is ahead: nobody (measured)
    ([0.01, 0.00, 0.02, 0.01], [9, 9, 9, 9], None),  # nobody waits
    ([0.30, None, None, None], [9, 9, 9, 9], None),  # one worker's share known yet
])
def test_the_worker_holding_the_others_back_is_behind_and_blocked_least(shares, clocks, rank):
    workers = [{"rank": r, "recent_blocked_fraction": f, "clock": c, "left": False}
               for r, (f, c) in enumerate(zip(shares, clocks, strict=True))]
    assert holding_back(workers) == rank
    if rank is not None:  # a worker that left holds nobody back
        workers[rank]["left"] = True
        assert holding_back(workers) != rank
