"""Exactness under managed communication, one worker process (tests/client/test_exactness.py).

Every process of the job follows a schedule that is a pure function of ``(seed, rank)``
(:func:`schedule`), so each worker knows every process's updates exactly, in order, and which tick
made each of them; only the timing (seeded random sleeps between operations) differs from run to run.

Two tables, ``I`` (an integer table) and ``F`` (float32; travels as float16 where ``comm.wire_dtype``
says so), each ``ROWS x (P + 1)`` for P worker processes:

* column ``q < P`` is written by process q only. Rows ``0 .. SHARED-1`` are written by every
  process (each in its own column): a row pushed to one process carries the others' updates.
  The other rows are private: row r is written only by process ``(r - SHARED) % P`` (the server
  pushes them to nobody who wrote them; decision 3 of docs/design.md).
* column P of ``I`` (the "mixed" column) is written by every process into the same cell: process q
  adds positive multiples of ``BASE**q``, and its contribution stays below ``BASE``, so the cell
  decomposes uniquely into per-process parts (base-``BASE`` digits).

An update is one ``inc``/``inc_rows`` call; its per-cell amount is what that call added to the cell
(a COO call may list a cell twice). For every read at tick c (staleness s) and every cell:

* the reading process's own part equals the sum of all its own updates so far (read-my-writes);
* another process q's part is a prefix sum of q's updates to that cell, ``S_q[n]``, with n at least
  the number of q's updates of ticks < c - s (the SSP guarantee) and at most the number of its
  updates of ticks <= c + s (q reads first in every tick, and that read cannot be satisfied before
  this process reaches q's tick - s, so q cannot have made more).

So every value read is "a server value plus exactly this process's updates not yet in it". For the
float table, deltas are multiples of 1/8 whose per-cell absolute sums stay below 256: every partial
sum the client buffer can hold is m/8 with |m| < 2048, exactly representable in float16 (11 bits),
so quantization (``client/encode.py`` ``quantize``) leaves no residual and the check is exact, not
within a bound; float32 sums of such values are exact too.

With ``--residual`` the float deltas also carry an odd multiple of 2**-13 (exact in float32 and in
all float32 sums here; not in float16 at magnitudes of 1/4 and more, where its ulp is 2**-12 or
coarser): quantization then leaves a residual in the sender's buffer, which goes out with a later
send. The reader's own part must still be exact, and so must the final tables; another process's
part must lie within ``RESIDUAL_TOL`` (half a float16 ulp of an amount below 256: the residual its
buffer holds) of an allowed prefix sum.

Violations go to a JSON result file with the process's own final contributions; the exit status is 0
when the run itself completed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np

ROWS = 12
SHARED = 6
BASE = 1 << 10  # digit base of the mixed column (int32 holds three digits)
OPS_PER_TICK = 4
RESIDUAL_TOL = 2.0**-4  # half of float16's ulp 2**-3 in [128, 256)


@dataclass
class Op:
    kind: str  # "read_rows", "read_row", "read_one", "inc_dense", "inc_coo", "inc_one"
    table: str
    rows: list[int]
    cols: list[int] = field(default_factory=list)
    deltas: list[float] = field(default_factory=list)  # dense: len(rows) * (P + 1), row-major; else per entry
    sleep_ms: float = 0.0


def rows_of(rank: int, procs: int) -> list[int]:
    return list(range(SHARED)) + [r for r in range(SHARED, ROWS) if (r - SHARED) % procs == rank]


def schedule(seed: int, rank: int, procs: int, ticks: int, max_sleep_ms: float,
             residual: bool = False) -> list[list[Op]]:
    """Process ``rank``'s operations, per tick. Every tick begins with a read (see the module doc)."""
    rng = random.Random(seed * 7919 + rank)
    mine = rows_of(rank, procs)
    cols = procs + 1
    out: list[list[Op]] = []
    for _ in range(ticks):
        ops: list[Op] = [Op("read_rows", rng.choice("IF"), sorted(rng.sample(range(ROWS), rng.randint(1, ROWS))))]
        for _ in range(OPS_PER_TICK):
            table = rng.choice("IF")
            kind = rng.choice(["read_rows", "read_row", "read_one", "inc_dense", "inc_coo", "inc_one", "inc_dense"])
            if kind.startswith("read"):
                rows = sorted(rng.sample(range(ROWS), rng.randint(1, ROWS) if kind == "read_rows" else 1))
                ops.append(Op(kind, table, rows, cols=[rng.randrange(cols)]))
                continue
            k = rng.randint(1, len(mine)) if kind != "inc_one" else 1
            rows = sorted(rng.sample(mine, k))
            if kind == "inc_dense":
                d = np.zeros((k, cols))
                for i, r in enumerate(rows):
                    d[i, rank] = delta(rng, table, residual)
                    if table == "I" and r < SHARED and rng.random() < 0.5:
                        d[i, procs] = rng.randint(1, 2) * BASE**rank
                ops.append(Op(kind, table, rows, deltas=d.ravel().tolist()))
            elif kind == "inc_coo":  # each cell twice: the call's amount is the sum
                rr, cc, dd = [], [], []
                for r in rows:
                    for _ in range(2):
                        rr.append(r)
                        cc.append(rank)
                        dd.append(delta(rng, table, residual))
                    if table == "I" and r < SHARED:
                        rr.append(r)
                        cc.append(procs)
                        dd.append(BASE**rank)
                ops.append(Op(kind, table, rr, cols=cc, deltas=dd))
            else:
                ops.append(Op(kind, table, rows, cols=[rank], deltas=[delta(rng, table, residual)]))
        for op in ops:
            op.sleep_ms = rng.uniform(0, max_sleep_ms) if rng.random() < 0.5 else 0.0
        out.append(ops)
    return out


