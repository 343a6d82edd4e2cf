"""Children forked from a zygote (bosen.jobs.zygote) behave as exec'd ones under bosen.jobs.supervise: exit
status, signals, stop escalation, their own process group, env/cwd/argv, tracebacks; what the zygote cannot
start the same way is exec'd; and no zygote outlives its owner."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import wait_until
from test_supervise import IGNORE_TERM, gone, wait_for_line, wait_gone

from bosen.jobs.supervise import Forked, ProcessGroup
from bosen.jobs.zygote import Zygote, enabled

pytestmark = pytest.mark.skipif(not enabled(), reason="no zygote on this platform (or BOSEN_FORK=0)")

SHOW = f"""import os, sys
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("FZ_X"), "group", os.getpgid(0) == os.getpid(),
      "parent", os.getppid(), flush=True)
code = sys.argv[1]
if code == "sleep":
    import time; time.sleep(120)
if code == "ignore":
    exec({IGNORE_TERM!r})
if code == "raise":
    raise ValueError("boom from the script")
if code == "burn":
    import time
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
sys.exit(int(code) if code.isdigit() else 0)
"""


def test_a_forked_child_has_its_argv_env_cwd_group_and_exit_status(tmp_path: Path, bosen_zygote: Zygote,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    with ProcessGroup(tmp_path / "logs", zygote=bosen_zygote, env={"FZ_X": "y"}) as group:
        p = group.python("show", script, "3", cwd=tmp_path)
        assert isinstance(p.popen, Forked), "a plain script was exec'd, not forked"
        assert p.wait(60) == 3
        out = p.output()
        assert f"argv ['3'] cwd {tmp_path} env y group True parent {os.getpid()}" in out, out
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        b = group.python("burner", script, "burn")
        assert b.wait(60) == 0 and b.stop() == 0  # reaped here: its CPU counts as this process's children's
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime >= 0.25
        monkeypatch.chdir(tmp_path)  # a relative path is the supervisor's, wherever the zygote started
        r = group.python("relative", "show.py", "0")
        assert isinstance(r.popen, Forked) and r.wait(60) == 0, r.tail()
        assert f"cwd {tmp_path} " in r.output()
        s = group.python("sleeper", script, "sleep")
        wait_for_line(s, "argv")
        assert psutil.Process(s.pid).cmdline() == [sys.executable, str(script), "sleep"]  # /proc shows the child's
        assert psutil.Process(s.pid).environ()["FZ_X"] == "y"
        assert os.getpgid(s.pid) == s.pid
        assert s.stop(grace=10.0) == -signal.SIGTERM
        assert gone(s.pid)


def test_a_forked_child_killed_by_a_signal_and_one_that_ignores_sigterm(tmp_path: Path, bosen_zygote: Zygote) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    with ProcessGroup(tmp_path / "logs", zygote=bosen_zygote) as group:
        k = group.python("killed", script, "sleep")
        stubborn = group.python("stubborn", script, "ignore")
        assert isinstance(k.popen, Forked) and isinstance(stubborn.popen, Forked)
        wait_for_line(k, "argv")
        os.kill(k.pid, signal.SIGKILL)
        assert k.wait(60) == -signal.SIGKILL
        wait_for_line(stubborn, "ready")
        assert stubborn.stop(grace=0.5) == -signal.SIGKILL and stubborn.escalated


def test_a_script_that_raises_exits_1_with_its_traceback(tmp_path: Path, bosen_zygote: Zygote) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    with ProcessGroup(tmp_path / "logs", zygote=bosen_zygote) as group:
        p = group.python("raiser", "-m", "show", "raise", env={"PYTHONPATH": tmp_path})
        assert isinstance(p.popen, Forked)
        assert p.wait(60) == 1
        out = p.output()
        assert "Traceback (most recent call last)" in out and "ValueError: boom from the script" in out, out
        assert "zygote.py" not in out, out  # the program's frames, as a fresh interpreter shows them


def test_what_the_zygote_cannot_start_the_same_way_is_execd(tmp_path: Path, bosen_zygote: Zygote) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    with ProcessGroup(tmp_path / "logs", zygote=bosen_zygote) as group:
        numba = group.python("numba", script, "0", env={"NUMBA_OPT": "1"})  # read when numba is imported
        option = group.python("option", "-c", "pass")
        off = group.python("off", script, "0", env={"BOSEN_FORK": "0"})
        for p in (numba, option, off):
            assert isinstance(p.popen, subprocess.Popen), p.name
            assert p.wait(60) == 0, p.tail()


OWNER = """
import os, sys, threading, time
import psutil
import zmq
from bosen.jobs.supervise import ProcessGroup
from bosen.jobs.zygote import Zygote, fork_unsafe
how = sys.argv[2]
env = dict(os.environ)
if how == "close":  # what makes a fork of this process unsafe, and that nothing does now
    print("unsafe env:", fork_unsafe({**env, "NUMBA_OPT": "1"}), flush=True)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    print("unsafe zmq:", fork_unsafe(env), flush=True)
    sock.close()
    ctx.term()
    done = threading.Event()
    t = threading.Thread(target=done.wait)
    t.start()
    print("unsafe thread:", fork_unsafe(env), flush=True)
    done.set()
    t.join()
    deadline = time.monotonic() + 10.0  # a joined thread's OS thread may take a moment to leave /proc
    while fork_unsafe(env) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fork_unsafe(env) is None, fork_unsafe(env)
