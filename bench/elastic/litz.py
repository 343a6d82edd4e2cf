"""``python -m bench.elastic.litz [--app lda|mlr] [--repeats 3] [--quick]``: Litz's scale-out and
scale-in experiment in miniature (the Qiao thesis, ch. 4; docs/evaluation.md, "Elastic jobs").

One job (``bosen launch``, micro-tasks, managed communication, checkpoints) runs four ways, alternated:
*static-half* (K/2 workers throughout), *static-full* (K), *scale-out* (K/2, then ``bosen.scale`` to K
once worker 0 reported ``--at`` of the iterations) and *scale-in* (K, then K/2 at ``1 - at``). A
run's time is that of its last clock record (``metrics.jsonl`` ``time``: seconds since the job's start,
so process start and numba's warm-up count alike everywhere) less that of its first. The *ideal* of an
elastic run is what a job that changed size for free would take: the static run's time up to the
clock B at which its micro-tasks moved (``committed: ... at clock B``), plus the other static run's
time from B to the end. Per case one line: the elastic time over its ideal (median over the repeats,
with the spread), the static runs' times and the scale steps' own times (``bosen.scale``). With
``--out DIR`` a figure per app, ``elastic-litz-APP.png``: clocks done against seconds for the four
runs of the first repeat, the boundary marked, beside each elastic run's ideal.

A scale-in's boundary is a checkpoint boundary (leavers go once the servers' part of it is on disk:
docs/design.md, "Workers that join and leave"), so it lands up to ``every_clocks`` - 1 clocks after
the asked point; the jobs here save every ``passes // 50`` clocks (at least 1), so that is within 2%
of the work, and the ideal is taken at the boundary the step used, whichever it was. Each line says
the clock asked for (``asked``) beside the boundary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bosen
from bench.common import emit, log, median, repo_env, spread

APPS: dict[str, dict[str, Any]] = {
    "lda": {"tables": {"word_topic": {"rows": 2000, "cols": 20, "dtype": "int32"},
                       "topic_summary": {"rows": 1, "cols": 20, "dtype": "int32"}},
            "app": {"module": "bosen.apps.lda",
                    "args": {"data": "synthetic", "K": 20, "synth_docs": 6000, "synth_vocab": 2000,
                             "synth_doc_len": 60.0, "micro_tasks": 8, "seed": 3}},
            "passes": "iterations"},
    "mlr": {"tables": {"W": {"rows": 10, "cols": 1001, "dtype": "float32", "init": {"zeros": True}}},
            "app": {"module": "bosen.apps.mlr",
                    "args": {"data": "synthetic", "synthetic": {"n": 100000, "nnz": 40}, "batch_size": 64,
                             "lr": 0.5, "micro_tasks": 8, "seed": 3, "eval_every": 0}},
            "passes": "epochs"},
}


def checkpoint_every(passes: int) -> int:
    """Clocks between checkpoints: a scale-in's boundary (the next checkpoint boundary) is then at most
    2% of the work past the asked point."""
    return max(1, passes // 50)


def write_job(app: str, path: Path, workers: int, passes: int) -> Path:
    spec = APPS[app]
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": workers},
           "consistency": {"staleness": 1}, "comm": {"enabled": True},
           "checkpoint": {"every_clocks": checkpoint_every(passes), "keep": 2},
           "tables": spec["tables"],
           "app": {"module": spec["app"]["module"], "args": {**spec["app"]["args"], spec["passes"]: passes}}}
    path.write_text(json.dumps(cfg))
    return path


def _reported(run: Path) -> int:
    try:
        lines = (run / "workers" / "0.jsonl").read_text().splitlines()
        return int(json.loads(lines[-1]).get("clock", -1)) if lines else -1
    except (OSError, ValueError):
        return -1


def run(cfg: Path, run_dir: Path, scale_at: int | None = None, to: int | None = None,
        timeout: float = 900.0) -> dict[str, Any]:
    """One job; with ``scale_at``, ``bosen.scale`` to ``to`` workers once worker 0 reported that clock.
    Its clock times (by clock), the boundary its micro-tasks moved at and the scale step's seconds."""
    p = subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(cfg), "--run-dir", str(run_dir), "--no-plot",
                          "--quiet"], env={**os.environ, **repo_env()}, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: dict[str, Any] = {}
    try:
        if scale_at is not None:
            t0 = time.monotonic()
            while _reported(run_dir) < scale_at:
                if p.poll() is not None or time.monotonic() - t0 > timeout:
                    raise SystemExit(f"the job ended before clock {scale_at}; logs in {run_dir / 'logs'}")
                time.sleep(0.02)
            lines: list[str] = []
            out["step_s"] = bosen.scale(run_dir, workers=to, out=lines.append)
            moved = [int(m) for x in lines for m in re.findall(r"micro-tasks move at clock (\d+)", x)]
            out["boundary"] = moved[-1] if moved else None
        text, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if p.returncode != 0:
        raise SystemExit(f"bosen launch failed ({p.returncode}):\n{text[-3000:]}")
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    times = {r["clock"]: float(r["time"]) for r in recs if r.get("kind") == "clock" and "time" in r}
    out["times"] = times
    out["seconds"] = times[max(times)] - times[min(times)]
    return out


def _since_start(times: dict[int, float], clock: int) -> float:
    """Seconds from the run's first clock record to that of ``clock`` (or the nearest before it)."""
    first = times[min(times)]
    at = max(c for c in times if c <= clock)
    return times[at] - first


def ideal(before: dict[int, float], after: dict[int, float], boundary: int) -> float:
    """The ``before`` run's time up to ``boundary`` plus the ``after`` run's from it to its end."""
    return _since_start(before, boundary) + (after[max(after)] - after[min(after)]) - _since_start(after, boundary)