def delta(rng: random.Random, table: str, residual: bool = False) -> float:
    """Nonzero; int: -2..3, float: multiples of 1/8 in [-1/2, 3/4] (sums of |delta| stay small);
    ``residual``: plus an odd multiple of 2**-13, which float16 cannot carry at magnitudes 1/4 and up."""
    if table == "I":
        return rng.choice([-2, -1, 1, 2, 3])
    d = rng.choice([-4, -2, -1, 1, 2, 3, 5, 6]) / 8
    return d + rng.choice([-3, -1, 1, 5]) * 2.0**-13 if residual else d


def op_amounts(op: Op, procs: int) -> dict[tuple[int, int], float]:
    """What one increment adds, per (row, col)."""
    amounts: dict[tuple[int, int], float] = {}
    if op.kind == "inc_dense":
        d = np.asarray(op.deltas).reshape(len(op.rows), procs + 1)
        for i, r in enumerate(op.rows):
            for c in np.flatnonzero(d[i]):
                amounts[(r, int(c))] = float(d[i, c])
    else:
        for r, c, v in zip(op.rows, op.cols, op.deltas, strict=True):
            amounts[(r, c)] = amounts.get((r, c), 0.0) + v
    return amounts


def cell_updates(ops_by_tick: list[list[Op]], procs: int) -> dict[tuple[str, int, int], list[tuple[int, float]]]:
    """Per (table, row, col): the process's updates to that cell in order, as (tick, amount)."""
    cells: dict[tuple[str, int, int], list[tuple[int, float]]] = {}
    for t, ops in enumerate(ops_by_tick):
        for op in ops:
            if op.kind.startswith("inc"):
                for (r, c), v in op_amounts(op, procs).items():
                    cells.setdefault((op.table, r, c), []).append((t, v))
    return cells


