"""A tiny app for launcher tests, run as ``python -m launch_worker`` (tests/workers on PYTHONPATH).

Each tick: add ``rank + 1`` to column ``rank`` of every row, read the rows, report fixed metrics,
clock. ``app.args`` can make one worker SIGKILL itself or raise at a given tick.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bosen.apps.runner import run_app
from bosen.client import Client
from bosen.config import from_dict


@dataclass(frozen=True)
class Args:
    ticks: int = 4
    die_at: int = -1  # tick at which worker ``die_rank`` kills itself with SIGKILL
    die_rank: int = 0
    marker: str = ""  # file that gets the time of death
    sleep_s: float = 0.0  # per tick


def train(client: Client, args: Mapping[str, Any]) -> None:
    a = from_dict(Args, args, "app.args")
    W = client.table("W")
    rows = np.arange(W.rows)
    for t in range(a.ticks):
        if t == a.die_at and client.rank == a.die_rank:
            if a.marker:
                with open(a.marker, "w") as f:
                    f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        deltas = np.zeros((W.rows, W.cols), dtype=W.dtype)
        deltas[:, client.rank] = client.rank + 1
        W.inc_rows(rows, deltas)
        vals = W.get_rows(rows)
        own = int(vals[0, client.rank])
        client.report(objective=float(client.rank + 1), samples=10, own_ok=int(own == (t + 1) * (client.rank + 1)))
        if a.sleep_s:
            time.sleep(a.sleep_s)
        client.clock()


if __name__ == "__main__":
    run_app(train)
