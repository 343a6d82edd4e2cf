"""A server process runs under the scheduling policy its config names, every thread of it (the
ZeroMQ I/O thread included), and still serves."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scheduling policies are Linux's")

POLICY = {"batch": os.SCHED_BATCH, "normal": os.SCHED_OTHER} if sys.platform.startswith("linux") else {}


def thread_policies(pid: int) -> dict[str, int]:
    """Thread name -> scheduling policy (field 41 of /proc/PID/task/TID/stat)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on
        out[f"{name}/{task.name}"] = int(fields[41 - 3])
    return out


@pytest.mark.parametrize("name", ["batch", "normal"])
def test_every_server_thread_runs_under_the_configured_policy(bosen_cluster, name):
    extra = {} if name == "batch" else {"server_sched": "normal"}  # batch: the default
    c = bosen_cluster(n_servers=1, config={"cluster": {"workers": 1, **extra},
                                           "tables": {"W": {"rows": 10, "cols": 4, "dtype": "int64"}}})
    assert c.status()[0]["clock"] == 0  # it serves
    policies = thread_policies(c.servers[0].pid)
    assert any(t.startswith("ZMQbg/IO") for t in policies), policies
    assert set(policies.values()) == {POLICY[name]}, policies
    assert f"scheduling policy '{name}'" in c.servers[0].output()


def test_apply_policy_switches_every_thread_of_the_process(tmp_path):
    # in a child process: the test process keeps its policy
    code = (
        "import os, threading, time\n"
        "from bosen.server import sched\n"
        "stop = threading.Event()\n"
        "t = threading.Thread(target=stop.wait); t.start()\n"
        "print(sched.apply_policy('batch'))\n"
        "print(sorted({os.sched_getscheduler(int(x)) for x in os.listdir('/proc/self/task')}))\n"
        "print(sched.apply_policy('normal'))\n"
        "print(sorted({os.sched_getscheduler(int(x)) for x in os.listdir('/proc/self/task')}))\n"
        "stop.set(); t.join()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.splitlines() == ["scheduling policy 'batch' (SCHED_BATCH)", f"[{os.SCHED_BATCH}]",
                                       "scheduling policy 'normal' (SCHED_OTHER)", f"[{os.SCHED_OTHER}]"]
