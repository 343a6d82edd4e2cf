"""PyTorch workers on a dense table with backup workers (docs/design.md, "Backup workers"): with k = n
the servers' steps are single-process SGD on the mean of the workers' gradients; with k < n some
gradients are dropped and the workers still go on to the end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import worker
from torch import nn

from bosen.apps.pytorch import PSModule, declare
from bosen.apps.pytorch.layout import Layout
from bosen.errors import ConfigError
from bosen.jobs.status import query

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workers"))
from torch_backup_worker import batch  # noqa: E402

pytestmark = pytest.mark.slow
LR = 0.05


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(6, 1)


def _run(bosen_cluster, bosen_procs, tmp_path: Path, n: int, steps: int, backup: dict) -> tuple[list[dict], dict]:
    c = bosen_cluster(1, n, tables=declare(_model(), tmp_path / "t", backup=backup))
    ps = [worker(bosen_procs, "torch_backup_worker.py", c.path, "--steps", steps, "--lr", LR,
                 env={"BOSEN_RANK": str(r)}) for r in range(n)]
    assert bosen_procs.wait_all(ps, 90) == [0] * n
    out = [json.loads(p.tail().strip().splitlines()[-1]) for p in ps]
    return out, query(c.config["cluster"]["servers"][0])["tables"][Layout.of(_model()).table]["backup"]


def test_k_equal_n_is_sgd_on_the_mean_gradient(bosen_cluster, bosen_procs, tmp_path):
    n, steps = 2, 12
    out, _ = _run(bosen_cluster, bosen_procs, tmp_path, n, steps, {"mode": "static", "k": n, "lr": LR})
    ref = _model()
    for t in range(steps):  # the servers' steps: lr * mean over the ranks of each one's gradient
        grads = []
        for r in range(n):
            ref.zero_grad()
            x, y = batch(r, t)
            F.mse_loss(ref(x), y).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        with torch.no_grad():
            for i, p in enumerate(ref.parameters()):
                p -= LR * sum(g[i] for g in grads) / n
    for o in out:
        assert o["iteration"] == steps
        assert o["weight"] == pytest.approx(ref.weight.view(-1).tolist(), abs=1e-5)
        assert o["bias"] == pytest.approx(ref.bias.tolist(), abs=1e-5)


def test_with_k_below_n_gradients_are_dropped_and_every_worker_finishes(bosen_cluster, bosen_procs, tmp_path):
    n, steps = 2, 10
    out, b = _run(bosen_cluster, bosen_procs, tmp_path, n, steps, {"mode": "static", "k": 1, "lr": LR})
    assert [o["iteration"] for o in out] == [steps] * n
    assert b["k_history"] == [1] * steps and b["accepted"] == steps and b["dropped_repeat"] == 0
    assert all(len(a) == 1 for a in b["applied"])


def test_backup_needs_the_servers_sgd_at_its_rate(bosen_cluster, tmp_path):
    from bosen.apps.pytorch import DeltaOptimizer, ServerOptimizer
    from bosen.client import Client

    backup = {"mode": "dynamic", "lr": LR}
    tables = declare(_model(), tmp_path / "t", backup=backup)
    tables |= declare(_with_embedding(), tmp_path / "e", backup=backup, prefix="e.")
    mixed = declare(_with_embedding(), tmp_path / "m", backup=backup, prefix="m.")
    del mixed["m.emb"]["backup"]  # the embedding's table plain SSP, the dense one synchronous
    c = bosen_cluster(1, 1, tables=tables | mixed)
    with Client.connect(c.path) as client:
        model = PSModule(_model(), client)
        assert model.backup is not None and model.backup.lr == LR
        with pytest.raises(ConfigError, match="use ServerOptimizer\\(model, 'sgd', lr=0.05\\)"):
            ServerOptimizer(model, "sgd", lr=0.1)
        with pytest.raises(ConfigError, match="clock_every=1"):
            PSModule(_model(), client, clock_every=2)
        # embeddings on backup tables: the servers' plain SGD only (no AdaGrad accumulators), every table alike
        emb = PSModule(_with_embedding(), client, prefix="e.")
        assert emb.backup is not None and emb._probes and emb.prefetch is False
        with pytest.raises(ConfigError, match="servers take SGD steps of lr=0.05: use ServerOptimizer"):
            ServerOptimizer(emb, "adagrad", lr=LR)
        with pytest.raises(ConfigError, match="DeltaOptimizer pushes parameter deltas.*backup workers"):
            DeltaOptimizer(emb, torch.optim.SGD(emb.parameters(), lr=LR))
        with pytest.raises(ConfigError, match="device_cache_rows=0"):
            PSModule(_with_embedding(), client, prefix="e.", device_cache_rows=8)
        with pytest.raises(ConfigError, match="the same backup entry on every table"):
            PSModule(_with_embedding(), client, prefix="m.")


class _Emb(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4, sparse=True)
        self.out = nn.Linear(4, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(ids))


def _with_embedding() -> nn.Module:
    torch.manual_seed(0)
    return _Emb()


def test_declare_refuses_backup_where_it_does_not_hold(tmp_path):
    with pytest.raises(ValueError, match="storage='dense'"):
        declare(_with_embedding(), tmp_path, backup={"mode": "static", "k": 2}, storage="sparse")
    with pytest.raises(ValueError, match="dense='ps'"):
        declare(_with_embedding(), tmp_path, backup={"mode": "static", "k": 2}, dense="allreduce")
    with pytest.raises(ValueError, match="plain SGD steps"):
        declare(_with_embedding(), tmp_path, backup={"mode": "static", "k": 2}, update="adagrad", lr=0.1)
    got = declare(_with_embedding(), tmp_path, backup={"mode": "static", "k": 2, "lr": 0.1})
    assert {n: e["backup"]["k"] for n, e in got.items()} == {"params": 2, "emb": 2}
    assert {e["update"] for e in got.values()} == {"add"}
