"""The plain PS workload beside an actor parameter server in a few lines of Ray (issue 28).

    python -m bench.actorps [--quick] [--cases sparse,dense-1MiB,dense-16MiB] [--rounds N]

Two worker processes share one float32 table; each iteration a worker reads some rows, adds a
constant delta (2^-10) to them and ends the iteration (``loop``: the same code for both systems):

- ``sparse``: a 100,000 x 16 table; each iteration 1,000 distinct random rows, a fresh draw from the
  worker's own seeded generator.
- ``dense-1MiB`` / ``dense-16MiB``: each iteration reads and adds the whole table. A user with a
  dense parameter of that size would split it into rows of a size a message carries well and that
  spread over servers: rows of 64 KiB (16,384 float32), 16 and 256 of them.

Ours: ``bosen`` servers (1, and 2 where the case lists it) and 2 worker processes
(``python -m bench.actorps.worker``: ``Client.connect``, then per iteration ``table.get_rows``
(dense cases: ``refresh()`` of a read-only ``table.view`` of every row), ``table.inc_rows``,
``client.clock()``) at staleness 2 and 0. Ray (``rayps``): ``ray.init(num_cpus=4)``, a
``PS`` actor holding the numpy table, 2 ``Worker`` actors calling ``ray.get(ps.get.remote(rows))`` and
``ps.inc.remote(rows, deltas)``. Start-up (servers, ``ray.init``, joining, compiling) is outside the
timed window: workers iterate from a common wall-clock start, ``--warmup`` seconds later the window
of ``--window`` seconds opens; a worker's rate is the iterations that ended inside it over the time
between the first and last of them; the metric is the sum over the 2 workers (iterations/s).

Systems alternate order from round to round; ``ratio`` = median over rounds of (ours / Ray in the
same round), with the rounds' min and max (``ratio_spread``); > 1 means we are faster. ``cpu_ratio``:
the same for the CPU time per iteration of all of a system's processes (Ray's CPU / ours; > 1: we
spend less), which a busy machine moves far less than the rate. Each run ends
with a check that every increment arrived exactly once (the table's sum; the delta keeps it exact).
Lines also carry where an iteration's time goes (``phase_wall_us`` / ``phase_cpu_us`` of the worker
thread: draw, read, inc, end), the CPU time of each of our worker's threads per iteration, the CPU
per iteration of every process (servers, workers; Ray's actors and daemons), and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from bench.actorps.loop import DELTA, Workload
from bench.common import REPO, Child, emit, log, median, servers
from bosen.jobs.job import job_config

BENCH = "actorps"
WORKERS = 2
DENSE_COLS = 16_384  # 64 KiB rows
CASES: dict[str, Workload] = {
    "sparse": Workload(rows=100_000, cols=16, rows_per_iter=1_000, seed=28),
    "dense-1MiB": Workload(rows=16, cols=DENSE_COLS, rows_per_iter=16, seed=28),
    "dense-16MiB": Workload(rows=256, cols=DENSE_COLS, rows_per_iter=256, seed=28),
}
# system -> (staleness, servers); Ray is "ray"
OURS = {"ours-s2": (2, 1), "ours-s0": (0, 1), "ours-s2-2servers": (2, 2), "ours-s0-2servers": (0, 2)}
GOALS = {("sparse", "ours-s2"): 1.5, ("dense-16MiB", "ours-s2"): 1.2}  # issue 28
RAY_NAME = "Ray actor PS (2 worker actors, 1 PS actor)"
READY_TIMEOUT_S = 180.0


def systems_for(case: str, quick: bool) -> list[str]:
    if quick:
        return ["ray", "ours-s2", "ours-s0"]
    if case == "sparse":
        return ["ray", *OURS]
    return ["ray", "ours-s2", "ours-s0", "ours-s2-2servers"]


# ----------------------------------------------------------------------------------------------
# CPU of every process the bench started


def tree_cpu() -> dict[int, tuple[str, float]]:
    """(label, CPU seconds so far) of this process and each of its descendants, by pid."""
    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            out[p.pid] = (label(p), t.user + t.system)
    return out


def label(p: psutil.Process) -> str:
    """A short name: the module a Python child runs (bosen.server, bench.actorps.worker), a Ray
    actor's class (its process title is ``ray::CLASS.METHOD`` while a method runs), else the process
    name (gcs_server, raylet, ...)."""
    with contextlib.suppress(psutil.Error):
        if p.pid == os.getpid():
            return "bench"
        cmd = p.cmdline()
        if cmd and cmd[0].startswith("ray::"):
            return cmd[0].split()[0].split(".")[0]
        if "-m" in cmd:
            return cmd[cmd.index("-m") + 1]
        return p.name()
    return "?"


def cpu_per_iteration(c0: dict[int, tuple[str, float]], c1: dict[int, tuple[str, float]],
                      iterations: float) -> dict[str, float]:
    """CPU microseconds per iteration, per process label (summed over same-named processes)."""
    out: dict[str, float] = {}
    for pid, (name, v) in c1.items():
        v0 = c0[pid][1] if pid in c0 else v
        out[name] = out.get(name, 0.0) + (v - v0) * 1e6 / max(iterations, 1)
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda x: -x[1]) if v >= 0.5}


def sample_window(t0: float, t1: float) -> tuple[dict[int, tuple[str, float]], dict[int, tuple[str, float]]]:
    time.sleep(max(0.0, t0 - time.time()))
    c0 = tree_cpu()
    time.sleep(max(0.0, t1 - time.time()))
    return c0, tree_cpu()


# ----------------------------------------------------------------------------------------------
# one run of one system


def run_ours(wl: Workload, staleness: int, nservers: int, warmup: float, window: float, work: Path) -> dict:
    table = {"rows": wl.rows, "cols": wl.cols, "dtype": "float32"}
    job = job_config([], workers=WORKERS, tables={"w": table}, staleness=staleness, read_timeout_s=120)
    run_dir = Path(tempfile.mkdtemp(prefix=f"ours-s{staleness}-{nservers}-", dir=work))
    with servers(job, nservers, workdir=run_dir) as cluster, contextlib.ExitStack() as stack:
        procs = [stack.enter_context(Child(
            ["-m", "bench.actorps.worker", json.dumps({"config": str(cluster.path), "rank": r,
                                                        "staleness": staleness, "workload": asdict(wl)})],
            f"worker-{r}", run_dir, pipes=True)) for r in range(WORKERS)]
        for p in procs:
            rec = p.read_json(READY_TIMEOUT_S)
            assert rec["step"] == "ready", rec
        t0 = time.time() + warmup
        t1 = t0 + window
        for p in procs:
            p.send_line(json.dumps({"t0": t0, "t1": t1}))
        c0, c1 = sample_window(t0, t1)
        done = [p.read_json(window + READY_TIMEOUT_S) for p in procs]
        procs[1].send_line("clock")
        assert procs[1].read_json(READY_TIMEOUT_S)["step"] == "clocked"
        procs[0].send_line("check")
        got = procs[0].read_json(READY_TIMEOUT_S)["table_sum"]
        for p in procs:
            p.send_line("quit")
        for p in procs:
            code = p.wait(60)
            if code != 0:
                raise RuntimeError(f"{p.name} exited with {code}:\n{p.tail(40)}")
    return finish(wl, done, got, c0, c1, window)


@contextlib.contextmanager
def ray_session() -> Iterator[Any]:
    """``ray.init`` for one run, shut down whatever happens (its start-up is not timed)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray's worker processes import bench.actorps.rayps: they inherit the root on PYTHONPATH
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="warning")
    try:
        yield ray
    finally:
        ray.shutdown()


