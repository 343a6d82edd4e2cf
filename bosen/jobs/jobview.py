"""What ``bosen dashboard`` shows of a job, gathered from where each figure already lives: the run
directory's ``metrics.jsonl`` (the clock records' objective and held-out measure, each worker's
newest record with its clock and blocked time, the servers' final STATUS, the summary), its
``checkpoints`` folder and ``logs`` (a replacement's log is ``NAME.N.log``), and, while the job runs,
each server's STATUS (``bosen.jobs.status``: clocks, traffic, the budget, the partition map).

Read only: nothing here writes into the run directory. ``metrics.jsonl`` is read from where the last
look stopped, so a poll costs the lines written since (docs/design.md, "Dashboard").
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import zmq

from bosen import checkpoint
from bosen import config as config_mod
from bosen.config import Config
from bosen.errors import BosenError
from bosen.jobs import status as status_mod
from bosen.jobs.job import METRICS
from bosen.metrics import HELDOUT_MEASURES
from bosen.security import Security

STATUS_TIMEOUT_S = 1.0
MAX_POINTS = 2000  # a long job's curve is thinned to about this many points (every k-th clock, the last kept)
DOWN_TIMEOUT_S = 0.25
MIN_INTERVAL_S = 0.5  # snapshots asked for sooner (many open pages) get the last one
RECENT_CLOCKS = 10  # a worker's blocked share now: over its last this many clocks
HOLD_MIN_SHARE = 0.05  # the others' blocked share above which the least blocked worker holds them back
HOLD_GAP = 0.2  # ... if it is blocked half as much as they are, or this share of its time less
_REPLACEMENT = re.compile(r"^(worker|server)-(\d+)\.(\d+)\.log$")


def holding_back(workers: list[dict[str, Any]]) -> int | None:
    """The rank the others wait for, if one does: under SSP a straggler is the one behind (its newest
    record has the lowest clock, ties included) and blocks least, while the workers ahead block on it.
    So: the least blocked over the last clocks, if it is at the lowest clock, the others are blocked
    (median share >= HOLD_MIN_SHARE) and it is at most half of theirs or HOLD_GAP less (on a crowded
    machine every read waits longer, the straggler's too). Neither sign alone: the workers of a
    balanced job pass each other by a clock, and their shares spread, all the time."""
    going = [w for w in workers if w["recent_blocked_fraction"] is not None and isinstance(w.get("clock"), int)
             and not w["left"]]
    if len(going) < 2:
        return None
    shares = sorted((w["recent_blocked_fraction"], w["rank"]) for w in going)
    least, rest = shares[0], [x for x, _ in shares[1:]]
    if next(w for w in going if w["rank"] == least[1])["clock"] > min(w["clock"] for w in going):
        return None
    median = rest[len(rest) // 2] if len(rest) % 2 else (rest[len(rest) // 2 - 1] + rest[len(rest) // 2]) / 2
    return int(least[1]) if median >= HOLD_MIN_SHARE and least[0] <= max(median / 2, median - HOLD_GAP) else None


class JobView:
    """A job seen from ``target``: a run directory (its ``config.yaml`` names the servers) or a config
    file (the servers' STATUS only). ``snapshot()`` is what the dashboard's JSON endpoint returns."""

    def __init__(self, target: str | Path, status_timeout: float = STATUS_TIMEOUT_S) -> None:
        path = Path(target)
        self.run_dir = path if path.is_dir() else None
        cfg_path = path / "config.yaml" if self.run_dir is not None else path
        if not cfg_path.is_file():
            what = "a run directory without config.yaml" if self.run_dir is not None else "no such file or directory"
            raise BosenError(f"{target}: {what} (give a run directory of bosen launch, or a job's config)")
        self.config: Config = config_mod.load(cfg_path)
        if self.run_dir is None and any(a.rsplit(":", 1)[-1] == "0" for a in self.config.cluster.servers):
            raise BosenError(f"{target}: its servers are on port 0 (bosen launch picks free ports): give the job's "
                             "run directory, whose config.yaml names the ports")
        self.title = str(self.run_dir.name if self.run_dir is not None else cfg_path)
        self.status_timeout = status_timeout
        # a client of the job: where its servers run CURVE (off loopback), STATUS needs the job's keys
        self._security = Security.load(self.config, "client")
        self._ctx = zmq.Context()
        self._lock = threading.Lock()
        self._offset = 0
        self._clocks: list[dict[str, Any]] = []
        self._workers: dict[int, dict[str, Any]] = {}  # per rank, its newest record
        # per rank, (time, blocked s) of its last RECENT_CLOCKS + 1 records
        self._recent: defaultdict[int, deque[tuple[float, float]]] = defaultdict(
            lambda: deque(maxlen=RECENT_CLOCKS + 1))
        self._redo: dict[int, int] = {}  # per replaced rank, the first clock its replacement redid
        self._final: dict[int, dict[str, Any]] = {}  # per server rank, the STATUS written at the job's end
        self._summary: dict[str, Any] | None = None
        self._heldout: str | None = None  # the app's held-out measure (bosen.metrics.HELDOUT_MEASURES)
        self._rates: dict[str, tuple[float, int, float]] = {}  # per address: (when, bytes out, recent Mbit/s)
        self._last: tuple[float, dict[str, Any]] | None = None
        self._answered = True  # whether a server answered the last poll
        self._complete: set[int] = set()  # clocks of the checkpoints found complete

    def close(self) -> None:
        self._ctx.term()

    def snapshot(self) -> dict[str, Any]:
        """Every figure of the page, JSON-ready."""
        with self._lock:
            if self._last is not None and time.monotonic() - self._last[0] < MIN_INTERVAL_S:
                return self._last[1]
            snap = self._snapshot()
            self._last = (time.monotonic(), snap)
            return snap

    # -- the run directory ------------------------------------------------------------------------

    def _read_metrics(self) -> None:
        """The lines of metrics.jsonl written since the last look (a job resumed in the same run
        directory writes it anew: then from the start)."""
        if self.run_dir is None:
            return
        path = self.run_dir / METRICS
        try:
            size = path.stat().st_size
        except OSError:
            return
        if size < self._offset:
            self._reset()
        with path.open("rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        self._offset += end
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                self._take(rec)

    def _reset(self) -> None:
        self._offset = 0
        self._clocks, self._workers, self._redo, self._final, self._summary = [], {}, {}, {}, None
        self._recent.clear()
        self._heldout = None

    def _take(self, rec: dict[str, Any]) -> None:
        kind, rank, clock = rec.get("kind"), rec.get("rank"), rec.get("clock")
        if kind == "clock" and isinstance(clock, int):
            point: dict[str, Any] = {"clock": clock, "time": rec.get("time"), "objective": rec.get("objective")}
            for name in HELDOUT_MEASURES:
                if name in rec:
                    point["heldout"] = rec[name]
                    self._heldout = name
            self._clocks.append(point)
        elif kind == "worker" and isinstance(rank, int) and isinstance(clock, int):
            if clock >= self._workers.get(rank, {}).get("clock", -1):
                self._workers[rank] = rec
                t, b = rec.get("time"), rec.get("blocked_s")
                if isinstance(t, (int, float)) and isinstance(b, (int, float)):
                    self._recent[rank].append((float(t), float(b)))
        elif kind == "redo" and isinstance(rank, int) and isinstance(clock, int):
            self._redo[rank] = min(self._redo.get(rank, clock), clock)
        elif kind == "server" and isinstance(rank, int):
            self._final[rank] = rec
        elif kind == "summary":
            self._summary = rec

    def _checkpoints(self) -> dict[str, Any] | None:
        ck = self.config.checkpoint
        if ck is None:
            return None
        base = Path(ck.dir)
        if not base.is_absolute():
            if self.run_dir is None:
                return {"every_clocks": ck.every_clocks, "dir": ck.dir, "saved": [], "complete": []}
            base = self.run_dir / base
        saved = checkpoint.clocks(base)
        for c in saved:
            if c in self._complete:  # once complete, a checkpoint stays so until it is pruned
                continue
            try:  # sizes against the manifests, no checksums
                checkpoint.check_complete(base, c, len(self.config.cluster.servers), None, None, verify=False)
                self._complete.add(c)
            except checkpoint.CheckpointError:
                pass
        complete = [c for c in saved if c in self._complete]
        return {"every_clocks": ck.every_clocks, "dir": str(base), "saved": saved, "complete": complete}

    def _recoveries(self) -> list[dict[str, Any]]:
        """Replacements of lost processes: the launcher names one ``worker-R.N`` or ``server-I.N``."""
        if self.run_dir is None or not (self.run_dir / "logs").is_dir():
            return []
        out = []
        for p in sorted((self.run_dir / "logs").iterdir()):
            m = _REPLACEMENT.match(p.name)
            if m:
                kind, rank, n = m.group(1), int(m.group(2)), int(m.group(3))
                rec: dict[str, Any] = {"process": p.name[:-4], "kind": kind, "rank": rank, "n": n}
                if kind == "worker" and rank in self._redo:
                    rec["from_clock"] = self._redo[rank]
                out.append(rec)
        return out

    # -- the servers ------------------------------------------------------------------------------

    def _servers(self, ended: bool) -> tuple[list[tuple[dict[str, Any], bool]], list[str]]:
        """Each server's STATUS while the job runs (asked now; live True), else its final one from
        metrics.jsonl; and why servers did not answer."""
        addresses = list(self.config.cluster.servers)
        if ended:  # its ports may serve another job by now: the records are the truth
            return [(self._final[r], False) for r in sorted(self._final)], []
        first: dict[str, Any] | None = None
        try:  # servers may have joined or left: server 0 knows which the job has now
            first = status_mod.query(addresses[0], self._timeout(), self._ctx, self._security)
            addresses = list(first.get("servers", addresses))
        except BosenError:
            pass
        out, down = [], []
        for rank, addr in enumerate(addresses):
            try:
                st = first if first is not None and first.get("address") == addr else \
                    status_mod.query(addr, self._timeout(), self._ctx, self._security)
                out.append((st, True))
                self._answered = True
            except BosenError as e:
                down.append(str(e))
                out.append((self._final.get(rank) or {"rank": rank, "address": addr, "up": False}, False))
        if len(down) == len(addresses):
            self._answered = False
        return out, down

    def _timeout(self) -> float:
        """A job stopped without its summary has no server left: then a short wait, so a poll stays quick."""
        return self.status_timeout if self._answered else min(self.status_timeout, DOWN_TIMEOUT_S)

    def _server_row(self, s: dict[str, Any], live: bool) -> dict[str, Any]:
        addr = str(s.get("address", "?"))
        out_bytes = int(s.get("bytes_out", 0))
        budget = s.get("budget_mbps")
        if budget is None and self.config.comm.enabled:
            budget = self.config.comm.server_bandwidth_mbps
        recent = None
        if live:  # Mbit/s since the last poll: what the budget bounds now
            now = time.monotonic()
            prev = self._rates.get(addr)
            recent = prev[2] if prev is not None else None
            if prev is not None and now - prev[0] > 0.2:
                recent = max(0.0, (out_bytes - prev[1]) * 8 / 1e6 / (now - prev[0]))
            if prev is None or now - prev[0] > 0.2:
                self._rates[addr] = (now, out_bytes, recent if recent is not None else 0.0)
        uptime = float(s.get("uptime_s", 0.0))
        return {"rank": s.get("rank"), "address": addr, "live": live, "up": s.get("up", True), "clock": s.get("clock"),
                "bytes_in": int(s.get("bytes_in", 0)), "bytes_out": out_bytes,
                "egress_mbps": round(out_bytes * 8 / 1e6 / uptime, 3) if uptime > 0 else 0.0,
                "recent_mbps": None if recent is None else round(recent, 3), "budget_mbps": budget,
                "msgs_in": s.get("msgs_in", 0), "errors": s.get("errors", 0),
                "rows": sum(int(t.get("rows", 0)) for t in s.get("tables", {}).values()),
                "partitions_owned": s.get("partitions", {}).get("owned"), "uptime_s": uptime}

    def _recent_share(self, rank: int) -> float | None:
        """The share of its time worker ``rank`` was blocked over its last RECENT_CLOCKS clocks
        (a replacement's counters start again: then over its records since)."""
        recent = self._recent.get(rank)
        if not recent or len(recent) < 2:
            return None
        start = max((i for i in range(1, len(recent)) if recent[i][1] < recent[i - 1][1]), default=0)
        (t0, b0), (t1, b1) = recent[start], recent[-1]  # from a replacement's first record, if one came
        return round(min(1.0, max(0.0, (b1 - b0) / (t1 - t0))), 4) if t1 > t0 else None

    # -- all of it --------------------------------------------------------------------------------

    def _snapshot(self) -> dict[str, Any]:
        self._read_metrics()
        ended = self._summary is not None
        stats, down = self._servers(ended)
        servers = [self._server_row(s, live) for s, live in stats]
        parts = next((s["partitions"] for s, _ in stats if isinstance(s.get("partitions"), dict)), None)
        server_clocks = next((s.get("client_clocks") for s, live in stats if live), None)
        workers: list[dict[str, Any]] = []
        for rank in sorted(set(self._workers) | set(range(self.config.cluster.workers))):
            rec = self._workers.get(rank, {})
            seen = server_clocks[rank] if server_clocks is not None and rank < len(server_clocks) else None
            t = rec.get("time")
            blocked = rec.get("blocked_s")
            workers.append({"rank": rank, "clock": rec.get("clock"), "time": t, "blocked_s": blocked,
                            "blocked_reads": rec.get("blocked_reads"),
                            "blocked_fraction": round(blocked / t, 4) if isinstance(blocked, (int, float))
                            and isinstance(t, (int, float)) and t > 0 else None,
                            "recent_blocked_fraction": self._recent_share(rank),
                            "server_clock": seen, "left": seen == "left"})
        behind = None if ended else holding_back(workers)
        stride = max(1, -(-len(self._clocks) // MAX_POINTS))
        curve = self._clocks[::stride]
        if self._clocks and curve[-1] is not self._clocks[-1]:
            curve = [*curve, self._clocks[-1]]
        state = "ended" if ended else "running" if any(live for _, live in stats) else "no server answers"
        return {"title": self.title, "source": "run_dir" if self.run_dir is not None else "config", "state": state,
                "app": self.config.app.module, "workers_configured": self.config.cluster.workers,
                "staleness": self.config.consistency.staleness, "comm": self.config.comm.enabled,
                "clocks": curve, "heldout_name": self._heldout, "clock_records": len(self._clocks),
                "workers": workers, "holding_back": behind,
                "servers": servers, "down": down, "partitions": parts, "checkpoints": self._checkpoints(),
                "recoveries": self._recoveries(), "summary": self._summary, "time": time.time()}
