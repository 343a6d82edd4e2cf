"""A worker of a table with backup workers whose gradients say who sent them and of which iteration
(tests/server/test_backup.py).

Table ``G`` (float64, 2 x (P + 1) for P workers): at iteration t the worker's gradient is 1 in row 0,
column ``rank`` (who), and t in row 1, column 0 (which iteration it was computed on). Steps are
lr_k/k times the sum of the accepted gradients, so the final table says exactly which gradients were
applied: nothing twice, none of a past iteration. Round trips are injected (bosen.apps.delays);
``--die-at`` ends the process without BYE in the middle of an iteration.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from bosen.apps.backup import read_iteration
from bosen.apps.delays import DelayArgs, Delays
from bosen.client import Client

p = argparse.ArgumentParser()
p.add_argument("--config", required=True)
p.add_argument("--rank", type=int, required=True)
p.add_argument("--iterations", type=int, required=True)
p.add_argument("--mean-s", type=float, default=0.0)
p.add_argument("--alpha", type=float, default=1.0)
p.add_argument("--slow-from", type=int, default=-1)
p.add_argument("--die-at", type=int, default=-1, help="exit without a word mid-iteration (after its read)")
p.add_argument("--out", default="", help="write the last value read (.npy): the final table")
p.add_argument("--start-together", default="", help="a folder: wait until every rank has joined (a file each "
               "there) before the first read, so that no rank starts after the others have finished")
args = p.parse_args()

with Client.connect(args.config, rank=args.rank) as client:
    G = client.table("G")
    n = client.num_workers
    rows = np.arange(2, dtype=np.int64)
    delays = Delays(DelayArgs(mean_s=args.mean_s, alpha=args.alpha, seed=1, slow_from=args.slow_from),
                    client.rank, n)
    if args.start_together:
        here = Path(args.start_together)
        here.mkdir(parents=True, exist_ok=True)
        (here / str(client.rank)).touch()
        while len(list(here.iterdir())) < n:
            time.sleep(0.005)
    while True:
        W, it = read_iteration(client, G, rows)
        if it >= args.iterations:
            if args.out:
                np.save(args.out, W)
            break
        if it == args.die_at:
            os._exit(3)
        t0 = time.perf_counter()
        g = np.zeros((2, n + 1))
        g[0, client.rank] = 1.0
        g[1, 0] = float(it)
        delays.wait(it, t0)
        G.inc_rows(rows, g)
        client.clock()
