"""The simulator's figure (``python -m bench.pollux --experiments sim --plot docs/img/pollux-sim.png``):
average JCT per policy and trace, and the CDF of finish-time fairness ρ."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def sim_figure(results: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(results)
    traces = len(next(iter(results.values())))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ys = [r["avg_jct_h"] for r in results[name]]
        ax.bar(np.arange(traces) + i * width, ys, width, label=name)
    ax.set_xticks(np.arange(traces) + 0.4 - width / 2, [str(t) for t in range(traces)])
    ax.set_xlabel("trace (seed)")
    ax.set_ylabel("average JCT, hours")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    for name in names:
        rho = np.sort(np.concatenate([r["rho"] for r in results[name]]))
        bx.step(rho, np.arange(1, rho.size + 1) / rho.size, where="post", label=name)
    bx.set_xscale("log")
    bx.set_xlabel("finish-time fairness ρ (JCT / alone on W/N̄ workers)")
    bx.set_ylabel("fraction of jobs")
    bx.axvline(1.0, color="gray", lw=0.5)
    bx.legend(fontsize=7)
    fig.suptitle("Pollux's scheduler in the simulator (bench/pollux/sim.py)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
