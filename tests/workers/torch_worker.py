"""One PyTorch worker process (tests/apps/pytorch/test_optim.py): linear regression on its own shard
of a planted-teacher data set through PSModule, then its held-out loss as JSON on stdout's last line."""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch import nn

from bosen.apps.pytorch import PSModule, ServerOptimizer
from bosen.apps.pytorch.ranks import connect


def teacher_data(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(20, 1, generator=g)  # the same teacher for every worker
    g.manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    return x, x @ w + 0.01 * torch.randn(n, 1, generator=g)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    client = connect(args.config)
    model = PSModule(nn.Linear(20, 1), client, clock_every=2)
    opt = ServerOptimizer(model, "sgd", lr=args.lr)
    x, y = teacher_data(100 + client.rank, 32 * args.steps)
    for i in range(args.steps):
        xb, yb = x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)]
        loss = F.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    xt, yt = teacher_data(999, 512)
    with torch.no_grad():
        held_out = F.mse_loss(model(xt), yt).item()
        start = F.mse_loss(torch.zeros_like(yt), yt).item()
    print(json.dumps({"rank": client.rank, "held_out": held_out, "baseline": start, "clock": client.tick,
                      "pull_s": model.pull_s}), flush=True)
    client.close()


if __name__ == "__main__":
    main()
