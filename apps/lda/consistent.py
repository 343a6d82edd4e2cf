"""LDA's objective from a consistent state: the servers' tables at a clock, without stopping the job.

The word-topic table and the topic summary only ever receive plain-add increments of the workers'
token-topic assignments (the initial counts, then each mini-batch's net change), so after exactly
the updates of ticks <= c they equal the sum over workers of each worker's *local* counts of its own
tokens at the end of its tick c. Each worker saves those counts (and its exact doc part) at every
scored tick; after the job rank 0 sums them per clock and scores the sums. The per-clock objective
the workers report instead reads word rows from each worker's cache (a stale, worker-specific view);
this one is what a checkpoint at that clock would score, with no barrier added to the run.

Files: ``$BOSEN_RUN_DIR/consistent-ll/CLOCK-RANK.npz`` (numpy arrays only, no pickle), removed once
summed; the result is ``$BOSEN_RUN_DIR/consistent-ll.jsonl``, one ``{"clock", "objective", ...}``
line per scored clock. Every worker must see the same run directory (one machine, or a shared file
system).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from bosen.apps.lda import evaluation
from bosen.errors import ConfigError, DataError

SNAPSHOTS = "consistent-ll"
RESULT = "consistent-ll.jsonl"


def snapshot_dir() -> Path:
    """The job's snapshot folder (created); the run directory comes from ``$BOSEN_RUN_DIR``."""
    run_dir = os.environ.get("BOSEN_RUN_DIR")
    if not run_dir:
        raise ConfigError("app.args.consistent_ll: needs $BOSEN_RUN_DIR (the job's run directory, set by "
                          "`bosen launch`), where every worker saves its counts at each scored clock")
    path = Path(run_dir) / SNAPSHOTS
    path.mkdir(parents=True, exist_ok=True)
    return path


def _name(clock: int, rank: int) -> str:
    return f"{clock:07d}-{rank:05d}.npz"


def local_counts(words: np.ndarray, z: np.ndarray, K: int, V: int) -> dict[str, np.ndarray]:
    """This worker's own n_wk, whichever form is smaller on disk: ``dense`` (V x K int32) or sparse
    ``keys`` (w*K + k, int64) with ``counts`` (int32)."""
    key = words.astype(np.int64) * K + z
    size = V * K
    if size <= max(4 * key.size, 1 << 20):  # one pass, no sort
        dense = np.bincount(key, minlength=size)
        nz = np.flatnonzero(dense)
        if nz.size * 12 < size * 4:
            return {"keys": nz, "counts": dense[nz].astype(np.int32)}
        return {"dense": dense.astype(np.int32).reshape(V, K)}
    keys, counts = np.unique(key, return_counts=True)
    return {"keys": keys, "counts": counts.astype(np.int32)}


def save(folder: Path, clock: int, rank: int, counts: dict[str, np.ndarray], ll_doc: float) -> None:
    """Write one worker's counts and doc part at ``clock``; the rename makes the file appear whole."""
    tmp = folder / f".{_name(clock, rank)}.tmp"
    arrays: dict[str, Any] = {"ll_doc": np.array(ll_doc, dtype=np.float64), **counts}
    with tmp.open("wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, folder / _name(clock, rank))


def combine(folder: Path, clocks: Iterable[int], required: Iterable[int], workers: int, V: int, K: int,
            beta: float) -> list[dict[str, float]]:
    """Sum the workers' files per clock and score the sums; delete the files.

    Every clock in ``required`` must have all ``workers`` files (a missing one is a DataError that
    names it); other ``clocks`` (scored before a resume) count when all theirs are there."""
    need = set(required)
    missing = [folder / _name(c, r) for c in sorted(need) for r in range(workers)
               if not (folder / _name(c, r)).is_file()]
    if missing:
        raise DataError(f"consistent_ll: {len(missing)} of the workers' count files are missing, e.g. {missing[0]}; "
                        "all workers must write to the same run directory ($BOSEN_RUN_DIR)")
    out = []
    for c in sorted(set(clocks) | need):
        paths = [folder / _name(c, r) for r in range(workers)]
        if not all(p.is_file() for p in paths):
            continue
        keys, counts, ll_doc = [], [], 0.0
        for p in paths:
            with np.load(p, allow_pickle=False) as f:
                ll_doc += float(f["ll_doc"])
                if "dense" in f:
                    flat = f["dense"].reshape(-1)
                    nz = np.flatnonzero(flat)
                    keys.append(nz.astype(np.int64))
                    counts.append(flat[nz].astype(np.int64))
                else:
                    keys.append(f["keys"].astype(np.int64))
                    counts.append(f["counts"].astype(np.int64))
        # summed by key (w*K + k), never as a V x K array: the non-zero counts in row-major order,
        # which is the order (and so the rounding) of the word part over the whole table
        uk, inv = np.unique(np.concatenate(keys), return_inverse=True)
        total = np.zeros(uk.size, dtype=np.int64)
        np.add.at(total, inv, np.concatenate(counts))
        if total.max(initial=0) >= np.iinfo(np.int32).max:
            raise DataError(f"consistent_ll: a word-topic count at clock {c} exceeds int32")
        nk = np.zeros(K, dtype=np.int64)  # the topic summary receives the same increments, summed over words
        np.add.at(nk, uk % K, total)
        ll_word = float(evaluation.loglik_words(total.astype(np.int32)[:, None], beta,
                                                np.ones(uk.size, dtype=np.bool_)))
        ll_word += float(evaluation.loglik_summary(nk.astype(np.int32), V, beta))
        out.append({"clock": c, "objective": ll_doc + ll_word, "ll_doc": ll_doc, "ll_word": ll_word})
    for p in folder.glob("*.npz"):
        p.unlink()
    try:
        folder.rmdir()
    except OSError:
        pass  # something else lives there: left as it is
    return out


def write(run_dir: Path, records: list[dict[str, float]]) -> Path:
    """``RUN_DIR/consistent-ll.jsonl``, one line per scored clock."""
    path = run_dir / RESULT
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path

