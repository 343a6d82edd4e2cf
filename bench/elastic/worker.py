"""One worker of ``bench.elastic``'s move case: ``python -m bench.elastic.worker CONFIG OUT``.

Each tick reads ``ROWS_PER_TICK`` random rows of table E, adds to them, and clocks, until the file
OUT.stop exists; the wall time of every clock goes to OUT (JSON), from which the bench reads how long
training stalled while partitions moved."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from bosen.client import Client

ROWS_PER_TICK = 256


def main() -> None:
    config, out = sys.argv[1], Path(sys.argv[2])
    stop = out.with_suffix(".stop")
    with Client.connect(config) as client:
        E = client.table("E")
        rng = np.random.default_rng(client.rank)
        times = []
        while not stop.exists():
            rows = np.unique(rng.integers(0, E.rows, ROWS_PER_TICK))
            vals = E.get_rows(rows)
            E.inc_rows(rows, np.full_like(vals, 0.5))
            client.clock()
            times.append(time.time())
    with open(out, "w") as f:
        json.dump({"clock_times": times}, f)


if __name__ == "__main__":
    main()
