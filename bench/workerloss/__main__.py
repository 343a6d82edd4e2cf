"""``python -m bench.workerloss [--app mf|lda] [--repeats N]``: a worker SIGKILL in a checkpointed
job against failure-free runs (bench/workerloss/__init__.py); one JSON line per app."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.common import emit, log
from bench.workerloss import JOBS, measure


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.workerloss", description=__doc__)
    p.add_argument("--app", choices=sorted(JOBS), action="append", help="default: mf and lda")
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--every", type=int, default=5, help="checkpoint every this many clocks")
    p.add_argument("--at", type=int, default=0, help="kill worker 1 once it reported this clock (default: epochs/2)")
    p.add_argument("--repeats", type=int, default=3, help="failure-free and failure runs each (alternated)")
    a = p.parse_args()
    for name in a.app or ["mf", "lda"]:
        with tempfile.TemporaryDirectory(prefix=f"workerloss-{name}-") as d:
            log(f"{name}: {a.repeats} failure-free and {a.repeats} failure runs")
            emit(**measure(JOBS[name], Path(d), epochs=a.epochs, every=a.every, at=a.at or a.epochs // 2,
                           repeats=a.repeats))


if __name__ == "__main__":
    main()
