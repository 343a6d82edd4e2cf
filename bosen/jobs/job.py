"""A job on this machine: its config data, its workers, its run directory and metrics.

``bosen launch`` starts each worker with ``start_worker`` and merges what the workers report into
RUN_DIR/metrics.jsonl (``MetricsMerger``); ``run_job`` runs a whole job through ``bosen launch`` and
reads that file back. One JSON object per line; ``kind`` says what it is:

- ``worker``: one worker's record of one clock (``rank``, ``clock``, ``time`` and what it reported);
- ``redo``: a replacement worker's record of a clock its lost worker had reported (it redoes the clocks
  since its checkpoint; the lost worker's record is the one summed);
- ``clock``: one clock summed over the workers (``time``: the latest), once every worker reported it,
  with the held-out measures derived from the summed held-out counts (``bosen.metrics.HELDOUT_MEASURES``);
- ``client``: each worker's final ``client.stats()``; ``server``: each server's final STATUS;
- ``summary``: the last line (seconds, clocks, workers, the final clock record).
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from bosen.errors import BosenError
from bosen.jobs.supervise import Env, Process, ProcessGroup, describe_exit, tail
from bosen.metrics import derive_heldout

METRICS = "metrics.jsonl"
WORKER_RECORDS = "workers"  # RUN_DIR/workers/RANK.jsonl: what each worker reported, one line per clock
DEFAULT_TABLES = {"W": {"rows": 10, "cols": 4, "dtype": "int64"}}


def job_config(servers: Sequence[str], workers: int = 1, tables: Mapping[str, Any] | None = None,
               staleness: int = 1, read_timeout_s: float = 20.0, comm: Mapping[str, Any] | None = None,
               app: Mapping[str, Any] | None = None, partitions: int | None = None) -> dict[str, Any]:
    """Config data for a small job (what a YAML file holds).

    The defaults suit tests: one small int64 table ``W``, staleness 1, and a 20 s read timeout, so a
    read that can never be satisfied fails a test in seconds rather than the default minute.
    """
    cfg: dict[str, Any] = {
        "cluster": {"servers": list(servers), "workers": workers,
                    **({"partitions": partitions} if partitions is not None else {})},
        "consistency": {"staleness": staleness, "read_timeout_s": read_timeout_s},
        "tables": copy.deepcopy(dict(tables if tables is not None else DEFAULT_TABLES)),
    }
    if comm is not None:
        cfg["comm"] = dict(comm)
    if app is not None:
        cfg["app"] = dict(app)
    return cfg


def write_config(path: str | Path, cfg: Mapping[str, Any]) -> Path:
    """Write config data as YAML; returns the path."""
    path = Path(path)
    path.write_text(yaml.safe_dump(dict(cfg), sort_keys=False))
    return path


def worker_env(config: str | Path, rank: int, run_dir: str | Path, t0: float,
               resume: str | Path | None = None, rejoin: int | None = None, join: str | None = None,
               resumed_at: int | None = None) -> dict[str, str]:
    """What a launched worker finds in its environment: the job's YAML, its rank, where its records
    go, the job's start time, resuming, the checkpoint, and replacing a lost worker, the clock it
    restarts from (``bosen.client.Client`` reads them); in a resumed run, the clock it resumed from
    (``BOSEN_RESUMED_AT``: a checkpoint there was made by another run, apps/microtasks.py)."""
    env = {"BOSEN_CONFIG": str(config), "BOSEN_RANK": str(rank), "BOSEN_RUN_DIR": str(run_dir),
           "BOSEN_T0": repr(t0)}
    if resume is not None:
        env["BOSEN_RESUME"] = str(resume)
    if rejoin is not None:
        env["BOSEN_REJOIN"] = str(rejoin)
    if join is not None:  # a new rank joining the running job (bosen scale): a clock, or "ahead"
        env["BOSEN_JOIN"] = str(join)
    if resumed_at is not None:
        env["BOSEN_RESUMED_AT"] = str(resumed_at)
    return env


def start_worker(group: ProcessGroup, module: str, config: str | Path, rank: int, run_dir: str | Path,
                 t0: float, resume: str | Path | None = None, rejoin: int | None = None,
                 name: str | None = None, join: str | None = None, resumed_at: int | None = None) -> Process:
    """``python -m MODULE`` as worker ``rank`` of the job (member ``name``, default ``worker-RANK``,
    of ``group``); with ``rejoin`` it replaces the lost worker of that rank from clock ``rejoin``; with
    ``join`` it is a new rank that joins the running job (``BOSEN_JOIN``: a clock, or ``ahead``)."""
    return group.python(name or f"worker-{rank}", "-m", module,
                        env=worker_env(config, rank, run_dir, t0, resume, rejoin, join, resumed_at))


def truncate_records(run_dir: Path, clock: int) -> float | None:
    """Keep only the worker records of clocks below ``clock`` (a job resumed from a checkpoint at
    ``clock`` reports the later ones again); returns the last kept record's time, if any."""
    last = None
    for path in sorted((run_dir / WORKER_RECORDS).glob("*.jsonl")):
        kept = []
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut off when the job died
            if isinstance(rec, dict) and isinstance(rec.get("clock"), int) and rec["clock"] < clock:
                kept.append(line)
                if isinstance(rec.get("time"), (int, float)):
                    last = max(last or 0.0, float(rec["time"]))
        path.write_text("".join(line + "\n" for line in kept))
    return last