class Expect:
    """What each process's part of each cell may be, from every process's schedule."""

    def __init__(self, seed: int, procs: int, ticks: int, max_sleep_ms: float, residual: bool = False):
        self.procs = procs
        self.scheds = [schedule(seed, q, procs, ticks, max_sleep_ms, residual) for q in range(procs)]
        # how far another process's part of the float table may be from a prefix sum: the float16
        # rounding residual its client keeps buffered, at most half a float16 ulp of an amount < 256
        self.tol = RESIDUAL_TOL if residual else 0.0
        self.cells = [cell_updates(s, procs) for s in self.scheds]

    def other_part_ok(self, q: int, key: tuple[str, int, int], part: float, c: int, s: int) -> str | None:
        """None if ``part`` is a prefix sum of q's updates to cell ``key`` that SSP allows a reader at
        tick c to see, else why not. For the mixed column ``part`` is the digit's multiplier."""
        ups = self.cells[q].get(key, [])
        scale = BASE**q if key[2] == self.procs else 1
        lo = sum(1 for t, _ in ups if t < c - s)
        hi = sum(1 for t, _ in ups if t <= c + s)
        prefix = 0.0
        ok_at = []
        for n in range(len(ups) + 1):
            if n:
                prefix += ups[n - 1][1] / scale
            if prefix == part or (key[0] == "F" and abs(prefix - part) <= self.tol):
                ok_at.append(n)
        if not ok_at:
            return f"{part} is no prefix sum of process {q}'s {len(ups)} updates"
        if not any(lo <= n <= hi for n in ok_at):
            return f"{part} = process {q}'s first {ok_at} updates, SSP allows {lo}..{hi}"
        return None


def check_cell(exp: Expect, rank: int, table: str, r: int, col: int, value: float,
               own: dict[tuple[str, int, int], float], c: int, s: int) -> list[str]:
    """Violations in one cell's value, read at tick c by process ``rank`` whose own updates so far
    sum to ``own`` per cell."""
    P = exp.procs
    key = (table, r, col)
    mine = own.get(key, 0.0)
    where = f"tick {c} {table}[{r},{col}] = {value}"
    if col < P:
        if col == rank:
            return [] if value == mine else [f"{where}: own part {value}, made {mine}"]
        why = exp.other_part_ok(col, key, value, c, s)
        return [] if why is None else [f"{where}: {why}"]
    # the mixed column: base-BASE digits, one per process
    rest = int(value) - int(mine)
    if rest < 0:
        return [f"{where}: less than own part {mine}"]
    bad = []
    for q in range(P):
        digit, rest = rest % BASE, rest // BASE
        if q == rank:
            if digit:
                bad.append(f"{where}: own digit holds {digit} beyond own part {mine}")
        elif (why := exp.other_part_ok(q, key, float(digit), c, s)) is not None:
            bad.append(f"{where}: digit {q}: {why}")
    if rest:
        bad.append(f"{where}: digits beyond {P} processes")
    return bad


def check_read(exp: Expect, rank: int, table: str, rows: list[int], vals: np.ndarray,
               own: dict[tuple[str, int, int], float], c: int, s: int) -> list[str]:
    """Violations in ``vals`` (rows x (P+1)) read at tick c (the float table has no mixed column
    writer: its column P must stay 0, which the prefix check of nobody's updates says)."""
    bad = []
    for i, r in enumerate(rows):
        for col in range(exp.procs + 1):
            if col == exp.procs and table == "F":
                if vals[i, col] != 0:
                    bad.append(f"tick {c} F[{r},{col}] = {vals[i, col]}: nobody writes it")
                continue
            bad += check_cell(exp, rank, table, r, col, float(vals[i, col]), own, c, s)
    return bad


