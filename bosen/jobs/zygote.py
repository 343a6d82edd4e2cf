"""A fork server ("zygote"): children of ``bosen.jobs.supervise`` forked from a process that has
already imported numpy, numba, pyzmq, msgpack and Bösen, instead of exec'ing a fresh interpreter.

Why: every server, worker and launcher used to spend ~1 s of CPU importing the same modules (numba
alone ~0.3 s); a small job's CPU was nearly all start-up, and so was the test suite's. A forked child
shares the zygote's imported modules (copy-on-write) and starts in milliseconds.

How the invariants of ``supervise`` still hold: the supervisor marks itself a child subreaper
(``PR_SET_CHILD_SUBREAPER``) before it starts the zygote. For a request the zygote forks an
intermediate process that forks the real child and exits at once, so the child is reparented to the
supervisor: it is the supervisor's own child, which ``waitid``/``killpg`` and the zombie rule of
``supervise`` need. The child is put in its own process group (by itself and by the intermediate,
before its pid is reported, so a group signal can never miss it), waits until its parent is the
supervisor and only then asks for SIGTERM at the parent's death (``PR_SET_PDEATHSIG`` set earlier
would fire at the reparenting itself). It then takes the requested stdio, cwd, environment (all of
it), ``sys.argv`` and ``sys.path``, reseeds numpy's global generator (``random`` reseeds itself at
fork), shows its own command line and environment in ``/proc`` (``PR_SET_MM_MAP``, so ``ps`` and
psutil see ``python -m bosen.server ...``, not the zygote), and runs the module or script through
``runpy`` as ``python -m MODULE`` / ``python SCRIPT`` would, exit status, traceback, thread join and
``atexit`` handlers included.

A request is served only when the result is the same as exec'ing it: this interpreter, ``-m MODULE``
or ``SCRIPT.py`` with no interpreter options, no pipes, and an environment that equals the zygote's in
every variable read at start-up (``PYTHON*`` but PYTHONPATH and PYTHONUNBUFFERED, which the child
applies itself; ``NUMBA_*``, ``OMP_*``, ``MKL_*``, ``OPENBLAS_*``, ``CUDA_*``, ``LD_*``, ``MALLOC_*``,
the locale). Anything else, a platform without fork or subreapers, or a dead zygote, takes the exec
path. The zygote imports torch only for a launcher of a PyTorch app (``preload_for``); nothing here
initializes CUDA, so a forked worker can, and the zygote
refuses to serve if a Python thread is running when it would fork. numpy's OpenBLAS pool (native
threads) is stopped around fork by OpenBLAS's own ``pthread_atfork`` handlers.

A launcher's zygote (``fork_self``, started by ``start`` before the launcher runs the app's code) is a
fork of the launcher itself where that is what an exec'd one would be (``fork_unsafe``): it has most
modules imported already (all of them, numba set up, where the launcher was itself forked from the test
session's zygote), so it imports only what is left. The fork
closes every other fd, resets signal handlers, shows an exec'd zygote's command line and never returns
into the launcher's code; it is the launcher's child in its own process group, as the exec'd one is.

Children share the zygote's hash seed (``PYTHONHASHSEED``), which a fresh interpreter would draw anew.
``BOSEN_FORK=0`` turns the zygote off (every child exec'd).
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import gc
import importlib
import io
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack

KNOB = "BOSEN_FORK"
PRELOAD = ("numpy", "numba", "zmq", "msgpack", "uvloop", "asyncio", "argparse", "logging", "bosen.config",
           "bosen.server.daemon", "bosen.server.sched", "bosen.server.moves", "bosen.client", "bosen.jobs.status",
           "bosen.prometheus", "bosen.security", "bosen.malloc")
START_TIMEOUT_S = 120.0  # the zygote's imports on a loaded machine, before it answers its first request
_STARTUP_PREFIXES = ("PYTHON", "NUMBA_", "OMP_", "MKL_", "OPENBLAS_", "CUDA_", "LD_", "MALLOC_", "LC_", "TORCH_",
                     "PYTORCH_")
_STARTUP_EXACT = ("LANG", "LANGUAGE")
_APPLIED = ("PYTHONPATH", "PYTHONUNBUFFERED")  # the child applies these itself
_PR_SET_PDEATHSIG = 1
_PR_SET_MM, _PR_SET_MM_MAP = 35, 14
_PR_SET_CHILD_SUBREAPER = 36
RUNPY = "<frozen runpy>"
_KEEP: list[Any] = []  # in a child: the zygote's stdio objects (freeing one closes fd 0/1/2) and /proc buffers


def enabled(env: Mapping[str, str] = os.environ) -> bool:
    """Whether children may be forked here: Linux (subreapers, PR_SET_MM_MAP) and ``BOSEN_FORK`` not 0."""
    return (sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(socket, "send_fds")
            and env.get(KNOB, "1") != "0")


def preload_for(app_module: str) -> tuple[str, ...]:
    """What a launcher's zygote imports for a job of ``app_module``: torch too for a PyTorch app (its
    name says torch: ``bosen.apps.pytorch.*``), ~1.5 s of CPU that each worker would spend. Importing
    torch starts no thread and leaves CUDA alone; a worker initializes CUDA itself, after the fork."""
    return (*PRELOAD, "torch") if "torch" in app_module else PRELOAD


def fork_target(cmd: Sequence[str]) -> tuple[str, str] | None:
    """``("module", NAME)`` for ``[python, -m, NAME, ...]``, ``("script", PATH)`` for ``[python,
    PATH.py, ...]`` where python is this interpreter; None for anything else (exec'd)."""
    if len(cmd) < 2 or os.path.realpath(cmd[0]) != os.path.realpath(sys.executable):
        return None
    if cmd[1] == "-m" and len(cmd) > 2 and cmd[2] and not cmd[2].startswith("-"):
        return "module", cmd[2]
    if cmd[1].endswith(".py") and not cmd[1].startswith("-"):
        return "script", cmd[1]
    return None


def startup_difference(a: Mapping[str, str], b: Mapping[str, str]) -> str | None:
    """The first variable read at interpreter or library start-up whose value differs between
    environments ``a`` and ``b`` (None: a child with ``b`` may fork from a zygote started with ``a``)."""
    for k in sorted(set(a) | set(b)):
        if (k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_EXACT) and k not in _APPLIED and a.get(k) != b.get(k):
            return k
    return None


def _openblas_threads() -> int:
    """The native threads of the OpenBLAS pools loaded here (numpy's, scipy's): they are the ones
    that run while no Python thread does, and OpenBLAS stops them around fork itself."""
    n = 0
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "openblas" in line.rsplit("/", 1)[-1]}
    except OSError:
        return 0
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("openblas_get_num_threads", "openblas_get_num_threads64_", "scipy_openblas_get_num_threads64_",
                     "scipy_openblas_get_num_threads"):
            if hasattr(lib, name):
                n += max(0, int(getattr(lib, name)()) - 1)
                break
    return n