class MetricsMerger:
    """Collects worker records and emits one summed record per clock once every worker reported."""

    def __init__(self, run_dir: Path, num_workers: int, out: TextIO, before: tuple[int, int] | None = None) -> None:
        self.dir = run_dir / WORKER_RECORDS
        self.num_workers = num_workers
        self.before = before  # (C, K): clocks below C had K workers (a job resumed with another count)
        self.out = out
        self.offsets: dict[Path, int] = {}
        self.partial: dict[int, dict[str, Any]] = defaultdict(dict)
        self.ranks: dict[int, set[int]] = defaultdict(set)
        self.done: list[dict[str, Any]] = []
        self.newest: dict[int, int] = {}  # per rank, the newest clock it reported
        self.latest: dict[int, dict[str, Any]] = {}  # per rank, its newest record (the launcher's /metrics)
        self.redo_until: dict[int, int] = {}  # per replaced rank, the newest clock its lost worker reported
        self.changes: list[tuple[int, int]] = []  # (C, K): from clock C on, K workers report (bosen scale)

    def workers_from(self, clock: int, workers: int) -> None:
        """From ``clock`` on the job has ``workers`` workers (a scale step moved its tasks there)."""
        self.changes.append((clock, workers))

    def _need(self, c: int, need: int) -> int:
        if self.before and c < self.before[0] and need > 1:
            need = self.before[1]
        for start, k in self.changes:
            if c >= start and need > 1:
                need = k
        return need

    def poll(self) -> list[dict[str, Any]]:
        """Read new worker lines; return the clock records completed by them."""
        if not self.dir.exists():
            return []
        for path in sorted(self.dir.glob("*.jsonl")):
            with path.open() as f:
                f.seek(self.offsets.get(path, 0))
                while True:
                    line = f.readline()
                    if not line.endswith("\n"):
                        break
                    self.offsets[path] = f.tell()
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if self._redone(rec):  # a replacement worker redoing a clock: the first record counts
                        self.out.write(json.dumps({"kind": "redo", **rec}) + "\n")
                        continue
                    self.out.write(json.dumps({"kind": "worker", **rec}) + "\n")
                    self._add(rec)
        return self._complete(self.num_workers)

    def replaced(self, rank: int) -> list[dict[str, Any]]:
        """Worker ``rank`` was lost and is being replaced: what it wrote is read first (the clock
        records that completes are returned), then its replacement's records of the clocks up to
        the newest it reported are redone clocks."""
        done = self.poll()
        self.redo_until[rank] = self.newest.get(rank, -1)
        return done

    def _redone(self, rec: dict[str, Any]) -> bool:
        """Whether ``rec`` is a replacement's record of a clock its lost worker reported (it redoes
        the clocks since the checkpoint it restarted from: the first record counts)."""
        rank, c = rec.get("rank", -1), rec.get("clock", 0)
        if not isinstance(rank, int) or not isinstance(c, int):
            return False
        if c <= self.redo_until.get(rank, -1):
            return True
        self.newest[rank] = max(self.newest.get(rank, -1), c)
        return False

    def _add(self, rec: dict[str, Any]) -> None:
        c = rec.get("clock", 0)
        agg = self.partial[c]
        self.ranks[c].add(rec.get("rank", -1))
        rank = rec.get("rank")
        if isinstance(rank, int) and isinstance(c, int) and c >= self.latest.get(rank, {}).get("clock", -1):
            self.latest[rank] = rec
        for k, v in rec.items():
            if k in ("rank", "clock") or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            agg[k] = max(agg.get(k, v), v) if k == "time" else agg.get(k, 0) + v

    def _complete(self, need: int) -> list[dict[str, Any]]:
        out = []
        for c in sorted(self.partial):
            if len(self.ranks[c]) >= self._need(c, need):
                rec = {"kind": "clock", "clock": c, "workers": len(self.ranks[c]), **self.partial.pop(c)}
                rec.update(derive_heldout(rec))
                del self.ranks[c]
                self.out.write(json.dumps(rec) + "\n")
                self.done.append(rec)
                out.append(rec)
        return out

    def finish(self) -> list[dict[str, Any]]:
        self.poll()
        return self._complete(1)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of RUN_DIR/metrics.jsonl, in file order."""
    path = Path(run_dir) / METRICS
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class JobRun:
    """A finished ``bosen launch``: exit status, wall seconds, what it printed, its metrics records."""

    run_dir: Path
    returncode: int
    seconds: float
    log: Path  # stdout and stderr of ``bosen launch``
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kind(self, kind: str) -> list[dict[str, Any]]:
        """The records of one kind (``worker``, ``clock``, ``client``, ``server``, ``summary``)."""
        return [r for r in self.records if r.get("kind") == kind]

    def check(self) -> JobRun:
        """This run, or JobFailed with the end of what ``bosen launch`` printed."""
        if not self.ok:
            raise JobFailed(f"bosen launch {describe_exit(self.returncode)} (run directory {self.run_dir}):\n"
                            f"{tail(self.log, 40)}")
        return self


class JobFailed(BosenError):
    """A job did not complete; the message says why."""


def _set_args(sets: Mapping[str, Any] | Sequence[str]) -> list[str]:
    if isinstance(sets, Mapping):
        return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in sets.items()]
    return [str(s) for s in sets]


def run_job(config: str | Path, run_dir: str | Path, *, sets: Mapping[str, Any] | Sequence[str] = (),
            workers: int | None = None, timeout: float | None = None, quiet: bool = True, plot: bool = False,
            env: Env | None = None, cwd: str | Path | None = None) -> JobRun:
    """Run a whole job with ``python -m bosen launch CONFIG`` and read its metrics.

    ``sets`` are config overrides (``{"app.args.epochs": 3}``: values that are not strings are
    written as JSON; or ``["app.args.epochs=3"]``). ``timeout`` goes to the launcher, which stops
    the job after that many seconds; should the launcher itself hang, it is stopped a minute later.
    The launcher's output goes to RUN_DIR/launch.log. A failed job is returned, not raised: its
    ``returncode`` is not 0, ``records`` hold what was written before it stopped; ``check()`` raises.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd: list[str | os.PathLike[str] | int] = ["-m", "bosen", "launch", config, "--run-dir", run_dir]
    if workers is not None:
        cmd += ["--workers", workers]
    if timeout is not None:
        cmd += ["--timeout", repr(float(timeout))]
    if quiet:
        cmd.append("--quiet")
    if not plot:
        cmd.append("--no-plot")
    for s in _set_args(sets):
        cmd += ["--set", s]
    t0 = time.monotonic()
    with ProcessGroup(run_dir, env=env, cwd=cwd) as group:
        launcher = group.python("launch", *cmd)
        code = launcher.wait(None if timeout is None else timeout + 60.0)
    seconds = time.monotonic() - t0
    records = read_metrics(run_dir) if (run_dir / METRICS).exists() else []
    return JobRun(run_dir, code, seconds, launcher.log, records)

