"""Supervised child processes: start one with a log file, stop it with grace, then kill it.

``bosen launch``, the benchmarks and the tests (through ``bosen.jobs.pytest_plugin``) start every child
process here, so they all stop the same way:

- Each child runs in its own process group, so a stop reaches whatever the child started too:
  SIGTERM to the group, a grace period, then SIGKILL to the group. The group stays in the
  supervisor's session: with the kernel's autogroup scheduling (the default on desktop and server
  distributions), a new session would put the child in a scheduling group of its own, which made
  1 KiB reads between a client and its server ~10% slower on 2 cores.
- On Linux each child gets SIGTERM when the thread that started it dies, even by SIGKILL
  (PR_SET_PDEATHSIG), so nothing outlives its supervisor. Start children from a thread that lives as
  long as they should (the main thread, in practice).
- A child that has exited stays unreaped (a zombie) until ``stop()``: its pid, which is also its
  group's id, cannot be reused before then, so the final SIGKILL to the group can never reach a
  stranger's processes. Read ``returncode`` / ``alive()`` rather than ``popen.poll()``, which reaps;
  a child reaped behind our back no longer gets the group SIGKILL.
- Given a ``bosen.jobs.zygote.Zygote``, a child that is ``python -m MODULE`` or ``python SCRIPT.py``
  is forked from it, with its modules already imported, instead of exec'd; it is still this
  process's child (a subreaper's), in its own group, with the same death signal, so all of the above
  holds for it unchanged. Anything the zygote cannot start the same way is exec'd.
"""

from __future__ import annotations

import ctypes
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from bosen.errors import BosenError
from bosen.jobs.zygote import Zygote

STOP_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1
_HAS_WAITID = hasattr(os, "waitid")

Env = Mapping[str, str | os.PathLike[str] | int | float | None]


class ProcessFailed(BosenError):
    """A supervised process exited when it should not have, or did not finish in time.

    The message names the process and carries the last lines of its log.
    """


def describe_exit(code: int) -> str:
    """``exited with status N`` or ``was killed by SIGNAME`` (Popen's negative codes are signals)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: a preexec function asking for SIGTERM when the starting thread dies; None elsewhere.

    prctl is looked up here, in the parent, so the child does as little as possible between fork
    and exec. A parent that died before prctl ran would never send the signal, so the child checks.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _environment(env: Env | None) -> dict[str, str]:
    """This process's environment with ``env`` applied (a None value removes the variable)."""
    out = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = os.fspath(v) if isinstance(v, os.PathLike) else str(v)
    return out