def run_ray(wl: Workload, warmup: float, window: float) -> dict:
    with ray_session() as ray:
        from bench.actorps.rayps import PS, Worker

        ps = PS.remote(wl.rows, wl.cols)
        workers = [Worker.remote(ps, asdict(wl), r) for r in range(WORKERS)]
        ray.get([ps.pid.remote(), *[w.ready.remote() for w in workers]], timeout=READY_TIMEOUT_S)
        t0 = time.time() + warmup
        t1 = t0 + window
        futs = [w.run.remote(t0, t1) for w in workers]
        c0, c1 = sample_window(t0, t1)
        done = ray.get(futs, timeout=window + READY_TIMEOUT_S)
        got = ray.get(ps.total.remote(), timeout=READY_TIMEOUT_S)
    return finish(wl, done, got, c0, c1, window)


def finish(wl: Workload, done: list[dict], table_sum: float, c0: dict[int, tuple[str, float]],
           c1: dict[int, tuple[str, float]], window: float) -> dict:
    """Check the table, and sum the workers' rates."""
    want = sum(d["rows_incremented"] for d in done) * wl.cols * float(DELTA)
    if table_sum != want:
        raise AssertionError(f"table sum {table_sum!r}, expected {want!r}: increments lost or doubled")
    rate = sum(d["it_per_s"] for d in done)
    return {"it_per_s": rate, "workers": done, "cpu_us_per_iteration": cpu_per_iteration(c0, c1, rate * window),
            "loadavg": os.getloadavg()}