if how == "thread":  # running while the zygote starts: it is exec'd
    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
zygote = Zygote(sys.argv[1] + "/zygote.log", fork_self=True)
zygote.start()  # as a launcher does, before it runs the job's own code
here = os.path.dirname(sys.argv[1])
sys.path.insert(0, here)
import lingers  # after the fork: the child below runs it as __main__ without finding it imported
group = ProcessGroup(sys.argv[1], zygote=zygote)
child = group.python("child", "-m", "lingers", env={"PYTHONPATH": here})
assert zygote.forked == 1
with open(f"/proc/{zygote.pid}/cmdline", "rb") as f:
    cmdline = f.read().replace(b"\\0", b" ").decode()
print("pids", zygote.pid, child.pid, psutil.Process(child.pid).ppid() == os.getpid(), "how:", zygote.how, flush=True)
print("zygote cmdline:", cmdline, flush=True)
if how == "close":
    group.stop_all()
    zygote.close()
    print("closed", flush=True)
time.sleep(120)
"""


def test_no_zygote_outlives_its_owner(tmp_path: Path) -> None:
    """A launcher's zygote is a fork of it (``fork_self``) where that is safe, exec'd where not (here: a
    thread runs); either way an owner that closes it leaves none, and one killed by SIGKILL takes its
    zygote and children with it."""
    (tmp_path / "owner.py").write_text(OWNER)
    (tmp_path / "lingers.py").write_text("import sys, time\nif __name__ == '__main__':\n"
                                         "    print('imported already:', 'lingers' in sys.modules, flush=True)\n"
                                         "    time.sleep(120)\n")
    with ProcessGroup(tmp_path) as group:
        for how in ("close", "kill", "thread"):
            o = group.python(f"owner-{how}", tmp_path / "owner.py", tmp_path / how, how)
            out = wait_for_line(o, "zygote cmdline", timeout=120.0)
            line = out[out.index("pids"):].splitlines()[0]
            zygote, child = map(int, line.split()[1:3])
            started = line.split("how: ")[1]
            assert line.split()[3] == "True", "the child is not its supervisor's"
            # nobody looking for a server by "bosen.server" in command lines finds the zygote, nor a
            # second launcher in a forked one: it shows the command line an exec'd zygote has
            cmdline = out[out.index("zygote cmdline:"):].splitlines()[0]
            assert "bosen.server" not in cmdline and "-m bosen.jobs.zygote --fd" in cmdline, cmdline
            if how == "thread":
                assert started.startswith("exec'd: ") and "threads are running" in started, started
            else:
                assert started == "a fork of its supervisor", started
            if how == "kill":  # its child lives until the owner dies
                log = tmp_path / how / "child.log"
                assert wait_until(lambda log=log: "imported already:" in log.read_text(), 60.0), log.read_text()
                assert "imported already: False" in log.read_text()  # as in a fresh interpreter
            if how == "close":
                assert "unsafe env: NUMBA_OPT differs from this interpreter's start" in out, out
                assert re.search(r"unsafe zmq: \d+ threads are running \(native", out), out
                assert "unsafe thread: 2 Python threads are running" in out, out
                wait_for_line(o, "closed", timeout=60.0)
                assert gone(zygote) and gone(child)
            else:
                assert not gone(zygote) and not gone(child)
                os.kill(o.pid, signal.SIGKILL)
                assert wait_gone(zygote, 10.0), "the zygote outlived its owner"
                assert wait_gone(child, 10.0), "a forked child outlived its supervisor"
            o.stop()
