"""Data for MLR: a libsvm/svmlight reader, a synthetic generator, and sklearn's digits.

Every loader returns a :class:`Dataset`: CSR sparse features (``indptr``, ``indices``, ``values``)
plus integer class labels in ``[0, classes)``. CSR is the one layout the kernels take, so dense data
(digits) is converted once at load time rather than giving the kernels a second code path.

The libsvm reader parses the whole file in one numba pass over its bytes (no per-line Python), then
turns an error code into a :class:`DataError` that names the file and the 1-based line, because a
bad line in a million-line file is otherwise impossible to find.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from bosen.apps import textparse as tp
from bosen.apps.datasets.packaged import prepare_hint
from bosen.apps.mlr.kernels import logits
from bosen.errors import DataError

__all__ = [
    "DataError", "Dataset", "read_libsvm", "read_libsvm_cached", "write_libsvm", "save_npz", "load_npz",
    "from_dense", "synthetic", "digits", "split_holdout", "partition",
]


@dataclass(frozen=True)
class Dataset:
    """Samples as CSR rows (feature ids 0-based) and labels 0..classes-1."""

    indptr: np.ndarray  # int64, len n+1
    indices: np.ndarray  # int32, feature ids, ascending within a row
    values: np.ndarray  # float32
    labels: np.ndarray  # int32
    features: int
    classes: int

    @property
    def n(self) -> int:
        return int(self.labels.shape[0])

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    def take(self, rows: np.ndarray) -> Dataset:
        """Sub-dataset of the given sample ids (vectorized CSR row gather)."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, stops = self.indptr[rows], self.indptr[rows + 1]
        lens = stops - starts
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        # position of every kept nonzero in the source arrays
        src = np.repeat(starts - indptr[:-1], lens) + np.arange(indptr[-1], dtype=np.int64)
        return Dataset(indptr, self.indices[src], self.values[src], self.labels[rows],
                       self.features, self.classes)

    def dense(self) -> np.ndarray:
        """(n, features) float32 matrix; for tests and dense baselines."""
        out = np.zeros((self.n, self.features), dtype=np.float32)
        row = np.repeat(np.arange(self.n), np.diff(self.indptr))
        out[row, self.indices] = self.values
        return out


# ----------------------------------------------------------------------------------------------
# libsvm / svmlight reader

_OK = 0
_E_LABEL = 1
_E_TOKEN = 2
_E_INDEX = 3
_E_VALUE = 4
_E_ORDER = 5
_E_TRUNC = 6
_E_NOLABEL_INT = 7
_E_RANGE = 8
_E_BASE = 9
_E_BIG = 10

_MAX_ID = 2**31 - 1  # feature ids are stored as int32


@njit(cache=True, nogil=True)
def _parse_libsvm(buf: np.ndarray, min_index: int, max_index: int):  # pragma: no cover - numba
    """Parse libsvm text. Returns (err, line, line_start, err_pos, n, labels, indptr, indices, values, lines).

    Feature ids are returned as written (base not yet applied). Blank and comment-only lines are
    skipped; ``#`` starts a comment; ``qid:`` tokens are ignored. ``max_index`` < 0: no upper bound.
    """
    size = buf.shape[0]
    cap = tp.count_byte(buf, tp.NEWLINE) + 1
    ncolon = tp.count_byte(buf, tp.COLON)
    labels = np.empty(cap, np.float64)
    indptr = np.zeros(cap + 1, np.int64)
    indices = np.empty(ncolon, np.int64)
    values = np.empty(ncolon, np.float32)
    lines = np.empty(cap, np.int64)
    n = 0
    nnz = 0
    line = 0
    pos = 0
    while pos < size:
        line += 1
        eol = tp.line_end(buf, pos)
        if eol == size and tp.skip_blanks(buf, pos, eol) < eol:  # no newline at the end: cut short
            return _E_TRUNC, line, pos, pos, n, labels, indptr, indices, values, lines
        stop = tp.find_byte(buf, pos, eol, tp.HASH)
        first = True
        prev = -1
        i = tp.skip_blanks(buf, pos, stop)
        while i < stop:
            j = tp.token_end(buf, i, stop)
            if first:
                ok, v = tp.parse_float(buf, i, j)
                if not ok:
                    return _E_LABEL, line, pos, i, n, labels, indptr, indices, values, lines
                if v != np.floor(v) or abs(v) > 2.0 ** 31:
                    return _E_NOLABEL_INT, line, pos, i, n, labels, indptr, indices, values, lines
                labels[n] = v
                lines[n] = line
                first = False
            else:
                colon = tp.find_byte(buf, i, j, tp.COLON)
                if colon == j:
                    return _E_TOKEN, line, pos, i, n, labels, indptr, indices, values, lines
                if colon - i == 3 and buf[i] == 113 and buf[i + 1] == 105 and buf[i + 2] == 100:
                    i = tp.skip_blanks(buf, j, stop)  # qid:N, ranking data; irrelevant for classification
                    continue
                ok, idx = tp.parse_int(buf, i, colon)
                if not ok or buf[i] == 43 or buf[i] == 45:  # digits only: no sign
                    return _E_INDEX, line, pos, i, n, labels, indptr, indices, values, lines
                ok, v = tp.parse_float(buf, colon + 1, j)
                if not ok or not np.isfinite(v):
                    return _E_VALUE, line, pos, colon + 1, n, labels, indptr, indices, values, lines
                if idx <= prev:
                    return _E_ORDER, line, pos, i, n, labels, indptr, indices, values, lines
                if idx < min_index:
                    return _E_BASE, line, pos, i, n, labels, indptr, indices, values, lines
                if max_index >= 0 and idx > max_index:
                    return _E_RANGE, line, pos, i, n, labels, indptr, indices, values, lines
                if idx - min_index > _MAX_ID:
                    return _E_BIG, line, pos, i, n, labels, indptr, indices, values, lines
                prev = idx
                indices[nnz] = idx
                values[nnz] = v
                nnz += 1
            i = tp.skip_blanks(buf, j, stop)
        if not first:
            n += 1
            indptr[n] = nnz
        pos = eol + 1
    return _OK, 0, 0, 0, n, labels, indptr, indices, values, lines