def main() -> int:
    from bosen.client import Client

    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--procs", type=int, required=True)
    p.add_argument("--ticks", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-sleep-ms", type=float, default=6.0)
    p.add_argument("--residual", action="store_true", help="float deltas that float16 cannot carry exactly")
    p.add_argument("--send-rows", action="store_true", help="send each increment's rows at once (Table.send_rows)")
    p.add_argument("--result", required=True)
    p.add_argument("--stay-until", default=None, help="a file: stay in the job (after the last clock) until it exists")
    args = p.parse_args()

    client = Client.connect(args.config)
    w = client.rank
    P = args.procs
    assert 0 <= w < P
    tables = {"I": client.table("I"), "F": client.table("F")}
    s = tables["I"].staleness
    exp = Expect(args.seed, P, args.ticks, args.max_sleep_ms, args.residual)
    own: dict[tuple[str, int, int], float] = {}
    bad: list[str] = []
    reads = 0

    def check(table: str, rows: list[int], vals: np.ndarray, c: int, where: str) -> None:
        nonlocal reads
        reads += 1
        bad.extend(f"{where}: {b}" for b in check_read(exp, w, table, rows, vals, own, c, s))

    t0 = time.monotonic()
    for c, ops in enumerate(exp.scheds[w]):
        for op in ops:
            T = tables[op.table]
            dt = np.dtype(T.dtype)
            if op.kind == "read_rows":
                check(op.table, op.rows, T.get_rows(np.asarray(op.rows, dtype=np.int64)), c, "get_rows")
            elif op.kind == "read_row":
                check(op.table, op.rows, T.get_row(op.rows[0])[None, :], c, "get_row")
            elif op.kind == "read_one":  # one cell: check it on a row with the others as expected
                r, col = op.rows[0], op.cols[0]
                reads += 1
                got = float(T.get(r, col))
                if op.table == "F" and col == P:
                    bad.extend([] if got == 0 else [f"get: tick {c} F[{r},{col}] = {got}: nobody writes it"])
                else:
                    bad.extend(f"get: {b}" for b in check_cell(exp, w, op.table, r, col, got, own, c, s))
            else:
                if op.kind == "inc_dense":
                    d = np.asarray(op.deltas).reshape(len(op.rows), P + 1).astype(dt)
                    T.inc_rows(np.asarray(op.rows, dtype=np.int64), d)
                elif op.kind == "inc_coo":
                    T.inc_rows(np.asarray(op.rows, dtype=np.int64), np.asarray(op.deltas).astype(dt),
                               cols=np.asarray(op.cols, dtype=np.int64))
                else:
                    T.inc(op.rows[0], op.cols[0], dt.type(op.deltas[0]))
                if args.send_rows:  # a partial flush: these rows' updates leave before the clock
                    T.send_rows(np.unique(np.asarray(op.rows, dtype=np.int64)))
                for (r, col), v in op_amounts(op, P).items():
                    own[(op.table, r, col)] = own.get((op.table, r, col), 0.0) + v
            if op.sleep_ms:
                time.sleep(op.sleep_ms / 1000)
        client.clock()
    for name in "IF":
        check(name, list(range(ROWS)), tables[name].get_rows(np.arange(ROWS)), args.ticks, "after the last clock")
    elapsed = time.monotonic() - t0
    if args.stay_until:  # whoever moves partitions needs every worker in the job until it is done
        deadline = time.monotonic() + 120
        while not os.path.exists(args.stay_until) and time.monotonic() < deadline:
            time.sleep(0.02)
    stats = client.stats()
    client.close()
    totals = {name: [[own.get((name, r, col), 0.0) for col in range(P + 1)] for r in range(ROWS)] for name in "IF"}
    with open(args.result, "w") as f:
        json.dump({"rank": w, "violations": bad[:100], "violation_count": len(bad), "reads": reads,
                   "seconds": elapsed, "totals": totals, "rows_sent_budgeted": stats.get("rows_sent_budgeted", 0),
                   "rows_sent_early": stats.get("rows_sent_early", 0),
                   "rows_pushed_to_us": stats["rows_pushed_to_us"],
                   "rows_pushed_early_to_us": stats.get("rows_pushed_early_to_us", 0)}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
