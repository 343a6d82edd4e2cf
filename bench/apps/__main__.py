"""App kernels beside the strongest libraries at equal quality, and whole jobs beside the bare kernel
(issue 17; docs/design.md, "Benchmarks").

``bench/apps/<app>.py`` does the measuring for each app (their docstrings give the method):

- LDA on the news corpus at K = 20, 100, 1000: tokens/s and time to equal log p(w, z) beside tomotopy
  (fixed priors, 1 and 2 threads) and the ``lda`` package;
- MF on MovieLens-100K and ~2M synthetic ratings: ratings/s, epochs and time to scikit-surprise
  ``SVD(biased=False)``'s test RMSE;
- MLR on Fashion-MNIST: time to scikit-learn ``LogisticRegression``'s held-out accuracy, beside
  ``SGDClassifier(loss="log_loss")``;
- each app's data through ``bosen launch`` with 1 and 2 workers beside the bare kernel doing the same
  work, with where a clock's extra time goes; LDA jobs beside tomotopy on Reuters and news;
- ``minibatch``: one mini-batch per clock against eight, per worker-thread CPU, for every app.

Every goal is a record with ``goal`` and ``met``. Peers come from the ``bench`` extra
(``pip install -e '.[bench]'``) and data from ``bosen data NAME``; a missing one is reported as
missing, not skipped silently.

    python -m bench.apps [--quick] [--only mf,mlr,lda,minibatch]
"""

from __future__ import annotations

import argparse
import importlib

from bench.common import emit, log

APPS = ("mf", "mlr", "lda", "minibatch")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small data (CI)")
    ap.add_argument("--only", default=",".join(APPS), help="comma-separated subset of " + ",".join(APPS))
    args = ap.parse_args()
    for app in args.only.split(","):
        if app not in APPS:
            raise SystemExit(f"bench.apps: unknown app {app!r} (one of {', '.join(APPS)})")
        log(f"apps: {app} ...")
        bench = importlib.import_module(f"bench.apps.{app}")  # bench/apps/<app>.py
        for rec in bench.run_bench(args.quick):
            emit(**{"bench": "apps", **rec})


if __name__ == "__main__":
    main()