def fork_unsafe(env: Mapping[str, str]) -> str | None:
    """Why a zygote started with ``env`` may not be a fork of this process (None: it may). A fork is what an
    exec'd zygote would be when this process runs no thread but OpenBLAS's pool (a thread running at
    fork could hold a lock forever, in the fork), this interpreter had no
    options (``-X``, ``-O``, ``-c``...) and its start-up environment (``/proc/self/environ``) equals
    ``env`` in every variable read at start-up (``startup_difference``)."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads are running"
    try:
        tasks = len(os.listdir("/proc/self/task"))
        with open("/proc/self/environ", "rb") as f:
            started = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError as e:
        return f"cannot read /proc: {e}"
    if tasks > 1 + _openblas_threads():
        return f"{tasks} threads are running (native ones: ZeroMQ's, a thread pool's)"
    argv = sys.orig_argv
    if len(argv) < 2 or os.path.realpath(argv[0]) != os.path.realpath(sys.executable) or \
            (argv[1].startswith("-") and argv[1] != "-m"):
        return f"this interpreter ran with options: {argv[:2]}"
    diff = startup_difference({os.fsdecode(k): os.fsdecode(v) for k, v in started.items()}, env)
    if diff is not None:
        return f"{diff} differs from this interpreter's start"
    return None


def _fresh_signals() -> None:
    """Signal handlers as a fresh interpreter has them: Python handlers the default (exec resets
    them), SIGINT KeyboardInterrupt; what is ignored stays ignored, as exec keeps it."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    if signal.getsignal(signal.SIGINT) == signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _prctl() -> Any:
    return ctypes.CDLL(None, use_errno=True).prctl


