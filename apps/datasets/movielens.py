"""MovieLens-100K (shipped by ``recbole``) as MF ratings: ``train.csv`` and ``test.csv``.

100,000 ratings (1-5) of 1,682 movies by 943 users. Ids are renumbered from 0 in sorted order of the
original ids (``users.txt``/``items.txt`` keep the originals), and a seeded random 20% of the ratings
is held out, the split scikit-surprise's ``train_test_split`` makes, so test RMSEs compare.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bosen.apps.datasets.packaged import pip_file
from bosen.errors import DataError

NAME = "movielens"
PACKAGE, RELPATH = "recbole", "dataset_example/ml-100k/ml-100k.inter"
INSTALL = "pip install --no-deps recbole==1.2.1"
TEST_FRACTION = 0.2


def source() -> Path:
    return pip_file(NAME, PACKAGE, RELPATH, INSTALL)


def read_inter(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(user ids, item ids, ratings) of a RecBole ``.inter`` file: a header, then tab-separated
    ``user item rating timestamp`` lines."""
    try:
        table = np.loadtxt(path, delimiter="\t", skiprows=1, usecols=(0, 1, 2), dtype=np.float64, ndmin=2)
    except ValueError as e:
        raise DataError(f"{path}: not a RecBole ratings file (user<TAB>item<TAB>rating<TAB>time): {e}") from None
    if table.shape[0] == 0:
        raise DataError(f"{path}: no ratings")
    return table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2].astype(np.float32)


def prepare(out: Path, seed: int = 0) -> dict:
    users, items, ratings = read_inter(source())
    uid, u = np.unique(users, return_inverse=True)
    iid, i = np.unique(items, return_inverse=True)
    perm = np.random.default_rng(seed).permutation(ratings.size)
    n_test = int(round(ratings.size * TEST_FRACTION))
    test, train = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    for name, rows in (("train.csv", train), ("test.csv", test)):
        body = np.column_stack([u[rows], i[rows], ratings[rows]])
        np.savetxt(out / name, body, fmt=("%d", "%d", "%g"), delimiter=",", header="user,item,rating",
                   comments="")
    (out / "users.txt").write_text("\n".join(map(str, uid.tolist())) + "\n")
    (out / "items.txt").write_text("\n".join(map(str, iid.tolist())) + "\n")
    return {"app": "mf", "files": {"train": "train.csv", "test": "test.csv"}, "n_users": int(uid.size),
            "n_items": int(iid.size), "train_ratings": int(train.size), "test_ratings": int(test.size),
            "rating_mean": round(float(ratings.mean()), 4)}
