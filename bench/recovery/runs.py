"""The jobs of the recovery experiments and how their objective is read (``python -m bench.recovery``).

``App`` names a model the experiments run on (MF on MovieLens-100K, LDA on the news corpus);
``write_job`` writes its config with a checkpoint section, ``launch`` runs it through ``bosen launch``
(fresh or ``--resume``), ``curve`` and ``clocks_to`` read how far its objective got, and when.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.common import REPO
from bosen import scar


@dataclass(frozen=True)
class App:
    """One model the experiments run on: its job, how its objective improves, and its row distance."""

    name: str              # the records' "app"
    config: str            # under configs/
    epochs_arg: str        # app.args key for the number of passes
    maximize: bool         # the objective improves upwards (a log-likelihood)
    metric: scar.Metric    # the running checkpoint's row distance
    args: tuple[tuple[str, Any], ...] = ()  # app.args overrides
    servers: int = 0       # 0: as the config has them

    @property
    def prefix(self) -> str:
        return "recovery" if self.name == "mf-movielens" else f"recovery_{self.name.split('-')[0]}"


APPS: dict[str, App] = {
    "mf": App("mf-movielens", "mf-movielens.yaml", "epochs", False, "l2"),
    # seconds a run: K = 20 as configured, held-out scoring off (the objective is the training log-likelihood)
    "lda": App("lda-news", "lda-news.yaml", "iterations", True, "tv",
               args=(("test_data", ""), ("eval_every", 0), ("save_model", False)), servers=2),
}


def write_job(app: App, path: Path, epochs: int, every_clocks: int | None, keep: int = 1000) -> Path:
    """``app``'s config with absolute data paths, ``epochs`` passes and a checkpoint section."""
    c = yaml.safe_load((REPO / "configs" / app.config).read_text())
    a = c["app"]["args"]
    a.update(dict(app.args))
    for k in ("data", "test_data"):
        if a.get(k):
            a[k] = str((REPO / a[k]).resolve())
    a[app.epochs_arg] = epochs
    if app.servers:
        c["cluster"]["servers"] = ["127.0.0.1:0"] * app.servers
    c["checkpoint"] = {"every_clocks": every_clocks or 100000, "keep": keep, "dir": "checkpoints"}
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path



def launch(cfg: Path, run_dir: Path, *, resume: bool = False, timeout: float = 300.0,
           kinds: tuple[str, ...] = ("clock",)) -> list[dict[str, Any]]:
    """Run ``bosen launch`` (a fresh run, or ``--resume`` of ``run_dir``); its records of ``kinds``."""
    cmd = [sys.executable, "-m", "bosen", "launch", str(cfg), "--quiet", "--no-plot", "--timeout", str(timeout)]
    cmd += ["--resume", str(run_dir)] if resume else ["--run-dir", str(run_dir)]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout + 60)
    if p.returncode != 0:
        raise RuntimeError(f"bosen launch {'--resume ' if resume else ''}{run_dir} failed ({p.returncode}):\n"
                           f"{p.stdout[-3000:]}{p.stderr[-3000:]}")
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in recs if r.get("kind") in kinds]


def curve(records: list[dict[str, Any]]) -> np.ndarray:
    """Training objective per clock (index = clock; NaN where a clock has none, e.g. LDA's barriers)."""
    obj = np.full(max(r["clock"] for r in records) + 1, np.nan)
    for r in records:
        obj[r["clock"]] = r.get("objective", np.nan)
    return obj


def clocks_to(obj: np.ndarray, target: float, after: int, maximize: bool) -> float:
    """Clock (fractional, interpolated) at which ``obj`` first reaches ``target`` among clocks >=
    ``after`` (at or below it; at or above it when ``maximize``, default: the app's sense); inf if
    it never does."""
    up = maximize
    o = -obj if up else obj  # reaching a maximized target = the negated objective falling to -target
    t = -target if up else target
    for k in range(max(after, 1), o.shape[0]):
        if o[k] <= t:
            prev = o[k - 1]
            if k - 1 >= after and np.isfinite(prev) and prev > t:
                return k - 1 + (prev - t) / (prev - o[k])
            return float(k)
    return float("inf")
