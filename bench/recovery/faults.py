"""The fault models of the recovery experiments: what a failure loses and how it is put back.

MF (and LDA with ``--lose rows``): a random fraction of the rows of the server tables (``lost_rows``
of the ``stacked`` tables), put back from a full checkpoint or from SCAR's running checkpoint
(``running_checkpoint``); ``perturbation`` says how far the put-back rows are from the live ones.
LDA (``--lose documents``, SCAR's LDA fault model): ``Documents`` loses documents' topic assignments
and regenerates the word-topic counts from all of them.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import yaml

from bench.recovery.states import States
from bosen import checkpoint, scar


class Documents:
    """LDA's documents as SCAR's parameters (its LDA fault model, T:1638-1642: the document-topic rows
    fail; the word-topic counts are regenerable). Per clock, the workers' checkpoint parts give every
    document's topic assignments ``z`` and doc-topic counts (rows of ``ndk``, stacked in global
    document order); a recovered state takes each lost document's ``z`` from the clock it was saved
    at, recounts ``ndk``, and regenerates ``word_topic`` and ``topic_summary`` from all of ``z``, so
    the servers' counts are consistent with the workers' assignments."""

    def __init__(self, states: States, cfg_path: Path) -> None:
        from bosen.apps.lda.data import load as load_corpus

        a = yaml.safe_load(cfg_path.read_text())["app"]["args"]
        corpus = load_corpus(a["data"], a.get("vocab") or None, a.get("format", "auto"))
        self.states = states
        self.K = int(a["K"])
        self.V = corpus.n_vocab
        self.workers = int(states.config.cluster.workers)
        self.words: list[np.ndarray] = []  # per worker: each token's word
        self.docs: list[np.ndarray] = []   # per worker: each token's document (global stacked row)
        self.first: list[int] = []         # per worker: its first document's stacked row
        self.count: list[int] = []         # per worker: its documents
        for r in range(self.workers):
            lo, hi = corpus.doc_range(r, self.workers)
            part = corpus.subset(lo, hi)
            self.words.append(part.words.astype(np.int64))
            self.docs.append(part.docs.astype(np.int64) + lo)
            self.first.append(lo)
            self.count.append(hi - lo)
        self.n_docs = corpus.n_docs
        self._cache: dict[int, list[dict[str, np.ndarray]]] = {}

    def reading(self, states: States) -> Documents:
        """These documents with the workers' parts read from ``states``' run (e.g. a resumed run)."""
        other = copy.copy(self)
        other.states, other._cache = states, {}
        return other

    def parts(self, clock: int) -> list[dict[str, np.ndarray]]:
        """The workers' checkpoint arrays at ``clock`` (clock 0: the first checkpoint's, which holds
        the initial assignments: the first clocks are barriers that sample nothing)."""
        clock = max(clock, 1)
        if clock not in self._cache:
            d = checkpoint.clock_dir(self.states.base, clock)
            self._cache[clock] = [checkpoint.read_part(d / f"worker-{r}", verify=False).load()
                                  for r in range(self.workers)]
        return self._cache[clock]

    def ndk(self, clock: int) -> np.ndarray:
        """Every document's topic counts at ``clock`` (one row per document)."""
        return np.concatenate([p["ndk"] for p in self.parts(clock)], axis=0)

    def recovered(self, live: int, source: np.ndarray) -> list[np.ndarray]:
        """Per worker ``z`` at clock ``live`` with each document d whose ``source[d] >= 0`` taken
        from clock ``source[d]``."""
        out = []
        for r, p in enumerate(self.parts(live)):
            z = p["z"].copy()
            src = source[self.docs[r]]
            for c in np.unique(src[src >= 0]):
                m = src == c
                z[m] = self.parts(int(c))[r]["z"][m]
            out.append(z)
        return out

    def counts(self, zs: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
        """(the server tables word_topic and topic_summary, every document's topic counts) of ``zs``."""
        K = self.K
        wt = np.zeros(self.V * K, np.int64)
        ndk = []
        for r, z in enumerate(zs):
            wt += np.bincount(self.words[r] * K + z, minlength=self.V * K)
            local = self.docs[r] - self.first[r]
            ndk.append(np.bincount(local * K + z, minlength=self.count[r] * K).reshape(-1, K))
        w = wt.reshape(self.V, K).astype(np.int32)
        return [w, w.sum(axis=0, dtype=np.int64)[None, :].astype(np.int32)], np.concatenate(ndk).astype(np.int32)

    def worker_arrays(self, live: int, zs: list[np.ndarray], ndk: np.ndarray) -> list[dict[str, np.ndarray]]:
        """The workers' checkpoint arrays at ``live`` with ``zs`` and ``ndk`` put in."""
        out = []
        for r, p in enumerate(self.parts(live)):
            a = dict(p)
            lo = self.first[r]
            a["z"] = zs[r].astype(p["z"].dtype)
            a["ndk"] = ndk[lo:lo + p["ndk"].shape[0]].astype(p["ndk"].dtype)
            out.append(a)
        return out


def stacked(values: list[np.ndarray]) -> np.ndarray:
    """The tables as one matrix of rows (MF: L's rows, then R's; LDA: word_topic's, then the summary
    row): the unit SCAR saves and loses."""
    return np.concatenate(values, axis=0)


def unstacked(m: np.ndarray, like: list[np.ndarray]) -> list[np.ndarray]:
    out, at = [], 0
    for a in like:
        out.append(m[at:at + a.shape[0]].astype(a.dtype))
        at += a.shape[0]
    return out


def lost_rows(like: list[np.ndarray], f: float, rng: np.random.Generator) -> np.ndarray:
    """Rows (of the stacked matrix) lost: a random fraction f of each table's rows."""
    out, at = [], 0
    for a in like:
        n = a.shape[0]
        out.append(at + rng.choice(n, size=int(round(f * n)), replace=False))
        at += n
    return np.sort(np.concatenate(out))


def running_checkpoint(states: States, metric: scar.Metric, policy: str, r: float, period: int, until: int,
                       seed: int) -> scar.RunningCheckpoint:
    """SCAR's running checkpoint at clock ``until``: from w(0), every r·period clocks the fraction r
    of rows chosen by ``policy`` saved from that clock's state, distances in ``metric``."""
    ck = scar.RunningCheckpoint(stacked(states.initial()), metric, seed=seed)
    step = max(1, int(round(r * period)))
    for c in range(step, until + 1, step):
        ck.step(policy, stacked(states.at(c)), r, c)  # type: ignore[arg-type]
    return ck



def perturbation(live: list[np.ndarray], recovered: np.ndarray, metric: scar.Metric) -> dict[str, float]:
    """How far the recovered rows are from the live ones: the L2 norm, and for count rows the summed
    scaled total variation (``bosen.scar``'s ``tv``)."""
    lv = stacked(live)
    out = {"perturbation_l2": float(np.linalg.norm(lv.astype(np.float64) - recovered))}
    if metric == "tv":
        out["perturbation_tv"] = float(scar.row_distance(lv, recovered, "tv").sum())
    return out
