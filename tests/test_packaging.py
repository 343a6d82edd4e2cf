"""Usable from ``pip install`` (issue 32): the wheel built from this checkout, installed into a fresh
virtual environment outside the repository, runs ``bosen launch mf`` from an empty folder, with the
example config from the package and a word while numba compiles (its cache is empty there).

No network: the wheel is built without build isolation (setuptools from this venv), installed with
``--no-deps``, and the fresh venv finds the dependencies in this venv's site-packages through a
``.pth`` line (a path added that way has its own ``.pth`` files unread, so this checkout's editable
install does not leak in: the test checks that ``bosen`` is imported from the fresh venv).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import time
import venv
import zipfile
from pathlib import Path

import pytest
from conftest import free_port_run, scrape

ROOT = Path(__file__).resolve().parent.parent
NO_JOB_ENV = {"PYTHONPATH": None, "BOSEN_CONFIG": None, "BOSEN_RANK": None, "BOSEN_RUN_DIR": None,
              "BOSEN_T0": None, "NUMBA_CACHE_DIR": None, "PYTHONUNBUFFERED": "1"}


def _run(args: list, cwd: Path, timeout: float = 120) -> str:
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_wheel_in_a_fresh_venv_launches_an_example_by_name(tmp_path, bosen_procs):
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ROOT, "-w", dist],
         cwd=tmp_path)
    (wheel,) = dist.glob("bosen-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    for name in ("mf", "lda", "mlr", "mf-movielens", "lda-news", "mlr-fashion", "torch-cnn"):
        assert f"bosen/examples/{name}.yaml" in shipped
    assert "bosen/jobs/dashboard.html" in shipped  # bosen dashboard's page

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", wheel], cwd=tmp_path)
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path).strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # numpy, numba, pyzmq, ...: ours
    work = tmp_path / "work"
    work.mkdir()
    where = _run([py, "-c", "import bosen.jobs.examples as e; print(e.__file__); print(e.folder())"], cwd=work)
    assert all(line.startswith(str(site)) for line in where.split()), where  # the wheel's, not the checkout's
    assert "mf " in _run([env_dir / "bin" / "bosen", "examples"], cwd=work)

    port = free_port_run(3)  # /metrics: the launcher's, then each server's
    launch = bosen_procs.spawn("launch", [env_dir / "bin" / "bosen", "launch", "mf", "--set", "app.args.epochs=2",
                                          "--set", "app.args.nnz=20000", "--set", f"metrics.port={port}",
                                          "--no-plot", "--timeout", "300"], env=NO_JOB_ENV, cwd=work)
    job, server = _scrape_while_running(launch, port)  # the workers compile for seconds: time enough
    assert bosen_procs.wait_all([launch], timeout=340) == [0], launch.tail(40)
    assert job["bosen_job_workers"][()] == 2, job
    assert {v for k, v in job["bosen_server_up"].items()} == {1.0} and len(job["bosen_server_up"]) == 2, job
    assert server["bosen_server_up"] == {(("server", "0"),): 1.0}
    assert server["bosen_server_table_rows"][(("server", "0"), ("table", "L"))] == 10000  # half of mf's 20,000
    out = launch.tail(40)
    assert "compiling kernels (first run only)" in out and "done in" in out, out
    assert "the servers compile theirs" in out, out  # their warm-up, before "servers up"
    (metrics,) = work.glob("runs/mf-*/metrics.jsonl")
    assert '"kind": "summary"' in metrics.read_text()


def _scrape_while_running(launch, port: int) -> tuple[dict, dict]:
    """The launcher's /metrics once both servers answer there, and server 0's own, while the job runs."""
    deadline = time.monotonic() + 300
    while launch.returncode is None and time.monotonic() < deadline:
        try:
            job = scrape(port)
            if len(job.get("bosen_server_up", {})) == 2 and set(job["bosen_server_up"].values()) == {1.0}:
                return job, scrape(port + 1)
        except OSError:  # not serving yet
            pass
        time.sleep(0.2)
    pytest.fail(f"the launcher's /metrics never showed both servers up; exit {launch.returncode}:\n{launch.tail(40)}")
