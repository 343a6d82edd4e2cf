"""bench.apps.ldamemory (an LDA worker's memory for a large vocabulary): its corpus and a short run
through ``bosen launch`` with a sparse word_topic."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from bench.apps import ldamemory
from bench.common import REPO, repo_env


def test_zipf_corpus_is_seeded_sorted_and_skewed():
    a, b = ldamemory.zipf_corpus(300, 5000, 20.0), ldamemory.zipf_corpus(300, 5000, 20.0)
    np.testing.assert_array_equal(a.words, b.words)
    assert a.n_docs == 300 and a.n_vocab == 5000 and a.words.max() < 5000 and a.words.min() >= 0
    key = a.docs.astype(np.int64) * 5000 + a.words
    assert np.all(np.diff(key) >= 0)  # by document, words sorted within one (Corpus' order)
    counts = np.sort(np.bincount(a.words, minlength=5000))[::-1]
    assert counts[0] > 20 * counts[100] > 0 and (counts == 0).sum() > 1000  # a Zipf head, many unused words


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_short_run_reports_each_workers_memory_and_rows_of_its_own_words():
    out = subprocess.run([sys.executable, "-m", "bench.apps.ldamemory", "--vocab", "3000", "--K", "16",
                          "--docs", "200", "--doc-len", "20", "--iterations", "1", "--storage", "sparse"],
                         cwd=REPO, env=repo_env(), capture_output=True, text=True, timeout=230, check=True)
    recs = {r["rank"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(recs) == {0, 1}
    for r in recs.values():
        assert r["ours"] > 50 and r["rss_after_first_clock_MB"]["median"] > 50
        assert r["words"] < 3000
    assert recs[1]["rows_held"] == recs[1]["words"]  # rank 1 holds its own words' rows only
    assert recs[1]["words"] <= recs[0]["rows_held"] < 3000  # rank 0 those of the corpus' words
