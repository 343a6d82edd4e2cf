"""Checkpoints on disk: how a server's shard or a worker's state is saved, found and verified.

A checkpoint is a directory per boundary clock B, holding one *part* per process of the job:

    DIR/clock-000000B0/server-J/   TABLE.values.npy, TABLE.<state>.npy (stored-procedure state), meta.json
    DIR/clock-000000B0/worker-R/   NAME.npy (what the app saved), meta.json

A part holds every update of ticks < B and none later (servers), or a worker's state as it entered
tick B. Files are plain ``.npy`` (``numpy.load(path)`` reads them; no pickle). A part is written in
``NAME.partial/``: each file written and fsynced, then ``meta.json`` (sha256 and size of every file,
the job's model fingerprint, the clock), then the directory renamed to its final name and its parent
fsynced. A checkpoint is *complete* when every server part and every worker part exists and every
file matches its checksum; resuming takes the newest complete one and says why newer ones were
skipped.

This module has no event loop and no threads of its own except ``PartWriter``'s, which saves parts
one after another while training goes on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bosen.config import Config
from bosen.errors import BosenError

log = logging.getLogger("bosen.checkpoint")

FORMAT = 1
META = "meta.json"
_CLOCK_DIR = re.compile(r"^clock-(\d{8})$")
_MOVE_DIR = re.compile(r"^move-(\d{8})-(\d{8})$")  # a server part saved as partitions moved: clock, map version
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class CheckpointError(BosenError):
    """A checkpoint cannot be used: missing, incomplete, corrupt, or made for another job."""


def is_boundary(clock: int, every_clocks: int) -> bool:
    """Whether ``clock`` is a checkpoint boundary: a multiple of ``checkpoint.every_clocks`` (0: no
    checkpoints). Clients and servers both ask this, so they agree on where a checkpoint cuts."""
    return every_clocks > 0 and clock % every_clocks == 0


def next_boundary(clock: int, every_clocks: int) -> int:
    """The first boundary above ``clock``."""
    return (clock // every_clocks + 1) * every_clocks


def model_fingerprint(config: Config, workers: int | None = None) -> str:
    """What a checkpoint must match to be resumed: the tables, the number of servers and of workers
    (not the addresses: a resumed job may listen on other ports). ``workers``: the checkpoint's own
    count where a job resumes with another (an app with micro-tasks, :func:`fingerprint_for`)."""
    d = config.to_dict()
    core = {"servers": len(config.cluster.servers), "workers": config.cluster.workers if workers is None else workers,
            "tables": d["tables"]}
    return hashlib.sha1(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint_for(config: Config) -> Callable[[int], str]:
    """The fingerprint of ``config``'s model as made by any number of workers: what a job that may
    resume with another worker count checks a checkpoint against (with ``workers=None``)."""
    return lambda workers: model_fingerprint(config, workers)


def checkpoint_workers(path: Path) -> int:
    """How many workers made checkpoint ``path`` (``.../clock-N``), as its first server part says."""
    metas = sorted(path.glob(f"{part_name('server', 0)[:-1]}*/{META}")) if path.is_dir() else []
    if not metas:
        raise CheckpointError(f"{path}: no server part (the checkpoint is incomplete)")
    meta_path = metas[0]
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{meta_path}: unreadable: {e}") from None
    workers = meta.get("workers") if isinstance(meta, dict) else None
    if not isinstance(workers, int):
        raise CheckpointError(f"{meta_path}: does not say how many workers made the checkpoint")
    return workers


def recorded_ranks(path: Path) -> list[int] | None:
    """The worker ranks checkpoint ``path``'s server part records as its makers (a job whose workers
    joined or left, ``bosen scale``), or None where it records none (ranks 0..workers-1 made it)."""
    metas = sorted(path.glob(f"{part_name('server', 0)[:-1]}*/{META}")) if path.is_dir() else []
    if not metas:
        return None
    try:
        ranks = json.loads(metas[0].read_text()).get("info", {}).get("ranks")
    except (OSError, ValueError, AttributeError):
        return None
    return ranks if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks) else None


def recorded_servers(path: Path) -> int | None:
    """How many servers made checkpoint ``path``, as its server 0 part records (servers joined or
    left the job), or None where it records nothing (the config's servers made it)."""
    meta = path / part_name("server", 0) / META
    try:
        servers = json.loads(meta.read_text()).get("info", {}).get("servers")
    except (OSError, ValueError, AttributeError):
        return None
    return len(servers) if isinstance(servers, list) and servers else None


def checkpoint_ranks(path: Path) -> list[int]:
    """The worker ranks whose parts make checkpoint ``path``: those it records, else 0..workers-1."""
    ranks = recorded_ranks(path)
    return ranks if ranks is not None else list(range(checkpoint_workers(path)))


_TASK_FILE = re.compile(r"^task\.(\d+)\.")


def task_count(parts: Mapping[str, Part]) -> int:
    """How many micro-tasks the worker parts of a checkpoint hold (``task.<t>.<name>`` arrays,
    docs/app-contract.md); 0: the app saved none, so its state is per worker rank."""
    ids = {int(m.group(1)) for name, p in parts.items() if name.startswith("worker-")
           for f in p.meta["files"] if (m := _TASK_FILE.match(f))}
    return max(ids) + 1 if ids else 0


def tasks_by_worker(parts: Mapping[str, Part]) -> dict[int, list[int]]:
    """Which micro-tasks each worker rank's part of a checkpoint holds (empty: the app saved none)."""
    out: dict[int, list[int]] = {}
    for name, p in parts.items():
        if name.startswith("worker-"):
            ids = {int(m.group(1)) for f in p.meta["files"] if (m := _TASK_FILE.match(f))}
            if ids:
                out[int(p.meta["rank"])] = sorted(ids)
    return dict(sorted(out.items()))


def task_owners(path: Path) -> np.ndarray | None:
    """The rank whose part of checkpoint ``path`` holds each micro-task (int64, one per task): who ran
    which task as the checkpoint's clock was reached (a job whose tasks moved, ``bosen scale``, runs
    them elsewhere than ``assign`` says). None where its worker parts hold no tasks, or not every one
    of 0..T-1 exactly once."""
    try:
        parts = {part_name("worker", r): read_part(path / part_name("worker", r), verify=False)
                 for r in checkpoint_ranks(path)}
    except CheckpointError:
        return None
    by = tasks_by_worker(parts)
    ids = sorted(t for ts in by.values() for t in ts)
    if not ids or ids != list(range(len(ids))):
        return None
    owners = np.empty(len(ids), dtype=np.int64)
    for r, ts in by.items():
        owners[ts] = r
    return owners


def root(config: Config) -> Path:
    """The checkpoint directory of ``config`` (relative paths: to the working directory; the launcher
    makes it absolute, inside the run directory)."""
    if config.checkpoint is None:
        raise CheckpointError(f"{config.source}: no checkpoint section")
    return Path(config.checkpoint.dir)


def clock_dir(base: Path, clock: int) -> Path:
    return base / f"clock-{clock:08d}"


def part_name(kind: str, rank: int) -> str:
    return f"{kind}-{rank}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def move_dir(base: Path, clock: int, version: int) -> Path:
    """Where the servers save a part each as partitions move to map ``version`` (at server clock
    ``clock``): not a checkpoint of the job, but what a lost server's replacement restores until its
    next part (docs/recovery.md, "A server lost after a partition move")."""
    return base / f"move-{clock:08d}-{version:08d}"


def moves(base: Path) -> list[tuple[int, int]]:
    """(clock, map version) of the move parts' directories under ``base``, newest first."""
    if not base.is_dir():
        return []
    found = [(int(m.group(1)), int(m.group(2))) for p in base.iterdir()
             if (m := _MOVE_DIR.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def write_part(base: Path, clock: int, kind: str, rank: int, arrays: Mapping[str, np.ndarray],
               info: Mapping[str, Any], fingerprint: str, workers: int | None = None,
               directory: Path | None = None) -> Path:
    """Write one part atomically (see the module docstring); returns its directory. ``workers``: the
    job's worker count, recorded so a job with micro-tasks can resume with another; ``directory``:
    where, if not the checkpoint of ``clock`` (a move part, :func:`move_dir`)."""
    final = (clock_dir(base, clock) if directory is None else directory) / part_name(kind, rank)
    tmp = final.with_name(final.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    files = {}
    for name, arr in arrays.items():
        if not _NAME.match(name):
            raise ValueError(f"checkpoint array name {name!r}: use letters, digits, '_', '.', '-'")
        path = tmp / f"{name}.npy"
        with path.open("wb") as f:
            np.save(f, np.asarray(arr, order="C"), allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        files[path.name] = {"sha256": _sha256(path), "bytes": path.stat().st_size}
    meta = {"format": FORMAT, "kind": kind, "rank": rank, "clock": clock, "fingerprint": fingerprint,
            "written": time.time(), "files": files, "info": dict(info)}
    if workers is not None:
        meta["workers"] = workers
    with (tmp / META).open("w") as f:
        json.dump(meta, f, indent=1, default=_json_default)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    if final.exists():  # a part of an earlier attempt at the same clock
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    return final


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON: {type(x).__name__}")


@dataclass
class Part:
    """One verified part: its metadata and arrays (loaded on demand)."""

    path: Path
    meta: dict[str, Any]

    @property
    def info(self) -> dict[str, Any]:
        return self.meta["info"]

    def load(self) -> dict[str, np.ndarray]:
        return {name[:-4]: np.load(self.path / name, allow_pickle=False) for name in self.meta["files"]}

    def load_matching(self, prefix: str) -> dict[str, np.ndarray]:
        """The arrays whose names start with ``prefix`` (memory-mapped: read as they are used)."""
        return {name[:-4]: np.load(self.path / name, mmap_mode="r", allow_pickle=False)
                for name in self.meta["files"] if name.startswith(prefix)}


def read_part(path: Path, fingerprint: str | None = None, verify: bool = True) -> Part:
    """A part's metadata, checked: format, fingerprint, every file present with its size and
    (``verify``) its checksum. CheckpointError says what is wrong."""
    meta_path = path / META
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no {META} (the part was never finished)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{meta_path}: unreadable: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path}: not a format-{FORMAT} checkpoint part")
    if fingerprint is not None and meta.get("fingerprint") != fingerprint:
        raise CheckpointError(f"{path}: made for another job (tables/servers/workers fingerprint "
                              f"{meta.get('fingerprint')}, this job's is {fingerprint})")
    for name, f in meta["files"].items():
        p = path / name
        if not p.is_file():
            raise CheckpointError(f"{p}: missing")
        if p.stat().st_size != f["bytes"]:
            raise CheckpointError(f"{p}: {p.stat().st_size} bytes, the manifest says {f['bytes']} (torn write?)")
        if verify and _sha256(p) != f["sha256"]:
            raise CheckpointError(f"{p}: checksum mismatch (corrupt)")
    return Part(path, meta)


def clocks(base: Path) -> list[int]:
    """Clocks that have a checkpoint directory under ``base``, newest first."""
    if not base.is_dir():
        return []
    found = [int(m.group(1)) for p in base.iterdir() if (m := _CLOCK_DIR.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def check_complete(base: Path, clock: int, servers: int, workers: int | None,
                   fingerprint: str | Callable[[int], str] | None, verify: bool = True) -> dict[str, Part]:
    """Every part of checkpoint ``clock``, verified; CheckpointError names the first problem.
    ``workers=None``: as many as made it (:func:`checkpoint_workers`), with ``fingerprint`` then a
    function of that count (:func:`fingerprint_for`). ``servers``: the config's, unless the
    checkpoint records others (:func:`recorded_servers`)."""
    d = clock_dir(base, clock)
    if workers is None:
        workers = checkpoint_workers(d)
    if callable(fingerprint):
        fingerprint = fingerprint(workers)
    ranks = recorded_ranks(d)  # where workers joined or left; else ranks 0..workers-1
    if ranks is None:
        ranks = list(range(workers))
    servers = recorded_servers(d) or servers  # where servers joined or left; else the config's
    parts = {}
    for kind, which in (("server", list(range(servers))), ("worker", ranks)):
        for r in which:
            name = part_name(kind, r)
            part = read_part(d / name, fingerprint, verify)
            if part.meta["clock"] != clock or part.meta["kind"] != kind or part.meta["rank"] != r:
                raise CheckpointError(f"{d / name}: metadata says {part.meta['kind']}-{part.meta['rank']} "
                                      f"at clock {part.meta['clock']}")
            parts[name] = part
    return parts


def taken_back(path: Path) -> list[str]:
    """The corrections beside checkpoint ``path`` (``redo.server-J.rank-R.npz``, sorted): its server parts
    were saved before a lost worker's updates since an older checkpoint were taken back (its replacement
    redid them), so they hold the lost process's ticks while its worker part holds the redo's. A lost
    server's replacement restored from such a part applies them (server/checkpoints.py); a whole-job
    resume starts from an older checkpoint instead (docs/recovery.md)."""
    return sorted(p.name for p in path.glob("redo.*.npz"))


def newest_complete(base: Path, servers: int, workers: int | None, fingerprint: str | Callable[[int], str] | None,
                    verify: bool = True, exact: bool = False) -> tuple[int, dict[str, Part], list[str]]:
    """The newest complete checkpoint under ``base``: (clock, parts, why newer ones were skipped);
    ``workers`` and ``fingerprint`` as for :func:`check_complete`. ``exact``: also skip those a
    take-back made stale (:func:`taken_back`), as a resume of the whole job must."""
    skipped: list[str] = []
    for c in clocks(base):
        if exact and (fixes := taken_back(clock_dir(base, c))):
            skipped.append(f"clock {c}: its server parts hold a lost worker's updates that were taken back after "
                           f"they were saved ({', '.join(fixes)} beside them), its worker part the replacement's "
                           "redo: not exact to resume from")
            continue
        try:
            return c, check_complete(base, c, servers, workers, fingerprint, verify), skipped
        except CheckpointError as e:
            skipped.append(f"clock {c}: {e}")
    detail = ("; ".join(skipped)) if skipped else "none was written"
    raise CheckpointError(f"{base}: no complete checkpoint ({detail})")


SUPERSEDED = "superseded-"  # a folder under the checkpoint directory: what a whole-job start set aside


def set_aside(base: Path, clock: int) -> tuple[Path | None, list[str]]:
    """Before the whole job starts again from checkpoint ``clock`` (``bosen launch --resume``, a
    restart; 0: from the beginning): move every checkpoint newer than it (torn, corrupt, stale ones
    the resume skipped) and every move parts' folder into ``base/superseded-<UTC time>/``. The new
    processes write those boundaries again, and old files beside the new parts would mix with them:
    a correction (``redo.*.npz``) applied to a part that never held its batches, an old part making
    a boundary look complete. Moved, not deleted: the user's to look at or delete; nothing reads
    them. Returns the folder (None: nothing moved) and the names moved."""
    found = [clock_dir(base, c) for c in clocks(base) if c > clock]
    found += [move_dir(base, c, v) for c, v in moves(base)]
    if not found:
        return None, []
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    into, n = base / f"{SUPERSEDED}{stamp}", 1
    while into.exists():  # a second restart within the same second
        n += 1
        into = base / f"{SUPERSEDED}{stamp}.{n}"
    into.mkdir()
    for p in sorted(found):
        os.rename(p, into / p.name)
    _fsync_dir(into)
    _fsync_dir(base)
    return into, sorted(p.name for p in found)


def prune(base: Path, keep: int, servers: int, workers: int) -> list[int]:
    """Delete all but the ``keep`` newest complete checkpoints, and unfinished ones older than the
    newest complete one (checked by sizes, not checksums: a cheap test that runs often). Complete
    ones a take-back made stale (:func:`taken_back`) do not count towards ``keep``: a resume needs
    ``keep`` exact ones; they stay while newer than the oldest of those (a lost worker's or server's
    replacement may still restart from them). Returns the clocks deleted."""
    complete: list[int] = []
    deleted = []
    for c in clocks(base):
        try:
            check_complete(base, c, servers, workers, None, verify=False)
            ok = True
        except CheckpointError:
            ok = False
        stale = ok and bool(taken_back(clock_dir(base, c)))
        if ok and len(complete) < keep:
            if not stale:
                complete.append(c)
        elif complete:  # beyond the newest ``keep``, or unfinished and older than a complete one
            shutil.rmtree(clock_dir(base, c), ignore_errors=True)
            deleted.append(c)
    for c, v in moves(base):  # every server has a newer part than a move part older than a complete checkpoint
        if complete and c < complete[0]:
            shutil.rmtree(move_dir(base, c, v), ignore_errors=True)
    return deleted


def _is_base(base: Path, clock: int, name: str) -> bool:
    """Whether part ``name`` of checkpoint ``clock`` holds every row (a priority checkpoint's base);
    only its manifest is read."""
    try:
        meta = json.loads((clock_dir(base, clock) / name / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    info = meta.get("info") if isinstance(meta, dict) else None
    return isinstance(info, dict) and not info.get("partial")


def prune_bases(base: Path, keep: int, servers: int, workers: int) -> list[int]:
    """Priority checkpoints: a restore starts at a server's newest base (a part of every row) at or
    before its clock, so delete every checkpoint older than each server's ``keep``-th newest base
    at or before the newest complete checkpoint (the oldest of those over the servers); nothing
    while a server has fewer. The servers are those that made that checkpoint (``servers``, the
    config's, unless it records others: servers joined or left, :func:`recorded_servers`); a server
    that joined after it has no part there or before, so nothing its chains need is older. Move
    parts older than that checkpoint go too. Returns the clocks deleted."""
    found = clocks(base)
    newest = None
    for c in found:
        if taken_back(clock_dir(base, c)):  # not one a resume starts from (:func:`prune`)
            continue
        try:
            check_complete(base, c, servers, workers, None, verify=False)
            newest = c
            break
        except CheckpointError:
            continue
    if newest is None:
        return []
    for c, v in moves(base):  # as ``prune``: every server has a newer part (after a move, a base)
        if c < newest:
            shutil.rmtree(move_dir(base, c, v), ignore_errors=True)
    cuts = []
    for r in range(recorded_servers(clock_dir(base, newest)) or servers):
        bases = [c for c in found if c <= newest and _is_base(base, c, part_name("server", r))]
        if len(bases) < keep:
            return []
        cuts.append(bases[keep - 1])
    cut = min(cuts)
    deleted = [c for c in found if c < cut]
    for c in deleted:
        shutil.rmtree(clock_dir(base, c), ignore_errors=True)
    return deleted


class PartWriter:
    """A thread that writes parts in the order they are submitted, so training goes on meanwhile.

    ``submit`` hands over arrays nobody changes any more (copies); ``close`` waits for what was
    submitted. A failed write is kept in ``error`` and logged; the owner raises it where its user
    will see it (``check``)."""

    def __init__(self, base: Path, fingerprint: str, workers: int | None = None) -> None:
        self.base = base
        self.fingerprint = fingerprint
        self.workers = workers
        self._queue: queue.Queue[tuple[int, str, int, dict[str, np.ndarray], dict[str, Any], Path | None] | None] \
            = queue.Queue()
        self.error: BaseException | None = None
        self.written: list[tuple[int, float, int]] = []  # (clock, seconds, bytes) per checkpoint part
        self.moves_written: list[tuple[Path, float, int]] = []  # (directory, seconds, bytes) per move part
        self._thread = threading.Thread(target=self._run, name="bosen-checkpoint", daemon=True)
        self._thread.start()

    def submit(self, clock: int, kind: str, rank: int, arrays: dict[str, np.ndarray], info: dict[str, Any],
               directory: Path | None = None) -> None:
        """Queue a part; ``directory``: a move part's (:func:`move_dir`), not the checkpoint of ``clock``."""
        self._queue.put((clock, kind, rank, arrays, info, directory))

    def drain(self) -> None:
        """Wait until every part submitted so far is written (or has failed)."""
        self._queue.join()

    def pending(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            finally:
                self._queue.task_done()

    def _write(self, clock: int, kind: str, rank: int, arrays: dict[str, np.ndarray], info: dict[str, Any],
               directory: Path | None) -> None:
        t = time.perf_counter()
        try:
            path = write_part(self.base, clock, kind, rank, arrays, info, self.fingerprint, self.workers,
                              directory=directory)
        except BaseException as e:  # kept and raised by the owner; later parts still try
            log.error("cannot write checkpoint part %s-%d at clock %d: %s", kind, rank, clock, e)
            if self.error is None:
                self.error = e
            return
        dt = time.perf_counter() - t
        nbytes = sum(a.nbytes for a in arrays.values())
        if directory is None:
            self.written.append((clock, dt, nbytes))
        else:
            self.moves_written.append((directory, dt, nbytes))
        log.info("checkpoint part %s written at clock %d: %.1f MB in %.3fs", path, clock, nbytes / 1e6, dt)

    def mean_save_s(self) -> float:
        return sum(w[1] for w in self.written) / len(self.written) if self.written else 0.0

    def close(self, timeout: float | None = None) -> None:
        self._queue.put(None)
        self._thread.join(timeout)
