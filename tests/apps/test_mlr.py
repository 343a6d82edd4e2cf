"""MLR app: kernels vs NumPy, the libsvm reader's errors, worker logic, and runs through the launcher."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cmd
from inprocess import InProcessClient, InProcessTable

from bosen.apps.mlr import data as D
from bosen.apps.mlr.kernels import evaluate, logits, loss_grad, sgd_pass
from bosen.apps.mlr.model import LocalModel
from bosen.apps.mlr.worker import MLRArgs, lr_at, train

REPO = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------------------------
# kernels vs a plain NumPy reference


def _small(seed: int = 0, n: int = 50, F: int = 12, K: int = 4, density: float = 0.4) -> D.Dataset:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, F)).astype(np.float32) * (rng.random((n, F)) < density)
    X[3] = 0.0  # a sample with no features at all
    mask = X != 0
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(mask.sum(1), out=indptr[1:])
    return D.Dataset(indptr, np.nonzero(mask)[1].astype(np.int32), X[mask], rng.integers(0, K, n).astype(np.int32),
                     F, K)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


def _ref_loss_grad(X, y, W):
    """W: K x (F+1), bias last."""
    z = X @ W[:, :-1].T + W[:, -1]
    p = _softmax(z)
    loss = -np.log(p[np.arange(len(y)), y]).sum()
    r = p.copy()
    r[np.arange(len(y)), y] -= 1
    return loss, np.hstack([r.T @ X, r.sum(0)[:, None]])


def _ref_sgd(X, y, W, order, B, lr, reg):
    W = W.astype(np.float64).copy()
    total = 0.0
    for s in range(0, len(order), B):
        idx = order[s:s + B]
        loss, G = _ref_loss_grad(X[idx], y[idx], W)
        total += loss
        G /= len(idx)
        G[:, :-1] += reg * W[:, :-1]  # L2 on weights, not biases
        W -= lr * G
    return total, W


def test_loss_grad_matches_numpy():
    ds = _small()
    W = np.random.default_rng(1).standard_normal((ds.classes, ds.features + 1))
    rows = np.arange(0, ds.n, 2, dtype=np.int64)
    loss, G = loss_grad(ds.indptr, ds.indices, ds.values, ds.labels, rows, W)
    want_loss, want_G = _ref_loss_grad(ds.dense()[rows].astype(np.float64), ds.labels[rows], W)
    assert loss == pytest.approx(want_loss, rel=1e-9)
    np.testing.assert_allclose(G, want_G, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("B, lr, reg", [(1, 0.1, 0.0), (7, 0.3, 0.01), (50, 0.5, 0.0), (4, 0.5, 1.5)])
def test_sgd_pass_matches_numpy_minibatch_sgd(B, lr, reg):
    # reg * lr = 0.75 decays the scale below the rescale threshold within a few batches
    ds = _small(seed=B)
    rng = np.random.default_rng(2)
    W = (rng.standard_normal((ds.classes, ds.features + 1)) * 0.3).astype(np.float32)
    order = rng.permutation(ds.n).astype(np.int64)
    order = np.concatenate([order, order[:9]])  # repeats allowed
    m = LocalModel(ds.classes, ds.features)
    m.load(W)
    loss = m.train(ds, order, B, lr, reg)
    want_loss, want_W = _ref_sgd(ds.dense().astype(np.float64), ds.labels, W, order, B, lr, reg)
    assert loss == pytest.approx(want_loss, rel=1e-4)
    np.testing.assert_allclose(m.table(), want_W, rtol=2e-4, atol=2e-5)


def test_sgd_pass_raw_signature_and_scale():
    ds = _small()
    V = np.zeros((ds.features, ds.classes), np.float32)
    b = np.zeros(ds.classes, np.float32)
    scale = np.ones(1)
    loss = sgd_pass(ds.indptr, ds.indices, ds.values, ds.labels, np.arange(ds.n, dtype=np.int64), 10, V, b,
                    scale, 0.1, 0.01)
    assert loss == pytest.approx(ds.n * np.log(ds.classes), rel=0.05)  # first batches start at uniform
    assert scale[0] == pytest.approx((1 - 0.1 * 0.01) ** 5)  # 5 batches of 10, lazily applied decay


def test_evaluate_and_logits_match_numpy():
    ds = _small(seed=3)
    rng = np.random.default_rng(3)
    W = rng.standard_normal((ds.classes, ds.features + 1)).astype(np.float32)
    m = LocalModel(ds.classes, ds.features)
    m.load(W)
    np.testing.assert_array_equal(m.table(), W)  # layout round trip is exact
    z = ds.dense() @ W[:, :-1].T + W[:, -1]
    np.testing.assert_allclose(logits(ds.indptr, ds.indices, ds.values, m.V, m.b), z, rtol=1e-5, atol=1e-5)
    correct, loss = m.evaluate(ds)
    assert correct == int((z.argmax(1) == ds.labels).sum())
    assert loss == pytest.approx(-np.log(_softmax(z.astype(np.float64))[np.arange(ds.n), ds.labels]).sum(), rel=1e-4)
    c2, _ = evaluate(ds.indptr, ds.indices, ds.values, ds.labels, m.V * 2, m.b, np.float32(0.5))
    assert c2 == correct  # W = s V


def test_kernels_learn_digits():
    tr, ho = D.split_holdout(D.digits(), 0.2, 0)
    m = LocalModel(tr.classes, tr.features)
    rng = np.random.default_rng(0)
    for e in range(10):
        m.train(tr, rng.permutation(tr.n), 32, 0.5 / (1 + 0.1 * e), 1e-4)
    assert m.evaluate(ho)[0] / ho.n >= 0.94


# ------------------------------------------------------------------------------------------------
# libsvm reader


def _write(tmp_path: Path, text: str, name: str = "d.svm") -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode())
    return p


def test_read_libsvm_one_based_comments_blank_lines(tmp_path):
    p = _write(tmp_path, "# header\n3 1:0.5 3:2e-1\n\n7 2:1 # trailing 0:9\n3\n-1 qid:4 4:-.25\n")
    ds, label_map = D.read_libsvm(p)
    assert label_map.tolist() == [-1, 3, 7]
    assert ds.labels.tolist() == [1, 2, 1, 0] and ds.features == 4 and ds.classes == 3
    np.testing.assert_allclose(ds.dense(), [[0.5, 0, 0.2, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, -0.25]])


def test_read_libsvm_zero_based_auto_and_explicit(tmp_path):
    p = _write(tmp_path, "0 0:1 2:3\n1 1:2\n")
    ds, _ = D.read_libsvm(p)  # an id 0 makes "auto" pick 0-based
    np.testing.assert_allclose(ds.dense(), [[1, 0, 3], [0, 2, 0]])
    ds, _ = D.read_libsvm(_write(tmp_path, "0 1:1 2:3\n1 3:2\n", "b.svm"), zero_based=True, features=5)
    np.testing.assert_allclose(ds.dense(), [[0, 1, 3, 0, 0], [0, 0, 0, 2, 0]])
    ds, _ = D.read_libsvm(_write(tmp_path, "0 1:1 2:3\n1 3:2\n", "c.svm"))  # auto: 1-based
    np.testing.assert_allclose(ds.dense(), [[1, 3, 0], [0, 0, 2]])


def test_read_libsvm_round_trip_and_test_file_label_map(tmp_path):
    ds = D.synthetic(300, 50, 5, nnz=8, seed=4)
    for one_based in (True, False):
        p = tmp_path / f"s{one_based}.svm"
        D.write_libsvm(p, ds, one_based=one_based)
        got, label_map = D.read_libsvm(p, features=50, zero_based=not one_based)
        assert label_map.tolist() == list(range(5))
        np.testing.assert_array_equal(got.indptr, ds.indptr)
        np.testing.assert_array_equal(got.indices, ds.indices)
        np.testing.assert_allclose(got.values, ds.values, rtol=1e-6)
        np.testing.assert_array_equal(got.labels, ds.labels)
    test = _write(tmp_path, "2 1:1\n9 2:1\n", "t.svm")
    with pytest.raises(D.DataError, match=r"t\.svm:2: label 9 is not one of the training classes"):
        D.read_libsvm(test, label_map=np.array([1, 2, 3]))


@pytest.mark.parametrize("text, line, what", [
    ("1 1:0.5\n2 3:abc\n", 2, "feature value is not a finite number: 'abc' in '2 3:abc'"),
    ("1 1:0.5\n2 3:nan\n", 2, "not a finite number"),
    ("1 1:0.5\n2 3:\n", 2, "not a finite number"),
    ("1 1:0.5\n2 3:1e\n", 2, "not a finite number"),
    ("1 1:0.5\n2 3 4:1\n", 2, "bad token, expected INDEX:VALUE: '3'"),
    ("1 1:0.5\n\nx 2:1\n", 3, "label is not a number: 'x'"),
    ("1.5 1:0.5\n", 1, "class label must be an integer"),
    ("1 a:0.5\n", 1, "feature id is not a non-negative integer: 'a:0.5'"),
    ("1 -3:0.5\n", 1, "feature id is not a non-negative integer"),
    ("1 3:1 2:1\n", 1, "strictly increasing"),
    ("1 3:1 3:1\n", 1, "strictly increasing"),
    ("# c\n1 1:0.5\n2 2:0.5 3:0.2", 3, "truncated last line"),
    ("1 1:0.5\n2 2:0.5 3:", 2, "truncated last line"),
])
def test_read_libsvm_errors_name_file_and_line(tmp_path, text, line, what):
    p = _write(tmp_path, text)
    with pytest.raises(D.DataError, match=what) as e:
        D.read_libsvm(p)
    assert f"{p}:{line}:" in str(e.value)


def test_read_libsvm_ids_outside_the_model(tmp_path):
    p = _write(tmp_path, "1 1:1\n2 4:1\n")
    with pytest.raises(D.DataError, match=r"d\.svm:2: feature id exceeds the model's feature count"):
        D.read_libsvm(p, features=3)
    with pytest.raises(D.DataError, match=r"d\.svm:2: feature id exceeds"):
        D.read_libsvm(p, features=4, zero_based=True)
    p = _write(tmp_path, "1 2:1\n2 0:1 4:1\n", "z.svm")
    with pytest.raises(D.DataError, match=r"z\.svm:2: feature id 0 in a 1-based file"):
        D.read_libsvm(p, zero_based=False)


def test_read_libsvm_missing_and_empty(tmp_path):
    with pytest.raises(D.DataError, match="data file not found") as e:
        D.read_libsvm(tmp_path / "nope.svm")
    assert "nope.svm" in str(e.value)
    with pytest.raises(D.DataError, match="no samples"):
        D.read_libsvm(_write(tmp_path, "# nothing\n\n"))
    with pytest.raises(D.DataError, match="no samples"):
        D.read_libsvm(_write(tmp_path, "", "e.svm"))


# ------------------------------------------------------------------------------------------------
# generated and packaged data


def test_synthetic_is_deterministic_sparse_and_learnable():
    a = D.synthetic(2000, 300, 6, nnz=15, seed=5)
    b = D.synthetic(2000, 300, 6, nnz=15, seed=5)
    for x, y in zip((a.indptr, a.indices, a.values, a.labels), (b.indptr, b.indices, b.values, b.labels),
                    strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(D.synthetic(2000, 300, 6, nnz=15, seed=6).labels, a.labels)
    lens = np.diff(a.indptr)
    assert lens.max() <= 15 and lens.mean() > 14
    rows = np.repeat(np.arange(a.n), lens)
    assert np.all(np.diff(a.indices)[np.diff(rows) == 0] > 0)  # strictly increasing within a row
    assert a.indices.max() < 300 and a.labels.max() < 6 and np.bincount(a.labels).min() > 100
    with pytest.raises(ValueError):
        D.synthetic(10, 5, 1)


def test_digits_split_and_partition():
    d = D.digits()
    assert (d.n, d.features, d.classes) == (1797, 64, 10)
    assert 0 < d.values.min() and d.values.max() <= 1.0
    tr, ho = D.split_holdout(d, 0.2, 0)
    assert (tr.n, ho.n) == (1438, 359)
    tr2, _ = D.split_holdout(d, 0.2, 0)
    np.testing.assert_array_equal(tr.labels, tr2.labels)
    parts = [D.partition(tr.n, r, 3) for r in range(3)]
    np.testing.assert_array_equal(np.concatenate(parts), np.arange(tr.n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


# ------------------------------------------------------------------------------------------------
# worker logic against an in-process stand-in for the client (exact reads, no staleness)


def _client(rows: int = 10, cols: int = 65, dtype: str = "float32", rank: int = 0, workers: int = 1,
            table: InProcessTable | None = None) -> InProcessClient:
    return InProcessClient(table or InProcessTable("W", rows, cols, dtype), rank=rank, num_workers=workers)


def _acc(r: dict) -> float:
    return r["heldout_correct"] / r["heldout_total"]


def test_train_in_process_digits_converges_and_reports_each_clock():
    c = _client()
    train(c, {"data": "digits", "epochs": 6, "clocks_per_epoch": 2, "batches_per_clock": 1})
    assert c.clocks == 12 and len(c.reports) == 12
    assert sum(r["samples"] for r in c.reports[:2]) == 1438  # two clocks cover the partition once
    assert len(c.tables["W"].reads) == 12 and c.tables["W"].incs == 12  # one read and one delta per clock
    assert all(r["compute_s"] >= 0 and r["comm_s"] >= 0 and r["heldout_total"] == 359 for r in c.reports)
    assert c.reports[-1]["objective"] < 0.3 * c.reports[0]["objective"]
    assert _acc(c.reports[-1]) >= 0.93
    assert c.reports[0]["lr"] == 0.5 and c.reports[2]["lr"] == pytest.approx(0.5 / 1.1)


def test_train_batches_per_clock_and_two_sequential_workers_share_the_table():
    t = InProcessTable("W", 10, 65)
    a, b = _client(table=t, rank=0, workers=2), _client(table=t, rank=1, workers=2)
    args = {"data": "digits", "epochs": 1, "batch_size": 16, "batches_per_clock": 9, "eval_every": 0}
    train(a, args)
    assert len(t.reads) == 9 and t.incs == 9  # 719 samples = 45 minibatches of 16, in 9 pieces of 5
    train(b, args)  # starts from rank 0's model: its deltas add to the table
    assert a.reports[0]["samples"] + b.reports[0]["samples"] == 1438
    assert "heldout_correct" not in a.reports[0] and "lr" in a.reports[0] and "lr" not in b.reports[0]
    assert b.reports[0]["objective"] < 0.5 * a.reports[0]["objective"]


def test_train_libsvm_file_with_test_file(tmp_path):
    full = D.synthetic(3000, 40, 4, nnz=10, seed=3, temperature=0.1)
    tr, ho = D.split_holdout(full, 0.25, 0)
    D.write_libsvm(tmp_path / "train.svm", tr)
    D.write_libsvm(tmp_path / "test.svm", ho)
    c = _client(4, 41)
    train(c, {"data": str(tmp_path / "train.svm"), "test_data": str(tmp_path / "test.svm"), "epochs": 8,
              "lr": 1.0, "reg": 0.0})
    assert c.reports[-1]["heldout_total"] == ho.n and sum(r["samples"] for r in c.reports) == 8 * tr.n
    assert _acc(c.reports[-1]) > 0.6


def test_npz_round_trip_and_malformed_files(tmp_path):
    ds = D.synthetic(200, 30, 3, nnz=6, seed=1)
    D.save_npz(tmp_path / "d.npz", ds)
    back, extra = D.load_npz(tmp_path / "d.npz")
    assert extra == {} and (back.features, back.classes) == (30, 3)
    for k in ("indptr", "indices", "values", "labels"):
        np.testing.assert_array_equal(getattr(back, k), getattr(ds, k))
    np.savez(tmp_path / "bad.npz", indptr=np.array([0, 5]), indices=np.arange(2), values=np.ones(2),
             labels=np.zeros(1), shape=np.array([30, 3]))
    with pytest.raises(D.DataError, match="bad.npz: inconsistent CSR arrays"):
        D.load_npz(tmp_path / "bad.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(D.DataError, match="junk.npz: not a readable .npz file"):
        D.load_npz(tmp_path / "junk.npz")


def test_libsvm_cache_is_used_until_the_file_changes(tmp_path):
    full = D.synthetic(500, 40, 4, nnz=8, seed=3)
    tr, ho = D.split_holdout(full, 0.3, 0)
    D.write_libsvm(tmp_path / "tr.svm", tr)
    D.write_libsvm(tmp_path / "te.svm", ho)
    a, lm = D.read_libsvm_cached(tmp_path / "tr.svm", features=40)
    cache = tmp_path / ("tr.svm" + D.CACHE_SUFFIX)
    assert cache.is_file()
    t_a, _ = D.read_libsvm_cached(tmp_path / "te.svm", features=40, label_map=lm)
    # a second read comes from the cache (mark it to tell) and equals the parse
    ds, extra = D.load_npz(cache)
    D.save_npz(cache, D.Dataset(ds.indptr, ds.indices, ds.values * 0 + 7, ds.labels, ds.features, ds.classes),
               **extra)
    b, lm_b = D.read_libsvm_cached(tmp_path / "tr.svm", features=40)
    assert np.all(b.values == 7) and np.array_equal(lm_b, lm) and np.array_equal(b.labels, a.labels)
    t_b, _ = D.read_libsvm_cached(tmp_path / "te.svm", features=40, label_map=lm)
    np.testing.assert_array_equal(t_b.labels, t_a.labels)
    # the file changes: parsed again
    D.write_libsvm(tmp_path / "tr.svm", tr.take(np.arange(100)))
    c, _ = D.read_libsvm_cached(tmp_path / "tr.svm", features=40)
    assert c.n == 100 and not np.any(c.values == 7)


def test_train_npz_files_report_heldout_accuracy_of_the_final_model(tmp_path):
    full = D.synthetic(3000, 40, 4, nnz=10, seed=3, temperature=0.1)
    tr, ho = D.split_holdout(full, 0.25, 0)
    D.save_npz(tmp_path / "train.npz", tr)
    D.save_npz(tmp_path / "test.npz", ho)
    c = _client(4, 41)
    train(c, {"data": str(tmp_path / "train.npz"), "test_data": str(tmp_path / "test.npz"), "epochs": 5,
              "lr": 1.0, "reg": 0.0})
    W = c.tables["W"].data
    direct = float(np.mean(np.argmax(ho.dense() @ W[:, :-1].T + W[:, -1], axis=1) == ho.labels))
    last = c.reports[-1]
    assert last["heldout_total"] == ho.n and last["heldout_correct"] / ho.n == pytest.approx(direct, abs=1e-9)
    assert direct > 0.6


def test_train_synthetic_uses_table_geometry():
    c = _client(5, 31)
    train(c, {"data": "synthetic", "synthetic": {"n": 2000, "nnz": 8}, "epochs": 3, "holdout": 0.1})
    assert c.reports[0]["samples"] == 1800 and c.reports[-1]["heldout_total"] == 200


@pytest.mark.parametrize("rows, cols, args, match", [
    (10, 65, {"epochs": 0}, "app.args.epochs"),
    (10, 65, {"learning_rate": 0.1}, "app.args.learning_rate: unknown key"),
    (10, 65, {"lr_schedule": "cosine"}, "app.args.lr_schedule"),
    (10, 65, {"lr_schedule": "exponential", "lr_decay": 2.0}, "lr_decay"),
    (10, 65, {"holdout": 1.0}, "app.args.holdout"),
    (10, 65, {"lr": 2.0, "reg": 0.5}, "lr \\* reg must be < 1"),
    (10, 65, {"synthetic": {"nnz": 0}}, "app.args.synthetic.nnz"),
    (10, 64, {"features": 64}, "need table 'W' of rows=10, cols=65"),
    (10, 64, {}, "64 features do not fit a table of 64 cols"),
    (10, 65, {"classes": 3}, "classes=3"),
    (9, 65, {}, "10 classes do not fit a table of 9 rows"),
    (10, 50, {"features": 49}, "64 features do not fit"),
])
def test_train_rejects_bad_args_and_geometry(rows, cols, args, match):
    with pytest.raises(ValueError, match=match):
        train(_client(rows, cols), {"data": "digits", **args})


def test_train_rejects_int_table_and_bad_files(tmp_path):
    with pytest.raises(ValueError, match="needs a float table"):
        train(_client(dtype="int32"), {})
    with pytest.raises(D.DataError, match="nope.svm: data file not found"):
        train(_client(), {"data": str(tmp_path / "nope.svm")})
    p = _write(tmp_path, "1 1:1\n2 70:1\n")
    with pytest.raises(D.DataError, match=r"d\.svm:2: feature id exceeds"):
        train(_client(), {"data": str(p)})


def test_lr_schedules():
    a = MLRArgs(lr=1.0, lr_decay=0.5, clocks_per_epoch=2)
    assert lr_at(a, 0) == 1.0 and lr_at(a, 2) == pytest.approx(1 / 1.5) and lr_at(a, 1) == pytest.approx(1 / 1.25)
    e = MLRArgs(lr=1.0, lr_decay=0.5, lr_schedule="exponential")
    assert lr_at(e, 2) == pytest.approx(0.25)
    assert lr_at(MLRArgs(lr_schedule="constant"), 9) == 0.5


# ------------------------------------------------------------------------------------------------
# end to end through `bosen launch`


def _launch(tmp_path: Path, *sets: str, workers: int = 2, timeout: float = 60) -> subprocess.CompletedProcess:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "bosen", "launch", str(REPO / "configs" / "mlr.yaml"), "--workers", str(workers),
           "--run-dir", str(run_dir), "--quiet", "--no-plot"]
    for s in sets:
        cmd += ["--set", s]
    return run_cmd(cmd, timeout=timeout)


def _clocks(tmp_path: Path) -> list[dict]:
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return sorted((x for x in lines if x.get("kind") == "clock"), key=lambda x: x["clock"])


@pytest.mark.slow
def test_e2e_digits_two_workers_staleness_2_reaches_90_percent(tmp_path):
    """The stated target: >= 0.90 held-out accuracy on sklearn's digits (real data), 2 workers, s = 2."""
    p = _launch(tmp_path, "consistency.staleness=2", "app.args.epochs=15")
    assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    clocks = _clocks(tmp_path)
    assert len(clocks) == 15 and all(c["samples"] == 1438 and c["workers"] == 2 for c in clocks)
    assert clocks[-1]["objective"] < 0.3 * clocks[0]["objective"]
    assert _acc(clocks[-1]) >= 0.90, [round(_acc(c), 3) for c in clocks]


