"""PSModule with its optimizers against real servers: exact equality with single-process torch at
staleness 0, SSP with two worker processes, and the errors users will make."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import worker
from torch import nn

from bosen.apps.pytorch import DeltaOptimizer, PSModule, ServerOptimizer, declare
from bosen.client import Client
from bosen.errors import ConfigError, UsageError


def net(hidden: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, hidden), nn.Tanh(), nn.Linear(hidden, 3))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 10, generator=g), torch.randint(0, 3, (16,), generator=g)


def assert_close(model: nn.Module, ref: nn.Module, rtol: float = 1e-5) -> None:
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        err = (p.detach() - q.detach()).abs().max().item() / q.detach().abs().max().item()
        assert err <= rtol, f"{name}: relative difference {err:.2e}"


def train(model: nn.Module, opt, steps: int) -> None:
    for step in range(steps):
        x, y = batch(step)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_server_sgd_at_staleness_0_equals_single_process_torch_sgd(bosen_cluster, tmp_path):
    m, ref = net(), net()
    c = bosen_cluster(2, workers=1, staleness=0, tables=declare(m, tmp_path / "t", update="sgd", lr=0.1,
                                                                 row_width=64))
    client = Client.connect(c.path, rank=0)
    try:
        model = PSModule(m, client, clock_every=1, row_width=64)
        train(model, ServerOptimizer(model, "sgd", lr=0.1), 50)
        train(ref, torch.optim.SGD(ref.parameters(), lr=0.1), 50)
        assert client.tick == 50
        model.pull()
        assert_close(m, ref)
        assert not all(torch.equal(a, b) for a, b in zip(ref.parameters(), net().parameters(), strict=True))
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_delta_optimizer_with_momentum_equals_local_torch_within_a_clock(bosen_cluster, tmp_path):
    """Deltas go to an ``add`` table whose cache shows this worker's own writes, so steps inside a
    clock of four see each other, as in a local loop."""
    m, ref = net(), net()
    c = bosen_cluster(2, workers=1, staleness=0, tables=declare(m, tmp_path / "t", row_width=64))
    client = Client.connect(c.path, rank=0)
    try:
        model = PSModule(m, client, clock_every=4, row_width=64)
        train(model, DeltaOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)), 50)
        train(ref, torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9), 50)
        assert client.tick == 12
        model.pull()
        assert_close(m, ref)
    finally:
        client.close()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_two_worker_processes_converge_under_ssp(bosen_cluster, bosen_procs, tmp_path):
    torch.manual_seed(0)
    c = bosen_cluster(1, workers=2, staleness=2, tables=declare(nn.Linear(20, 1), tmp_path / "t", update="sgd",
                                                                 lr=0.05))
    procs = [worker(bosen_procs, "torch_worker.py", c.path, "--steps", 150) for _ in range(2)]
    assert bosen_procs.wait_all(procs, timeout=90) == [0, 0]
    results = [json.loads(p.output().strip().splitlines()[-1]) for p in procs]
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert r["clock"] == 75
        assert r["held_out"] < 0.01 * r["baseline"], r  # the planted teacher is learned


@pytest.mark.timeout(120)
def test_the_errors_users_will_make_name_what_is_wrong(bosen_cluster, tmp_path):
    m = net()
    emb = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Flatten(), nn.Linear(8, 2))
    tables = {**declare(m, tmp_path / "t", update="sgd", lr=0.1, row_width=64),
              **declare(emb, tmp_path / "e", prefix="emb.", update="sgd", lr=0.1, row_width=64),
              **declare(net(), tmp_path / "d", prefix="d.", row_width=64),
              "small.params": {"rows": 1, "cols": 64}}
    c = bosen_cluster(1, workers=1, staleness=0, tables=tables)
    client = Client.connect(c.path, rank=0)
    try:
        with pytest.raises(ConfigError, match="changed since its tables were made .*parameter 0.weight: "
                                              r"shape \(17, 10\) here, \(16, 10\) when the tables were made"):
            PSModule(net(17), client, row_width=64)
        with pytest.raises(ConfigError, match=r"table small.params is too small: 1 rows x 64 hold 64 values; "
                                              "the model's 227 dense parameters need 4 rows"):
            PSModule(net(), client, prefix="small.", row_width=64)
        with pytest.raises(ConfigError, match="table other.params is missing"):
            PSModule(net(), client, prefix="other.", row_width=64)
        with pytest.raises(ConfigError, match="row_width 1024 here, 64 when the tables were made"):
            PSModule(net(), client)
        with pytest.raises(ConfigError, match=r"model on unexpected device: its parameters are on cpu, "
                                              "expected cuda:0"):
            PSModule(net(), client, row_width=64, device="cuda:0")
        model = PSModule(m, client, row_width=64)
        with pytest.raises(ConfigError, match="applies 'sgd' on the servers, not 'adagrad'"):
            ServerOptimizer(model, "adagrad", lr=0.1)
        with pytest.raises(ConfigError, match="steps with lr=0.1 on the servers, not lr=0.2"):
            ServerOptimizer(model, "sgd", lr=0.2)
        with pytest.raises(ConfigError, match="DeltaOptimizer pushes parameter deltas and needs update='add'"):
            DeltaOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
        opt = ServerOptimizer(model, "sgd", lr=0.1)
        with pytest.raises(UsageError, match=r"step\(\) before backward\(\)"):
            opt.step()
        deltas = PSModule(net(), client, prefix="d.", row_width=64)
        with pytest.raises(ValueError, match="must be built on model.parameters"):
            DeltaOptimizer(deltas, torch.optim.SGD(m.parameters(), lr=0.1))
        sparse = PSModule(emb, client, prefix="emb.", row_width=64)
        (sparse(torch.tensor([[1, 2]])).sum() + emb[0].weight.sum()).backward()  # the weight used twice
        with pytest.raises(UsageError, match="sparse and dense gradients mixed on table emb.0: 0.weight got a dense"):
            ServerOptimizer(sparse, "sgd", lr=0.1).step()
        assert client.tick == 0  # nothing was pushed by the failed calls
        np.testing.assert_array_equal(client.table("params").get_rows(np.arange(4)).reshape(-1)[:227],
                                      model.values()[:227])
    finally:
        client.close()