@njit(cache=True, nogil=True)
def _has_zero_id(buf: np.ndarray) -> bool:  # pragma: no cover - numba
    """Whether some token outside comments reads ``0:`` (a 0 feature id: the file is 0-based)."""
    comment = False
    for i in range(buf.shape[0] - 1):
        c = buf[i]
        if c == tp.NEWLINE:
            comment = False
        elif c == tp.HASH:
            comment = True
        elif c == 48 and not comment and buf[i + 1] == tp.COLON:
            if i == 0 or tp.is_blank(buf[i - 1]):
                return True
    return False


_MESSAGES = {
    _E_LABEL: "label is not a number",
    _E_NOLABEL_INT: "class label must be an integer",
    _E_TOKEN: "bad token, expected INDEX:VALUE",
    _E_INDEX: "feature id is not a non-negative integer",
    _E_VALUE: "feature value is not a finite number",
    _E_ORDER: "feature ids must be strictly increasing within a line",
    _E_TRUNC: "truncated last line (no newline at end of file)",
    _E_RANGE: "feature id exceeds the model's feature count",
    _E_BASE: "feature id 0 in a 1-based file (set zero_based: true or 'auto')",
    _E_BIG: f"feature id exceeds {_MAX_ID}",
}


def read_libsvm(path: str | os.PathLike, features: int | None = None, zero_based: bool | str = "auto",
                label_map: np.ndarray | None = None) -> tuple[Dataset, np.ndarray]:
    """Read a libsvm/svmlight file (``.gz`` too): ``LABEL [INDEX:VALUE ...] [# comment]`` per line.

    ``zero_based``: "auto" treats ids as 1-based (the libsvm convention) unless an id 0 occurs.
    ``features``: the model's feature count; a larger id is an error naming its line. None: the
    largest id + 1. Labels are integers mapped to 0..K-1 in sorted order; pass the ``label_map``
    returned for a training file when reading its test file so both use the same classes.
    Returns (dataset, label_map) where ``label_map[k]`` is the file label of class k.
    """
    if zero_based not in (True, False, "auto"):
        raise ValueError(f"zero_based: expected true, false or 'auto', got {zero_based!r}")
    p = Path(path)
    buf = tp.read_bytes(p, "data")
    # pass 1 settles the id base when "auto": libsvm is 1-based, a 0 id means the file is 0-based
    if zero_based == "auto":
        base = 0 if _has_zero_id(buf) else 1
    else:
        base = 0 if zero_based else 1
    max_index = -1 if features is None else features - 1 + base
    err, line, start, pos, n, labels, indptr, indices, values, lines = _parse_libsvm(buf, base, max_index)
    if err != _OK:
        what = _MESSAGES[err]
        if err == _E_RANGE:
            what += f" (features={features}, ids {base}-based)"
        if err == _E_TRUNC:
            raise DataError(f"{p}:{line}: {what}: {tp.line_text(buf, start)!r}")
        raise DataError(f"{p}:{line}: {what}: {tp.token_text(buf, pos)!r} in {tp.line_text(buf, start)!r}")
    if n == 0:
        raise DataError(f"{p}: no samples (empty file or only comments)")
    labels = labels[:n]
    lines = lines[:n]
    indptr = indptr[: n + 1].copy()
    nnz = int(indptr[-1])
    indices = (indices[:nnz] - base).astype(np.int32)
    values = values[:nnz].copy()
    nfeat = features if features is not None else (int(indices.max()) + 1 if nnz else 1)
    ilabels = labels.astype(np.int64)
    if label_map is None:
        label_map = np.unique(ilabels)
    pos_in = np.minimum(np.searchsorted(label_map, ilabels), len(label_map) - 1)
    bad = np.nonzero(label_map[pos_in] != ilabels)[0]
    if len(bad):
        b = int(bad[0])
        raise DataError(f"{p}:{int(lines[b])}: label {int(ilabels[b])} is not one of the training "
                        f"classes {label_map.tolist()}")
    ds = Dataset(indptr, indices, values, pos_in.astype(np.int32), nfeat, len(label_map))
    return ds, label_map


