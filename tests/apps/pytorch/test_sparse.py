"""Sparse embeddings through PSModule: only the rows a batch touches are read and sent, with the
same result as single-process torch at staleness 0, and traffic that follows the batch, not the table."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import wait_until
from torch import nn

from bosen.apps.pytorch import DeltaOptimizer, Layout, PSModule, ServerOptimizer, declare
from bosen.client import Client

ROWS, DIM = 5000, 32


class Clicks(nn.Module):
    """Sum-pooled embeddings of a bag of ids, then a linear score."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True)
        self.out = nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(ids)).squeeze(1)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    ids = (torch.rand(64, 4, generator=g) ** 3 * ROWS).long()  # skewed: hot rows repeat
    return ids, torch.rand(64, generator=g)


def train(model: nn.Module, opt, steps: int) -> list[int]:
    touched = []
    for step in range(steps):
        ids, y = batch(step)
        loss = ((model(ids) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        touched.append(int(torch.unique(ids).numel()))
    return touched


def test_a_sparse_embedding_is_a_table_of_its_own():
    lay = Layout.of(Clicks(), prefix="ctr.")
    assert [(e.module, e.param, e.table, e.rows, e.cols) for e in lay.sparse] == [
        ("emb", "emb.weight", "ctr.emb", ROWS, DIM)]
    assert [s.name for s in lay.slots] == ["out.weight", "out.bias"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["server-sgd", "delta-sgd"])
@pytest.mark.slow
def test_sparse_steps_equal_single_process_torch_at_staleness_0(bosen_cluster, tmp_path, kind):
    m, ref = Clicks(), Clicks()
    update, lr = ("sgd", 0.05) if kind == "server-sgd" else ("add", None)
    c = bosen_cluster(2, workers=1, staleness=0, tables=declare(m, tmp_path / "t", update=update, lr=lr))
    client = Client.connect(c.path, rank=0)
    try:
        model = PSModule(m, client, clock_every=1)
        opt = (ServerOptimizer(model, "sgd", lr=0.05) if kind == "server-sgd"
               else DeltaOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.05)))
        touched = train(model, opt, 30)
        train(ref, torch.optim.SGD(ref.parameters(), lr=0.05), 30)
        assert model.rows_pushed == sum(touched) and model.rows_pulled == sum(touched)
        rows = np.arange(ROWS)
        got = client.table("emb").get_rows(rows)
        np.testing.assert_allclose(got, ref.emb.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
        model.pull()
        np.testing.assert_allclose(m.out.weight.detach().numpy(), ref.out.weight.detach().numpy(), rtol=1e-5)
        assert not np.allclose(got, Clicks().emb.weight.detach().numpy())  # rows did move
    finally:
        client.close()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_sparse_pushes_move_about_the_rows_the_batch_touched(bosen_cluster, tmp_path):
    """Bytes sent, from the client's stats, against unique rows x dim x 4 + a 4-byte id per row (ids
    travel as int32 where every id of the message fits, bosen/wire.py ``wire_ids``)."""
    torch.manual_seed(0)
    emb = nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True)
    c = bosen_cluster(2, workers=1, staleness=0, tables=declare(emb, tmp_path / "t", update="sgd", lr=0.05))
    client = Client.connect(c.path, rank=0)
    try:
        model = PSModule(emb, client, clock_every=1)
        opt = ServerOptimizer(model, "sgd", lr=0.05)
        before = client.stats()["bytes_sent"]
        touched = 0
        for step in range(40):
            ids, y = batch(step)
            loss = ((model(ids).sum(1) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            touched += int(torch.unique(ids).numel())
        client.clock()  # the last step's update is on its way: the comm thread counts it once sent
        payload = touched * (DIM * 4 + 4)
        assert wait_until(lambda: client.stats()["bytes_sent"] - before >= payload, 10)
        sent = client.stats()["bytes_sent"] - before
        assert payload <= sent <= 1.1 * payload, (sent, payload)
        assert touched < 40 * 64 * 4 and touched * 10 < 40 * ROWS  # the table is far larger than the traffic
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_rows_prefetched_by_ids_are_the_rows_the_forward_would_read(bosen_cluster, tmp_path):
    m, ref = Clicks(), Clicks()
    c = bosen_cluster(1, workers=1, staleness=0, tables=declare(m, tmp_path / "t"))
    client = Client.connect(c.path, rank=0)
    try:
        model = PSModule(m, client, clock_every=1)
        opt = DeltaOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.05))
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
        for step in range(12):
            ids, y = batch(step)
            if step % 3 == 1:
                model.prefetch_rows({"emb": ids})  # exactly the batch's ids
            elif step % 3 == 2:
                model.prefetch_rows({"emb": ids[:32]})  # some of them: the rest is read in the forward
            for mod, o in ((model, opt), (ref, ref_opt)):
                loss = ((mod(ids) - y) ** 2).mean()
                o.zero_grad()
                loss.backward()
                o.step()
        np.testing.assert_allclose(client.table("emb").get_rows(np.arange(ROWS)), ref.emb.weight.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
        with pytest.raises(KeyError, match="'out' is not a sparse embedding of the model .they are: emb"):
            model.prefetch_rows({"out": ids})
        with pytest.raises(IndexError, match=r"embedding emb: ids must be in \[0, 5000\), got -1"):
            model.prefetch_rows({"emb": torch.tensor([-1, 3])})
        model.close()
    finally:
        client.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["server-sgd", "delta-sgd"])
def test_rows_read_a_step_ahead_give_the_steps_of_single_process_torch(bosen_cluster, tmp_path, kind):
    """The next batch's rows are read in the background before the current forward (one tick early,
    before this step's push): at staleness 0 the forward must not use them as they were read, but as
    fresh as its own tick requires, with the step just pushed in them."""
    m, ref = Clicks(), Clicks()
    update, lr = ("sgd", 0.05) if kind == "server-sgd" else ("add", None)
    c = bosen_cluster(1, workers=1, staleness=0, tables=declare(m, tmp_path / "t", update=update, lr=lr))
    client = Client.connect(c.path, rank=0)
    try:
        model = PSModule(m, client, clock_every=1)
        assert model.prefault_s > 0  # the sparse table's buffers were faulted in up front
        opt = (ServerOptimizer(model, "sgd", lr=0.05) if kind == "server-sgd"
               else DeltaOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.05)))
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
        for step in range(12):
            ids, y = batch(step)
            model.prefetch_rows({"emb": batch(step + 1)[0]})  # the next batch's rows, during this step
            for mod, o in ((model, opt), (ref, ref_opt)):
                loss = ((mod(ids) - y) ** 2).mean()
                o.zero_grad()
                loss.backward()
                o.step()
        np.testing.assert_allclose(client.table("emb").get_rows(np.arange(ROWS)), ref.emb.weight.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
        model.close()
    finally:
        client.close()
