"""Supervised processes (bosen.jobs.supervise): stop with grace then kill, whole process groups, groups
that stop all members also when the body raises, and children that die with their supervisor."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from bosen.errors import BosenError
from bosen.jobs.supervise import Process, ProcessFailed, ProcessGroup, describe_exit, wait_any

IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
              "time.sleep(120)"
SLEEP = "import time; print('ready', flush=True); time.sleep(120)"


def wait_for_line(p: Process, text: str, timeout: float = 20.0) -> str:
    """The log once it has a whole line containing ``text`` (the child has reached that point). Whole:
    an unbuffered child's ``print(a, b)`` writes its pieces one by one, so ``text`` alone may be there
    before the rest of its line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = p.output()
        at = out.find(text)
        if at >= 0 and "\n" in out[at:]:
            return out
        assert p.alive(), f"{p.name} {describe_exit(p.returncode or 0)}:\n{p.tail()}"
        time.sleep(0.01)
    raise AssertionError(f"{p.name} never printed {text!r}:\n{p.tail()}")


def gone(pid: int) -> bool:
    """No such process, or only its zombie (dead, waiting for whoever inherited it to reap it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return gone(pid)


def test_stop_escalates_to_sigkill_for_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as group:
        p = group.python("stubborn", "-c", IGNORE_TERM)
        wait_for_line(p, "ready")
        t0 = time.monotonic()
        code = p.stop(grace=0.5)
        took = time.monotonic() - t0
    assert code == -signal.SIGKILL
    assert 0.5 <= took < 0.5 + 1.0, took
    assert gone(p.pid)


def test_a_child_that_heeds_sigterm_stops_without_waiting_out_the_grace(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as group:
        p = group.python("polite", "-c", SLEEP)
        wait_for_line(p, "ready")
        t0 = time.monotonic()
        assert p.stop(grace=10.0) == -signal.SIGTERM
        assert time.monotonic() - t0 < 5.0


def test_a_child_of_a_supervised_process_is_stopped_with_its_group(tmp_path: Path) -> None:
    """The process starts a helper that ignores SIGTERM, then exits on SIGTERM itself: the helper is
    still killed (SIGKILL to the whole group)."""
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        helper = subprocess.Popen([sys.executable, "-c", {IGNORE_TERM!r}])
        print("helper", helper.pid, flush=True)
        time.sleep(120)
    """)
    with ProcessGroup(tmp_path) as group:
        p = group.python("parent", "-c", script)
        helper = int(wait_for_line(p, "helper").split()[1])
        time.sleep(0.3)  # the helper installs its SIGTERM handler
        assert p.stop(grace=1.0) == -signal.SIGTERM
    assert wait_gone(helper, 2.0), psutil.Process(helper).status()


def test_what_an_exited_process_left_behind_is_killed_at_stop(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import subprocess, sys
        helper = subprocess.Popen([sys.executable, "-c", {SLEEP!r}])
        print("helper", helper.pid, flush=True)
    """)
    with ProcessGroup(tmp_path) as group:
        p = group.python("leaver", "-c", script)
        assert p.wait(20) == 0
        helper = int(wait_for_line(p, "helper").split()[1])
        assert not gone(helper)
        assert psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE  # unreaped: its group id stays ours
        assert p.stop() == 0
    assert wait_gone(helper, 2.0)
    assert gone(p.pid)


def test_a_group_stops_every_member_even_when_the_body_raises(tmp_path: Path) -> None:
    members: list[Process] = []
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="the body failed"):
        with ProcessGroup(tmp_path, grace=0.5) as group:
            members += [group.python(f"stubborn-{i}", "-c", IGNORE_TERM) for i in range(3)]
            members.append(group.python("polite", "-c", SLEEP))
            for p in members:
                wait_for_line(p, "ready")
            t0 = time.monotonic()
            raise RuntimeError("the body failed")
    took = time.monotonic() - t0
    assert [p.returncode for p in members] == [-signal.SIGKILL] * 3 + [-signal.SIGTERM]
    assert all(gone(p.pid) for p in members)
    assert took < 0.5 + 1.5, f"members were not stopped in parallel: {took:.2f}s"  # one shared grace period


def test_wait_all_stops_everything_and_names_the_laggard(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as group:
        quick = group.python("quick", "-c", "print('done')")
        slow = group.python("slow", "-c", SLEEP)
        assert group.wait_all([quick], timeout=20) == [0]
        with pytest.raises(ProcessFailed, match=r"slow did not finish within 0.5s") as e:
            group.wait_all([quick, slow], timeout=0.5)
        assert "ready" in str(e.value) and "done" in str(e.value)  # both logs
        assert not slow.alive()


def test_wait_any_wakes_when_a_running_member_exits_not_for_one_that_had(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as group:
        ended = group.python("ended", "-c", "pass")
        assert ended.wait(20) == 0
        slow = group.python("slow", "-c", SLEEP)
        t = time.monotonic()
        wait_any([ended, slow], 0.5)  # the exited member does not cut the wait short
        assert time.monotonic() - t >= 0.45 and slow.alive()
        other = group.python("other", "-c", SLEEP)
        os.kill(slow.pid, signal.SIGKILL)
        t = time.monotonic()
        wait_any([ended, slow, other], 120.0)  # wakes on slow's end, long before the timeout
        assert time.monotonic() - t < 60 and slow.returncode == -signal.SIGKILL and other.alive()


def test_wait_stops_a_process_that_runs_too_long(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as group:
        p = group.python("sleeper", "-c", SLEEP)
        with pytest.raises(ProcessFailed, match="sleeper did not finish within 0.3s"):
            p.wait(0.3)
        assert not p.alive()


def test_environment_names_and_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPERVISE_DROP", "x")
    monkeypatch.setenv("SUPERVISE_KEEP", "kept")
    with ProcessGroup(tmp_path / "logs", env={"SUPERVISE_GROUP": "g", "SUPERVISE_DROP": None}) as group:
        code = "import os; print([os.environ.get(k) for k in ('SUPERVISE_GROUP', 'SUPERVISE_DROP', " \
               "'SUPERVISE_KEEP', 'SUPERVISE_OWN')])"
        p = group.python("env", "-c", code, env={"SUPERVISE_OWN": 3})
        assert p.wait(20) == 0
        assert p.output().strip() == "['g', None, 'kept', '3']"
        assert p.log == tmp_path / "logs" / "env.log"
        with pytest.raises(BosenError, match="already has a process named 'env'"):
            group.python("env", "-c", "pass")
        err = group.python("err", "-c", "import sys; sys.exit('bad input: x')")
        assert err.wait(20) == 1 and "bad input: x" in err.tail()
    assert describe_exit(2) == "exited with status 2" and describe_exit(-9) == "was killed by SIGKILL"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_children_die_with_their_supervisor_even_when_it_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from bosen.jobs.supervise import ProcessGroup
        group = ProcessGroup(sys.argv[1])
        child = group.python("orphan-to-be", "-c", {SLEEP!r})
        print("child", child.pid, flush=True)
        time.sleep(120)
    """)
    with ProcessGroup(tmp_path) as group:
        supervisor = group.python("supervisor", "-c", script, tmp_path / "inner")
        child = int(wait_for_line(supervisor, "child").split()[1])
        assert not gone(child)
        os.kill(supervisor.pid, signal.SIGKILL)  # no chance to clean up
        assert wait_gone(child, 5.0), "the child outlived its supervisor"
