"""``bosen launch``: run a whole job on this machine (servers and workers as subprocesses).

The launcher owns every process it starts: whatever happens (a worker dies, a server dies, Ctrl-C,
a timeout, a bug here) it stops them all before returning, and it says why. Workers write metrics
to ``RUN_DIR/workers/RANK.jsonl``; the launcher merges them per clock into ``RUN_DIR/metrics.jsonl``,
prints progress, and plots the objective at the end.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, TextIO

import zmq

from bosen import config as config_mod
from bosen import status as status_mod
from bosen.config import Config
from bosen.errors import BosenError

POLL_S = 0.2
SERVER_READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1")


class JobFailed(BosenError):
    pass


class Stopped(Exception):
    """SIGTERM or SIGINT reached the launcher: stop the job cleanly."""


def _stop_on_signal(signum: int, frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


def _die_with_launcher() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: a child gets SIGTERM if the launcher dies, even by SIGKILL, so nothing is orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


@dataclasses.dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, n: int = 15) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return "(no log)"
        return "\n".join("    " + line for line in lines) or "    (log is empty)"


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def resolve_ports(cfg: Config) -> Config:
    """Replace port 0 in local server addresses by free ports (so examples never collide)."""
    servers = []
    for addr in cfg.cluster.servers:
        host, _, port = addr.rpartition(":")
        if port == "0":
            if host not in LOCAL_HOSTS:
                raise BosenError(f"{cfg.source}: port 0 (pick a free port) only works for local hosts, not {host}")
            port = str(status_mod.free_port(host if host != "localhost" else "127.0.0.1"))
        servers.append(f"{host}:{port}")
    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, servers=tuple(servers)))


class MetricsMerger:
    """Collects worker records and emits one summed record per clock once every worker reported."""

    def __init__(self, run_dir: Path, num_workers: int, out: TextIO) -> None:
        self.dir = run_dir / "workers"
        self.num_workers = num_workers
        self.out = out
        self.offsets: dict[Path, int] = {}
        self.partial: dict[int, dict[str, Any]] = defaultdict(dict)
        self.ranks: dict[int, set[int]] = defaultdict(set)
        self.done: list[dict[str, Any]] = []

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
                    self.out.write(json.dumps({"kind": "worker", **rec}) + "\n")
                    self._add(rec)
        return self._complete(self.num_workers)

    def _add(self, rec: dict[str, Any]) -> None:
        c = rec.get("clock", 0)
        agg = self.partial[c]
        self.ranks[c].add(rec.get("rank", -1))
        for k, v in rec.items():
            if k in ("rank", "clock") or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            agg[k] = max(agg.get(k, v), v) if k == "time" else agg.get(k, 0) + v

    def _complete(self, need: int) -> list[dict[str, Any]]:
        out = []
        for c in sorted(self.partial):
            if len(self.ranks[c]) >= need:
                rec = {"kind": "clock", "clock": c, "workers": len(self.ranks[c]), **self.partial.pop(c)}
                del self.ranks[c]
                self.out.write(json.dumps(rec) + "\n")
                self.done.append(rec)
                out.append(rec)
        return out

    def finish(self) -> list[dict[str, Any]]:
        self.poll()
        return self._complete(1)


class Launcher:
    def __init__(self, config: str | Config, workers: int | None = None, overrides: Any = (),
                 run_dir: str | Path | None = None, timeout: float | None = None, quiet: bool = False,
                 plot: bool = True) -> None:
        overrides = list(overrides)
        if workers is not None:
            overrides.append(("cluster.workers", workers))
        self.config = resolve_ports(config_mod.load(config, overrides))
        if not self.config.app.module:
            raise BosenError(f"{self.config.source}: app.module is not set: nothing to launch")
        name = self.config.app.module.rsplit(".", 1)[-1]
        self.run_dir = Path(run_dir or Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.timeout = timeout
        self.quiet = quiet
        self.plot = plot
        self.procs: list[Proc] = []
        self._last_time: float | None = None
        self._t0 = time.time()

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)

    # -- running -------------------------------------------------------------------------------

    def run(self) -> int:
        """Run the job to completion; 0 on success, 1 on failure (with the reason printed)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        stale = self.run_dir / "workers"  # records of an earlier run in the same directory
        if stale.exists():
            shutil.rmtree(stale)
        cfg_path = self.run_dir / "config.yaml"
        config_mod.dump(self.config, cfg_path)
        metrics_path = self.run_dir / "metrics.jsonl"
        start = self._t0 = time.time()
        # explicit handlers: SIGINT may arrive ignored (background jobs), SIGTERM has no default cleanup
        previous = {sig: signal.signal(sig, _stop_on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            with metrics_path.open("w", buffering=1) as metrics:
                merger = MetricsMerger(self.run_dir, self.config.cluster.workers, metrics)
                try:
                    self._start_servers(cfg_path)
                    self._start_workers(cfg_path)
                    self._watch(merger, start)
                    for rec in merger.finish():
                        self._progress(rec)
                    for path in sorted((self.run_dir / "workers").glob("*.stats.json")):
                        metrics.write(json.dumps({"kind": "client", **json.loads(path.read_text())}) + "\n")
                    stats = self._server_stats()
                    for s in stats:
                        metrics.write(json.dumps({"kind": "server", **s}) + "\n")
                    summary = {"kind": "summary", "seconds": round(time.time() - start, 3),
                               "clocks": len(merger.done), "workers": self.config.cluster.workers,
                               "final": merger.done[-1] if merger.done else None}
                    metrics.write(json.dumps(summary) + "\n")
                finally:
                    self._stop_all()
        except JobFailed as e:
            print(f"bosen launch: job failed: {e}", file=sys.stderr, flush=True)
            print(f"bosen launch: logs are in {self.run_dir / 'logs'}", file=sys.stderr, flush=True)
            return 1
        except (KeyboardInterrupt, Stopped) as e:
            print(f"bosen launch: {e or 'SIGINT'}: stopped the job; all processes stopped", file=sys.stderr,
                  flush=True)
            return 130
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.plot:
            self._plot(merger.done)
        self.say(f"done in {time.time() - start:.1f}s: {len(merger.done)} clocks; run directory {self.run_dir}")
        return 0

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Proc:
        log = self.run_dir / "logs" / f"{name}.log"
        with log.open("w") as f:
            popen = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **env},
                                     preexec_fn=_die_with_launcher if sys.platform.startswith("linux") else None)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def _start_servers(self, cfg_path: Path) -> None:
        servers = [self._spawn(f"server-{i}", [sys.executable, "-m", "bosen.server", "--config", str(cfg_path),
                                               "--rank", str(i)], {})
                   for i in range(len(self.config.cluster.servers))]
        deadline = time.time() + SERVER_READY_TIMEOUT_S
        ctx = zmq.Context()
        try:
            for proc, addr in zip(servers, self.config.cluster.servers):
                while True:
                    self._check_alive()
                    try:
                        status_mod.query(addr, timeout=0.5, ctx=ctx)
                        break
                    except BosenError:
                        if time.time() > deadline:
                            raise JobFailed(f"{proc.name} at {addr} did not answer within "
                                            f"{SERVER_READY_TIMEOUT_S:g}s:\n{proc.tail()}") from None
        finally:
            ctx.term()
        self.say(f"{len(servers)} servers up: {', '.join(self.config.cluster.servers)}")

    def _start_workers(self, cfg_path: Path) -> None:
        k = self.config.cluster.workers
        for rank in range(k):
            self._spawn(f"worker-{rank}", [sys.executable, "-m", self.config.app.module],
                        {"BOSEN_CONFIG": str(cfg_path), "BOSEN_RANK": str(rank),
                         "BOSEN_RUN_DIR": str(self.run_dir), "BOSEN_T0": repr(self._t0)})
        self.say(f"{k} workers running {self.config.app.module}; run directory {self.run_dir}")

    def _check_alive(self) -> bool:
        """Raise JobFailed if any process failed; True when every worker has finished."""
        workers_done = True
        for p in self.procs:
            code = p.popen.poll()
            if p.name.startswith("server"):
                if code is not None:
                    raise JobFailed(f"{p.name} {describe_exit(code)}; stopping the job. Last log lines:\n{p.tail()}")
            elif code is None:
                workers_done = False
            elif code != 0:
                raise JobFailed(f"{p.name} {describe_exit(code)}; stopping the job. Last log lines:\n{p.tail()}")
        return workers_done

    def _watch(self, merger: MetricsMerger, start: float) -> None:
        while True:
            done = self._check_alive()
            for rec in merger.poll():
                self._progress(rec)
            if done:
                return
            if self.timeout is not None and time.time() - start > self.timeout:
                raise JobFailed(f"timed out after {self.timeout:g}s")
            time.sleep(POLL_S)

    def _progress(self, rec: dict[str, Any]) -> None:
        parts = [f"clock {rec['clock']:>4}"]
        if "objective" in rec:
            parts.append(f"objective {rec['objective']:.6g}")
        t = rec.get("time")
        prev = self._last_time
        for k in ("samples", "tokens", "ratings"):
            if k in rec and t is not None and prev is not None and t > prev:
                parts.append(f"{rec[k] / (t - prev):,.0f} {k}/s")
        if t is not None:
            parts.append(f"t={t:.1f}s")
            self._last_time = t
        self.say(" | ".join(parts))

    def _server_stats(self) -> list[dict[str, Any]]:
        out = []
        for addr in self.config.cluster.servers:
            try:
                out.append(status_mod.query(addr, timeout=3.0))
            except BosenError as e:
                out.append({"address": addr, "error": str(e)})
        return out

    def _stop_all(self) -> None:
        live = [p for p in self.procs if p.popen.poll() is None]
        for p in live:
            p.popen.send_signal(signal.SIGTERM)
        deadline = time.time() + STOP_GRACE_S
        for p in live:
            try:
                p.popen.wait(max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()

    def _plot(self, records: list[dict[str, Any]]) -> None:
        pts = [(r["clock"], r["objective"]) for r in records if "objective" in r]
        if len(pts) < 2:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".")
        ax.set_xlabel("clock")
        ax.set_ylabel("objective")
        ax.set_title(self.config.app.module)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(self.run_dir / "objective.png", dpi=100)
        plt.close(fig)
