"""Markdown tables of a convergence run, for docs/evaluation.md.

    python bench/convergence.py --scenario lda > lda.jsonl
    python bench/evaluation_table.py lda.jsonl [mf.jsonl ...]

Reads the JSON lines ``bench/convergence.py`` printed and writes, per app and worker count, one row
per mode (medians over seeds) and then every goal line with whether it was met.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any


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


def tables(records: Iterable[dict[str, Any]]) -> str:
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
                   "| staleness of reads (clocks) |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
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
                f" | {_f(m.get('read_staleness_mean'), '{:.2f}')} |")
        goals = [r for r in rs if "goal" in r]
        if goals:
            out.append("")
            out.append("| goal | ours | baseline | ratio | met |")
            out.append("|---|---|---|---|---|")
            for g in goals:
                ours = f"{_f(g.get('ours'), '{:.3g}')} {g.get('unit', '')}" + (
                    f" ({g['ours_name']})" if g.get("ours_name") else "")
                base = f"{_f(g.get('baseline'), '{:.3g}')} ({g.get('baseline_name', '')})"
                out.append(f"| {g['goal']} | {ours} | {base} | {_f(g.get('ratio'), '{:.2f}')} | {_f(g['met'])} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    a = p.parse_args(argv)
    recs = []
    for f in a.files:
        for line in f.read_text().splitlines():
            if line.strip().startswith("{"):
                recs.append(json.loads(line))
    sys.stdout.write(tables(recs) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
