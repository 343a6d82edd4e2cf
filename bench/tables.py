"""Markdown tables of a benchmark's JSON lines, for the docs.

    python -m bench.convergence --scenario lda > lda.jsonl
    python -m bench.tables evaluation lda.jsonl [mf.jsonl ...]     (docs/evaluation.md)
    python -m bench.recovery > out.jsonl
    python -m bench.tables recovery out.jsonl                      (docs/recovery.md)

``evaluation``: per app and worker count of a convergence run, one row per mode (medians over seeds)
and then every goal line with whether it was met. ``recovery``: rework of full restart against
partial recovery per lost fraction, priority checkpoints per policy and r, then the cost and
end-to-end lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np


def _f(v: Any, fmt: str = "{:.3g}") -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float | int):
        return fmt.format(v)
    return str(v)


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


def evaluation(records: Iterable[dict[str, Any]]) -> str:
    """The convergence run's tables (docs/evaluation.md) as markdown."""
    recs = [r for r in records if r.get("bench") == "convergence" and "app" in r]
    out: list[str] = []
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault((r["app"], r["workers"]), []).append(r)
    for (app, P), rs in groups.items():
        modes = [r for r in rs if r.get("metric") == "epochs_to_target_median"]
        if not modes:
            continue
        out.append(f"#### {app.upper()}, P = {P} ({modes[0].get('seeds')} seeds, {modes[0]['epochs_run']} epochs)\n")
        out.append("| mode | epochs to target, median [min–max] | reached | vs BS (epochs) | training s to target "
                   "| vs BS (s) | s / epoch | MB / epoch | budget used | reads of mid-clock values "
                   "| staleness of reads (clocks) | updates missing per row read | content age (ms) |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for m in modes:
            name = m["case"].split("/", 2)[2]
            seeds = m.get("seeds", 1)
            lo, hi = _f(m.get("epochs_min"), "{:g}"), _f(m.get("epochs_max"), "{:g}")
            out.append(
                f"| {name} | {_f(m['ours'], '{:g}')} [{lo}–{hi}]"
                f" | {m.get('reached')}/{seeds} | {_f(m.get('ratio'), '{:.2f}x')} | {_f(m.get('seconds'), '{:.2f}')}"
                f" | {_f(m.get('seconds_ratio'), '{:.2f}x')} | {_f(m.get('seconds_per_epoch'), '{:.3f}')}"
                f" | {_f((m.get('bytes_per_epoch') or 0) / 1e6 if m.get('bytes_per_epoch') else None, '{:.2f}')}"
                f" | {_pct(m.get('budget_use'))} | {_pct(m.get('early_read_share'))}"
                f" | {_f(m.get('read_staleness_mean'), '{:.2f}')}"
                f" | {_f(m.get('missing_updates_per_read'), '{:.3g}')}"
                f" | {_f(m.get('content_age_ms'), '{:.3g}')} |")
        goals = [r for r in rs if "goal" in r]
        if goals:
            out.append("")
            out.append("| goal | ours | baseline | ratio | met |")
            out.append("|---|---|---|---|---|")
            for g in goals:
                ours = f"{_f(g.get('ours'), '{:.3g}')} {g.get('unit', '')}" + (
                    f" ({g['ours_name']})" if g.get("ours_name") else "")
                base = (f"{_f(g.get('baseline'), '{:.3g}')} ({g['baseline_name']})" if g.get("baseline_name")
                        else "–")
                out.append(f"| {g['goal']} | {ours} | {base} | {_f(g.get('ratio'), '{:.2f}')} | {_f(g['met'])} |")
        out.append("")
    return "\n".join(out)


def recovery(recs: list[dict[str, Any]]) -> None:
    """Print the recovery run's tables (docs/recovery.md) as markdown."""
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



def read_records(files: Iterable[Path]) -> list[dict[str, Any]]:
    """Every JSON line of ``files`` (other lines, e.g. progress, are skipped)."""
    recs = []
    for f in files:
        for line in f.read_text().splitlines():
            if line.strip().startswith("{"):
                recs.append(json.loads(line))
    return recs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="kind", required=True)
    sub.add_parser("evaluation", help="python -m bench.convergence's lines").add_argument("files", nargs="+", type=Path)
    sub.add_parser("recovery", help="python -m bench.recovery's lines").add_argument("file", type=Path)
    a = p.parse_args(argv)
    if a.kind == "evaluation":
        sys.stdout.write(evaluation(read_records(a.files)) + "\n")
    else:
        recovery(read_records([a.file]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
