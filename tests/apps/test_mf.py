"""SGD matrix factorization app: kernels, data, worker logic, and end-to-end runs through the launcher."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import PY, run_cmd
from inprocess import InProcessClient, InProcessTable

from bosen.apps.mf.data import load_csv, partition, synthetic, user_owner
from bosen.apps.mf.kernels import GATHER, clipped_squared_error, sgd_pass, squared_loss
from bosen.apps.mf.model import batches
from bosen.apps.mf.worker import train

# ------------------------------------------------------------------------------------------------
# kernels vs a plain NumPy reference


def _small(seed: int = 0, nu: int = 7, ni: int = 5, k: int = 4, n: int = 40):
    rng = np.random.default_rng(seed)
    u = rng.integers(0, nu, n).astype(np.int64)
    i = rng.integers(0, ni, n).astype(np.int64)
    r = rng.standard_normal(n).astype(np.float32)
    L = (rng.standard_normal((nu, k)) * 0.5).astype(np.float32)
    R = (rng.standard_normal((ni, k)) * 0.5).astype(np.float32)
    return u, i, r, L, R, rng


def _ref_pass(u, i, r, L, R, lr, reg, order):
    L, R = L.astype(np.float64), R.astype(np.float64)
    sse = 0.0
    for j in order:
        lu, ri = L[u[j]].copy(), R[i[j]].copy()
        e = r[j] - lu @ ri
        sse += e * e
        L[u[j]] = lu + lr * (e * ri - reg * lu)
        R[i[j]] = ri + lr * (e * lu - reg * ri)
    return sse, L, R


def test_squared_loss_matches_numpy():
    u, i, r, L, R, _ = _small()
    ref = float(((r.astype(np.float64) - np.einsum("ij,ij->i", L[u], R[i]).astype(np.float64)) ** 2).sum())
    assert squared_loss(u, i, r, L, R) == pytest.approx(ref, rel=1e-5)


def test_sgd_pass_matches_sequential_reference():
    u, i, r, L, R, rng = _small()
    order = rng.permutation(r.size)
    order = np.concatenate([order, order[:5]])  # ratings may repeat within a pass
    want_sse, want_L, want_R = _ref_pass(u, i, r, L, R, 0.05, 0.1, order)
    L2, R2 = L.copy(), R.copy()
    sse = sgd_pass(u, i, r, L2, R2, 0.05, 0.1, order)
    assert sse == pytest.approx(want_sse, rel=1e-4)
    np.testing.assert_allclose(L2, want_L, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(R2, want_R, rtol=1e-4, atol=1e-5)


def test_sgd_pass_in_gathered_blocks_matches_the_sequential_reference():
    # more ratings than one gathered block, a partial last block, repeats across block edges
    u, i, r, L, R, rng = _small(seed=3, nu=30, ni=20, k=5, n=GATHER + 300)
    order = np.concatenate([rng.permutation(r.size), rng.permutation(r.size)[:GATHER + 7]])
    want_sse, want_L, want_R = _ref_pass(u, i, r, L, R, 0.01, 0.05, order)
    L2, R2 = L.copy(), R.copy()
    sse = sgd_pass(u, i, r, L2, R2, 0.01, 0.05, order)
    assert sse == pytest.approx(want_sse, rel=1e-4)
    np.testing.assert_allclose(L2, want_L, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(R2, want_R, rtol=1e-3, atol=1e-5)
    assert sgd_pass(u, i, r, L2, R2, 0.01, 0.05, order[:0]) == 0.0  # an empty order is a no-op


def test_batch_sgd_returns_the_running_loss_and_the_deltas():
    u, i, r, L, R, rng = _small(seed=4, nu=20, ni=10, n=200)
    (b,) = batches((u, i, r), 1, rng)
    Lv, Rv = L[b.users].copy(), R[b.items].copy()
    order = rng.permutation(b.r.size)
    loss, dL, dR = b.sgd(Lv, Rv, 0.05, 0.02, order)
    Lw, Rw = Lv.copy(), Rv.copy()
    assert loss == pytest.approx(sgd_pass(b.u_idx, b.i_idx, b.r, Lw, Rw, 0.05, 0.02, order), rel=1e-6)
    np.testing.assert_allclose(Lv + dL, Lw, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(Rv + dR, Rw, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(Lv, L[b.users])  # the rows read are not changed


def test_sgd_pass_only_touches_rows_in_order_and_lowers_loss():
    u, i, r = synthetic(10, 8, 4, 60, noise=0.0, seed=2, alpha=0.0)
    _, _, _, L, R, _ = _small(nu=10, ni=8)
    L2, R2 = L.copy(), R.copy()
    sub = np.flatnonzero(u < 5)
    sgd_pass(u, i, r, L2, R2, 0.05, 0.0, sub)
    np.testing.assert_array_equal(L2[5:], L[5:])  # users not in the order keep their rows
    before = squared_loss(u, i, r, L, R)
    for _ in range(100):
        sgd_pass(u, i, r, L2, R2, 0.05, 0.0, np.arange(r.size))
    assert squared_loss(u, i, r, L2, R2) < 0.1 * before


# ------------------------------------------------------------------------------------------------
# synthetic data and partitioning


def test_synthetic_properties():
    u, i, r = synthetic(2000, 500, 8, 30_000, noise=0.1, seed=3, alpha=0.8)
    assert u.dtype == np.int64 and i.dtype == np.int64 and r.dtype == np.float32
    assert u.size == i.size == r.size == 30_000
    assert u.min() >= 0 and u.max() < 2000 and i.min() >= 0 and i.max() < 500
    assert np.unique(u * 500 + i).size == u.size  # no duplicate (user, item) pairs
    assert np.isfinite(r).all() and 0.5 < r.std() < 2.0
    du, di = np.bincount(u, minlength=2000), np.bincount(i, minlength=500)
    assert du.max() > 10 * np.median(du) and di.max() > 10 * np.median(di)  # power-law-ish
    for a, b in zip(synthetic(2000, 500, 8, 30_000, noise=0.1, seed=3, alpha=0.8), (u, i, r), strict=True):
        np.testing.assert_array_equal(a, b)  # same seed, same data on every worker
    assert not np.array_equal(synthetic(2000, 500, 8, 30_000, seed=4)[0], u)


def test_synthetic_uniform_dense_and_bad_sizes():
    u, i, _ = synthetic(50, 40, 4, 1500, alpha=0.0, seed=1)  # dense: 75% of all cells
    assert np.unique(u * 40 + i).size == 1500
    u, i, _ = synthetic(300, 200, 4, 20_000, alpha=2.0, seed=1)  # strong skew saturates the head
    assert np.unique(u * 200 + i).size == 20_000
    with pytest.raises(ValueError, match="nnz"):
        synthetic(10, 10, 2, 101)


def test_partition_by_user_is_disjoint_complete_and_balanced():
    u, i, r = synthetic(3000, 400, 4, 40_000, seed=0, alpha=0.8)
    parts = [partition(u, i, r, k, 3) for k in range(3)]
    assert sum(p[0].size for p in parts) == u.size
    keys = np.concatenate([p[0] * 400 + p[1] for p in parts])
    np.testing.assert_array_equal(np.sort(keys), np.sort(u * 400 + i))
    for a in range(3):
        for b in range(a + 1, 3):
            assert not np.intersect1d(parts[a][0], parts[b][0]).size  # L rows are private
    sizes = np.array([p[0].size for p in parts])
    assert sizes.max() - sizes.min() <= 2 * np.bincount(u).max()
    with pytest.raises(ValueError):
        partition(u, i, r, 3, 3)


# ------------------------------------------------------------------------------------------------
# CSV loader


def _write(tmp_path: Path, text: str, name: str = "r.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_load_csv_with_and_without_header(tmp_path):
    u, i, r = load_csv(_write(tmp_path, "user,item,rating\n0,1,4.5\n\n# note\n2,0,-1e0  # x\n"))
    np.testing.assert_array_equal(u, [0, 2])
    np.testing.assert_array_equal(i, [1, 0])
    np.testing.assert_allclose(r, [4.5, -1.0])
    u, _, _ = load_csv(_write(tmp_path, "3,4,1\n", "b.csv"))
    assert u.tolist() == [3] and u.dtype == np.int64


@pytest.mark.parametrize("text, line, what", [
    ("", None, "empty"),
    ("user,item,rating\n", None, "no ratings"),
    ("0,1,2\n1,2\n", 2, "3 columns"),
    ("u,i,r\n0,1,2\n1,2,3,4\n", 3, "3 columns"),
    ("0,1,2\n0,x,2\n", 2, "not a number"),
    ("0,1,2\n\n-1,1,2\n", 3, "non-negative"),
    ("# c\n0,1,2 # c\n0,1\n", 3, "3 columns"),
    ("0,1.5,2\n", 1, "non-negative"),
    ("0,1,2\n1,1,nan\n", 2, "not finite"),
    ("0,1,inf\n", 1, "not finite"),
])
def test_load_csv_errors_name_file_and_line(tmp_path, text, line, what):
    p = _write(tmp_path, text)
    with pytest.raises(ValueError, match=what) as e:
        load_csv(p)
    assert str(p) in str(e.value)
    if line is not None:
        assert f"{p}:{line}:" in str(e.value)


def test_load_csv_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read") as e:
        load_csv(tmp_path / "nope.csv")
    assert "nope.csv" in str(e.value)


# ------------------------------------------------------------------------------------------------
# worker logic against an in-process stand-in for the client (one worker, exact reads)


def _client(shapes: dict[str, tuple[int, int]], dtype: str = "float32") -> InProcessClient:
    """Tables with small random entries (drawn in the order given), as the PS would initialize them."""
    rng = np.random.default_rng(0)
    return InProcessClient(*(InProcessTable(n, r, c, dtype, (rng.standard_normal((r, c)) * 0.1).astype(dtype))
                             for n, (r, c) in shapes.items()))


ARGS = {"nnz": 6000, "epochs": 8, "lr": 0.08, "reg": 0.02, "noise": 0.05}


@pytest.mark.parametrize("batches", [1, 3])
def test_train_in_process_converges_and_reports_each_clock(batches):
    c = _client({"L": (400, 8), "R": (100, 8)})
    train(c, {**ARGS, "clocks_per_epoch": 2, "batches_per_clock": batches})
    assert c.clocks == 16 and len(c.reports) == 16
    assert all(r["samples"] > 0 and r["seconds"] >= 0 for r in c.reports)
    assert sum(r["samples"] for r in c.reports[:2]) == 6000  # two chunks cover the data once
    epoch = [c.reports[k]["objective"] + c.reports[k + 1]["objective"] for k in range(0, 16, 2)]
    assert epoch[-1] < 0.3 * epoch[0]
    # one get_rows per table and mini-batch
    assert len(c.tables["L"].reads) == 16 * batches and len(c.tables["R"].reads) == 16 * batches
    # where each clock's time went
    for rec in c.reports:
        assert all(rec[k] >= 0 for k in ("seconds", "read_s", "send_s", "eval_s", "clock_s"))


@pytest.mark.parametrize("shapes, args, match", [
    ({"L": (400, 8)}, {}, "table R is missing"),
    ({"L": (400, 8), "R": (100, 4)}, {}, "tables.L.cols=8 and tables.R.cols=4"),
    ({"L": (400, 8), "R": (100, 8)}, {"n_users": 500}, "n_users=500 does not match tables.L.rows=400"),
    ({"L": (400, 8), "R": (100, 8)}, {"rank": 4}, "rank=4 does not match tables.L.cols=8"),
    ({"L": (400, 8), "R": (100, 8)}, {"epochs": 0}, "app.args.epochs"),
    ({"L": (400, 8), "R": (100, 8)}, {"learning_rate": 0.1}, "app.args.learning_rate: unknown key"),
])
def test_train_rejects_bad_tables_and_args(shapes, args, match):
    with pytest.raises(ValueError, match=match):
        train(_client(shapes), {**ARGS, **args})


def test_train_rejects_non_float32_table():
    with pytest.raises(ValueError, match="dtype must be float32"):
        train(_client({"L": (400, 8), "R": (100, 8)}, dtype="float64"), ARGS)


def test_heldout_rmse_is_the_rmse_of_the_final_model_on_the_heldout_ratings():
    c = _client({"L": (400, 8), "R": (100, 8)})
    train(c, {**ARGS, "holdout": 0.2, "eval_every": 3})
    held = [r for r in c.reports if "heldout_se" in r]
    assert [c.reports.index(r) for r in held] == [2, 5, 7]  # every 3rd clock and the last
    u, i, r = synthetic(400, 100, 8, 6000, 0.05, 0, 0.8)
    k = 1200  # the first 20% of the (shuffled) synthetic ratings are held out
    pred = np.einsum("ij,ij->i", c.tables["L"].data[u[:k]], c.tables["R"].data[i[:k]]).astype(np.float64)
    pred = np.clip(pred, r[k:].min(), r[k:].max())  # clipped to the training ratings' range
    direct = float(np.sqrt(np.mean((r[:k] - pred) ** 2)))
    last = held[-1]
    assert last["heldout_count"] == k
    assert np.sqrt(last["heldout_se"] / last["heldout_count"]) == pytest.approx(direct, rel=1e-5)
    assert direct < 0.9 * np.sqrt(held[0]["heldout_se"] / k)  # it learned something


def test_clipped_squared_error_and_owner_of_heldout_users():
    L = np.array([[1.0, 0.0], [0.0, 3.0]], np.float32)
    R = np.array([[2.0, 0.0], [0.0, 2.0]], np.float32)
    u, i = np.array([0, 1, 1]), np.array([0, 1, 0])
    r = np.array([1.5, 5.0, 0.5], np.float32)  # predictions 2, 6 -> 5, 0 -> 1
    assert clipped_squared_error(u, i, r, L, R, 1.0, 5.0) == pytest.approx(0.25 + 0.0 + 0.25)
    users = np.array([0, 0, 1, 2, 2, 2, 5], np.int64)
    owner = user_owner(users, 8, 2)
    assert owner.shape == (8,) and set(owner.tolist()) <= {0, 1}
    assert owner[3] == 3 % 2 and owner[7] == 7 % 2  # no training ratings: spread by id
    test_u = np.array([0, 3, 7, 2], np.int64)
    parts = [partition(test_u, test_u, test_u.astype(np.float32), k, 2, owner=owner)[0] for k in range(2)]
    assert sorted(np.concatenate(parts).tolist()) == sorted(test_u.tolist())


def test_train_csv_ids_must_fit_tables(tmp_path):
    p = _write(tmp_path, "0,1,1.0\n5,99,2.0\n")
    with pytest.raises(ValueError, match="item id 99 does not fit table R with 10 rows"):
        train(_client({"L": (10, 4), "R": (10, 4)}), {"data": str(p)})


# ------------------------------------------------------------------------------------------------
# end to end through `bosen launch` (2 workers, SSP staleness 2; one server: the app learning is the
# point, not partitioning rows across servers)


E2E_CONFIG = """\
cluster:
  servers: ["127.0.0.1:0"]
  workers: 2
