"""One finished job as the convergence benchmark sees it: per-epoch curves read from its metrics.

A job's ``metrics.jsonl`` holds one record per clock (fields summed over workers, ``time`` the
latest worker's), then each client's and server's final stats. :func:`read_run` turns the clock
records into per-epoch points: the objective (summed over an epoch's clocks for a running training
loss, or the epoch's last value for a state measure like LDA's log-likelihood), the wall time at the
epoch's end, and the bytes clients sent and received so far.

Where the job scored a consistent state (LDA's ``consistent_ll``: the servers' tables at each scored
clock, in RUN_DIR/consistent-ll.jsonl) that is the objective, and so what targets and epochs-to-target
use; the sum of the workers' own views stays in ``objective_worker_view`` for comparison.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bosen.jobs.job import JobRun

Aggregate = Literal["sum", "last"]


@dataclass
class Run:
    """One job's per-epoch curves, its settings and the final stats of its processes."""

    name: str                       # mode, e.g. "BS", "MC-50-RM", "BS-4"
    seed: int
    workers: int
    objective: list[float]          # per epoch, oriented as the app reports it
    times: list[float]              # seconds since the launch, at each epoch's end (train_times: since training)
    bytes: list[float]              # client bytes sent + received so far, at each epoch's end
    maximize: bool
    seconds: float                  # the whole job
    settings: dict[str, Any] = field(default_factory=dict)
    clients: list[dict[str, Any]] = field(default_factory=list)
    servers: list[dict[str, Any]] = field(default_factory=list)
    clocks: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None      # the job stopped early (e.g. SGD diverged)
    objective_worker_view: list[float] = field(default_factory=list)  # per epoch, from the clock records

    def better(self, a: float, b: float) -> bool:
        """Whether objective value ``a`` is at least as good as ``b``."""
        return a >= b if self.maximize else a <= b

    def epochs_to(self, target: float) -> int | None:
        """1-based index of the first epoch at or past the target (None: never)."""
        for e, v in enumerate(self.objective):
            if self.better(v, target):
                return e + 1
        return None

    def seconds_to(self, target: float) -> float | None:
        """Training seconds to the target: from the start of epoch 1, taken as its end less one median
        epoch (workers start at different times; start-up is the same in every mode and left out)."""
        e = self.epochs_to(target)
        if e is None:
            return None
        return self.times[e - 1] - self.times[0] + (self.seconds_per_epoch() or self.times[0])

    def train_times(self) -> list[float]:
        """Training seconds at each epoch's end (see :meth:`seconds_to`)."""
        first = self.seconds_per_epoch() or (self.times[0] if self.times else 0.0)
        return [t - self.times[0] + first for t in self.times]

    def bytes_to(self, target: float) -> float | None:
        e = self.epochs_to(target)
        return None if e is None else self.bytes[e - 1]

    def seconds_per_epoch(self) -> float | None:
        """Median epoch duration (differences of epoch end times; the first epoch includes start-up)."""
        d = [b - a for a, b in zip(self.times, self.times[1:], strict=False)]
        return statistics.median(d) if d else None

    def bytes_per_epoch(self) -> float | None:
        return self.bytes[-1] / len(self.bytes) if self.bytes else None

    def client_totals(self) -> dict[str, float]:
        """Read counters and traffic summed over the clients' final stats."""
        keys = ("rows_read", "rows_read_early", "read_staleness_sum", "rows_pushed_to_us",
                "rows_pushed_early_to_us", "bytes_sent", "bytes_received", "rows_sent", "rows_sent_budgeted",
                "blocked_s", "blocked_reads", "freshness_probed_rows", "missing_updates_sum",
                "content_age_sum")
        out = {k: float(sum(c.get(k, 0) or 0 for c in self.clients)) for k in keys}
        return out

    def server_totals(self) -> dict[str, float | None]:
        """What the servers said of keeping up, from their final STATUS (servers that report it):
        ``apply_lag_ms``, an update's mean time from being read off the socket to applied;
        ``push_wait_ms``, how long an update arriving at a random moment waited on average behind
        pushes (the loop reads nothing while it pushes: sum of squared push times / (2 x uptime));
        ``push_busy_share``, the loop's share of time spent pushing."""
        lag_n = lag_s = stall_s = squares = uptime = 0.0
        seen = False
        for srv in self.servers:
            lag, stall = srv.get("apply_lag_ms"), srv.get("push_stall_ms")
            if not isinstance(lag, dict) or not isinstance(stall, dict):
                continue
            seen = True
            lag_n += lag["n"]
            lag_s += lag["total_s"]
            stall_s += stall["total_s"]
            squares += stall.get("squares_s2", 0.0)
            uptime += srv.get("uptime_s", 0.0)
        # rows the servers pushed, all and budgeted (comm.push_to compares them)
        pushed: dict[str, float | None] = {k: sum(int(srv.get(k, 0)) for srv in self.servers)
                                           for k in ("rows_pushed", "rows_pushed_budgeted")}
        # server CPU (loop and ZeroMQ I/O thread) per MB the servers sent, pushes and replies
        cpu, out = sum(float(srv.get("cpu_s", 0.0)) for srv in self.servers), sum(
            int(srv.get("bytes_out", 0)) for srv in self.servers)
        pushed["server_cpu_ms_per_mb"] = cpu * 1e3 / (out / 1e6) if out and cpu else None
        if not seen:
            return {"apply_lag_ms": None, "push_wait_ms": None, "push_busy_share": None, **pushed}
        return {"apply_lag_ms": lag_s * 1e3 / lag_n if lag_n else None,
                "push_wait_ms": squares / (2 * uptime) * 1e3 if uptime else None,
                "push_busy_share": stall_s / uptime if uptime else None, **pushed}

    def egress_mbps(self) -> float | None:
        """Clients' mean egress per client while training (first to last clock record), in Mbps:
        updates, clocks and requests, flushes included."""
        recs = [c for c in self.clocks if "bytes_sent" in c]
        if len(recs) < 2 or recs[-1]["time"] <= recs[0]["time"]:
            return None
        mbps = (recs[-1]["bytes_sent"] - recs[0]["bytes_sent"]) * 8 / 1e6 / (recs[-1]["time"] - recs[0]["time"])
        return mbps / self.workers

    def budget_use(self) -> float | None:
        """Clients' mean egress while training over their budget; None without managed
        communication. End-of-tick flushes are not budgeted but count, as they do against the bucket."""
        budget = self.settings.get("comm.client_bandwidth_mbps")
        egress = self.egress_mbps()
        return egress / float(budget) if budget and egress is not None else None

    def send_counts(self, table: str, side: Literal["client", "server"] = "client") -> dict[int, int]:
        """How many rows of ``table`` were sent how many times, summed over processes."""
        hist: dict[int, int] = {}
        for proc in self.clients if side == "client" else self.servers:
            h = (proc.get("tables") or {}).get(table, {}).get("send_count_hist") or {}
            for k, n in h.items():
                hist[int(k)] = hist.get(int(k), 0) + int(n)
        return hist


