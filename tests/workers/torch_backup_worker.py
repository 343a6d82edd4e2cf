"""One PyTorch worker of a dense table with backup workers (tests/apps/pytorch/test_torch_backup.py): linear
regression whose mini-batch at iteration t is a pure function of (rank, t), so the test can redo the
steps; the final parameters as JSON on stdout's last line (rank 0)."""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch import nn

from bosen.apps.pytorch import PSModule, ServerOptimizer
from bosen.apps.pytorch.ranks import connect


def batch(rank: int, it: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + it)
    x = torch.randn(16, 6, generator=g)
    return x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(16, 1, generator=g)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    args = ap.parse_args()
    client = connect(args.config)
    torch.manual_seed(0)
    model = PSModule(nn.Linear(6, 1), client)
    opt = ServerOptimizer(model, "sgd", lr=args.lr)
    while True:
        model.pull()  # w_t, and t
        if model.iteration >= args.steps:
            break
        x, y = batch(client.rank, model.iteration)
        loss = F.mse_loss(model.module(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(json.dumps({"rank": client.rank, "iteration": model.iteration, "tick": client.tick,
                      "weight": model.module.weight.detach().view(-1).tolist(),
                      "bias": model.module.bias.detach().tolist()}), flush=True)
    client.close()


if __name__ == "__main__":
    main()
