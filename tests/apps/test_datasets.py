"""``bosen data``: each packaged data set on its real files, and the errors a user meets without them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bosen.apps import datasets
from bosen.apps.datasets import images, movielens, news, packaged
from bosen.apps.lda.data import read_uci
from bosen.apps.mf.data import load_csv
from bosen.apps.mlr.data import load_npz
from bosen.jobs import cli


@pytest.mark.slow
def test_movielens_split_is_disjoint_complete_and_readable(tmp_path):
    u0, i0, r0 = movielens.read_inter(movielens.source())
    assert u0.size == 100_000 and np.unique(u0).size == 943 and np.unique(i0).size == 1682
    meta = datasets.prepare("movielens", tmp_path)
    assert meta["n_users"] == 943 and meta["n_items"] == 1682
    assert (meta["train_ratings"], meta["test_ratings"]) == (80_000, 20_000)
    assert json.loads((tmp_path / "dataset.json").read_text())["files"]["test"] == "test.csv"
    tr, te = load_csv(tmp_path / "train.csv"), load_csv(tmp_path / "test.csv")
    pairs = [set(zip(t[0].tolist(), t[1].tolist(), strict=True)) for t in (tr, te)]
    assert not pairs[0] & pairs[1] and len(pairs[0]) + len(pairs[1]) == 100_000  # each rating once
    assert tr[0].max() == 942 or te[0].max() == 942  # ids renumbered from 0
    # the same ratings as the source: the multiset of rating values is unchanged
    assert np.array_equal(np.sort(np.concatenate([tr[2], te[2]])), np.sort(r0))


@pytest.mark.slow
def test_news_corpus_vocabulary_filters_and_heldout(tmp_path):
    assert news.tokenize("The Senate voted: DeVos's 50-50 tie, it is") == ["senate", "voted", "devos", "tie"]
    meta = datasets.prepare("news", tmp_path)
    train = read_uci(tmp_path / "docword.news.txt")
    held = read_uci(tmp_path / "docword.news-heldout.txt")
    assert train.vocab is not None and len(train.vocab) == train.n_vocab == held.n_vocab == meta["vocabulary"]
    assert train.n_docs > 3000 and 300 < held.n_docs < 400 and train.n_tokens > 500_000
    assert not set(train.vocab) & news.STOP_WORDS
    # kept words occur in MIN_DF..MAX_DF of the training documents (before short documents are dropped)
    df = np.bincount(np.unique(train.docs.astype(np.int64) * train.n_vocab + train.words) % train.n_vocab,
                     minlength=train.n_vocab)
    assert df.min() >= 1 and (df >= news.MIN_DF).mean() > 0.99 and df.max() <= news.MAX_DF * train.n_docs
    assert np.diff(held.doc_ptr()).min() >= news.MIN_TOKENS


def test_mnist5k_split_and_npz_round_trip(tmp_path):
    meta = datasets.prepare("mnist-5k", tmp_path, libsvm=True)
    assert (meta["train_samples"], meta["test_samples"], meta["features"]) == (4000, 1000, 784)
    train, _ = load_npz(tmp_path / "train.npz")
    test, _ = load_npz(tmp_path / "test.npz")
    assert train.n == 4000 and test.n == 1000 and train.classes == 10
    assert np.bincount(np.concatenate([train.labels, test.labels])).tolist() == [500] * 10
    assert 0 < train.values.min() and train.values.max() <= 1.0  # pixels scaled, zeros left out
    assert (tmp_path / "train.libsvm").stat().st_size > 0


def test_fashion_mnist_from_the_debian_package(tmp_path):
    if not images.FASHION_DIR.is_dir():
        pytest.skip(f"Debian package dataset-fashion-mnist not installed ({images.FASHION_DIR} missing): "
                    f"{images.FASHION_INSTALL}")
    x = images.read_idx(images.fashion_sources()["test_x"], 3)
    assert x.shape == (10_000, 28, 28) and x.dtype == np.uint8
    meta = datasets.prepare("fashion-mnist", tmp_path)
    assert (meta["train_samples"], meta["test_samples"], meta["classes"]) == (60_000, 10_000, 10)
    test, _ = load_npz(tmp_path / "test.npz")
    assert np.bincount(test.labels).tolist() == [1000] * 10


def test_missing_packages_say_how_to_install_them(monkeypatch, tmp_path, capsys):
    with pytest.raises(packaged.MissingPackage, match="'no_such_pkg_x' that ships it is not installed: pip inst"):
        packaged.pip_file("demo", "no_such_pkg_x", "a/b.txt", "pip install no_such_pkg_x")
    monkeypatch.setattr(movielens, "PACKAGE", "recbole_not_here")
    with pytest.raises(packaged.MissingPackage, match=r"pip install --no-deps recbole==1\.2\.1"):
        datasets.prepare("movielens", tmp_path)
    monkeypatch.setattr(images, "FASHION_DIR", tmp_path / "nowhere")
    with pytest.raises(packaged.MissingPackage, match="apt-get install dataset-fashion-mnist"):
        datasets.prepare("fashion-mnist", tmp_path)
    # the command line: exit status 2 and one line naming the install command
    assert cli.main(["data", "movielens", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "recbole==1.2.1" in err[0]


def test_unknown_name_and_missing_prepared_file(tmp_path):
    with pytest.raises(ValueError, match="unknown data set 'nope'; known: movielens, news"):
        datasets.prepare("nope", tmp_path)
    with pytest.raises(ValueError, match=r"run `bosen data movielens` first"):
        load_csv(tmp_path / "data" / "movielens" / "train.csv")
    with pytest.raises(ValueError, match=r"run `bosen data fashion-mnist` first"):
        load_npz(tmp_path / "fashion-mnist" / "train.npz")


def test_cli_prepares_a_data_set(tmp_path, capsys):
    assert cli.main(["data", "mnist-5k", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "train_samples 4000" in out and "train.npz" in out
    (tmp_path / "afile").write_text("")
    assert cli.main(["data", "mnist-5k", "--out", str(tmp_path / "afile")]) == 2
    assert f"bosen data: cannot write {tmp_path / 'afile'}" in capsys.readouterr().err
