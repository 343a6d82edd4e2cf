"""Data reader speed: the apps' text parsers on large generated files (MB/s, lines/s).

Each format gets one file written once (``--dir`` keeps them between runs, so two versions of the
readers can be timed on identical bytes): UCI bag-of-words and LDA-C for LDA, libsvm for MLR,
``user,item,rating`` CSV for MF. A reader runs once untimed (numba compiles or loads its cache), then
``--repeats`` times; the best time is reported, since other processes on a shared machine only ever
add time.

    python -m bench.apps.readers [--quick] [--dir DIR] [--repeats N]
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import emit, log


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n")


def write_uci(path: Path, docs: int, vocab: int, per_doc: int, rng: np.random.Generator) -> int:
    """A docword file of ``docs`` documents with ``per_doc`` distinct words each; returns its lines."""
    w = np.sort(rng.choice(vocab, size=(docs, per_doc)), axis=1)
    keep = np.ones_like(w, dtype=bool)
    keep[:, 1:] = w[:, 1:] != w[:, :-1]
    d = np.repeat(np.arange(docs), keep.sum(axis=1))
    w = w[keep]
    c = rng.integers(1, 20, size=w.size)
    body = [f"{a} {b} {n}" for a, b, n in zip((d + 1).tolist(), (w + 1).tolist(), c.tolist(), strict=True)]
    _write_lines(path, [str(docs), str(vocab), str(len(body))] + body)
    return len(body) + 3


def write_ldac(path: Path, docs: int, vocab: int, per_doc: int, rng: np.random.Generator) -> int:
    lines = []
    for _ in range(docs):  # generating the file, not the timed part
        w = np.unique(rng.choice(vocab, size=per_doc))
        c = rng.integers(1, 20, size=w.size)
        lines.append(f"{w.size} " + " ".join(f"{a}:{b}" for a, b in zip(w.tolist(), c.tolist(), strict=True)))
    _write_lines(path, lines)
    return len(lines)


def write_libsvm(path: Path, n: int, features: int, nnz: int, rng: np.random.Generator) -> int:
    lines = []
    for _ in range(n):
        ids = np.unique(rng.choice(features, size=nnz)) + 1
        vals = rng.random(ids.size)
        pairs = " ".join(f"{j}:{v:.6g}" for j, v in zip(ids.tolist(), vals.tolist(), strict=True))
        lines.append(f"{int(rng.integers(0, 10))} {pairs}")
    _write_lines(path, lines)
    return n


def write_csv(path: Path, n: int, users: int, items: int, rng: np.random.Generator) -> int:
    u = rng.integers(0, users, size=n).tolist()
    i = rng.integers(0, items, size=n).tolist()
    r = (rng.standard_normal(n) * 1.5 + 3).tolist()
    _write_lines(path, ["user,item,rating"] + [f"{a},{b},{c:.4f}" for a, b, c in zip(u, i, r, strict=True)])
    return n + 1


def _best(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # compile / load the numba cache, warm the page cache
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="files of a few MB (CI)")
    ap.add_argument("--dir", default="", help="keep the generated files here (default: a temporary folder)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from bosen.apps.lda.data import read_ldac, read_uci
    from bosen.apps.mf.data import load_csv
    from bosen.apps.mlr.data import read_libsvm

    scale = 10 if args.quick else 1
    with tempfile.TemporaryDirectory(prefix="bosen-readers-") as tmp:
        root = Path(args.dir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        cases: list[tuple[str, str, Path, Callable[[Path, np.random.Generator], int], Callable[[Path], Any]]] = [
            ("lda", "uci", root / "docword.bench.txt",
             lambda p, g: write_uci(p, 40_000 // scale, 20_000, 100, g), lambda p: read_uci(p)),
            ("lda", "ldac", root / "bench.ldac",
             lambda p, g: write_ldac(p, 40_000 // scale, 20_000, 100, g), lambda p: read_ldac(p)),
            ("mlr", "libsvm", root / "bench.svm",
             lambda p, g: write_libsvm(p, 100_000 // scale, 5_000, 40, g), lambda p: read_libsvm(p)),
            ("mf", "csv", root / "ratings.bench.csv",
             lambda p, g: write_csv(p, 3_000_000 // scale, 100_000, 20_000, g), lambda p: load_csv(p)),
        ]
        for app, fmt, path, write, read in cases:
            lines_path = path.with_suffix(path.suffix + ".lines")
            if not path.exists() or not lines_path.exists():
                log(f"readers: writing {path.name} ...")
                lines_path.write_text(str(write(path, rng)))
            lines = int(lines_path.read_text())
            mb = path.stat().st_size / 1e6
            log(f"readers: {fmt} ({mb:.0f} MB) ...")
            t = _best(functools.partial(read, path), args.repeats)
            emit(bench="apps_readers", case=app, format=fmt, metric="read_throughput", unit="MB/s",
                 ours=mb / t, lines_per_s=lines / t, seconds=t, megabytes=mb, lines=lines, repeats=args.repeats)


if __name__ == "__main__":
    main()
