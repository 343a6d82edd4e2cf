"""Whether a job's numba kernels are compiled yet, so ``bosen launch`` can say so: on a first run (a
fresh install, or after the sources changed) every worker compiles the app's and the client's kernels
at their first call, tens of seconds before the first clock ends, and the launcher would otherwise
sit silent. Numba keeps what it compiled in its cache (``@njit(cache=True)``, ``__pycache__/*.nbi``
beside the sources); the launcher looks there before it starts the servers (which compile theirs in
their warm-up, before they answer) and the workers."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

# the library's packages whose kernels a worker runs (the servers compile theirs at start, server/warmup.py)
LIBRARY = ("bosen", "bosen.client")
# what a server compiles in its warm-up, before it answers STATUS (server/warmup.py)
SERVER = ("bosen", "bosen.server", "bosen.server.procedures")
NOTICE_EVERY_S = 10.0


def _folders(name: str) -> list[str]:
    """The folders of package ``name``, found the way ``import`` finds them but without running any
    ``__init__``: importing an app's package to look at files would load what it imports (torch, 2 s of
    CPU in the launcher of every PyTorch job; numba and the server's modules, 0.35 s in every launch)."""
    path: list[str] | None = None
    spec = None
    parts = name.split(".")
    for i in range(len(parts)):
        full = ".".join(parts[:i + 1])
        module = sys.modules.get(full)
        spec = getattr(module, "__spec__", None) if module is not None else None
        if spec is None:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(full, path) if find is not None else None
                if spec is not None:
                    break
        if spec is None:
            return []
        path = list(spec.submodule_search_locations or [])
        if not path and i < len(parts) - 1:
            return []
    return path or []


def _kernel_modules(package: str) -> list[Path]:
    """The source files of ``package``'s modules (not its subpackages) that have numba kernels."""
    out = []
    for folder in _folders(package):
        for path in sorted(Path(folder).glob("*.py")):
            if "@njit" in path.read_text(errors="replace"):
                out.append(path)
    return out


def _cache_folders(source: Path) -> list[Path]:
    """Where numba keeps the cache of ``source``'s kernels: ``$NUMBA_CACHE_DIR`` when set, else the
    ``__pycache__`` beside it or, where that is not writable, the user's cache folder (numba names a
    folder there by the source folder's name and the SHA-1 of its path)."""
    folder = os.path.dirname(os.path.abspath(source))
    sub = f"{os.path.basename(folder)}_{hashlib.sha1(folder.encode()).hexdigest()}"
    if os.environ.get("NUMBA_CACHE_DIR"):
        return [Path(os.environ["NUMBA_CACHE_DIR"]) / sub]
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numba" / sub
    return [Path(folder) / "__pycache__", user]


def _cached(sources: list[Path]) -> tuple[int, int]:
    """(kernel modules that numba's cache holds kernels of for the current source, kernel modules):
    a module counts as held when an index of one of its kernels (``STEM.FUNCTION-LINE.pyXY.nbi``) was
    written after the source last changed. Files, not numba: the launcher imports neither numba nor
    the modules for this notice."""
    held = 0
    for src in sources:
        changed = src.stat().st_mtime
        held += any(index.stat().st_mtime >= changed for folder in _cache_folders(src)
                    for index in folder.glob(f"{src.stem}.*.nbi"))
    return held, len(sources)


def first_run(app_module: str) -> list[str]:
    """The packages (the app's, the client library) that have kernels of which numba's cache holds
    none: a first run, or their source changed. Not every kernel runs in every job (an app's CSV
    parser, AdaRevision's gradients), so one cached kernel of a package is taken for a run before."""
    package = app_module if _folders(app_module) else app_module.rpartition(".")[0]
    out = []
    for what, modules in ((package, _kernel_modules(package) if package else []),
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