@pytest.mark.slow
def test_e2e_managed_comm_with_mid_clock_syncs(tmp_path):
    p = _launch(tmp_path, "comm.enabled=true", "comm.client_bandwidth_mbps=50", "app.args.batches_per_clock=4",
                "app.args.epochs=8", "app.args.clocks_per_epoch=2", "consistency.staleness=1")
    assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    clocks = _clocks(tmp_path)
    assert len(clocks) == 16 and _acc(clocks[-1]) >= 0.90


@pytest.mark.slow
def test_e2e_bad_data_file_fails_naming_file_and_line(tmp_path):
    bad = _write(tmp_path, "1 1:0.5\n2 2:0.1 3:oops\n", "bad.svm")
    p = _launch(tmp_path, f"app.args.data={bad}")
    assert p.returncode != 0
    logs = p.stdout + p.stderr + "".join(f.read_text() for f in (tmp_path / "run").rglob("*.log"))
    assert f"{bad}:2: feature value is not a finite number" in logs


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_resumed_dynamic_k_job_draws_on_from_each_workers_saved_sampler(tmp_path):
    """DBW proper (dynamic k, 3 workers, gradients dropped): every worker draws its mini-batches from the
    whole training set with its own generator, which is its checkpoint state with the count drawn (rank 2
    is made slower, so k_t usually falls and its gradients are dropped: each rank draws at its own pace). In
    every part, the generator is the rank's fresh one after that many draws. The job resumed from its
    checkpoint at clock 40 draws on from there: at 44 each rank's generator is its saved one of 40
    advanced by the 0-4 mini-batches it drew since (the uninterrupted run's too: one stream, whichever
    gradients were dropped), not a fresh one's."""
    from bosen import checkpoint
    from bosen.apps.mlr.worker import SAMPLER_DRAWN, SAMPLER_RNG, load_data
    from bosen.apps.state import rng_state
    from bosen.config import from_dict

    # rank 2 five times slower from iteration 2 (bosen.apps.delays): k_t usually falls below 3 and its
    # gradients are dropped (not asserted: k_t follows measured round trips, which the machine's load
    # blurs); the samplers' checks hold whichever gradients were dropped
    args = {"data": "digits", "holdout": 0.1, "batch_size": 7, "epochs": 44, "eval_every": 0,
            "delay": {"mean_s": 0.02, "alpha": 0.0, "slow_from": 2, "slow_factor": 5.0}}
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 3}, "checkpoint": {"every_clocks": 4, "keep": 100},
           "tables": {"W": {"rows": 10, "cols": 65, "dtype": "float64", "init": {"zeros": True},
                            "backup": {"mode": "dynamic", "lr": 1.0}}},
           "app": {"module": "bosen.apps.mlr", "args": args}}
    path, run = tmp_path / "job.yaml", tmp_path / "run"
    path.write_text(json.dumps(cfg))
    a = from_dict(MLRArgs, args, "app.args")
    n = load_data(a, 10, 64)[0].n

    def samplers(clock: int) -> dict[int, tuple[np.ndarray, int]]:
        """Each rank's saved generator and mini-batches drawn, checked against its fresh stream."""
        parts = checkpoint.check_complete(run / "checkpoints", clock, 1, 3, None)
        out = {}
        for r in range(3):
            st = parts[f"worker-{r}"].load()
            drawn = st[SAMPLER_DRAWN].tolist()
            assert drawn[1] == 7 * drawn[0], (clock, r, drawn)
            rng = np.random.default_rng([a.seed, r])
            for _ in range(drawn[0]):
                rng.integers(0, n, 7)
            np.testing.assert_array_equal(st[SAMPLER_RNG], rng_state(rng), err_msg=f"clock {clock}, rank {r}")
            out[r] = (st[SAMPLER_RNG], drawn[0])
        return out

    launch = [sys.executable, "-m", "bosen", "launch", str(path), "--no-plot", "--quiet"]
    p = run_cmd([*launch, "--run-dir", str(run)], timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    at40, whole = samplers(40), samplers(44)
    for c in checkpoint.clocks(run / "checkpoints"):
        if c > 40:
            shutil.rmtree(checkpoint.clock_dir(run / "checkpoints", c))
    p = subprocess.run([*launch[:-1], "--resume", str(run)], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0 and "resuming from the checkpoint at clock 40" in p.stdout, p.stdout[-3000:] + p.stderr
    resumed = samplers(44)
    for r in range(3):
        assert at40[r][1] > 4, at40  # so a fresh generator (at most 4 draws since) could not pass the checks
        for got in (whole[r][1], resumed[r][1]):  # both drew on from 40: at most one mini-batch an iteration
            assert at40[r][1] <= got <= at40[r][1] + 4, (r, at40[r][1], whole[r][1], resumed[r][1])


def test_fashion_config_is_logistic_regressions_objective():
    import yaml

    from bosen.config import from_dict

    cfg = yaml.safe_load((REPO / "configs" / "mlr-fashion.yaml").read_text())
    a = from_dict(MLRArgs, cfg["app"]["args"], "app.args")
    # reg = 1 / n_train: scikit-learn LogisticRegression's C=1 penalty per sample (bench/apps/mlr.py)
    assert a.reg == pytest.approx(1 / 60_000, rel=1e-3)
    assert (a.batch_size, a.lr, a.lr_schedule, a.lr_decay) == (16, 0.1, "inverse", 1.0)
    assert lr_at(a, 3) == pytest.approx(0.1 / 4)


def test_bench_time_to_accuracy_counts_training_seconds_up_to_the_first_hit():
    from bench.apps import mlr as apps_mlr  # pyproject's pytest pythonpath: the checkout
    run = {"epoch_s": [1.0, 2.0, 4.0], "accuracy": [0.5, 0.8, 0.9]}
    assert apps_mlr._time_to(run, 0.8) == (2, 3.0)
    assert apps_mlr._time_to(run, 0.95) == (None, None)


def test_digits_without_scikit_learn_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # as if not installed (pip install bosen alone)
    with pytest.raises(D.DataError, match="pip install scikit-learn"):
        D.digits()
