"""Which row versions each client holds, so that a client lost without BYE releases them.

A versioned table (AdaRevision) keeps a snapshot of a row for as long as some client holds the
version it was sent (``server/procedures/versioning.py`` counts holders per version, not who they
are). A client releases every version it received exactly once; one that dies cannot, and its
references would pin snapshots forever. So per client the shard logs the (row, version) pairs it
sent and the ones released, as numpy arrays appended per message, and nets them out now and then
(``compact``: a sort over the log, amortized O(1) per entry). When the client is lost, what is left
is released on its behalf.
"""

from __future__ import annotations

import numpy as np

_EMPTY = np.empty(0, dtype=np.int64)


def net(rows: np.ndarray, versions: np.ndarray, sign: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (row, version) pairs with a positive balance of ``sign``, each repeated that many times."""
    if rows.shape[0] == 0:
        return _EMPTY, _EMPTY
    keys = np.stack([rows, versions], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    balance = np.bincount(inverse.reshape(-1), weights=sign, minlength=uniq.shape[0]).round().astype(np.int64)
    keep = balance > 0
    counts = balance[keep]
    return np.repeat(uniq[keep, 0], counts), np.repeat(uniq[keep, 1], counts)


class Holdings:
    """One client's (row, version) references on one shard."""

    def __init__(self) -> None:
        self._rows: list[np.ndarray] = []
        self._versions: list[np.ndarray] = []
        self._signs: list[np.ndarray] = []
        self._entries = 0
        self._compact_at = 1 << 16

    def _log(self, rows: np.ndarray, versions: np.ndarray, sign: int) -> None:
        held = versions != 0  # version 0 carries no reference
        if not held.all():
            rows, versions = rows[held], versions[held]
        if rows.shape[0] == 0:
            return
        self._rows.append(rows.astype(np.int64, copy=True))
        self._versions.append(versions.astype(np.int64, copy=True))
        self._signs.append(np.full(rows.shape[0], sign, dtype=np.float64))
        self._entries += rows.shape[0]
        if self._entries >= self._compact_at:
            self.compact()

    def sent(self, rows: np.ndarray, versions: np.ndarray) -> None:
        self._log(rows, versions, 1)

    def released(self, rows: np.ndarray, versions: np.ndarray) -> None:
        self._log(rows, versions, -1)

    def compact(self) -> None:
        rows, versions = self.outstanding()
        self._rows, self._versions = [rows], [versions]
        self._signs = [np.ones(rows.shape[0])]
        self._entries = rows.shape[0]
        self._compact_at = max(1 << 16, 4 * self._entries)

    def outstanding(self) -> tuple[np.ndarray, np.ndarray]:
        """The (row, version) references this client still holds, one entry per reference."""
        if not self._rows:
            return _EMPTY, _EMPTY
        return net(np.concatenate(self._rows), np.concatenate(self._versions), np.concatenate(self._signs))

    def entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The log as it is, not netted: (rows, versions, signs: +1 sent, -1 released). A partition move
        carries a row's entries to its new server (``replace`` there): O(entries), no sort."""
        if not self._rows:
            return _EMPTY, _EMPTY, np.empty(0)
        return np.concatenate(self._rows), np.concatenate(self._versions), np.concatenate(self._signs)

    def replace(self, rows: np.ndarray, versions: np.ndarray, signs: np.ndarray) -> None:
        """The log becomes these entries (``entries`` of the rows now here, in their local rows)."""
        self.clear()
        if rows.shape[0]:
            self._rows = [rows.astype(np.int64)]
            self._versions = [versions.astype(np.int64)]
            self._signs = [signs.astype(np.float64)]
            self._entries = rows.shape[0]
        self._compact_at = max(1 << 16, 4 * self._entries)

    def clear(self) -> None:
        self._rows, self._versions, self._signs, self._entries = [], [], [], 0
