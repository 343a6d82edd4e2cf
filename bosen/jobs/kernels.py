"""Whether a job's numba kernels are compiled yet, so ``bosen launch`` can say so: on a first run (a
fresh install, or after the sources changed) every worker compiles the app's and the client's kernels
at their first call, tens of seconds before the first clock ends, and the launcher would otherwise
sit silent. Numba keeps what it compiled in its cache (``@njit(cache=True)``, ``__pycache__/*.nbi``
beside the sources); the launcher looks there before it starts the servers (which compile theirs in
their warm-up, before they answer) and the workers."""

from __future__ import annotations

import importlib
import importlib.util
import time
from pathlib import Path

# the library's packages whose kernels a worker runs (the servers compile theirs at start, server/warmup.py)
LIBRARY = ("bosen", "bosen.client")
# what a server compiles in its warm-up, before it answers STATUS (server/warmup.py)
SERVER = ("bosen", "bosen.server", "bosen.server.procedures")
NOTICE_EVERY_S = 10.0


def _kernel_modules(package: str) -> list[str]:
    """The modules of ``package`` (not its subpackages) whose source has numba kernels."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    out = []
    for folder in spec.submodule_search_locations:
        for path in sorted(Path(folder).glob("*.py")):
            if "@njit" in path.read_text(errors="replace"):
                out.append(package if path.stem == "__init__" else f"{package}.{path.stem}")
    return out


def _cached(modules: list[str]) -> tuple[int, int]:
    """(kernels numba's cache holds for the current source, cached kernels in all) of ``modules``."""
    from numba.core.dispatcher import Dispatcher

    held = total = 0
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception:  # an app module that needs an extra (torch) the launcher lacks: not ours to judge
            continue
        for obj in vars(module).values():
            index = getattr(getattr(obj, "_cache", None), "_cache_file", None) if isinstance(obj, Dispatcher) else None
            if index is not None and getattr(obj, "__module__", None) == name:
                total += 1
                held += bool(index._load_index())  # empty when missing, or stale for the current source
    return held, total


def first_run(app_module: str) -> list[str]:
    """The packages (the app's, the client library) that have kernels of which numba's cache holds
    none: a first run, or their source changed. Not every kernel runs in every job (an app's CSV
    parser, AdaRevision's gradients), so one cached kernel of a package is taken for a run before."""
    try:
        spec = importlib.util.find_spec(app_module)
    except ImportError:
        return []
    package = app_module if spec is not None and spec.submodule_search_locations else app_module.rpartition(".")[0]
    out = []
    for what, modules in ((package, _kernel_modules(package)),
                          ("the client library", [m for p in LIBRARY for m in _kernel_modules(p)])):
        held, total = _cached(modules)
        if total and not held:
            out.append(what)
    return out


def servers_first_run() -> bool:
    """Whether numba's cache holds none of the servers' kernels: their warm-up compiles them all."""
    held, total = _cached([m for p in SERVER for m in _kernel_modules(p)])
    return total > 0 and not held


class CompileNotice:
    """The launcher's lines while the workers compile: one when they start, then one every
    ``every_s`` until the first clock's record arrives, and one when it has. Most of the compiling
    is before that record (the reads and the app's kernels); what a clock's end first calls (the
    send path, pushes applied, an evaluation) compiles in the clocks right after it."""

    def __init__(self, packages: list[str], clocks: int = 0, every_s: float = NOTICE_EVERY_S) -> None:
        self.packages = packages
        self.clocks = clocks  # finished before the workers started (a resumed job's)
        self.every_s = every_s
        self.t0 = self.last = time.monotonic()
        self.done = not packages

    def first(self) -> str | None:
        if self.done:
            return None
        return (f"compiling kernels (first run only): numba's cache holds none of {' or '.join(self.packages)}'s "
                "kernels yet; the workers compile them at their first call, so the first clock waits (tens of seconds)")

    def tick(self, clocks: int) -> str | None:
        """A line to print now, given how many clocks have finished; None for nothing."""
        if self.done:
            return None
        now = time.monotonic()
        if clocks > self.clocks:
            self.done = True
            return (f"first clock done {now - self.t0:.0f}s after the workers started; the next ones may still "
                    "compile kernels they are the first to call (send, push and evaluation paths)")
        if now - self.last >= self.every_s:
            self.last = now
            return f"compiling kernels (first run only)... {now - self.t0:.0f}s"
        return None
