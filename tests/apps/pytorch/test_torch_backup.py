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
    from bosen.apps.pytorch import ServerOptimizer
    from bosen.client import Client

    c = bosen_cluster(1, 1, tables=declare(_model(), tmp_path / "t", backup={"mode": "dynamic", "lr": LR}))
    with Client.connect(c.path) as client:
        model = PSModule(_model(), client)
        assert model.backup is not None and model.backup.lr == LR
        with pytest.raises(ConfigError, match="use ServerOptimizer\\(model, 'sgd', lr=0.05\\)"):
            ServerOptimizer(model, "sgd", lr=0.1)
        with pytest.raises(ConfigError, match="clock_every=1"):
            PSModule(_model(), client, clock_every=2)
