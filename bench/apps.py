"""App kernel speed beside well-known libraries, on the same data in the same run (docs/design.md,
"Benchmarks").

``bench/apps_<app>.py`` does the measuring for each app (see their docstrings for the baselines and why):
MF (ratings/s vs numpy mini-batch SGD), MLR (samples/s vs PyTorch softmax SGD, plus 2-vs-1 worker
scaling), LDA (tokens/s vs the ``lda`` package's collapsed Gibbs sampler at K=20/100/1000, plus
scaling). Baselines that are not installed are reported as missing, not skipped silently:
``pip install lda==3.0.2 torch==2.13.0`` (torch: the local CPU build).

    python bench/apps.py [--quick] [--only mf,mlr,lda]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, log  # noqa: E402

APPS = ("mf", "mlr", "lda")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small data (CI)")
    ap.add_argument("--only", default=",".join(APPS), help="comma-separated subset of " + ",".join(APPS))
    args = ap.parse_args()
    for app in args.only.split(","):
        if app not in APPS:
            raise SystemExit(f"bench/apps.py: unknown app {app!r} (one of {', '.join(APPS)})")
        log(f"apps: {app} ...")
        bench = importlib.import_module(f"apps_{app}")  # bench/apps_<app>.py, beside this file
        for rec in bench.run_bench(args.quick):
            emit(**{"bench": "apps", **rec})


if __name__ == "__main__":
    main()