def read_run(job: JobRun, name: str, seed: int, workers: int, clocks_per_epoch: int, aggregate: Aggregate,
             maximize: bool, settings: dict[str, Any]) -> Run:
    """Per-epoch curves of a finished (or failed) job; only clock records with an objective count."""
    failure = None
    if not job.ok:
        lines = [x.strip() for x in job.output().splitlines() if x.strip()]
        failure = next((x for x in reversed(lines) if x.startswith("worker")), lines[-1] if lines else "?")
    clocks = sorted((c for c in job.kind("clock") if "objective" in c), key=lambda c: c["clock"])
    k = clocks_per_epoch
    n = len(clocks) // k
    cons = read_consistent(job.run_dir)
    objective, times, nbytes, worker_view = [], [], [], []
    for e in range(n):
        chunk = clocks[e * k:(e + 1) * k]
        vals = [c["objective"] for c in chunk]
        worker_view.append(sum(vals) if aggregate == "sum" else vals[-1])
        if cons is not None:
            if any(c["clock"] not in cons for c in chunk):
                failure = failure or f"no consistent objective for clock {chunk[-1]['clock']}"
                cons = None
            else:
                vals = [cons[c["clock"]] for c in chunk]
        objective.append(sum(vals) if aggregate == "sum" else vals[-1])
        times.append(max(c["time"] for c in chunk))
        nbytes.append(float(chunk[-1].get("bytes_sent", 0) + chunk[-1].get("bytes_received", 0)))
    if failure is None and n == 0:
        failure = "no complete epoch"
    if cons is None:
        objective = worker_view  # one kind of objective throughout
    return Run(name, seed, workers, objective, times, nbytes, maximize, job.seconds, dict(settings),
               job.kind("client"), job.kind("server"), clocks, failure, worker_view)


def read_consistent(run_dir: Path) -> dict[int, float] | None:
    """Clock -> the objective of the servers' tables at that clock (RUN_DIR/consistent-ll.jsonl,
    written by LDA's rank 0 at the job's end), or None where the job has none."""
    path = Path(run_dir) / "consistent-ll.jsonl"
    if not path.is_file():
        return None
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {int(r["clock"]): float(r["objective"]) for r in recs}


def median_curve(runs: Sequence[Run], attr: str = "objective") -> tuple[list[float], list[float], list[float]]:
    """Per-epoch median, min and max of ``attr`` over runs (as far as all runs got)."""
    curves = [getattr(r, attr) for r in runs if getattr(r, attr)]
    if not curves:
        return [], [], []
    n = min(len(c) for c in curves)
    cols = [[c[i] for c in curves] for i in range(n)]
    return [statistics.median(x) for x in cols], [min(x) for x in cols], [max(x) for x in cols]