# ----------------------------------------------------------------------------------------------


def cpu_total(run: dict) -> float:
    """CPU microseconds per iteration of every process of a system (the bench process left out)."""
    return sum(v for k, v in run["cpu_us_per_iteration"].items() if k != "bench") or float("nan")


def bench_case(case: str, systems: list[str], rounds: int, warmup: float, window: float, work: Path,
               quick: bool) -> None:
    wl = CASES[case]
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    for k in range(rounds):
        for s in systems if k % 2 == 0 else systems[::-1]:
            log(f"actorps: {case} {s} (round {k + 1}/{rounds}), load {os.getloadavg()[0]:.2f}")
            if s == "ray":
                r = run_ray(wl, warmup, window)
            else:
                st, ns = OURS[s]
                r = run_ours(wl, st, ns, warmup, window, work)
            log(f"  {r['it_per_s']:.1f} it/s")
            runs[s].append(r)
    ray_runs = runs["ray"]
    ray_rate = median(r["it_per_s"] for r in ray_runs)
    for s in systems[1:]:
        ratios = [o["it_per_s"] / b["it_per_s"] for o, b in zip(runs[s], ray_runs, strict=True)]
        cpu_ratios = [cpu_total(b) / cpu_total(o) for o, b in zip(runs[s], ray_runs, strict=True)]
        mid = sorted(range(rounds), key=lambda i: runs[s][i]["it_per_s"])[rounds // 2]
        st, ns = OURS[s]
        goal = GOALS.get((case, s))
        ratio = median(ratios)
        emit(bench=BENCH, case=f"{case}/{s}", metric="iterations_per_s", unit="it/s",
             ours=median(r["it_per_s"] for r in runs[s]), baseline=ray_rate, baseline_name=RAY_NAME,
             ratio=ratio, **({"goal": goal, "met": ratio >= goal} if goal else {}),
             ratio_spread={"min": min(ratios), "max": max(ratios)}, ratios=ratios,
             cpu_ratio=median(cpu_ratios), cpu_ratio_spread={"min": min(cpu_ratios), "max": max(cpu_ratios)},
             ours_all=[r["it_per_s"] for r in runs[s]], baseline_all=[r["it_per_s"] for r in ray_runs],
             staleness=st, servers=ns, workers=WORKERS, rounds=rounds, warmup_s=warmup, window_s=window,
             quick=quick, workload=asdict(wl), table_MiB=wl.rows * wl.cols * 4 / 2**20,
             ours_workers=[{k: v for k, v in w.items() if k != "total_iterations"} for w in runs[s][mid]["workers"]],
             ours_cpu_us_per_iteration=runs[s][mid]["cpu_us_per_iteration"],
             baseline_workers=ray_runs[mid]["workers"],
             baseline_cpu_us_per_iteration=ray_runs[mid]["cpu_us_per_iteration"],
             loadavg=[r["loadavg"] for r in runs[s]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round, short windows, staleness 2 and 0 on 1 server")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {', '.join(CASES)}")
    p.add_argument("--systems", default=None,
                   help=f"comma-separated: ray and any of {', '.join(OURS)} (default: per case; ray always runs)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per system (default 3, quick 1)")
    p.add_argument("--warmup", type=float, default=None, help="seconds of iterations before the window")
    p.add_argument("--window", type=float, default=None, help="seconds of the timed window")
    a = p.parse_args(argv)
    cases = [c for c in a.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        p.error(f"--cases: unknown case {bad[0]!r} (known: {', '.join(CASES)})")
    wanted = None
    if a.systems:
        wanted = [s for s in a.systems.split(",") if s and s != "ray"]
        unknown = [s for s in wanted if s not in OURS]
        if unknown:
            p.error(f"--systems: unknown system {unknown[0]!r} (known: ray, {', '.join(OURS)})")
    try:
        import ray  # noqa: F401
    except ImportError:
        log("actorps: ray is not installed (pip install -e '.[bench]'): no baseline, nothing to compare")
        return 0
    rounds = a.rounds or (1 if a.quick else 3)
    warmup = a.warmup if a.warmup is not None else (1.0 if a.quick else 2.0)
    window = a.window if a.window is not None else (2.0 if a.quick else 5.0)
    with tempfile.TemporaryDirectory(prefix="bosen-actorps-") as tmp:
        for c in cases:
            systems = ["ray", *wanted] if wanted else systems_for(c, a.quick)
            bench_case(c, systems, rounds, warmup, window, Path(tmp), a.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
