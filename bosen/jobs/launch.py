"""``bosen launch``: run a whole job on this machine (servers and workers as subprocesses).

The launcher owns every process it starts (one ``bosen.jobs.supervise.ProcessGroup``: the servers through
``bosen.jobs.cluster``, the workers through ``bosen.jobs.job.start_worker``): whatever happens (a worker dies,
a server dies, Ctrl-C, a timeout, a bug here) it stops them all before returning, and it says why;
on Linux they die with it even if it is killed. Workers write metrics to ``RUN_DIR/workers/RANK.jsonl``;
the launcher merges them per clock into ``RUN_DIR/metrics.jsonl`` (format: ``bosen.jobs.job``), prints
progress, and plots the objective at the end.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bosen import checkpoint
from bosen import config as config_mod
from bosen.apps import microtasks
from bosen.config import Config
from bosen.errors import BosenError
from bosen.jobs import app_tables, exporter, kernels
from bosen.jobs import status as status_mod
from bosen.jobs.cluster import LocalCluster, resolve_ports
from bosen.jobs.job import METRICS, WORKER_RECORDS, JobFailed, MetricsMerger, start_worker, truncate_records
from bosen.jobs.scale import Scaler
from bosen.jobs.supervise import Process, ProcessFailed, ProcessGroup, describe_exit, wait_any
from bosen.jobs.zygote import Zygote, preload_for
from bosen.metrics import HELDOUT_MEASURES
from bosen.security import Security, job_keys
from bosen.security import describe as describe_security

if TYPE_CHECKING:
    from bosen.jobs.ray import RayJob

POLL_S = 0.2
SCALE_POLL_S = 0.02  # while a scale step is under way: its phases wait on files and the servers' clocks
# replacements of one server (or worker rank) in a row without a newer complete checkpoint between them:
# a replacement that keeps dying ends the job; one that lets the job make progress starts the count again
MAX_REPLACEMENTS = 3
PRUNE_EVERY_S = 2.0  # how often old checkpoints are looked for and deleted while the job runs
SERVER_READY_TIMEOUT_S = 60.0
STATUS_TIMEOUT_S = 10.0  # a server answers STATUS within this, on a loaded machine too
# after a worker is replaced, old checkpoints are kept this long: the replacement reads its part
# while it starts, and a checkpoint that the lost worker had finished may complete meanwhile
PRUNE_PAUSE_S = 60.0


class RestartJob(Exception):
    """A lost worker's replacement would not be taken back exactly (a server cannot take back its
    predecessor's updates since the checkpoint it restarts from, STATUS ``take_back_from``): the
    whole job restarts from its newest complete checkpoint instead (``Launcher._restart``)."""


class Stopped(Exception):
    """SIGTERM or SIGINT reached the launcher: stop the job cleanly."""


def _stop_on_signal(signum: int, frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


# Workers one server process keeps up with under managed communication (README, "How many servers"):
# a server pushes each changed row to every subscriber, so its work grows with the workers it serves.
WORKERS_PER_SERVER = 4


def servers_for(workers: int) -> int:
    """The server processes a job of ``workers`` worker processes should have."""
    return max(1, -(-workers // WORKERS_PER_SERVER))


class Launcher:
    def __init__(self, config: str | Config, workers: int | None = None, overrides: Any = (),
                 run_dir: str | Path | None = None, timeout: float | None = None, quiet: bool = False,
                 plot: bool = True, resume: str | Path | None = None, servers: int | None = None,
                 ray: bool | str = False) -> None:
        overrides = list(overrides)
        if workers is not None:
            overrides.append(("cluster.workers", workers))
        if servers is not None:  # N server processes on this machine, on free ports
            if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
                raise BosenError(f"--servers {servers!r}: the number of server processes, at least 1")
            overrides.append(("cluster.servers", ["127.0.0.1:0"] * servers))
        self.config = resolve_ports(config_mod.load(config, overrides))
        # CURVE keys (bosen.security): a job that needs them and lacks them fails here, naming the key;
        # the launcher's own connections (STATUS, LEFT) are a client's
        Security.load(self.config, "server")
        self.security = Security.load(self.config, "client")
        if not self.config.app.module:
            raise BosenError(f"{self.config.source}: app.module is not set: nothing to launch")
        name = self.config.app.module.rsplit(".", 1)[-1]
        if resume is not None:
            if run_dir is not None and Path(run_dir).resolve() != Path(resume).resolve():
                raise BosenError(f"--resume {resume} and --run-dir {run_dir}: a resumed job goes on in its own run "
                                 "directory")
            if not Path(resume).is_dir():
                raise BosenError(f"--resume {resume}: no such run directory")
            if self.config.checkpoint is None:
                raise BosenError(f"--resume {resume}: {self.config.source} has no checkpoint section, so the job "
                                 "made no checkpoints")
            run_dir = resume
        self.resume = resume is not None
        self.run_dir = Path(run_dir or Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.timeout = timeout
        self.quiet = quiet
        self.plot = plot
        self.ray = ray  # True: a local Ray for the job; an address: that cluster (bosen.jobs.ray)
        self._t0 = time.time()
        self._cfg_path: Path | None = None
        # per clock of the checkpoint the whole job restarted from (a lost worker not taken back exactly)
        self._restarts: dict[int, int] = {}
        self._printed_below = 0  # after a whole-job restart from a checkpoint: its clock
        self._fresh()

    def _fresh(self) -> None:
        """The state of one start of the job's processes: a whole-job restart begins it again."""
        self.cluster: LocalCluster | None = None
        self.workers: list[Process] = []
        self._last_time: float | None = None
        self._replaced: dict[int, int] = {}
        self._workers_replaced: dict[int, int] = {}
        # per ("server" | "worker", index): the newest complete checkpoint when it was last replaced, and
        # its replacements since the job last made a newer one (the totals above name the processes)
        self._replaced_at: dict[tuple[str, int], int] = {}
        self._streak: dict[tuple[str, int], int] = {}
        self._told_left: set[int] = set()  # worker ranks that finished, told to servers replaced meanwhile
        self.servers_changed = False  # `bosen scale --servers` added or removed servers
        # ranks killed after they had left the job (BYE): their work is done, nothing is redone
        self._left_then_killed: set[int] = set()
        self._no_prune_until = 0.0
        self._merger: MetricsMerger | None = None
        self._resumed_from: tuple[int, int] | None = None  # (clock, workers) of a checkpoint made by other workers
        self._resumed_at: int | None = None  # the clock of the checkpoint this run resumed from
        self._compiling: kernels.CompileNotice | None = None  # says so while the workers compile numba kernels
        self.dropped: set[int] = set()  # ranks started by a scale step that failed, then stopped: not a failure
        self._released: set[int] = set()  # ranks that left by `bosen scale` and exited (their Ray actors released)
        self.scaler: Scaler | None = None  # answers `bosen scale` (bosen/jobs/scale.py) while the job runs

    @property
    def merger(self) -> MetricsMerger | None:
        return self._merger

    @property
    def ray_job(self) -> RayJob | None:
        """The job's processes as Ray actors (``--ray``), or None."""
        from bosen.jobs.ray import RayJob

        group = self.cluster.group if self.cluster is not None else None
        return group if isinstance(group, RayJob) else None

    def start_joiner(self, rank: int) -> None:
        """Start worker ``rank``, the next one, to join the running job (``bosen scale``): it loads its
        data, then joins at the clock the scaler names (``BOSEN_JOIN=ahead``, apps/microtasks.py)."""
        assert self.cluster is not None and self._cfg_path is not None and rank == len(self.workers)
        module = self.config.app.module
        assert module is not None
        self.workers.append(start_worker(self.cluster.group, module, self._cfg_path, rank, self.run_dir, self._t0,
                                         join=microtasks.JOIN_AHEAD))

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)

    # -- running -------------------------------------------------------------------------------

    def run(self) -> int:
        """Run the job to completion; 0 on success, 1 on failure (with the reason printed)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with Zygote(self.run_dir / "logs" / "zygote.log", preload_for(self.config.app.module),
                    fork_self=True) as zygote:
            if self.ray is False:
                # now, before any of the job's own code runs here (app_tables: the app's module, its model):
                # a fork of this process is then what an exec'd zygote would be (bosen/jobs/zygote.py)
                zygote.start()
            return self._run(zygote)

    def _run(self, zygote: Zygote) -> int:
        self.config = app_tables.resolve(self.config, self.run_dir / "tables")
        ck = self.config.checkpoint
        if ck is not None and not Path(ck.dir).is_absolute():  # every process finds it, whatever its cwd
            self.config = dataclasses.replace(self.config, checkpoint=dataclasses.replace(
                ck, dir=str((self.run_dir / ck.dir).resolve())))
        start = self._t0 = time.time()
        resume_from = None
        if self.resume:
            try:
                resume_from, earlier = self._find_checkpoint()
            except checkpoint.CheckpointError as e:
                print(f"bosen launch: cannot resume: {e}", file=sys.stderr, flush=True)
                return 1
            self._t0 = start - (earlier or 0.0)  # record times go on from where the kept ones stop
            if resume_from is not None:
                self._resumed_at = int(resume_from.name.rpartition("-")[2])
                self._set_aside(self._resumed_at)
        else:
            stale = self.run_dir / WORKER_RECORDS  # records of an earlier run in the same directory
            if stale.exists():
                shutil.rmtree(stale)
        cfg_path = self._cfg_path = self.run_dir / "config.yaml"
        config_mod.dump(self.config, cfg_path)
        n_servers, n_workers = len(self.config.cluster.servers), self.config.cluster.workers
        if self.config.comm.enabled and n_servers < servers_for(n_workers):
            print(f"bosen launch: {n_workers} workers on {n_servers} server(s): under managed communication a "
                  f"server keeps up with about {WORKERS_PER_SERVER} workers; --servers {servers_for(n_workers)} "
                  "(README, 'How many servers')", file=sys.stderr, flush=True)
        # explicit handlers: SIGINT may arrive ignored (background jobs), SIGTERM has no default cleanup
        previous = {sig: signal.signal(sig, _stop_on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while True:
                try:
                    merger = self._start_and_watch(cfg_path, resume_from, start, zygote)
                    break
                except RestartJob as e:  # every process has stopped (the process group's exit)
                    self.say(str(e))
                    resume_from = self._restart(e)
            # the servers have stopped, their part writers drained: the checkpoints the job leaves are
            # pruned to ``keep`` (at the workers' end, the servers' last parts may not be on disk yet)
            self._prune()
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

    def _start_and_watch(self, cfg_path: Path, resume_from: Path | None, start: float,
                         zygote: Zygote) -> MetricsMerger:
        """One start of the job's processes (from checkpoint ``resume_from``, or from the beginning),
        watched until the workers finish; every process is stopped before it returns or raises."""
        # an earlier run's task plans and hand-offs: this run's workers start (from the checkpoint, resumed)
        # with their own assignment, and would otherwise move tasks at that run's boundaries (docs/recovery.md)
        microtasks.drop_run_plans(self.run_dir / microtasks.HANDOFF_DIR)
        with (self.run_dir / METRICS).open("w", buffering=1) as metrics:
            merger = self._merger = MetricsMerger(self.run_dir, self.config.cluster.workers, metrics,
                                                  self._resumed_from)
            # children get their own process groups, so Ctrl-C in a terminal reaches only the
            # launcher, which then stops them all here (SIGTERM, grace, SIGKILL)
            with exporter.serving(self.config.metrics.port, merger, self.config.cluster.workers,
                                  self._servers, self._t0, self.security) as endpoint, \
                    self._process_group(zygote) as group:
                if endpoint is not None:
                    self.say(f"metrics on http://{exporter.HOST}:{endpoint.port}/metrics")
                if self.ray is not False:
                    self._place_on_ray(group, cfg_path)
                self._start_servers(cfg_path, group, resume_from)
                self._start_workers(cfg_path, group, resume_from)
                self.scaler = Scaler(self)
                restart = False
                try:
                    self._watch(merger, start)
                except RestartJob:
                    restart = True
                    raise
                finally:  # a failed job's metrics keep every clock its workers recorded
                    if self.scaler is not None:
                        self.scaler.close()
                        self.scaler = None
                    # but not a restarted one's: it redoes the clocks past its checkpoint, and a clock that not
                    # every worker reported yet would be summed over some (LDA's objective a fraction of the job's)
                    if not restart:
                        for rec in merger.finish():
                            self._progress(rec)
                for path in sorted((self.run_dir / WORKER_RECORDS).glob("*.stats.json")):
                    metrics.write(json.dumps({"kind": "client", **json.loads(path.read_text())}) + "\n")
                stats = self._server_stats()
                for s in stats:
                    metrics.write(json.dumps({"kind": "server", **s}) + "\n")
                summary = {"kind": "summary", "seconds": round(time.time() - start, 3),
                           "clocks": len(merger.done), "workers": self.config.cluster.workers,
                           "final": merger.done[-1] if merger.done else None}
                metrics.write(json.dumps(summary) + "\n")
        return merger

    def _restart(self, why: RestartJob) -> Path | None:
        """A lost worker could not be taken back exactly and every process has stopped: the whole job
        starts again from its newest complete checkpoint (the exact one ``bosen launch --resume``
        takes; none yet: from the beginning), with the config's servers and workers, in this run
        directory. Checkpoints newer than that are no point to resume from (else they would be
        taken) and the processes write them again: they are set aside (``_set_aside``, as a resume
        does), so none of their parts, corrections or move parts mixes with the new ones. Returns the
        checkpoint to start from (None: the start)."""
        ck = self.config.checkpoint
        assert ck is not None
        base = Path(ck.dir)
        self._fresh()
        resume_from = None  # none complete yet: from the beginning, as a first start
        try:
            checkpoint.newest_complete(base, len(self.config.cluster.servers), None,
                                       checkpoint.fingerprint_for(self.config), exact=True)
        except checkpoint.CheckpointError:
            truncate_records(self.run_dir, 0)
        else:
            try:
                resume_from, _ = self._find_checkpoint()
            except checkpoint.CheckpointError as e:
                raise JobFailed(f"{why}, but the job cannot resume: {e}") from None
        clock = 0 if resume_from is None else int(resume_from.name.rpartition("-")[2])
        n = self._restarts[clock] = self._restarts.get(clock, 0) + 1
        if n > MAX_REPLACEMENTS:
            raise JobFailed(f"{why}; the job was restarted from the checkpoint at clock {clock} {n - 1} times "
                            "already: stopping it")
        self._set_aside(clock)
        self._resumed_at = None if resume_from is None else clock
        self._printed_below = clock
        return resume_from

    def _set_aside(self, clock: int) -> None:
        """The whole job starts from its checkpoint at ``clock`` (0: the beginning): the newer
        checkpoints and every move parts' folder are moved out of its way (``checkpoint.set_aside``),
        and the launcher says which and where."""
        ck = self.config.checkpoint
        assert ck is not None
        into, moved = checkpoint.set_aside(Path(ck.dir), clock)
        if into is not None:
            self.say(f"set aside {', '.join(moved)} (the job starts again from clock {clock} and writes what comes "
                     f"after again: old parts, corrections or move parts must not mix with the new ones) in {into}")

    def _process_group(self, zygote: Zygote) -> ProcessGroup:
        """Local subprocesses (forked from ``zygote`` where they can be, bosen/jobs/zygote.py), or
        with ``--ray`` the actors of ``bosen.jobs.ray.RayJob``."""
        if self.ray is False:
            return ProcessGroup(self.run_dir / "logs", zygote=zygote)
        from bosen.jobs.ray import RayJob

        return RayJob(self.config, self.run_dir, None if self.ray is True else self.ray)

    def _place_on_ray(self, group: ProcessGroup, cfg_path: Path) -> None:
        """The servers' addresses are their actors' nodes: rewrite the config the processes read."""
        from bosen.jobs.ray import RayJob

        assert isinstance(group, RayJob)
        self.config = job_keys(group.place(self.config), self.run_dir / "keys")
        self.security = Security.load(self.config, "client")
        config_mod.dump(self.config, cfg_path)
        nodes = len({n[0] for n in group.nodes})
        self.say(f"Ray: {len(group.bundles)} actors on {nodes} node(s) in {group.startup_s or 0.0:.1f}s "
                 f"(placement group, strategy {group.strategy}); placements in {self.run_dir / 'ray.json'}")

    def _replace_server(self, i: int, lost: Process) -> None:
        """Partial recovery (server/checkpoints.py): server ``i`` restarts from its newest
        checkpoint part; the others keep their values, and the workers resend what came later."""
        assert self.cluster is not None and self.config.checkpoint is not None
        code = lost.returncode
        assert code is not None
        # ranks that ended their clocks; not those `bosen scale` let go (a replacement restored from a
        # part older than such a rank's BYE refuses: what it sent since is lost, docs/recovery.md)
        members = self.scaler.members if self.scaler is not None else range(len(self.workers))
        gone = [str(r) for r, w in enumerate(self.workers)
                if w.returncode == 0 and r in members]
        self.say(f"{lost.name} {describe_exit(code)}: starting a replacement from its newest checkpoint")
        self._replaced[i] = self._replaced.get(i, 0) + 1
        self._replaced_at["server", i] = self._newest_complete()
        self._streak["server", i] = self._streak.get(("server", i), 0) + 1
        shape: list[str] = []
        # a rank that left by `bosen scale` keeps its place in ``workers``: the count alone does not say
        scaled = set(members) != set(range(self.config.cluster.workers))
        if self.servers_changed or len(self.workers) != self.config.cluster.workers or scaled:
            # the job's servers, map and worker ranks now, from a running server: not the config's
            live = [a for j, (a, q) in enumerate(zip(self.cluster.addresses, self.cluster.servers, strict=True))
                    if j != i and q.returncode is None]
            if not live:
                raise JobFailed(f"{lost.name} {describe_exit(code)} and no other server runs; stopping the job")
            shape = ["--shape-from", live[0]]
        try:
            new = self.cluster.replace_server(i, ["--resume", self.config.checkpoint.dir, "--recover",
                                                  "--gone", ",".join(gone), *shape], SERVER_READY_TIMEOUT_S)
        except ProcessFailed as e:
            raise JobFailed(f"{lost.name} {describe_exit(code)} and its replacement failed: {e}") from None
        self.say(f"{new.name} replaces {lost.name}; the workers resend their updates since its checkpoint")

    def _tell_left(self, rank: int) -> None:
        """Worker ``rank`` finished: tell every server. One restored from a checkpoint after the
        worker's BYE went to the lost server it replaces would wait for the rank for ever (the
        launcher names the ranks that finished before it starts one, ``--gone``; this is for a worker
        that said BYE and exited while its server was being replaced); so would a server that joined
        the job (``bosen scale --servers``) after its STATUS of server 0 counted the rank, which
        exited without connecting to it: its partition move would wait for the rank's PAUSED. A
        server that does not answer is told at the next look."""
        assert self.cluster is not None
        try:
            for addr in self.cluster.addresses:
                status_mod.tell_left(addr, [rank], security=self.security)
        except BosenError:
            return
        self._told_left.add(rank)

    def _left(self, rank: int) -> bool:
        """Whether worker ``rank`` had left the job (its BYE reached the servers) before it ended."""
        if self.cluster is None:
            return False
        try:
            clocks = status_mod.query(self.cluster.addresses[0], timeout=3.0, security=self.security)["client_clocks"]
        except (BosenError, KeyError, IndexError):
            return False  # not known: replaced, as a worker lost mid-job
        return 0 <= rank < len(clocks) and clocks[rank] == "left"

    def _replace_worker(self, rank: int, lost: Process) -> None:
        """A lost worker is replaced (docs/recovery.md): a new process of the same rank restores its
        app state from the newest complete checkpoint (clock C; none yet: the start, C = 0) and
        redoes its clocks from C; the servers keep their live values and the rank's clock."""
        assert self.config.checkpoint is not None and self._cfg_path is not None
        code = lost.returncode
        assert code is not None
        module = self.config.app.module
        assert module is not None
        base = Path(self.config.checkpoint.dir)
        # asked first: a server's answer only rises (a newer complete checkpoint trims its log)
        reach = self._take_back_reach()
        try:
            clock, _, _ = checkpoint.newest_complete(base, len(self.config.cluster.servers), None,
                                                     checkpoint.fingerprint_for(self.config))
            resume: Path | None = checkpoint.clock_dir(base, clock)
            where = f"the checkpoint at clock {clock}"
        except checkpoint.CheckpointError:  # lost before the first checkpoint: its state at clock 0
            clock, resume, where = 0, None, "the start (no complete checkpoint yet)"
        short = [f"server {i} cannot take back its updates of ticks {clock}..{r - 1} (its take-back log starts at "
                 f"clock {r})" if isinstance(r, int) else f"server {i} did not say how far back it takes updates "
                 f"back ({r})" for i, r in reach.items() if not isinstance(r, int) or r > clock]
        if short:  # a replacement's redo would count those ticks twice there
            raise RestartJob(f"{lost.name} {describe_exit(code)}: {'; '.join(short)}; restarting the whole job from "
                             "its newest complete checkpoint")
        n = self._workers_replaced[rank] = self._workers_replaced.get(rank, 0) + 1
        self._replaced_at["worker", rank] = clock
        self._streak["worker", rank] = self._streak.get(("worker", rank), 0) + 1
        if self._merger is not None:  # its records so far first: the replacement's of those clocks are redone
            for rec in self._merger.replaced(rank):
                self._progress(rec)
        self._no_prune_until = time.time() + PRUNE_PAUSE_S
        self.say(f"{lost.name} {describe_exit(code)}: replacing it from {where}")
        assert self.cluster is not None
        self.workers[rank] = start_worker(self.cluster.group, module, self._cfg_path, rank, self.run_dir, self._t0,
                                          resume, rejoin=clock, name=f"worker-{rank}.{n}", resumed_at=self._resumed_at)
        self.say(f"worker-{rank}.{n} replaces {lost.name}: it redoes clocks from {clock} on")

    def _take_back_reach(self) -> dict[int, int | str]:
        """Per running server, the oldest clock a lost worker's replacement may restart from and be
        taken back whole there (STATUS ``take_back_from``; the error where it did not answer). Only
        a server that started later than the job (a lost one's replacement restored from its own
        part, one joined by ``bosen scale``) can lack ticks of the newest complete checkpoint: none
        asked otherwise."""
        if self.cluster is None or not (self._replaced or self.servers_changed):
            return {}
        reach: dict[int, int | str] = {}
        for i, (addr, p) in enumerate(zip(self.cluster.addresses, self.cluster.servers, strict=True)):
            if p.returncode is not None:  # a server leaving the job (a scale step retires it)
                continue
            try:
                r = status_mod.query(addr, timeout=STATUS_TIMEOUT_S, security=self.security).get("take_back_from")
            except BosenError as e:
                reach[i] = str(e)
                continue
            if isinstance(r, int):
                reach[i] = r
        return reach

    def _find_checkpoint(self) -> tuple[Path, float | None]:
        """The newest complete checkpoint of the run (newer unusable ones named), with the worker
        records of the clocks it holds kept and the rest dropped; and the last kept record's time."""
        ck = self.config.checkpoint
        assert ck is not None
        base = Path(ck.dir)
        clock, parts, skipped = checkpoint.newest_complete(base, len(self.config.cluster.servers), None,
                                                           checkpoint.fingerprint_for(self.config), exact=True)
        for why in skipped:
            self.say(f"skipping checkpoint {why}")
        made_by, workers = checkpoint.checkpoint_workers(checkpoint.clock_dir(base, clock)), self.config.cluster.workers
        if made_by != workers:  # only micro-tasks move between workers (docs/app-contract.md)
            tasks = checkpoint.task_count(parts)
            where = f"the checkpoint at clock {clock} was made by {made_by} workers"
            if not tasks:
                raise checkpoint.CheckpointError(
                    f"{where} and its app saved no micro-tasks: it resumes with {made_by} workers only "
                    "(an app with micro-tasks, app.args.micro_tasks, resumes with any number up to its tasks)")
            if workers > tasks:
                raise checkpoint.CheckpointError(f"{where}, which hold {tasks} micro-tasks: --workers {workers} "
                                                 f"leaves workers without one (at most {tasks})")
            self.say(f"{where}; its {tasks} micro-tasks go to {workers} workers")
            self._resumed_from = (clock, made_by)
        self.say(f"resuming from the checkpoint at clock {clock} ({checkpoint.clock_dir(base, clock)})")
        return checkpoint.clock_dir(base, clock), truncate_records(self.run_dir, clock)

    def _start_servers(self, cfg_path: Path, group: ProcessGroup, resume: Path | None) -> None:
        args = ["--resume", str(resume)] if resume is not None else []
        if self.config.checkpoint is not None:  # a lost worker is replaced: its clock waits for that
            args.append("--hold-lost")
        self.cluster = LocalCluster(cfg_path, self.config.cluster.servers, group, name="server", server_args=args)
        self.say(describe_security(self.config))
        if not self.quiet and self.ray is False and kernels.servers_first_run():
            self.say("compiling kernels (first run only): the servers compile theirs before they answer")
        try:
            self.cluster.start(SERVER_READY_TIMEOUT_S)
        except ProcessFailed as e:
            raise JobFailed(str(e)) from None
        self.say(f"{len(self.cluster.servers)} servers up: {', '.join(self.config.cluster.servers)}")

    def _start_workers(self, cfg_path: Path, group: ProcessGroup, resume: Path | None) -> None:
        k = self.config.cluster.workers
        module = self.config.app.module
        assert module is not None  # checked in __init__
        self.workers = [start_worker(group, module, cfg_path, rank, self.run_dir, self._t0, resume)
                        for rank in range(k)]
        self.say(f"{k} workers running {module}; run directory {self.run_dir}")
        if not self.quiet:
            done = len(self._merger.done) if self._merger is not None else 0  # a resumed job's kept clocks
            self._compiling = kernels.CompileNotice(kernels.first_run(module), done)
            if line := self._compiling.first():
                self.say(line)

    def _check_alive(self) -> bool:
        """Raise JobFailed if any process failed (a lost server is replaced where the job makes
        checkpoints); True when every worker has finished."""
        for i, p in enumerate(self.cluster.servers if self.cluster is not None else []):
            code = p.returncode
            if code == 0 and self.scaler is not None and self.scaler.leaving(i):
                continue  # it left the job: the scale step retires it
            if code is not None:
                if self.config.checkpoint is None or self._in_a_row("server", i) >= MAX_REPLACEMENTS:
                    raise JobFailed(f"{p.name} {describe_exit(code)}; stopping the job. Last log lines:\n"
                                    f"{p.tail(15)}")
                self._replace_server(i, p)
        workers_done = True
        for rank, p in enumerate(self.workers):
            code = p.returncode
            if code is None:
                workers_done = False
            elif code == 0:
                # a server restored from a part older than the rank's BYE, or one that joined the job
                # (bosen scale) after its STATUS counted the rank, would wait for it for ever
                moving = self.scaler is not None and self.scaler.moving_servers
                if (self._replaced or self.servers_changed or moving) and rank not in self._told_left:
                    self._tell_left(rank)
                if self.scaler is not None and rank not in self.scaler.members and rank not in self._released:
                    self._released.add(rank)  # it left by `bosen scale`: its Ray actor goes
                    if (ray := self.ray_job) is not None:
                        ray.release(p.name)
            elif rank in self._left_then_killed or rank in self.dropped \
                    or (self.scaler is not None and rank in self.scaler.joining):
                continue
            elif code < 0 and self.config.checkpoint is not None and self._left(rank):
                # a replacement would redo its clocks after the others finished with its results:
                # what they wrote (a final model) would no longer be the tables' state
                self.say(f"{p.name} {describe_exit(code)} after it left the job: its work is done, nothing "
                         "is redone")
                self._left_then_killed.add(rank)
            elif code < 0 and self.config.checkpoint is not None \
                    and self._in_a_row("worker", rank) < MAX_REPLACEMENTS:
                self._replace_worker(rank, p)  # killed (SIGKILL, OOM): its state is in the checkpoints
                workers_done = False
            elif code != 0:
                why = ""
                if code < 0 and self.config.checkpoint is None:
                    why = (" (a lost worker is replaced only in a job that makes checkpoints: add a checkpoint "
                           "section, docs/recovery.md)")
                elif code < 0:
                    why = f" (replaced {MAX_REPLACEMENTS} times in a row, no newer checkpoint between)"
                raise JobFailed(f"{p.name} {describe_exit(code)}{why}; stopping the job. Last log lines:\n"
                                f"{p.tail(15)}")
        return workers_done

    def _in_a_row(self, kind: str, i: int) -> int:
        """Replacements of server or worker ``i`` since the job last made a complete checkpoint newer
        than the one it had at the latest of them (such progress starts the count again)."""
        key = (kind, i)
        at = self._replaced_at.get(key)
        if at is not None and self._streak.get(key, 0) and self._newest_complete() > at:
            self._streak[key] = 0
        return self._streak.get(key, 0)

    def _newest_complete(self) -> int:
        """The clock of the run's newest complete checkpoint (-1: none yet)."""
        ck = self.config.checkpoint
        if ck is None or self.cluster is None:
            return -1
        try:
            clock, _, _ = checkpoint.newest_complete(Path(ck.dir), len(self.cluster.addresses), None, None,
                                                     verify=False)
        except checkpoint.CheckpointError:
            return -1
        return clock

    def _watch(self, merger: MetricsMerger, start: float) -> None:
        pruned = time.time()
        while True:
            done = self._check_alive()
            for rec in merger.poll():
                self._progress(rec)
            if self._compiling is not None and (line := self._compiling.tick(len(merger.done))):
                self.say(line)
            if done or time.time() - pruned > PRUNE_EVERY_S:
                self._prune()
                pruned = time.time()
            if done:
                return
            if self.timeout is not None and time.time() - start > self.timeout:
                raise JobFailed(f"timed out after {self.timeout:g}s")
            if self.scaler is not None:
                self.scaler.poll()
                self.scaler.step()
            # wakes at once when a worker or server exits (the job's end, a loss to replace)
            wait_any([*self.workers, *(self.cluster.servers if self.cluster is not None else [])],
                     SCALE_POLL_S if self.scaler is not None and self.scaler.busy else POLL_S)

    def _prune(self) -> None:
        ck = self.config.checkpoint
        if time.time() < self._no_prune_until:  # a replacement worker may be reading its part
            return
        if ck is None:
            return
        handoffs = self.run_dir / microtasks.HANDOFF_DIR
        if handoffs.is_dir():  # a replacement restarts at the newest complete checkpoint or later
            microtasks.drop_handoffs(handoffs, self._newest_complete())
        servers, workers = len(self.config.cluster.servers), self.config.cluster.workers
        if ck.priority_fraction == 1.0:
            checkpoint.prune(Path(ck.dir), ck.keep, servers, workers)
        else:  # priority parts build on the parts since their base
            checkpoint.prune_bases(Path(ck.dir), ck.keep, servers, workers)

    def _progress(self, rec: dict[str, Any]) -> None:
        parts = [f"clock {rec['clock']:>4}"]
        if "objective" in rec:
            parts.append(f"objective {rec['objective']:.6g}")
        for k in HELDOUT_MEASURES:
            if k in rec:
                parts.append(f"{k.removeprefix('heldout_').replace('_', ' ')} {rec[k]:.4g} (held out)")
        t = rec.get("time")
        prev = self._last_time
        for k in ("samples", "tokens"):
            if k in rec and t is not None and prev is not None and t > prev:
                parts.append(f"{rec[k] / (t - prev):,.0f} {k}/s")
        if t is not None:
            parts.append(f"t={t:.1f}s")
            self._last_time = t
        if rec["clock"] >= self._printed_below:  # a restarted job's kept clocks were printed before
            self.say(" | ".join(parts))

    def _servers(self) -> list[str]:
        """The job's servers now (servers join and leave through ``bosen scale``)."""
        return list(self.cluster.addresses) if self.cluster is not None else list(self.config.cluster.servers)

    def _server_stats(self) -> list[dict[str, Any]]:
        out = []
        for addr in self._servers():
            try:
                out.append(status_mod.query(addr, timeout=3.0, security=self.security))
            except BosenError as e:
                out.append({"address": addr, "error": str(e)})
        return out

    def _plot(self, records: list[dict[str, Any]]) -> None:
        """objective.png: the objective per clock and, beside it, the held-out measure if any."""
        pts = [(r["clock"], r["objective"]) for r in records if "objective" in r]
        held = next((k for k in HELDOUT_MEASURES if any(k in r for r in records)), None)
        if len(pts) < 2:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2 if held else 1, figsize=(11 if held else 6, 4), squeeze=False)
        panels = [("objective", pts)]
        if held:
            panels.append((held.replace("_", " "), [(r["clock"], r[held]) for r in records if held in r]))
        for ax, (label, series) in zip(axes[0], panels, strict=True):
            ax.plot([p[0] for p in series], [p[1] for p in series], marker=".")
            ax.set_xlabel("clock")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        fig.suptitle(self.config.app.module)
        fig.tight_layout()
        fig.savefig(self.run_dir / "objective.png", dpi=100)
        plt.close(fig)