def plot(app: str, runs: dict[str, dict[str, Any]], half: int, full: int, out: Path) -> Path:
    """Clocks done against seconds since the first clock for one repeat's four runs; each elastic run's
    boundary marked and its ideal (the static runs' pieces joined at the boundary) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def xy(times: dict[int, float]) -> tuple[list[float], list[int]]:
        cs = sorted(times)
        return [times[c] - times[cs[0]] for c in cs], cs

    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {"half": ("static-half", "tab:gray"), "full": ("static-full", "black"),
              "out": (f"scale-out {half} -> {full}", "tab:blue"), "in": (f"scale-in {full} -> {half}", "tab:orange")}
    for key, (label, color) in styles.items():
        x, y = xy(runs[key]["times"])
        ax.plot(x, y, color=color, label=label, lw=1.6 if key in ("out", "in") else 1.0)
    for key, before, after in (("out", "half", "full"), ("in", "full", "half")):
        b = runs[key]["boundary"]
        tb = _since_start(runs[before]["times"], b)
        after_t = runs[after]["times"]
        x, y = xy(after_t)
        shift = tb - _since_start(after_t, b)
        ideal = [(t + shift, c) for t, c in zip(x, y, strict=True) if c >= b]
        bx, by = xy(runs[before]["times"])
        ideal = [(t, c) for t, c in zip(bx, by, strict=True) if c <= b] + ideal
        ax.plot([t for t, _ in ideal], [c for _, c in ideal], ls="--", color=styles[key][1], lw=0.8,
                label=f"ideal of {key}")
        ax.axhline(b, color=styles[key][1], lw=0.5, ls=":")
    ax.set_xlabel("seconds since the first clock")
    ax.set_ylabel("clocks done")
    ax.set_title(f"Litz in miniature: {app.upper()}, {half} and {full} workers")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"elastic-litz-{app}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--app", choices=sorted(APPS), action="append", help="default: lda and mlr")
    p.add_argument("--half", type=int, default=1, help="workers of the small job (the large one has twice)")
    p.add_argument("--passes", type=int, default=60, help="iterations (LDA) or epochs (MLR)")
    p.add_argument("--at", type=float, default=0.3, help="scale out at this fraction of the work (in at 1 - at)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--docs", type=int, default=6000, help="LDA: synthetic documents (of --doc-len tokens)")
    p.add_argument("--doc-len", type=float, default=60.0)
    p.add_argument("--quick", action="store_true", help="LDA, 20 iterations, one repeat (CI)")
    p.add_argument("--out", type=Path, default=None, help="write elastic-litz-APP.png here")
    a = p.parse_args()
    APPS["lda"]["app"]["args"].update(synth_docs=a.docs, synth_doc_len=a.doc_len)
    apps = ["lda"] if a.quick else (a.app or ["lda", "mlr"])
    passes, repeats = (20, 1) if a.quick else (a.passes, a.repeats)
    half, full = a.half, 2 * a.half
    for app in apps:
        res: dict[str, list[Any]] = {k: [] for k in ("half", "full", "out", "in")}
        loads = [os.getloadavg()[0]]
        with tempfile.TemporaryDirectory(prefix=f"bench-litz-{app}-") as d:
            cfg_half = write_job(app, Path(d) / "half.yaml", half, passes)
            cfg_full = write_job(app, Path(d) / "full.yaml", full, passes)
            out_at, in_at = round(a.at * passes), round((1 - a.at) * passes)
            for i in range(repeats):
                res["half"].append(run(cfg_half, Path(d) / f"half-{i}"))
                res["out"].append(run(cfg_half, Path(d) / f"out-{i}", out_at, full))
                res["full"].append(run(cfg_full, Path(d) / f"full-{i}"))
                res["in"].append(run(cfg_full, Path(d) / f"in-{i}", in_at, half))
                loads.append(os.getloadavg()[0])
                log(f"{app} {i}: half {res['half'][-1]['seconds']:.2f}s, full {res['full'][-1]['seconds']:.2f}s, "
                    f"out {res['out'][-1]['seconds']:.2f}s (at {res['out'][-1]['boundary']}), "
                    f"in {res['in'][-1]['seconds']:.2f}s (at {res['in'][-1]['boundary']})")
        if a.out is not None:
            plot(app, {k: v[0] for k, v in res.items()}, half, full, a.out)
        for case, small_first in (("out", True), ("in", False)):
            ratios, ideals = [], []
            for i, r in enumerate(res[case]):
                h, f = res["half"][i]["times"], res["full"][i]["times"]
                ide = ideal(h, f, r["boundary"]) if small_first else ideal(f, h, r["boundary"])
                ideals.append(ide)
                ratios.append(r["seconds"] / ide)
            emit(bench="elastic", case=f"litz-scale-{case}-{app}", metric="time_over_ideal", unit="x",
                 ours=median(ratios), spread=spread(ratios), target=1.10 if case == "out" else 1.05,
                 seconds=median([r["seconds"] for r in res[case]]), ideal_s=median(ideals),
                 static_half_s=median([r["seconds"] for r in res["half"]]),
                 static_full_s=median([r["seconds"] for r in res["full"]]),
                 step_s=median([r["step_s"] for r in res[case]]),
                 boundary=median([float(r["boundary"]) for r in res[case]]),
                 asked=out_at if case == "out" else in_at, checkpoint_every=checkpoint_every(passes),
                 passes=passes, half=half, full=full,
                 repeats=repeats, load_avg=spread(loads))


if __name__ == "__main__":
    main()

