"""Pushes in bfloat16 / float16 on request: half the bytes, the rounding residual kept on the worker
(its reads, and so its model, stay exact), float32 values on the servers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bosen.apps.pytorch import DeltaOptimizer, PSModule, declare
from bosen.client import Client


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))


def run(bosen_cluster, tmp_path, wire_dtype: str | None, steps: int = 30) -> tuple[nn.Module, np.ndarray, int]:
    m = net()
    c = bosen_cluster(1, workers=2, staleness=0, tables=declare(m, tmp_path / str(wire_dtype), row_width=128,
                                                                 wire_dtype=wire_dtype))
    reader = Client.connect(c.path, rank=1)  # clocks ahead at once; reads the servers' values at the end
    for _ in range(steps + 1):
        reader.clock()
    client = Client.connect(c.path, rank=0)
    try:
        model = PSModule(m, client, clock_every=1, row_width=128)
        opt = DeltaOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.05))
        for step in range(steps):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.pull()
        sent = client.stats()["bytes_sent"]
        client.close()
        server = reader.table("params").get_rows(np.arange(model.layout.rows)).reshape(-1)
        return m, server, sent
    finally:
        client.close()
        reader.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wire_dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)])
def test_narrow_pushes_halve_the_bytes_and_lose_nothing(bosen_cluster, tmp_path, wire_dtype):
    exact, exact_server, sent32 = run(bosen_cluster, tmp_path, None)
    narrow, server, sent16 = run(bosen_cluster, tmp_path, wire_dtype)
    for (name, p), (_, q) in zip(narrow.named_parameters(), exact.named_parameters(), strict=True):
        err = (p.detach() - q.detach()).abs().max().item() / q.detach().abs().max().item()
        assert err <= 1e-5, f"{name}: the worker's model drifted by {err:.2e} (residual lost?)"
    n = sum(p.numel() for p in exact.parameters())
    assert exact_server[:n].dtype == np.float32
    # the servers lag the worker by at most the residual still buffered (one rounding per value)
    tol = 2.0 ** -8 if wire_dtype == "bfloat16" else 2.0 ** -11
    delta = np.abs(server[:n] - exact_server[:n])
    assert delta.max() <= tol * np.abs(exact_server[:n]).max(), delta.max()
    assert 0.45 <= sent16 / sent32 <= 0.6, (sent16, sent32)