class Zygote:
    """The supervisor's end of a zygote, started at the first ``spawn`` and stopped by ``close``.

    The process that creates it becomes a child subreaper: forked children, and any process they
    leave behind, are reparented to it. ``log`` takes the zygote's own output (its errors).
    """

    def __init__(self, log: str | Path, preload: Sequence[str] = PRELOAD, fork_self: bool = False) -> None:
        self.log = Path(log)
        self.preload = tuple(preload)
        self.fork_self = fork_self
        self.supervisor = os.getpid()
        self.failed: str | None = None  # why this zygote serves no more requests
        self.forked = 0  # children served
        self.popen: subprocess.Popen[bytes] | None = None  # the exec'd zygote
        self.pid: int | None = None  # the zygote's pid, exec'd or forked
        self.how: str | None = None  # "forked" (a fork of this process) or why it was exec'd
        self._sock: socket.socket | None = None
        self._env: dict[str, str] = {}
        self._lock = threading.Lock()

    def _start(self) -> None:
        if _prctl()(_PR_SET_CHILD_SUBREAPER, 1) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._env = dict(os.environ)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        unsafe = fork_unsafe(self._env) if self.fork_self else "not asked to (fork_self)"
        with theirs:
            if unsafe is None:
                self.how = "a fork of its supervisor"
                self.pid = self._fork_self(mine, theirs)
            else:
                self.how = f"exec'd: {unsafe}"
                self.pid = self._exec(theirs)
        # the modules go over the socket, not on the command line: whoever looks for a server by
        # "bosen.server" in command lines must not find the zygote's "bosen.server.daemon"
        mine.sendall(msgpack.packb({"preload": list(self.preload)}))
        self._sock = mine

    def _exec(self, theirs: socket.socket) -> int:
        """A fresh interpreter running ``main``."""
        parent = os.getpid()
        prctl = _prctl()

        def die_with_parent() -> None:  # pragma: no cover - runs in the zygote before exec
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
            if os.getppid() != parent:
                os._exit(1)

        with self.log.open("w") as out:
            print(f"zygote: {self.how}", file=out, flush=True)
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "bosen.jobs.zygote", "--fd", str(theirs.fileno()), "--supervisor", str(parent)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),),
                env=self._env, process_group=0, preexec_fn=die_with_parent)
        return self.popen.pid

    def _fork_self(self, mine: socket.socket, theirs: socket.socket) -> int:
        """A fork of this process running ``_serve`` (it has most of ``preload`` imported already): what
        an exec'd zygote would be, with its fds, signal handlers and command line, so it never returns."""
        parent = os.getpid()
        for f in (sys.stdout, sys.stderr):
            f.flush()  # else both processes would write what is buffered
        out = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the zygote
            code = 1
            try:
                os.setpgid(0, 0)
                _prctl()(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
                if os.getppid() != parent:
                    os._exit(1)
                mine.close()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(out, 1)
                os.dup2(out, 2)
                keep = theirs.fileno()  # every other fd closes, as Popen's close_fds does
                os.closerange(3, keep)
                os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
                _fresh_signals()
                print(f"zygote: {self.how}", file=sys.stderr, flush=True)
                _show_in_proc([sys.executable, "-m", "bosen.jobs.zygote", "--fd", str(keep), "--supervisor",
                               str(parent)], self._env)
                code = _serve(theirs, parent)
            except BaseException:  # noqa: BLE001 - never back into the supervisor's code
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(out)
        return pid

    def start(self) -> None:
        """Start the zygote now rather than at the first ``spawn`` (a launcher's: before it runs the job's
        own code, so that a fork of it is what an exec'd zygote would be). A failure leaves spawns to exec."""
        with self._lock:
            self._started()

    def _started(self) -> bool:
        if self.failed is not None:
            return False
        try:
            if self.how is None:
                self._start()
        except OSError as e:
            self.failed = f"could not start: {e}"
            return False
        return True

    def spawn(self, cmd: Sequence[str], env: Mapping[str, str], cwd: str | Path | None, out: int,
              err: int | None = None) -> int | None:
        """Fork ``cmd`` with ``env`` (the whole environment) in ``cwd``, stdout to fd ``out`` and
        stderr to ``err`` (default: ``out``): the child's pid, or None where it must be exec'd instead."""
        target = fork_target(cmd)
        if target is None or not enabled(env) or os.getpid() != self.supervisor:
            return None
        if cwd is not None and not os.path.isdir(cwd):
            return None  # Popen raises the error that names it
        where = os.path.abspath(os.getcwd() if cwd is None else cwd)  # the zygote's own cwd may be another
        with self._lock:
            if not self._started():
                return None
            assert self._sock is not None
            if startup_difference(self._env, env) is not None:
                return None
            request = msgpack.packb({"argv": list(cmd), "env": dict(env), "kind": target[0], "target": target[1],
                                     "cwd": where})
            try:
                with open(os.devnull, "rb") as null:
                    socket.send_fds(self._sock, [request], [null.fileno(), out, out if err is None else err])
                self._sock.settimeout(START_TIMEOUT_S)
                reply = msgpack.unpackb(self._sock.recv(1 << 16))
            except (OSError, ValueError) as e:  # dead or stuck zygote: exec from now on
                self._fail(f"no answer: {e!r}")
                return None
            if "pid" not in reply:
                self._fail(str(reply.get("error")))
                return None
            self.forked += 1
            return int(reply["pid"])

    def _fail(self, why: str) -> None:
        self.failed = why
        self._stop()

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the zygote exits at EOF
            self._sock = None
        if self.forked == 0 and self.pid is not None:  # none of its work is wasted: no wait for its imports
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.popen is not None and self.popen.returncode is None:
            try:
                self.popen.wait(10.0)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        elif self.popen is None and self.pid is not None:  # forked
            deadline = time.monotonic() + 10.0
            try:
                while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                    if time.monotonic() > deadline:
                        os.kill(self.pid, signal.SIGKILL)
                        os.waitpid(self.pid, 0)
                        break
                    time.sleep(0.005)
            except ChildProcessError:
                pass  # reaped already
            self.pid = None

    def close(self) -> None:
        """Stop the zygote (its children are the supervisor's and live on); later spawns exec."""
        with self._lock:
            if self.failed is None:
                self.failed = "closed"
            self._stop()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the zygote process ---------------------------------------------------------------------------

def _sys_path_rest() -> list[str]:
    """``sys.path`` without its first entry and the PYTHONPATH entries: what every child shares."""
    rest = sys.path[1:]
    for entry in filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if rest and os.path.abspath(rest[0]) == os.path.abspath(entry):
            rest.pop(0)
    return rest


def _show_in_proc(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Point /proc/self/cmdline and /proc/self/environ at ``argv`` and ``env`` (PR_SET_MM_MAP needs no
    privilege when the exe link stays). Where the kernel refuses, /proc keeps showing the zygote's."""
    class MMMap(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in ("start_code", "end_code", "start_data", "end_data", "start_brk",
                                                     "brk", "start_stack", "arg_start", "arg_end", "env_start",
                                                     "env_end", "auxv")] + \
                   [("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]

    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()

        def field(i: int) -> int:  # proc(5) numbers the fields from 1
            return int(fields[i - 3])

        args = b"".join(os.fsencode(a) + b"\0" for a in argv)
        blob = args + b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in env.items())
        buf = ctypes.create_string_buffer(blob, len(blob))
        base = ctypes.addressof(buf)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sbrk.restype = ctypes.c_void_p
        mm = MMMap(field(26), field(27), field(45), field(46), field(47), libc.sbrk(0), field(28), base,
                   base + len(args), base + len(args), base + len(blob), 0, 0, 0xFFFFFFFF)
        if libc.prctl(_PR_SET_MM, _PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0) == 0:
            _KEEP.append(buf)
    except (OSError, ValueError, IndexError, AttributeError):
        pass


def _take_stdio(unbuffered: bool) -> None:
    """New ``sys.stdout``/``sys.stderr`` on fds 1 and 2, buffered as a fresh interpreter's would be."""
    _KEEP.extend([sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__])
    enc, errors = sys.stdout.encoding, sys.stdout.errors
    streams = []
    for fd in (1, 2):
        raw = io.FileIO(fd, "w", closefd=False)
        buffered = not unbuffered
        line = fd == 2 or (buffered and raw.isatty())
        streams.append(io.TextIOWrapper(io.BufferedWriter(raw) if buffered else raw, encoding=enc,  # type: ignore[arg-type]
                                        errors="backslashreplace" if fd == 2 else errors, line_buffering=line,
                                        write_through=not buffered))
    sys.stdout = streams[0]
    sys.stderr = streams[1]
    setattr(sys, "__stdout__", streams[0])  # noqa: B010 - typeshed marks them final; the interpreter sets them so
    setattr(sys, "__stderr__", streams[1])  # noqa: B010


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish(code: int, interrupted: bool) -> None:
    """What the interpreter does at exit: join non-daemon threads, run atexit handlers, flush stdio."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:  # noqa: BLE001 - as the interpreter: report, go on exiting
        traceback.print_exc()
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    if interrupted:  # as CPython: die by the signal, so the parent sees what happened
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _child(req: dict[str, Any], fds: list[int], sock: socket.socket, supervisor: int, rest: list[str]) -> None:
    """In the forked child: become the requested program; never returns."""
    try:
        try:
            os.setpgid(0, 0)
        except OSError:
            pass  # the intermediate already did
        sock.close()
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        deadline = time.monotonic() + 60.0
        while os.getppid() != supervisor:  # until the intermediate has exited
            if time.monotonic() > deadline:
                os._exit(1)
            time.sleep(0.0002)
        _prctl()(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != supervisor:
            os._exit(1)  # the supervisor died before the request was armed
        argv, env, kind, target = req["argv"], req["env"], req["kind"], req["target"]
        _show_in_proc(argv, env)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(env)
        _take_stdio(bool(env.get("PYTHONUNBUFFERED")))
        first = os.getcwd() if kind == "module" else os.path.dirname(os.path.realpath(target))
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [first, *extra, *rest]
        sys.argv = ["-m" if kind == "module" else target, *argv[3 if kind == "module" else 2:]]
        sys.orig_argv = list(argv)
        importlib.invalidate_caches()  # files written since the zygote started
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()
    except BaseException:  # noqa: BLE001 - the child must never return into the zygote's loop
        traceback.print_exc()
        os._exit(1)
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
        code, interrupted = 0, False
    except SystemExit as e:
        code, interrupted = _exit_code(e.code), False
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 1, True
    except BaseException as e:  # noqa: BLE001 - as the interpreter: the traceback, status 1
        tb = e.__traceback__
        # the program's frames, as a fresh interpreter shows them
        while tb is not None and (tb.tb_frame.f_globals is globals() or tb.tb_frame.f_code.co_filename == RUNPY):
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        code, interrupted = 1, False
    _finish(code, interrupted)


def _fork(req: dict[str, Any], fds: list[int], sock: socket.socket, supervisor: int, rest: list[str]) -> int:
    """Fork an intermediate that forks the child and exits; the child's pid."""
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:  # pragma: no cover - the intermediate
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _child(req, fds, sock, supervisor, rest)
            try:
                os.setpgid(pid, pid)  # before the pid is reported: a group signal always finds it
            except OSError:
                pass
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 64):
        data += chunk
    os.close(r)
    os.waitpid(mid, 0)  # the child has been reparented by the time this returns
    if not data:
        raise OSError("fork failed in the intermediate process")
    return int(data)


def _warm_up() -> None:
    """Numba's one-time set-up (LLVM, the CPU target; ~0.2 s per process) and the server kernels of
    the common table types, loaded once here instead of in every child. Best effort: a failure here
    leaves the child to do it, as an exec'd one would."""
    try:
        import numba

        from bosen import config as config_mod
        from bosen.server.warmup import warm_up

        numba.njit(lambda x: x + 1)(1)
        tables = {f"{dt}_{st}": {"rows": 4, "cols": 2, "dtype": dt, "storage": st}
                  for dt in ("int64", "float32", "float64") for st in ("dense", "sparse")}
        warm_up(config_mod.build({"cluster": {"servers": ["127.0.0.1:1"], "workers": 1}, "tables": tables}), 0)
    except Exception as e:  # noqa: BLE001 - an optimization, never a failure
        print(f"zygote: warm-up skipped: {e!r}", file=sys.stderr, flush=True)


def _serve(sock: socket.socket, supervisor: int) -> int:
    """The zygote's loop: import the modules the supervisor names, set numba up, then fork a child per
    request until the supervisor closes its end. Returns the exit status."""
    first = sock.recv(1 << 16)  # the modules to import before serving
    if not first:
        return 0
    for name in msgpack.unpackb(first)["preload"]:
        importlib.import_module(name)
    _warm_up()
    rest = _sys_path_rest()
    sys.stdout.flush()
    sys.stderr.flush()
    gc.collect()
    gc.freeze()  # the children's collections leave the zygote's objects (and their pages) alone
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        except OSError:
            return 0
        if not msg:
            return 0  # the supervisor closed its end
        try:
            if threading.active_count() != 1:
                raise RuntimeError(f"{threading.active_count()} threads are running; forking is unsafe")
            pid = _fork(msgpack.unpackb(msg), fds, sock, supervisor, rest)
            reply: dict[str, Any] = {"pid": pid}
        except Exception as e:  # noqa: BLE001 - reported to the supervisor, which execs instead
            print(f"zygote: {e!r}", file=sys.stderr, flush=True)
            reply = {"error": f"{type(e).__name__}: {e}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.sendall(msgpack.packb(reply))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bosen.jobs.zygote", description="fork server of bosen.jobs.supervise")
    ap.add_argument("--fd", type=int, required=True, help="the socket to the supervisor")
    ap.add_argument("--supervisor", type=int, required=True, help="the pid children are reparented to")
    args = ap.parse_args(argv)
    return _serve(socket.socket(fileno=args.fd), args.supervisor)


if __name__ == "__main__":
    sys.exit(main())
