"""How MF's rows move between checkpoints, from a run with a checkpoint at every clock: why priority
checkpoints do or do not shrink the perturbation (docs/recovery.md, E4).

    bosen launch CONFIG --run-dir RUN --set checkpoint.every_clocks=1 ...   (configs/mf-movielens.yaml
    with ``checkpoint: {every_clocks: 1, keep: 1000}``), then ``python bench/recovery_spread.py RUN``

Prints per-row speed statistics, how distance grows with a row's age, and the norm of the perturbation
half the rows lost leaves with a full checkpoint every 8 clocks and with each policy at r = 1/8.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recovery  # noqa: E402

from bosen import scar  # noqa: E402


def main(run: Path) -> None:
    st = recovery.States(run, run / "config.yaml")
    n = len(recovery.checkpoint.clocks(run / "checkpoints"))
    S = {c: recovery.stacked(st.at(c)).astype(np.float64) for c in range(0, n)}
    step = np.array([np.linalg.norm(S[c] - S[c - 1], axis=1) for c in range(1, n)])
    for c in (5, 12, 20):
        v = step[c - 1]
        print(f"clock {c}: per-row change mean {v.mean():.4f}, coefficient of variation {v.std() / v.mean():.2f}, "
              f"rows moving < 10% of the mean {np.mean(v < 0.1 * v.mean()):.3f}")
    for a in (1, 2, 4, 8):
        d = np.linalg.norm(S[20] - S[20 - a], axis=1)
        print(f"age {a}: median distance / (age x one clock's change) {np.median(d / (a * step[19] + 1e-12)):.2f}")
    for T in (11, 12, 13, 18, 19, 21):
        lost = recovery.lost_rows(st.at(T), 0.5, np.random.default_rng(1))
        out = {"full": np.linalg.norm((S[T] - S[8 * (T // 8)])[lost])}
        for pol in scar.POLICIES:
            ck = scar.RunningCheckpoint(S[0], seed=0)
            for c in range(1, T):
                ck.step(pol, S[c], 1 / 8, c)  # type: ignore[arg-type]
            out[pol] = np.linalg.norm((S[T] - ck.values)[lost])
        print(f"failure at {T}: ‖δ‖ " + ", ".join(f"{k} {float(v):.2f}" for k, v in out.items()))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
