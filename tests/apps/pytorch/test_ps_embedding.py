"""``PSEmbedding`` over ``storage: sparse`` tables (issue 29): the DLRM example trains to the same
parameters and losses as with its dense table, a worker holds only the rows its batches touch, and
raw 64-bit ids (hashed) need no row count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from bosen import rowmath
from bosen.apps.pytorch import DeltaOptimizer, Layout, PSEmbedding, PSModule, ServerOptimizer, declare, hash_ids
from bosen.apps.pytorch.examples import criteo, dlrm
from bosen.client import Client
from bosen.config import UNBOUNDED, InitConfig
from bosen.errors import ConfigError, UsageError

SMALL = {"max_rows": 500, "train_samples": 4096, "test_samples": 2048, "batch_size": 128, "evals_per_epoch": 4,
         "clock_every": 2, "dim": 8, "bottom": 16, "top": 16, "optimizer": "adagrad", "lr": 0.05}


def run_dlrm(bosen_cluster: Any, out: Path, **args: Any) -> tuple[list[dict], np.ndarray, np.ndarray, np.ndarray]:
    """One worker, staleness 0, through dlrm.train: (its reports, the dense table, the touched ids,
    their embedding rows at the end)."""
    a = {**SMALL, **args}
    c = bosen_cluster(1, workers=1, staleness=0, tables=dlrm.tables(a, out))  # storage, not partitioning
    client = Client.connect(c.path, rank=0)
    try:
        dlrm.train(client, a)
        client.clock()
        p = dlrm.DLRMArgs(**{k: v for k, v in a.items()})
        ids = np.unique(p.keys(criteo.generate(p.spec, 0, p.train_samples).ids)
                        + (0 if p.hashed else np.cumsum((0, *p.spec.cardinalities[:-1]))))
        params = client.table("params")
        dense = params.get_rows(np.arange(params.rows))
        emb = client.table("emb").get_rows(ids)
        return list(client.reports), dense, ids, emb
    finally:
        client.close()


@pytest.mark.timeout(180)
def test_dlrm_on_a_sparse_table_equals_the_dense_table(bosen_cluster, tmp_path):
    """Same seeds, same server initializer: the dense table read into a full nn.Embedding weight and
    the sparse table read a batch's rows at a time into a PSEmbedding give bit-identical losses,
    held-out scores and parameters. Exact, not to a tolerance: both sum a row's gradient over the
    batch by coalescing a sparse gradient whose indices sort in the same order (ids, or their ranks
    among the batch's distinct ids), and the servers apply the same AdaGrad to the same values."""
    dense = run_dlrm(bosen_cluster, tmp_path / "dense", storage="dense", embedding_init="server")
    sparse = run_dlrm(bosen_cluster, tmp_path / "sparse", storage="sparse")
    keys = ("objective", "heldout_logloss", "heldout_auc", "rows_pushed", "rows_pulled")
    assert [[r[k] for k in keys] for r in dense[0]] == [[r[k] for k in keys] for r in sparse[0]]
    assert len(dense[0]) == 4
    np.testing.assert_array_equal(dense[1], sparse[1])
    np.testing.assert_array_equal(dense[2], sparse[2])
    np.testing.assert_array_equal(dense[3], sparse[3])
    # the rows moved from their initial values (the servers' uniform, table 1), and the model learned
    start = rowmath.init_rows(InitConfig(uniform=(-0.05, 0.05)), dense[2], (UNBOUNDED, 8), np.dtype("float32"), 1)
    assert (dense[3] != start).all(1).mean() > 0.99
    assert dense[0][-1]["heldout_auc"] > 0.55


def test_a_sparse_table_is_declared_without_a_file_of_its_rows(tmp_path):
    a = dlrm.DLRMArgs(**{**SMALL, "storage": "sparse"})
    net = dlrm.model(a)
    assert isinstance(net.emb, PSEmbedding) and not any(p.numel() > 10_000 for p in net.parameters())
    t = dlrm.tables({**SMALL, "storage": "sparse", "cache_rows": 1000}, tmp_path)
    rows = sum(a.spec.cardinalities)
    assert t["emb"] == {"cols": 8, "dtype": "float32", "update": "adagrad",
                        "update_args": {"alpha": 0.05, "init_z": 1e-8}, "init": {"uniform": [-0.05, 0.05], "seed": 0},
                        "rows": rows, "storage": "sparse", "cache_rows": 1000}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.layout.json", "params.npy"]
    # hashed ids: a table without rows, any 64-bit id
    h = dlrm.tables({**SMALL, "storage": "sparse", "hashed": True}, tmp_path / "h")
    assert "rows" not in h["emb"] and h["emb"]["storage"] == "sparse"
    assert Layout.of(dlrm.model(dlrm.DLRMArgs(**{**SMALL, "storage": "sparse", "hashed": True}))).sparse[0].rows \
        == UNBOUNDED
    # an nn.Embedding declared sparse: the servers draw N(0, 1), nn.Embedding's own init
    e = declare(nn.Embedding(10**8, 64, sparse=True, device="meta"), tmp_path / "e", storage="sparse")
    assert e["embedding"]["init"] == {"normal": 1.0} and e["embedding"]["rows"] == 10**8
    assert not (tmp_path / "e" / "embedding.npy").exists()


def test_bad_declarations_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="only a sparse table holds it"):
        declare(PSEmbedding(None, 4), tmp_path)
    with pytest.raises(ValueError, match="padding_idx"):
        declare(nn.Embedding(10, 4, padding_idx=0, sparse=True), tmp_path, storage="sparse")
    with pytest.raises(ValueError, match="storage: dense or sparse"):
        declare(PSEmbedding(10, 4), tmp_path, storage="compressed")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_embeddings"):
        PSEmbedding(0, 4)
    with pytest.raises(ValueError, match="app.args.embedding_init"):
        dlrm.tables({"storage": "sparse", "embedding_init": "model"}, tmp_path)
    with pytest.raises(ValueError, match="app.args.table_rows: 0"):
        dlrm.tables({"hashed": True}, tmp_path)
    with pytest.raises(UsageError, match="wrap the model in PSModule"):
        PSEmbedding(10, 4)(torch.tensor([1, 2]))


