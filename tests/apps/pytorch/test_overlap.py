"""Overlap in PS mode (``PSModule(..., overlap=True)``): dense gradients pushed per bucket from the
backward hooks and sent at once (``Table.send_rows``); at staleness 0 the result still equals
single-process torch, and the buckets go out during the backward, in one fixed order whatever order
the hooks fire in."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bosen.apps.pytorch import DeltaOptimizer, PSModule, ServerOptimizer, declare
from bosen.apps.pytorch.buckets import Buckets
from bosen.client import Client
from bosen.errors import ConfigError


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 10, generator=g), torch.randint(0, 3, (16,), generator=g)


def test_buckets_go_out_in_one_order_whatever_order_the_gradients_come_in():
    slots = [(0, 10), (10, 5), (15, 20), (35, 5)]  # 40 values, cut every 16 (aligned to 8)
    sent: list[tuple[int, int, int]] = []
    b = Buckets(slots, 40, lambda k, lo, hi: sent.append((k, lo, hi)), size=16, align=8)
    assert b.ranges == [(24, 40), (8, 24), (0, 8)]
    b.ready(0)  # the first parameter's bucket waits for those before it in the sending order
    assert sent == []
    b.ready(3)
    assert sent == []  # bucket 0 also holds slot 2
    b.ready(2)
    assert sent == [(0, 24, 40)]
    b.ready(2)  # twice in a step counts once
    b.flush()  # slot 1 had no gradient: the rest goes now, in order
    assert sent == [(0, 24, 40), (1, 8, 24), (2, 0, 8)]
    sent.clear()
    for k in (3, 2, 1, 0):  # the next step starts afresh
        b.ready(k)
    assert [k for k, _, _ in sent] == [0, 1, 2]
    with pytest.raises(ValueError, match="size and align must be positive"):
        Buckets(slots, 40, lambda *a: None, size=0)


@pytest.mark.timeout(120)
def test_overlapped_server_sgd_at_staleness_0_equals_torch_and_pushes_during_backward(bosen_cluster, tmp_path):
    m, ref = net(), net()
    c = bosen_cluster(2, workers=1, staleness=0, tables=declare(m, tmp_path / "t", update="sgd", lr=0.1,
                                                                 row_width=64))
    client = Client.connect(c.path, rank=0)
    try:
        model = PSModule(m, client, clock_every=1, row_width=64, overlap=True, bucket_values=256)
        assert model._pushed is not None and len(model._pushed.ranges) == 6  # 1,507 values in 24 rows
        opt = ServerOptimizer(model, "sgd", lr=0.1)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(30):
            x, y = batch(step)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            if step == 0:
                assert model._pushed.sent >= 5  # pushed from the hooks, before the step
            opt.step()
            rl = F.cross_entropy(ref(x), y)
            ropt.zero_grad()
            rl.backward()
            ropt.step()
        model.pull()
        for (name, p), (_, q) in zip(m.named_parameters(), ref.named_parameters(), strict=True):
            err = (p.detach() - q.detach()).abs().max().item() / q.detach().abs().max().item()
            assert err <= 1e-5, f"{name}: relative difference {err:.2e}"
        assert model.split()["push_s"] > 0
        s = client.stats()  # every bucket left from the backward (Table.send_rows), none with the clock
        assert s["rows_sent_early"] == s["rows_sent"] == 30 * 24
        with pytest.raises(ConfigError, match=r"overlap=True\) is for ServerOptimizer"):
            DeltaOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
        model.close()
    finally:
        client.close()
