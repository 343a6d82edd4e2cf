"""Stop a launched job once a given checkpoint is complete, then resume it (the apps' resume tests)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bosen import checkpoint


def run_until_checkpoint(config: Path, run_dir: Path, clock: int, servers: int, workers: int,
                         timeout: float = 60) -> None:
    """``bosen launch`` in the background; SIGTERM once checkpoint ``clock`` is complete, like a
    machine lost after it (the job must not have finished by then); later checkpoints are removed."""
    p = subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(config), "--run-dir", str(run_dir),
                          "--no-plot", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                checkpoint.check_complete(run_dir / "checkpoints", clock, servers, workers, None)
                break
            except checkpoint.CheckpointError:
                pass
            if p.poll() is not None:
                out = p.stdout.read().decode() if p.stdout else ""
                raise AssertionError(f"the job ended (status {p.returncode}) before checkpoint {clock}:\n{out}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no complete checkpoint at clock {clock} within {timeout:g}s")
            time.sleep(0.02)
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)
        # a loaded machine may let the job pass a later checkpoint before the signal lands: drop those,
        # so the resume starts from ``clock`` as the caller counts on (the tiny jobs finish in a second)
        for later in checkpoint.clocks(run_dir / "checkpoints"):
            if later > clock:
                shutil.rmtree(checkpoint.clock_dir(run_dir / "checkpoints", later))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def resume(config: Path, run_dir: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bosen", "launch", str(config), "--resume", str(run_dir),
                           "--no-plot"], capture_output=True, text=True, timeout=timeout)


def whole_and_resumed(config: dict, tmp_path: Path, clock: int, servers: int, workers: int) -> tuple[Path, Path]:
    """Run the job ``config`` through (run dir ``a``), and again stopped after checkpoint ``clock`` and
    resumed (``b``); both run directories."""
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    whole = subprocess.run([sys.executable, "-m", "bosen", "launch", str(path), "--run-dir", str(tmp_path / "a"),
                            "--no-plot"], capture_output=True, text=True, timeout=90)
    assert whole.returncode == 0, whole.stdout[-2000:] + whole.stderr[-2000:]
    run_until_checkpoint(path, tmp_path / "b", clock, servers, workers)
    p = resume(path, tmp_path / "b")
    assert p.returncode == 0 and "resuming from the checkpoint at clock" in p.stdout, p.stdout[-2000:] + p.stderr
    return tmp_path / "a", tmp_path / "b"
