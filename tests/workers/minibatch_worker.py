"""A worker that runs mini-batches within clock 0 and never clocks until told: the mid-clock test.

``--role writer``: waits for the file ``DIR/go``, adds VALUE to row ROW (its one mini-batch), then
waits for ``DIR/done`` before it clocks and leaves.

``--role reader``: reads every row (subscribing to them), writes ``DIR/go``, then runs mini-batches:
each reads the rows from the cache and adds 1 to row ``ROW + 1`` (its own update), until one read
holds VALUE in row ROW or ``--max-batches`` ran. Writes ``DIR/result.json`` (the first mini-batch
that saw the value, its tick then, the read counters, the servers' clocks), then ``DIR/done``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bosen.client import Client

ROW = 3
VALUE = 7.0


def _wait_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.005)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--role", choices=["writer", "reader"], required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--max-batches", type=int, default=2000)
    a = p.parse_args()
    d = Path(a.dir)
    client = Client.connect(a.config)
    try:
        W = client.table("W")
        rows = np.arange(W.rows, dtype=np.int64)
        if a.role == "writer":
            _wait_file(d / "go")
            W.inc_row(ROW, np.full(W.cols, VALUE))
            _wait_file(d / "done")
        else:
            W.get_rows(rows)  # subscribe to every row
            (d / "go").write_text("")
            seen = None
            batches = 0
            while batches < a.max_batches:
                vals = W.get_rows(rows)
                if vals[ROW, 0] == VALUE:
                    seen = batches
                    break
                W.inc_row(ROW + 1, np.ones(W.cols))
                batches += 1
                time.sleep(0.005)
            st = client.stats()
            result = {"seen_at": seen, "batches": batches, "tick": client.tick, "server_clocks": st["server_clocks"],
                      "rows_read": st["rows_read"], "rows_read_early": st["rows_read_early"],
                      "read_staleness_sum": st["read_staleness_sum"]}
            (d / "result.json").write_text(json.dumps(result))
            (d / "done").write_text("")
        client.clock()
    finally:
        client.close()


if __name__ == "__main__":
    main()
