"""How LDA's parameters move between checkpoints, from a run with a checkpoint at every clock: why
priority checkpoints do or do not shrink the perturbation, and why restoring word-topic rows from a
checkpoint leaves an error that never decays (docs/recovery.md, E3-E4 on LDA).

    python bench/recovery.py --app lda ... writes such runs in a temporary directory; to keep one:
    bosen launch CONFIG --run-dir RUN   (configs/lda-news.yaml with 2 servers, test_data "" and
    ``checkpoint: {every_clocks: 1, keep: 1000}``), then ``python bench/recovery_spread_lda.py RUN``

Prints, for documents (SCAR's LDA parameters: doc-topic rows, distance ``tv``) and for word-topic
rows: per-row speed statistics per clock, and the ``tv`` perturbation half the rows lost leaves with
a full checkpoint every 8 clocks and with each policy at r = 1/8. Then it resumes the run at clock
19 with half the word-topic rows put back to clock 16 (``--lose rows``) and measures, at every later
clock, how far the servers' counts are from the counts of the workers' topic assignments.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recovery  # noqa: E402

from bosen import checkpoint, scar  # noqa: E402


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
    for T in (11, 12, 13, 18, 19, 21):
        lost = recovery.lost_rows([S[T]], 0.5, np.random.default_rng(1))
        out = {"full": scar.row_distance(S[T][lost], S[8 * (T // 8)][lost], "tv").sum()}
        for pol in scar.POLICIES:
            ck = scar.RunningCheckpoint(S[0], "tv", seed=0)
            for c in range(1, T):
                ck.step(pol, S[c], 1 / 8, c)  # type: ignore[arg-type]
            out[pol] = scar.row_distance(S[T][lost], ck.values[lost], "tv").sum()
        print(f"{name}, failure at {T}: tv perturbation of the lost half: "
              + ", ".join(f"{k} {float(v):.0f}" for k, v in out.items()))


def offset_persists(run: Path, st: recovery.States, docs: recovery.Documents, T: int = 19, B: int = 16) -> None:
    live = st.at(T)
    lost = recovery.lost_rows(live, 0.5, np.random.default_rng(1))
    mixed = recovery.stacked(live).copy()
    mixed[lost] = recovery.stacked(st.at(B))[lost]
    work = Path(tempfile.mkdtemp(prefix="bosen-spread-"))
    dst = work / "resumed"
    st.write_resume(dst, T, recovery.unstacked(mixed, live))
    c = yaml.safe_load((run / "config.yaml").read_text())
    c["checkpoint"] = {"every_clocks": 1, "keep": 1000, "dir": "checkpoints"}
    c["app"]["args"]["iterations"] = min(int(c["app"]["args"]["iterations"]), 40)
    cfg = work / "c.yaml"
    cfg.write_text(yaml.safe_dump(c, sort_keys=False))
    try:
        _offsets(st, docs, dst, cfg, T, B)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _offsets(st: recovery.States, docs: recovery.Documents, dst: Path, cfg: Path, T: int, B: int) -> None:
    subprocess.run([sys.executable, "-m", "bosen", "launch", str(cfg), "--quiet", "--no-plot", "--resume", str(dst)],
                   check=True, capture_output=True, cwd=recovery.REPO)
    st2 = object.__new__(recovery.States)  # the baseline's reader on the resumed run's checkpoints
    st2.__dict__.update(st.__dict__)
    st2.run_dir, st2.base, st2._cache = dst, dst / "checkpoints", {}
    for clock in sorted(checkpoint.clocks(dst / "checkpoints")):
        if clock < T or (clock - T) % 5:
            continue
        regen, _ = docs.counts([p["z"] for p in recovery.Documents.parts(_with(docs, st2), clock)])
        e = st2.at(clock)[0].astype(np.int64) - regen[0]
        print(f"word rows lost at {T}, put back to {B}: clock {clock}: servers' counts minus the assignments' "
              f"counts: L1 {int(np.abs(e).sum())}, rows off {int((e != 0).any(axis=1).sum())}")


def _with(docs: recovery.Documents, st: recovery.States) -> recovery.Documents:
    """``docs`` reading another run's worker parts."""
    d = object.__new__(recovery.Documents)
    d.__dict__.update(docs.__dict__)
    d.states = st
    d._cache = {}
    return d


def main(run: Path) -> None:
    recovery.APP = recovery.APPS["lda"]
    st = recovery.States(run, run / "config.yaml")
    docs = recovery.Documents(st, run / "config.yaml")
    n = len(checkpoint.clocks(run / "checkpoints"))
    speeds("documents", {c: docs.ndk(c) for c in range(0, min(n, 32))}, min(n, 32))
    speeds("word rows", {c: recovery.stacked(st.at(c)) for c in range(0, min(n, 32))}, min(n, 32))
    offset_persists(run, st, docs)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