def write_libsvm(path: str | os.PathLike, ds: Dataset, one_based: bool = True) -> None:
    """Write a dataset in libsvm format (used by tests and to export the synthetic set)."""
    base = 1 if one_based else 0
    with open(path, "w") as f:
        for i in range(ds.n):  # export only; not a training path
            a, b = ds.indptr[i], ds.indptr[i + 1]
            toks = " ".join(f"{j + base}:{v:.7g}" for j, v in zip(ds.indices[a:b], ds.values[a:b], strict=True))
            f.write(f"{int(ds.labels[i])} {toks}\n" if toks else f"{int(ds.labels[i])}\n")


# ----------------------------------------------------------------------------------------------
# the binary form: a .npz of the CSR arrays, read in milliseconds (no pickle)

_NPZ_KEYS = ("indptr", "indices", "values", "labels", "shape")
CACHE_SUFFIX = ".bosen.npz"  # a libsvm file's parsed form, written beside it


def save_npz(path: str | os.PathLike, ds: Dataset, **extra: np.ndarray) -> None:
    """Write ``ds`` as an uncompressed .npz (atomically: a temporary file, then rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    arrays: dict[str, np.ndarray] = {"indptr": ds.indptr, "indices": ds.indices, "values": ds.values,
                                     "labels": ds.labels,
                                     "shape": np.array([ds.features, ds.classes], dtype=np.int64), **extra}
    np.savez(tmp, **arrays)  # type: ignore[arg-type]  # numeric arrays: nothing is pickled
    os.replace(tmp, path)


def load_npz(path: str | os.PathLike) -> tuple[Dataset, dict[str, np.ndarray]]:
    """Read a file written by :func:`save_npz`; (dataset, its other arrays). Checked like a text file:
    a malformed one is a DataError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: data file not found, cannot read it{prepare_hint(p)}")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"{p}: not a readable .npz file: {e}") from None
    missing = [k for k in _NPZ_KEYS if k not in arrays]
    if missing:
        raise DataError(f"{p}: not an MLR data file: no {', '.join(missing)} array")
    indptr, indices = arrays["indptr"].astype(np.int64), arrays["indices"].astype(np.int32)
    values, labels = arrays["values"].astype(np.float32), arrays["labels"].astype(np.int32)
    features, classes = (int(v) for v in arrays["shape"][:2])
    n = labels.shape[0]
    ok = (indptr.shape == (n + 1,) and indptr[0] == 0 and np.all(np.diff(indptr) >= 0)
          and indptr[-1] == indices.shape[0] == values.shape[0])
    if not ok:
        raise DataError(f"{p}: inconsistent CSR arrays (indptr does not match indices/values/labels)")
    if indices.size and (indices.min() < 0 or indices.max() >= features):
        raise DataError(f"{p}: a feature id is outside 0..{features - 1}")
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise DataError(f"{p}: a label is outside 0..{classes - 1}")
    extra = {k: v for k, v in arrays.items() if k not in _NPZ_KEYS}
    return Dataset(indptr, indices, values, labels, features, classes), extra


def read_libsvm_cached(path: str | os.PathLike, features: int | None = None, zero_based: bool | str = "auto",
                       label_map: np.ndarray | None = None) -> tuple[Dataset, np.ndarray]:
    """:func:`read_libsvm`, but the parsed arrays are kept beside the file (``FILE.bosen.npz``) and
    read from there while the file's size and modification time are unchanged. Parsing text is what
    dominated jobs on large files (every worker parses the whole file); a directory we may not
    write to just means no cache."""
    p = Path(path)
    cache = p.with_name(p.name + CACHE_SUFFIX)
    try:
        st = p.stat()
    except OSError:
        return read_libsvm(p, features, zero_based, label_map)
    key = np.array([st.st_size, st.st_mtime_ns, -1 if features is None else features,
                    {True: 0, False: 1, "auto": 2}[zero_based]], dtype=np.int64)
    if cache.is_file():
        try:
            ds, extra = load_npz(cache)
            if "source_key" in extra and np.array_equal(extra["source_key"], key):
                # the file's own labels: remap them through the caller's training classes
                file_labels = extra["label_map"][ds.labels]
                lm = extra["label_map"] if label_map is None else label_map
                return _relabel(ds, file_labels, lm, p), lm
        except DataError:
            pass  # a stale or torn cache is rebuilt
    ds, lm = read_libsvm(p, features, zero_based, label_map)
    try:
        save_npz(cache, ds, label_map=lm, source_key=key)
    except OSError:
        pass
    return ds, lm