def test_hashed_ids_are_64_bit_and_fixed():
    v = np.array([[0, 1], [0, 1], [2**40, 7]], dtype=np.int64)
    h = hash_ids(v, np.arange(2))
    assert h.dtype == np.int64 and (h >= 0).all() and (h < UNBOUNDED).all()
    assert h[0, 0] == h[1, 0] and h[0, 0] != h[0, 1] and len(np.unique(h)) == 4  # by (feature, value)
    assert h.max() > 2**40  # spread over 63 bits
    assert (hash_ids(v, np.arange(2), 1000) < 1000).all()
    np.testing.assert_array_equal(h, hash_ids(v, np.arange(2)))
    many = hash_ids(np.arange(200_000), 3)
    assert len(np.unique(many)) == 200_000
    with pytest.raises(TypeError, match="integers"):
        hash_ids(np.array([0.5]))


class Bag(nn.Module):
    def __init__(self, rows: int | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = PSEmbedding(rows, 8, init={"normal": 0.1, "seed": 3})
        self.out = nn.Linear(8, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(ids).sum(1)).squeeze(1)


@pytest.mark.timeout(120)
def test_a_worker_holds_only_the_rows_its_batches_touch(bosen_cluster, tmp_path):
    """A table without rows: 64-bit ids, each step pushes the rows it touched (twice read in one
    step: summed), and the client's cache holds those rows only."""
    net = Bag(None)
    c = bosen_cluster(2, workers=1, staleness=0, tables=declare(net, tmp_path / "t", update="sgd", lr=0.5,
                                                                storage="sparse"))
    client = Client.connect(c.path, rank=0)
    try:
        m = PSModule(net, client, clock_every=1)
        with pytest.raises(ConfigError, match="use ServerOptimizer"):
            DeltaOptimizer(m, torch.optim.SGD(m.parameters(), lr=0.1))
        opt = ServerOptimizer(m, "sgd", lr=0.5)
        emb = client.table("emb")
        ids = torch.tensor([[2**62 + 5, 3], [3, 2**40]])
        before = emb.get_rows(np.array([3, 2**40, 2**62 + 5]))
        opt.zero_grad()
        loss = m(ids).sum() + m(ids[:1]).sum()  # rows read twice in one step: their gradients add up
        loss.backward()
        g = net.emb.gradient()
        assert g is not None and g[0].tolist() == [3, 2**40, 2**62 + 5]
        w = net.out.weight.detach()[0]
        np.testing.assert_allclose(g[1].numpy(), np.stack([3 * w, w, 2 * w]), rtol=1e-6)
        opt.step()
        assert net.emb._batches == [] and m.rows_pushed == 3
        client.clock()
        after = emb.get_rows(np.array([3, 2**40, 2**62 + 5]))
        np.testing.assert_allclose(after, before - 0.5 * np.stack([3 * w, w, 2 * w]), rtol=1e-5, atol=1e-7)
        held = client.stats()["tables"]["emb"]
        assert held["rows_held"] == 3, held
        with torch.no_grad():  # an evaluation keeps nothing for the optimizer
            m(torch.tensor([[7, 8]]))
        assert net.emb._batches == []
        with pytest.raises(IndexError, match="ids must be in"):
            m(torch.tensor([[-1, 2]]))
    finally:
        client.close()
