"""Stop a launched job once a given checkpoint is complete, then resume it (the apps' resume tests).

Every ``bosen launch`` here is forked from the session's zygote where it can be (``conftest.run_cmd``:
the launcher's imports are not paid again), and the job that runs through runs beside the one stopped
at its checkpoint: the two share nothing but the machine, and a job's start-up waits on processes
more than it uses both cores."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from conftest import _ZYGOTE, PY, REPO, child_env, run_cmd

from bosen import checkpoint
from bosen.jobs.supervise import Forked


def _start(args: list[str], out: IO[Any]) -> Forked | subprocess.Popen:
    """``bosen launch ARGS`` in the background, in a process group of its own, stdout and stderr to ``out``."""
    cmd, env = [PY, "-m", "bosen", "launch", *args], child_env()
    pid = _ZYGOTE[0].spawn(cmd, env, str(REPO), out.fileno()) if _ZYGOTE else None
    if pid is not None:
        return Forked(pid)  # its own process group already (bosen/jobs/zygote.py)
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            cwd=REPO, start_new_session=True)


def _output(out: IO[Any]) -> str:
    out.seek(0)
    return out.read()


def run_until_checkpoint(config: Path, run_dir: Path, clock: int, servers: int, workers: int,
                         timeout: float = 60) -> None:
    """``bosen launch`` in the background; SIGTERM once checkpoint ``clock`` is complete, like a
    machine lost after it (the job must not have finished by then); later checkpoints are removed."""
    with tempfile.TemporaryFile("w+") as out:
        p = _start([str(config), "--run-dir", str(run_dir), "--no-plot", "--quiet"], out)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    checkpoint.check_complete(run_dir / "checkpoints", clock, servers, workers, None)
                    break
                except checkpoint.CheckpointError:
                    pass
                if p.poll() is not None:
                    raise AssertionError(f"the job ended (status {p.returncode}) before checkpoint {clock}:\n"
                                         f"{_output(out)}")
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
    return run_cmd([PY, "-m", "bosen", "launch", str(config), "--resume", str(run_dir), "--no-plot"],
                   timeout=timeout)


def whole_and_resumed(config: dict, tmp_path: Path, clock: int, servers: int, workers: int) -> tuple[Path, Path]:
    """Run the job ``config`` through (run dir ``a``), and beside it again, stopped after checkpoint
    ``clock`` and resumed (``b``); both run directories."""
    import json

    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    with tempfile.TemporaryFile("w+") as out:
        whole = _start([str(path), "--run-dir", str(tmp_path / "a"), "--no-plot"], out)
        try:
            run_until_checkpoint(path, tmp_path / "b", clock, servers, workers)
            code = whole.wait(90)
        finally:
            if whole.poll() is None:
                os.killpg(whole.pid, signal.SIGKILL)
                whole.wait()
        assert code == 0, _output(out)[-4000:]
    p = resume(path, tmp_path / "b")
    assert p.returncode == 0 and "resuming from the checkpoint at clock" in p.stdout, p.stdout[-2000:] + p.stderr
    return tmp_path / "a", tmp_path / "b"