def _relabel(ds: Dataset, file_labels: np.ndarray, label_map: np.ndarray, path: Path) -> Dataset:
    pos = np.minimum(np.searchsorted(label_map, file_labels), len(label_map) - 1)
    bad = np.nonzero(label_map[pos] != file_labels)[0]
    if len(bad):
        raise DataError(f"{path}: label {int(file_labels[bad[0]])} (sample {int(bad[0]) + 1}) is not one of the "
                        f"training classes {label_map.tolist()}")
    return Dataset(ds.indptr, ds.indices, ds.values, pos.astype(np.int32), ds.features, len(label_map))


# ----------------------------------------------------------------------------------------------
# generated and packaged data


def synthetic(n: int, features: int, classes: int, nnz: int = 20, seed: int = 0,
              temperature: float = 0.3) -> Dataset:
    """Sparse softmax-regression data with a known generating model.

    Each sample has about ``nnz`` distinct active features with values in (0, 1]; its label is drawn
    from softmax(W* x / temperature) for a random W*, so a softmax model can fit it but not perfectly
    (lower temperature = cleaner labels; with the defaults' shape the Bayes accuracy is about 0.7).
    Deterministic in ``seed``.
    """
    if n < 1 or features < 1 or classes < 2 or nnz < 1:
        raise ValueError("synthetic: needs n >= 1, features >= 1, classes >= 2, nnz >= 1")
    rng = np.random.default_rng(seed)
    m = min(nnz, features)
    ids = np.sort(rng.integers(0, features, size=(n, m), dtype=np.int64), axis=1)
    keep = np.ones_like(ids, dtype=bool)
    keep[:, 1:] = ids[:, 1:] != ids[:, :-1]  # drop repeated ids within a row
    lens = keep.sum(axis=1)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    indices = ids[keep].astype(np.int32)
    values = rng.uniform(0.1, 1.0, size=indices.shape[0]).astype(np.float32)
    wstar = rng.normal(0.0, 3.0 / np.sqrt(m), size=(features, classes)).astype(np.float32)
    z = logits(indptr, indices, values, wstar, np.zeros(classes, np.float32)).astype(np.float64)  # numba, no scatter
    z /= max(temperature, 1e-6)
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    np.cumsum(z, axis=1, out=z)
    u = rng.random(n) * z[:, -1]
    labels = (z < u[:, None]).sum(axis=1).clip(0, classes - 1).astype(np.int32)
    return Dataset(indptr, indices, values, labels, features, classes)


def from_dense(x: np.ndarray, labels: np.ndarray, classes: int) -> Dataset:
    """A dense (n, features) matrix as CSR rows without its zeros."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    mask = x != 0
    indptr = np.zeros(x.shape[0] + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=indptr[1:])
    indices = np.nonzero(mask)[1].astype(np.int32)
    return Dataset(indptr, indices, x[mask], np.asarray(labels, dtype=np.int32), x.shape[1], classes)


def digits() -> Dataset:
    """sklearn's handwritten digits (1797 8x8 images, 10 classes): a real data set shipped with
    scikit-learn, so tests need no download. Pixels are scaled from 0..16 to [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # not a dependency of the package: the test extra has it
        raise DataError("data: digits: the data set ships in scikit-learn, which is not installed: "
                        "pip install scikit-learn") from None
    d = load_digits()
    return from_dense(d.data / 16.0, d.target, 10)


def split_holdout(ds: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """Shuffle once (seeded, so every worker agrees) and cut off a held-out tail."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"holdout: {fraction} is not in [0, 1)")
    perm = np.random.default_rng(seed).permutation(ds.n)
    k = int(round(ds.n * fraction))
    return ds.take(perm[k:]), ds.take(perm[:k])


def partition(n: int, rank: int, workers: int) -> np.ndarray:
    """Sample ids of one worker's share: contiguous, sizes differ by at most one."""
    bounds = np.linspace(0, n, workers + 1).round().astype(np.int64)
    return np.arange(bounds[rank], bounds[rank + 1], dtype=np.int64)
