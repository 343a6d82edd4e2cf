"""An app for checkpoint tests, run by ``bosen launch`` as ``python -m checkpoint_worker``.

Each tick t: add ``t + 1`` to column ``rank`` of every row of the int64 table W, read every row
(so SSP bounds how far ahead a worker runs), clock. So a state that holds exactly the ticks < B
has B(B+1)/2 in every cell. The worker's checkpoint state is its tick; ``app.args`` can make one
rank slower, or SIGKILL itself at a tick (after the checkpoints before it are on disk; a replacement
for it, started with ``$BOSEN_REJOIN``, does not unless ``die_again``).
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
from bosen.apps.state import restored
from bosen.client import Client
from bosen.config import from_dict


@dataclass(frozen=True)
class Args:
    ticks: int = 12
    slow_rank: int = -1
    slow_s: float = 0.0  # extra sleep per tick of ``slow_rank``
    die_at: int = -1  # tick at which rank ``die_rank`` kills itself (``ticks``: after it left the job)
    die_rank: int = 0
    die_again: bool = False  # its replacements die at that tick too (the launcher gives up after 3)


def train(client: Client, args: Mapping[str, Any]) -> None:
    a = from_dict(Args, args, "app.args")
    W = client.table("W")
    rows = np.arange(W.rows)
    tick = 0
    client.checkpoint_state(lambda: {"tick": np.array([tick])})
    saved = restored(client.restored_state(), ("tick",))
    if saved is not None:
        tick = int(saved["tick"][0])
        assert tick == client.tick, (tick, client.tick)
    while tick < a.ticks:
        if tick == a.die_at and client.rank == a.die_rank and (a.die_again or not os.environ.get("BOSEN_REJOIN")):
            time.sleep(0.5)  # the parts of the checkpoint before reach the disk
            os.kill(os.getpid(), signal.SIGKILL)
        deltas = np.zeros((W.rows, W.cols), dtype=W.dtype)
        deltas[:, client.rank] = tick + 1
        W.inc_rows(rows, deltas)
        vals = W.get_rows(rows)
        client.report(objective=float(vals.sum()), samples=1)
        if client.rank == a.slow_rank:
            time.sleep(a.slow_s)
        tick += 1
        client.clock()
    if a.die_at == a.ticks and client.rank == a.die_rank and not os.environ.get("BOSEN_REJOIN"):
        client.close()  # it left the job, its work done, and is killed on its way out
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    run_app(train)
