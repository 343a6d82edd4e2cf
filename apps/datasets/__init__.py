"""Real data sets that ship inside packages, prepared into the apps' input formats: ``bosen data NAME``.

Each module knows where its package keeps the raw files and how to turn them into what an app reads;
:func:`prepare` writes them into a directory with a ``dataset.json`` that lists the files and their
shapes (the numbers the matching ``configs/*.yaml`` use). The modules are imported only when a data
set is prepared: ``packaged`` (names, hints, package lookup) is what the rest of the code imports.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from bosen.apps.datasets.packaged import NAMES, MissingPackage

__all__ = ["NAMES", "DEFAULT_ROOT", "MissingPackage", "prepare"]

DEFAULT_ROOT = Path("data")  # ``bosen data NAME`` writes data/NAME/ unless told otherwise


def _images(which: str) -> Callable[[Path, bool], dict]:
    def write(out: Path, libsvm: bool) -> dict:
        from bosen.apps.datasets import images
        from bosen.apps.mlr.data import save_npz, write_libsvm

        train, test = images.fashion() if which == "fashion" else images.mnist5k()
        save_npz(out / "train.npz", train)
        save_npz(out / "test.npz", test)
        files = {"train": "train.npz", "test": "test.npz"}
        if libsvm:
            write_libsvm(out / "train.libsvm", train)
            write_libsvm(out / "test.libsvm", test)
            files.update(train_libsvm="train.libsvm", test_libsvm="test.libsvm")
        return {"app": "mlr", "files": files, "features": train.features, "classes": train.classes,
                "train_samples": train.n, "test_samples": test.n}
    return write


def _movielens(out: Path, libsvm: bool) -> dict:
    from bosen.apps.datasets import movielens

    return movielens.prepare(out)


def _news(out: Path, libsvm: bool) -> dict:
    from bosen.apps.datasets import news

    return news.prepare(out)


_PREPARE: dict[str, Callable[[Path, bool], dict]] = {
    "movielens": _movielens, "news": _news, "fashion-mnist": _images("fashion"), "mnist-5k": _images("mnist5k"),
}
assert tuple(_PREPARE) == NAMES


def prepare(name: str, out: str | Path | None = None, libsvm: bool = False) -> dict:
    """Write data set ``name`` into ``out`` (default ``data/NAME``); returns its ``dataset.json``.

    Raises ValueError for an unknown name and MissingPackage (a DataError) with the install command
    when the package that ships the data is not installed.
    """
    if name not in _PREPARE:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(NAMES)}")
    out = Path(out) if out is not None else DEFAULT_ROOT / name
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    meta = {"name": name, **_PREPARE[name](out, libsvm)}
    meta["seconds"] = round(time.perf_counter() - t0, 2)
    (out / "dataset.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta
