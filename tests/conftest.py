"""Helpers of this test suite. Clusters and worker processes come from the ``bosen`` pytest plugin
(bosen/jobs/pytest_plugin.py: ``bosen_cluster``, ``bosen_procs``).

Everything starts real processes that talk ZeroMQ over TCP on loopback. Every process a test starts
is stopped when the test ends, pass or fail (SIGTERM, a grace period, then SIGKILL to its process
group), and a failing test's report carries the processes' logs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bosen.jobs.cluster import free_ports  # noqa: F401  (tests import it from here)
from bosen.jobs.job import job_config, write_config  # noqa: F401  (tests import them from here)
from bosen.jobs.supervise import Process, ProcessGroup, tail  # noqa: F401

pytest_plugins = ("pytester",)  # tests/bosen/jobs/test_pytest_plugin.py runs pytest on small test files

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
WORKERS = TESTS / "workers"
PY = sys.executable


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for commands a test runs itself (``run_cmd``, ``bosen launch``): tests/workers and
    the checkout on PYTHONPATH (``python -m launch_worker``), no ``BOSEN_*`` job variables."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    paths = [str(WORKERS), str(REPO)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("BOSEN_RANK", None)
    env.pop("BOSEN_RUN_DIR", None)
    env.pop("BOSEN_CONFIG", None)
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def run_cmd(args: Sequence[Any], timeout: float = 60, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command to completion (stdout/stderr captured); fail the test on timeout."""
    try:
        return subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=timeout,
                              env=child_env(env), cwd=str(cwd or REPO), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{args} did not finish within {timeout:g}s; output:\n{e.stdout}\n{e.stderr}")


def worker(group: ProcessGroup, script: str, config: Path | str, *args: Any, name: str | None = None,
           env: dict[str, str] | None = None) -> Process:
    """``python tests/workers/SCRIPT --config CONFIG ARGS...`` as a member of ``group``."""
    name = name or f"{Path(script).stem}-{len(group)}"
    return group.python(name, WORKERS / script, "--config", config, *args, env=env)


def wait_until(cond, timeout: float = 20.0, step: float = 0.002) -> bool:
    """Poll ``cond`` until it holds or ``timeout`` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def ahead_reader(path: Path | str, rank: int, clocks: int) -> Any:
    """A client (``bosen.client.Client``) that joins now and clocks ``clocks`` ticks at once, so it
    never holds the job back; once the others have left, its reads (through an empty cache) return
    the servers' exact values."""
    from bosen.client import Client

    c = Client.connect(path, rank=rank)
    for _ in range(clocks):
        c.clock()
    return c
