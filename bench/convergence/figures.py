"""Figures of the convergence benchmark (matplotlib, written as PNG; nothing is shown).

:func:`app_figure` draws one app: objective against epochs, against seconds, and bytes against
epochs, a row per worker count, a line per mode (median over seeds, the band their min and max).
:func:`send_count_figure` draws thesis Fig 3.5 in miniature: for each mode, the share of rows sent
at most n times. :func:`loss_figure` draws the adarev scenario's loss curves.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.convergence.curves import Run, median_curve


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path, dpi: int) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    import matplotlib.pyplot as plt

    plt.close(fig)


def _style(mode: str) -> dict[str, object]:
    if mode == "BS":
        return {"color": "black", "ls": "-", "lw": 2.0}
    if mode.startswith("BS-"):
        return {"ls": ":", "lw": 1.3}
    return {"ls": "--" if mode.endswith("-R") else "-", "lw": 1.5}


def app_figure(path: Path, title: str, ylabel: str, groups: Mapping[int, Mapping[str, Sequence[Run]]],
               targets: Mapping[int, float]) -> None:
    """``groups[P][mode]`` are the runs (one per seed) of a mode at P workers."""
    plt = _pyplot()
    rows = sorted(groups)
    fig, axes = plt.subplots(len(rows), 3, figsize=(15, 4.2 * len(rows)), squeeze=False)
    for r, P in enumerate(rows):
        ax_e, ax_t, ax_b = axes[r]
        for mode, runs in groups[P].items():
            med, lo, hi = median_curve(runs)
            if not med:
                continue
            st = _style(mode)
            epochs = list(range(1, len(med) + 1))
            (line,) = ax_e.plot(epochs, med, label=mode, **st)
            ax_e.fill_between(epochs, lo, hi, color=line.get_color(), alpha=0.15)
            t = [statistics.median(x) for x in zip(*(r.train_times() for r in runs), strict=False)]
            ax_t.plot(t[:len(med)], med[:len(t)], color=line.get_color(), label=mode, **{k: v for k, v in st.items()
                                                                                            if k != "color"})
            b, _, _ = median_curve(runs, "bytes")
            ax_b.plot(list(range(1, len(b) + 1)), [x / 1e6 for x in b], color=line.get_color(), label=mode,
                      **{k: v for k, v in st.items() if k != "color"})
        for ax in (ax_e, ax_t):
            if P in targets:
                ax.axhline(targets[P], color="gray", lw=0.8, ls="-.")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        ax_e.set_xlabel("epoch")
        ax_t.set_xlabel("training seconds (start-up left out)")
        ax_b.set_xlabel("epoch")
        ax_b.set_ylabel("MB sent + received by clients")
        ax_b.grid(alpha=0.3)
        ax_e.set_title(f"{title}, P = {P}: objective per epoch (median of seeds, band min-max)", fontsize=9)
        ax_t.set_title(f"P = {P}: objective vs wall time", fontsize=9)
        ax_b.set_title(f"P = {P}: bytes vs epoch", fontsize=9)
        ax_e.legend(fontsize=7, ncol=2)
    _save(fig, path, 90)


def send_count_figure(path: Path, title: str, hists: Mapping[str, Mapping[int, int]]) -> None:
    """``hists[mode]`` maps n -> rows sent exactly n times; drawn as a CDF over the rows sent."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, h in hists.items():
        if not h:
            continue
        ns = sorted(h)
        total = sum(h.values())
        acc, ys = 0, []
        for n in ns:
            acc += h[n]
            ys.append(acc / total)
        ax.step(ns, ys, where="post", label=f"{mode} ({total} rows, mean {sum(n * h[n] for n in ns) / total:.1f})",
                **_style(mode))
    ax.set_xscale("log")
    ax.set_xlabel("times a row's updates were sent (per client, summed over clients)")
    ax.set_ylabel("share of rows sent at most that often")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    _save(fig, path, 90)


def loss_figure(path: Path, title: str, target: float, groups: Sequence[tuple[str, Sequence[Run]]]) -> None:
    """Loss per epoch (log scale) of every run, one line style per group (the adarev scenario)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (label, runs), style in zip(groups, ["-", "--", ":", "-."], strict=False):
        for run in runs:
            ax.plot(range(1, len(run.objective) + 1), run.objective, style, marker=".",
                    label=f"{label} {run.name}{' (stopped: diverged)' if run.failure else ''}")
    ax.axhline(target, color="gray", lw=0.8, label="target")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss (sum over the epoch)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    _save(fig, path, 110)