def tail(path: str | Path, n: int = 30) -> str:
    """The last ``n`` lines of a log file, indented for embedding in an error message."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + x for x in lines) or "    (log is empty)"


class Forked:
    """The part of ``subprocess.Popen`` that ``Process`` uses, for a child forked by a zygote (it is
    this process's child: reparented to it as a subreaper)."""

    stdin: IO[str] | None = None
    stdout: IO[str] | None = None

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status if the child has exited (reaping it), else None."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Reap the child; subprocess.TimeoutExpired if it runs ``timeout`` seconds more."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = math.inf if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            if not _exit_seen(self.pid, min(left, 1.0)):
                time.sleep(min(left, 0.01))
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


class Process:
    """One supervised child process; stdout and stderr go to ``log``.

    With ``pipes`` the child's stdin and stdout are text pipes (``popen.stdin``/``popen.stdout``, for
    line protocols) and only stderr goes to the log. ``env`` is applied on top of this process's
    environment (None removes a variable). With a ``zygote`` the child is forked from it where it can
    be (``bosen.jobs.zygote``; ``popen`` is then a ``Forked``).
    """

    def __init__(self, name: str, cmd: Sequence[str | os.PathLike[str] | int], log: str | Path, *,
                 env: Env | None = None, cwd: str | Path | None = None, pipes: bool = False,
                 zygote: Zygote | None = None) -> None:
        self.name = name
        self.cmd = [os.fspath(c) if isinstance(c, os.PathLike) else str(c) for c in cmd]
        self.log = Path(log)
        self._terminated = False
        self.escalated = False  # stop() had to SIGKILL it: it outlived its grace period
        pipe = subprocess.PIPE if pipes else subprocess.DEVNULL
        full_env = _environment(env)
        self.popen: subprocess.Popen[str] | Forked
        with self.log.open("w") as out:
            pid = None if zygote is None or pipes else zygote.spawn(self.cmd, full_env, cwd, out.fileno())
            if pid is not None:
                self.popen = Forked(pid)
            else:
                self.popen = subprocess.Popen(
                    self.cmd, stdin=pipe, stdout=pipe if pipes else out, stderr=out if pipes else subprocess.STDOUT,
                    env=full_env, cwd=cwd, text=True, bufsize=1, process_group=0, preexec_fn=_die_with_parent())

    def __repr__(self) -> str:
        code = self.returncode
        return f"<Process {self.name} pid={self.pid} {'running' if code is None else describe_exit(code)}>"

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has exited (negative: killed by that signal), else None."""
        if self.popen.returncode is not None or not _HAS_WAITID:
            return self.popen.poll()
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped elsewhere: Popen reports what it can
            return self.popen.poll()
        if info is None:
            return None
        return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status

    def alive(self) -> bool:
        return self.returncode is None

    def tail(self, n: int = 30) -> str:
        return tail(self.log, n)

    def output(self) -> str:
        """The whole log."""
        return self.log.read_text(errors="replace")

    def _exited_within(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to exit, without reaping it."""
        if not _HAS_WAITID:
            try:
                self.popen.wait(None if math.isinf(timeout) else max(timeout, 0.0))
                return True
            except subprocess.TimeoutExpired:
                return False
        if self.returncode is not None:
            return True
        if _exit_seen(self.pid, timeout):  # woken by the exit itself where a pidfd can watch it
            return self.returncode is not None
        deadline = time.monotonic() + timeout
        pause = 0.001
        while self.returncode is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(2 * pause, 0.05)
        return True

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; a process still running after ``timeout`` seconds (None: no limit) is
        stopped and ProcessFailed raised with its log."""
        if not self._exited_within(math.inf if timeout is None else timeout):
            self.stop(grace=1.0)
            raise ProcessFailed(f"{self.name} did not finish within {timeout:g}s; stopped it. Last log lines:\n"
                                f"{self.tail()}")
        code = self.returncode
        assert code is not None
        return code

    def _signal_group(self, sig: int) -> None:
        if self.popen.returncode is not None:
            return  # reaped: the group id may belong to someone else now
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        """SIGTERM to the process group, once (``stop`` waits for the effect)."""
        if not self._terminated and self.alive():
            self._terminated = True
            self._signal_group(signal.SIGTERM)

    def kill(self) -> int:
        """SIGKILL to the process group at once; the exit status."""
        return self.stop(grace=0.0)

    def stop(self, grace: float = STOP_GRACE_S) -> int:
        """SIGTERM to the group, up to ``grace`` seconds to exit, then SIGKILL to the group (which
        also ends anything the process left behind); reaps it and returns its exit status."""
        if grace > 0 and not self._exited_within(0.0):
            self.terminate()
            self._exited_within(grace)
        self.escalated = self._terminated and self.alive()
        self._signal_group(signal.SIGKILL)
        try:
            code = self.popen.wait(10.0)
        except subprocess.TimeoutExpired:
            raise ProcessFailed(f"{self.name} (pid {self.pid}) survived SIGKILL for 10s") from None
        for f in (self.popen.stdin, self.popen.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        return code

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _exit_seen(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds (inf: no limit) for process ``pid`` to exit, through a pidfd;
    False where none can be opened (then the caller polls)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)  # readable once the process has exited
        poller.poll(None if math.isinf(timeout) else max(timeout, 0.0) * 1000)
    finally:
        os.close(fd)
    return True


def wait_any(procs: Sequence[Process], timeout: float) -> None:
    """Sleep until one of the running ``procs`` exits or ``timeout`` seconds pass, reaping none: a
    supervisor's loop wakes when a member ends instead of at its next poll. Each running member is
    watched through a pidfd (Linux); where there is none, this is a sleep."""
    running = [p for p in procs if p.returncode is None]
    fds: list[int] = []
    try:
        for p in running:
            fds.append(os.pidfd_open(p.pid))
    except (AttributeError, OSError):  # no pidfd here (or none for a member): a plain sleep
        for fd in fds:
            os.close(fd)
        time.sleep(timeout)
        return
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)  # readable once the process has exited
        poller.poll(max(timeout, 0.0) * 1000)
    finally:
        for fd in fds:
            os.close(fd)


def stop_all(procs: Sequence[Process], grace: float = STOP_GRACE_S) -> list[int]:
    """Stop several processes in parallel (SIGTERM to all, one shared grace period); exit statuses."""
    for p in procs:
        p.terminate()
    deadline = time.monotonic() + grace
    return [p.stop(max(deadline - time.monotonic(), 0.0)) for p in procs]


class ProcessGroup:
    """The processes started for one purpose (a job, a test, a benchmark case); logs in ``log_dir``.

    ``stop_all`` stops every member in parallel; as a context manager the group does that on exit,
    also when the body raises. ``env`` and ``cwd`` are defaults for every member; members are forked
    from ``zygote`` where they can be (its owner stops it).
    """

    def __init__(self, log_dir: str | Path, *, env: Env | None = None, cwd: str | Path | None = None,
                 grace: float = STOP_GRACE_S, zygote: Zygote | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(env or {})
        self.cwd = cwd
        self.grace = grace
        self.zygote = zygote
        self.procs: list[Process] = []

    def __iter__(self) -> Iterator[Process]:
        return iter(self.procs)

    def __len__(self) -> int:
        return len(self.procs)

    def spawn(self, name: str, cmd: Sequence[str | os.PathLike[str] | int], *, env: Env | None = None,
              cwd: str | Path | None = None, pipes: bool = False) -> Process:
        """Start ``cmd`` as member ``name`` (unique in the group; its log is LOG_DIR/NAME.log)."""
        if any(p.name == name for p in self.procs):
            raise BosenError(f"this group already has a process named {name!r} (log {self.log_dir / name}.log)")
        p = Process(name, cmd, self.log_dir / f"{name}.log", env={**self.env, **(env or {})},
                    cwd=cwd if cwd is not None else self.cwd, pipes=pipes, zygote=self.zygote)
        self.procs.append(p)
        return p

    def python(self, name: str, *args: str | os.PathLike[str] | int, env: Env | None = None,
               cwd: str | Path | None = None, pipes: bool = False) -> Process:
        """``python ARGS...`` with this interpreter, as member ``name``."""
        return self.spawn(name, [sys.executable, *args], env=env, cwd=cwd, pipes=pipes)

    def wait_all(self, procs: Sequence[Process], timeout: float) -> list[int]:
        """Exit statuses of ``procs`` (one shared deadline). If one is still running at the
        deadline, all of them are stopped and ProcessFailed raised with every log."""
        deadline = time.monotonic() + timeout
        codes = []
        for p in procs:
            code = p.returncode if p._exited_within(deadline - time.monotonic()) else None
            if code is None:
                logs = "\n".join(f"--- {q!r}:\n{q.tail()}" for q in procs)
                stop_all(procs, grace=1.0)
                raise ProcessFailed(f"{p.name} did not finish within {timeout:g}s; stopped all {len(procs)}.\n{logs}")
            codes.append(code)
        return codes

    def stop_all(self, grace: float | None = None) -> list[int]:
        """Stop every member (see ``stop_all``); exit statuses in start order."""
        return stop_all(self.procs, self.grace if grace is None else grace)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop_all()
