"""The ``bosen`` pytest plugin, as a project that installs bosen gets it (entry point pytest11): run
pytest on small test files and check what their fixtures did."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.timeout(120)


def gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner=source)
    # a separate interpreter, so the plugin comes from the entry point as in any other project
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")


def test_the_plugin_is_registered_by_its_entry_point(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner="def test_x(): pass")
    r = pytester.runpytest_subprocess("--fixtures", "-q")
    out = r.stdout.str()
    assert "bosen_cluster" in out and "bosen_procs" in out and "bosen/jobs/pytest_plugin.py" in out


@pytest.mark.slow
def test_bosen_cluster_gives_running_servers_that_are_gone_after_the_test(pytester: pytest.Pytester,
                                                                         tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    r = run(pytester, f"""
        import json
        from bosen.client import Client

        def test_cluster(bosen_cluster, bosen_procs):
            c = bosen_cluster(2, workers=1, tables={{"V": {{"rows": 6, "cols": 3, "dtype": "float32"}}}})
            stats = c.status()
            assert [s["address"] for s in stats] == c.addresses
            assert sum(s["tables"]["V"]["rows"] for s in stats) == 6
            with Client.connect(c.path) as client:
                client.table("V").inc(1, 2, 1.5)
                client.clock()
                assert client.table("V").get(1, 2) == 1.5
            w = bosen_procs.python("sleeper", "-c", "import time; time.sleep(120)")
            with open({str(record)!r}, "w") as f:
                json.dump([p.pid for p in c.servers] + [w.pid], f)
    """)
    r.assert_outcomes(passed=1)
    pids = json.loads(record.read_text())
    assert len(pids) == 3
    assert all(gone(pid) for pid in pids), [psutil.Process(p) for p in pids if not gone(p, 0)]


def test_a_failing_test_carries_the_server_and_worker_logs(pytester: pytest.Pytester) -> None:
    r = run(pytester, """
        def test_fails(bosen_cluster, bosen_procs):
            c = bosen_cluster(1)
            w = bosen_procs.python("talker", "-c", "print('worker says hello')")
            w.wait(20)
            assert c.status()[0]["clock"] == 99
    """)
    r.assert_outcomes(failed=1)
    out = r.stdout.str()
    assert "log of <Process job0-server-0" in out and "log of <Process talker" in out
    assert "worker says hello" in out
    assert "scheduling policy" in out  # a line of the server's log


@pytest.mark.slow
def test_a_server_that_dies_during_a_test_fails_it(pytester: pytest.Pytester) -> None:
    r = run(pytester, """
        import os, signal

        def test_killed(bosen_cluster):
            c = bosen_cluster(2)
            os.kill(c.servers[1].pid, signal.SIGKILL)
            c.servers[1].wait(10)

        def test_stopped_on_purpose(bosen_cluster):
            c = bosen_cluster(2)
            c.stop_server(1, signal.SIGKILL)
    """)
    r.assert_outcomes(passed=2, errors=1)
    out = r.stdout.str()
    assert "ERROR at teardown of test_killed" in out
    assert "job0-server-1 was killed by SIGKILL while its cluster was running" in out
