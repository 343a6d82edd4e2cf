"""Markdown tables of ``bench/recovery.py``'s JSON lines (for docs/recovery.md).

``python bench/recovery.py > out.jsonl; python bench/recovery_table.py out.jsonl``
"""

from __future__ import annotations

import json
import sys

import numpy as np


def main(path: str) -> None:
    recs = [json.loads(x) for x in open(path) if x.strip().startswith("{")]
    per: dict[str, list[float]] = {}
    delta: dict[str, list[float]] = {}
    for r in recs:
        if "/seed" in r["case"] and r.get("metric") == "rework":
            key = r["case"].rsplit("/seed", 1)[0]
            per.setdefault(key, []).append(r["value"])
            if "perturbation_tv" in r:  # count rows (LDA): the summed scaled total variation
                delta.setdefault(key, []).append(r["perturbation_tv"])
            elif "perturbation_l2" in r:
                delta.setdefault(key, []).append(r["perturbation_l2"])
    med = {k: {"median": float(np.median(v)), "min": min(v), "max": max(v), "reps": len(v)} for k, v in per.items()}
    full = med["full"]["median"]
    norm = "tv" if any("perturbation_tv" in r for r in recs) else "‖δ‖"

    def cell(key: str) -> str:
        m = med[key]
        d = f", {norm} {np.median(delta[key]):.{0 if norm == 'tv' else 1}f}" if key in delta else ""
        return f"{m['median']:.2f} ({m['min']:.2f}–{m['max']:.2f}, n={m['reps']}{d})"

    def cut(key: str) -> str:
        return f"{100 * (1 - med[key]['median'] / full):.0f}%"

    lows = {"0.25": (59, 89), "0.5": (31, 62), "0.75": (12, 42)}
    print("| lost | full restart: rework | partial recovery: rework | cut | thesis' cut | met |")
    print("|---|---|---|---|---|---|")
    for f in ("0.25", "0.5", "0.75"):
        if f"partial/f={f}" not in med:
            continue
        c = 100 * (1 - med[f"partial/f={f}"]["median"] / full)
        lo, hi = lows[f]
        print(f"| {f} | {cell('full')} | {cell(f'partial/f={f}')} | {c:.0f}% | {lo}–{hi}% | {c >= lo} |")
    if "control" in med:
        print(f"\nNothing lost (resumed at the failure clock as saved): {cell('control')} clocks.\n")
    print("| r (fraction saved) | every | priority | round_robin | random |")
    print("|---|---|---|---|---|")
    if "partial/f=0.5" in med:
        c = cell("partial/f=0.5")
        print(f"| 1 (full) | 8 | {c} | {c} | {c} |")
    for r, every in (("0.5", 4), ("0.25", 2), ("0.125", 1)):
        row = [cell(f"priority/{p}/r={r}") + f" [{cut(f'priority/{p}/r={r}')}]"
               if f"priority/{p}/r={r}" in med else "–" for p in ("priority", "round_robin", "random")]
        print(f"| {r} | {every} | " + " | ".join(row) + " |")
    for r in recs:
        if r["case"].startswith("cost/"):
            print(f"\n{r['case']}: clock time ratio {r['median']:.3f} ({r['min']:.3f}–{r['max']:.3f}), "
                  f"{r['clock_s']['median'] * 1e3:.2f} ms vs {r['clock_s_without']['median'] * 1e3:.2f} ms, "
                  f"met {r['met']}"
                  + (f", servers' save s/clock {r['server_save_s_per_clock']['median'] * 1e3:.2f} ms"
                     if "server_save_s_per_clock" in r else ""))
        if r["case"].startswith("e2e/"):
            print(f"\n{r['case']}: {r}")


if __name__ == "__main__":
    main(sys.argv[1])
