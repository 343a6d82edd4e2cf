"""How a model's rows move between checkpoints, from a run with a checkpoint at every clock: why
priority checkpoints do or do not shrink the perturbation (docs/recovery.md, E4), and for LDA why
restoring word-topic rows from a checkpoint leaves an error that never decays (E3-E4 on LDA).

    python -m bench.recovery.spread --app mf|lda RUN

RUN comes from ``bosen launch CONFIG --run-dir RUN`` with ``checkpoint: {every_clocks: 1, keep: 1000}``
(``python -m bench.recovery`` writes such runs in a temporary directory): for ``--app mf``
configs/mf-movielens.yaml; for ``--app lda`` configs/lda-news.yaml with 2 servers and test_data "".

``--app mf`` prints per-row speed statistics, how distance grows with a row's age, and the norm of the
perturbation half the rows lost leaves with a full checkpoint every 8 clocks and with each policy at
r = 1/8. ``--app lda`` prints, for documents (SCAR's LDA parameters: doc-topic rows, distance ``tv``)
and for word-topic rows, per-row speed statistics per clock and the same perturbations in ``tv``; then
it resumes the run at clock 19 with half the word-topic rows put back to clock 16 (``--lose rows``)
and measures, at every later clock, how far the servers' counts are from the counts of the workers'
topic assignments.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from bench.common import REPO
from bench.recovery.faults import Documents, lost_rows, stacked, unstacked
from bench.recovery.states import States
from bosen import checkpoint, scar

FAILURES = (11, 12, 13, 18, 19, 21)  # failure clocks whose perturbations are printed
PERIOD = 8  # clocks between full checkpoints


def perturbations(S: dict[int, np.ndarray], T: int, lost: np.ndarray, metric: scar.Metric,
                  distance: Callable[[np.ndarray, np.ndarray], float]) -> dict[str, float]:
    """``distance`` between the lost rows at failure clock ``T`` and what puts them back: the full
    checkpoint at the last boundary, and each policy's running checkpoint at r = 1/8."""
    out = {"full": distance(S[T][lost], S[PERIOD * (T // PERIOD)][lost])}
    for pol in scar.POLICIES:
        ck = scar.RunningCheckpoint(S[0], metric, seed=0)
        for c in range(1, T):
            ck.step(pol, S[c], 1 / 8, c)  # type: ignore[arg-type]
        out[pol] = distance(S[T][lost], ck.values[lost])
    return out


# ----------------------------------------------------------------------------------------------
# MF


def mf(run: Path) -> None:
    st = States(run, run / "config.yaml")
    n = len(checkpoint.clocks(run / "checkpoints"))
    S = {c: stacked(st.at(c)).astype(np.float64) for c in range(0, n)}
    step = np.array([np.linalg.norm(S[c] - S[c - 1], axis=1) for c in range(1, n)])
    for c in (5, 12, 20):
        v = step[c - 1]
        print(f"clock {c}: per-row change mean {v.mean():.4f}, coefficient of variation {v.std() / v.mean():.2f}, "
              f"rows moving < 10% of the mean {np.mean(v < 0.1 * v.mean()):.3f}")
    for a in (1, 2, 4, 8):
        d = np.linalg.norm(S[20] - S[20 - a], axis=1)
        print(f"age {a}: median distance / (age x one clock's change) {np.median(d / (a * step[19] + 1e-12)):.2f}")
    for T in FAILURES:
        lost = lost_rows(st.at(T), 0.5, np.random.default_rng(1))
        out = perturbations(S, T, lost, "l2", lambda a, b: np.linalg.norm(a - b))
        print(f"failure at {T}: ‖δ‖ " + ", ".join(f"{k} {float(v):.2f}" for k, v in out.items()))


# ----------------------------------------------------------------------------------------------
# LDA


def speeds(name: str, S: dict[int, np.ndarray], n: int) -> None:
    step = {c: scar.row_distance(S[c], S[c - 1], "tv") for c in range(4, n)}  # clocks 1-3 are barriers
    for c in (6, 12, 19, 30):
        if c not in step:
            continue
        v = step[c]
        top = np.sort(v)[::-1]
        share = top[: max(1, v.size // 8)].sum() / max(v.sum(), 1e-12)
        print(f"{name}, clock {c}: per-row tv change mean {v.mean():.2f}, coefficient of variation "
              f"{v.std() / max(v.mean(), 1e-12):.2f}, rows moving < 10% of the mean {np.mean(v < 0.1 * v.mean()):.3f}, "
              f"share of the change in the top 1/8 of rows {share:.2f}")
    for T in FAILURES:
        lost = lost_rows([S[T]], 0.5, np.random.default_rng(1))
        out = perturbations(S, T, lost, "tv", lambda a, b: scar.row_distance(a, b, "tv").sum())
        print(f"{name}, failure at {T}: tv perturbation of the lost half: "
              + ", ".join(f"{k} {float(v):.0f}" for k, v in out.items()))


def offset_persists(run: Path, st: States, docs: Documents, T: int = 19, B: int = 16) -> None:
    live = st.at(T)
    lost = lost_rows(live, 0.5, np.random.default_rng(1))
    mixed = stacked(live).copy()
    mixed[lost] = stacked(st.at(B))[lost]
    work = Path(tempfile.mkdtemp(prefix="bosen-spread-"))
    dst = work / "resumed"
    st.write_resume(dst, T, unstacked(mixed, live))
    c = yaml.safe_load((run / "config.yaml").read_text())
    c["checkpoint"] = {"every_clocks": 1, "keep": 1000, "dir": "checkpoints"}
    c["app"]["args"]["iterations"] = min(int(c["app"]["args"]["iterations"]), 40)
    cfg = work / "c.yaml"
    cfg.write_text(yaml.safe_dump(c, sort_keys=False))
    try:
        _offsets(st, docs, dst, cfg, T, B)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _offsets(st: States, docs: Documents, dst: Path, cfg: Path, T: int, B: int) -> None:
    subprocess.run([sys.executable, "-m", "bosen", "launch", str(cfg), "--quiet", "--no-plot", "--resume", str(dst)],
                   check=True, capture_output=True, cwd=REPO)
    st2 = st.reading(dst)  # the baseline's reader on the resumed run's checkpoints
    docs2 = docs.reading(st2)
    for clock in sorted(checkpoint.clocks(dst / "checkpoints")):
        if clock < T or (clock - T) % 5:
            continue
        regen, _ = docs.counts([p["z"] for p in docs2.parts(clock)])
        e = st2.at(clock)[0].astype(np.int64) - regen[0]
        print(f"word rows lost at {T}, put back to {B}: clock {clock}: servers' counts minus the assignments' "
              f"counts: L1 {int(np.abs(e).sum())}, rows off {int((e != 0).any(axis=1).sum())}")


def lda(run: Path) -> None:
    st = States(run, run / "config.yaml")
    docs = Documents(st, run / "config.yaml")
    n = len(checkpoint.clocks(run / "checkpoints"))
    speeds("documents", {c: docs.ndk(c) for c in range(0, min(n, 32))}, min(n, 32))
    speeds("word rows", {c: stacked(st.at(c)) for c in range(0, min(n, 32))}, min(n, 32))
    offset_persists(run, st, docs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--app", choices=("mf", "lda"), required=True, help="the model the run trained")
    p.add_argument("run", type=Path, help="run directory with a checkpoint at every clock")
    a = p.parse_args(argv)
    {"mf": mf, "lda": lda}[a.app](a.run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
