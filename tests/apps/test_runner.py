"""Exit status of an app's worker process (bosen.apps.runner): 2 when the job as given cannot run
(command line, config, app.args, input data), 1 when it fails while running; a one-line message
either way, and a traceback only for bugs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable

FAILING_APP = '''\
"""A worker that fails the way app.args.fail says, after joining the job."""
from bosen.apps.runner import run_app
from bosen.errors import ServerError


def train(client, args):
    client.table("W").get_rows([0])
    if args["fail"] == "server":
        raise ServerError("server 0 rejected an update (simulated)")
    raise RuntimeError("a bug (simulated)")


if __name__ == "__main__":
    run_app(train)
'''


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOSEN_")}
    env.update(extra)
    return env


def _worker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "bosen.apps.mf", *args], capture_output=True, text=True, timeout=60,
                          env=_env())


def test_config_error_exits_2_with_one_line_naming_key_and_file(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(json.dumps({"cluster": {"servers": ["127.0.0.1:1"]}, "consistency": {"stalenes": 1},
                               "tables": {"L": {"rows": 2, "cols": 2}}}))
    r = _worker("--config", str(cfg))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(cfg) in lines[0] and "consistency.stalenes" in lines[0], r.stderr
    r = _worker("--config", str(cfg), "--set", "consistency=[")  # a bad override, same
    assert r.returncode == 2 and "--set" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_missing_config_exits_2():
    r = _worker()
    assert r.returncode == 2 and "no config" in r.stderr, r.stderr


def _launch(tmp_path: Path, cfg: dict | Path, *sets: str, env: dict[str, str] | None = None) -> str:
    if isinstance(cfg, dict):
        path = tmp_path / "job.yaml"
        path.write_text(json.dumps(cfg))
        cfg = path
    cmd = [PY, "-m", "bosen", "launch", str(cfg), "--workers", "1", "--run-dir", str(tmp_path / "run"),
           "--quiet", "--no-plot"]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env or _env(), cwd=REPO)
    assert r.returncode != 0, "the job should have failed"
    logs = "".join(f.read_text() for f in (tmp_path / "run" / "logs").glob("worker-*.log"))
    return r.stdout + r.stderr + logs


@pytest.mark.slow
def test_bad_app_args_exit_2_through_the_launcher(tmp_path):
    out = _launch(tmp_path, REPO / "configs" / "mlr.yaml", "app.args.epochs=0", "cluster.workers=1")
    assert "worker-0 exited with status 2" in out, out
    assert "worker 0: ValueError: app.args.epochs: must be >= 1" in out and "Traceback" not in out, out


@pytest.mark.parametrize("fail, shown", [
    ("server", "worker 0: ServerError: server 0 rejected an update (simulated)"),
    ("bug", "RuntimeError: a bug (simulated)"),
])
@pytest.mark.slow
def test_runtime_failures_exit_1(tmp_path, fail, shown):
    (tmp_path / "failing_app.py").write_text(FAILING_APP)
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 1},
           "tables": {"W": {"rows": 2, "cols": 2, "dtype": "float32"}},
           "app": {"module": "failing_app", "args": {"fail": fail}}}
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    out = _launch(tmp_path, cfg, env=_env(PYTHONPATH=path))
    assert "worker-0 exited with status 1" in out and shown in out, out
    assert ("Traceback" in out) == (fail == "bug"), out  # a bug keeps its traceback, a known failure does not