consistency:
  staleness: 2
tables:
  L: {{rows: {users}, cols: {rank}, dtype: float32, init: {{normal: 0.1, seed: 1}}}}
  R: {{rows: {items}, cols: {rank}, dtype: float32, init: {{normal: 0.1, seed: 2}}}}
app:
  module: bosen.apps.mf
  args: {args}
"""


def _launch(tmp_path: Path, users: int, items: int, rank: int, args: dict) -> list[dict]:
    cfg = tmp_path / "mf.yaml"
    cfg.write_text(E2E_CONFIG.format(users=users, items=items, rank=rank, args=json.dumps(args)))
    run_dir = tmp_path / "run"
    p = run_cmd([PY, "-m", "bosen", "launch", str(cfg), "--workers", "2",
                "--run-dir", str(run_dir)], timeout=120)
    assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    clocks = sorted((x for x in lines if x.get("kind") == "clock"), key=lambda x: x["clock"])
    assert clocks, "no per-clock metrics written"
    return clocks


@pytest.mark.slow
def test_e2e_synthetic_two_workers_ssp(tmp_path):
    args = {"nnz": 40_000, "epochs": 12, "lr": 0.08, "lr_decay": 0.95, "reg": 0.02, "noise": 0.1}
    clocks = _launch(tmp_path, 2000, 500, 8, args)
    assert len(clocks) == 12
    assert all(c["samples"] == 40_000 for c in clocks)  # both workers reported every clock
    obj = [c["objective"] for c in clocks]
    assert obj[-1] < 0.3 * obj[0], f"MF did not converge: {obj}"


@pytest.mark.slow
def test_e2e_csv_two_workers(tmp_path):
    u, i, r = synthetic(300, 80, 4, 4000, noise=0.05, seed=7)
    csv = tmp_path / "ratings.csv"
    csv.write_text("user,item,rating\n" + "".join(f"{a},{b},{c:.5f}\n" for a, b, c in zip(u, i, r, strict=True)))
    clocks = _launch(tmp_path, 300, 80, 4, {"data": str(csv), "epochs": 15, "lr": 0.08, "reg": 0.01,
                                            "clocks_per_epoch": 1})
    assert len(clocks) == 15 and all(c["samples"] == 4000 for c in clocks)
    obj = [c["objective"] for c in clocks]
    assert obj[-1] < 0.3 * obj[0], f"MF did not converge: {obj}"


@pytest.mark.slow
def test_e2e_heldout_rmse_from_a_test_file_in_every_clock_record(tmp_path):
    u, i, r = synthetic(300, 80, 4, 5000, noise=0.05, seed=7)
    for name, sl in (("train.csv", slice(1000, None)), ("test.csv", slice(0, 1000))):
        body = "".join(f"{a},{b},{c:.5f}\n" for a, b, c in zip(u[sl], i[sl], r[sl], strict=True))
        (tmp_path / name).write_text("user,item,rating\n" + body)
    args = {"data": str(tmp_path / "train.csv"), "test_data": str(tmp_path / "test.csv"), "epochs": 10,
            "lr": 0.08, "reg": 0.01}
    clocks = _launch(tmp_path, 300, 80, 4, args)
    assert all(c["heldout_count"] == 1000 for c in clocks)  # both workers' shares, every clock
    rmse = [c["heldout_rmse"] for c in clocks]
    # converged, and the last clock within 1% of the best: plain SGD's held-out error may tick up by
    # a hair at the end (seen: 0.6001 after a best of 0.5993, as the workers' updates interleave)
    assert rmse[-1] < 0.75 * rmse[0] and rmse[-1] <= 1.01 * min(rmse), rmse
    assert (tmp_path / "run" / "objective.png").stat().st_size > 0


# ------------------------------------------------------------------------------------------------
# the benchmark's helpers (bench/apps/mf.py) and the MovieLens config


def _bench_mf():
    from bench.apps import mf as apps_mf  # pyproject's pytest pythonpath: the checkout

    return apps_mf


def test_bench_scorer_is_clipped_rmse_with_the_mean_for_unseen_ids():
    B = _bench_mf()
    rng = np.random.default_rng(0)
    train_t = (np.array([0, 1, 2, 0]), np.array([0, 1, 0, 2]), np.array([1.0, 5.0, 3.0, 4.0], np.float32))
    test_t = (np.array([0, 3, 1]), np.array([1, 0, 3]), np.array([2.0, 4.0, 5.0], np.float32))
    L = rng.standard_normal((4, 3)).astype(np.float32)
    R = rng.standard_normal((4, 3)).astype(np.float32)
    # (0, 1): both seen -> clip(L0·R1, 1, 5); (3, 0): user 3 unseen; (1, 3): item 3 unseen -> mean 3.25
    pred = np.array([np.clip(L[0] @ R[1], 1, 5), 3.25, 3.25])
    want = np.sqrt(np.mean((test_t[2] - pred) ** 2))
    assert B.Scorer(train_t, test_t, 4, 4).rmse(L, R) == pytest.approx(want, rel=1e-6)


def test_bench_surprise_order_is_the_order_surprise_visits():
    B = _bench_mf()
    pytest.importorskip("surprise")
    u = np.array([5, 2, 5, 7, 2, 2, 9])
    i = np.arange(u.size)
    r = np.ones(u.size, np.float32)
    ts = B.surprise_trainset((u, i, r))
    visited = [(ts.to_raw_uid(a), ts.to_raw_iid(b)) for a, b, _ in ts.all_ratings()]
    order = B.surprise_order(u)
    assert [(int(u[j]), int(i[j])) for j in order] == visited


def test_bench_same_start_and_order_reproduce_surprise_svd():
    """From the factors surprise draws (bench's surprise_init) and in its order, our sgd_pass takes
    surprise SVD(biased=False)'s steps: the factors after 3 epochs agree to float32 rounding."""
    B = _bench_mf()
    pytest.importorskip("surprise")
    from surprise import SVD

    rng = np.random.default_rng(1)
    u = rng.integers(0, 30, 400)
    i = rng.integers(0, 20, 400)
    keep = np.unique(u * 20 + i, return_index=True)[1]
    u, i = u[np.sort(keep)], i[np.sort(keep)]
    r = rng.integers(1, 6, u.size).astype(np.float32)
    ts = B.surprise_trainset((u, i, r))
    algo = SVD(biased=False, n_factors=B.RANK, n_epochs=3, lr_all=B.LR, reg_all=B.REG, init_mean=0.0,
               init_std_dev=B.INIT_STD, random_state=4)
    algo.fit(ts)
    L, R = B.surprise_init(ts, 30, 20, 4)
    order = B.surprise_order(u)
    for _ in range(3):
        B.sgd_pass(u, i, r, L, R, B.LR, B.REG, order)
    for raw, inner in ts._raw2inner_id_users.items():
        np.testing.assert_allclose(L[raw], algo.pu[inner], atol=2e-5)
    for raw, inner in ts._raw2inner_id_items.items():
        np.testing.assert_allclose(R[raw], algo.qi[inner], atol=2e-5)


def test_movielens_config_args_are_valid():
    import yaml

    from bosen.apps.mf.worker import MFArgs
    from bosen.config import from_dict

    cfg = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "mf-movielens.yaml").read_text())
    a = from_dict(MFArgs, cfg["app"]["args"], "app.args")
    assert (a.lr, a.reg, a.lr_decay, a.batches_per_clock) == (0.005, 0.02, 1.0, 1)
    assert cfg["tables"]["L"]["cols"] == cfg["tables"]["R"]["cols"] == 16
