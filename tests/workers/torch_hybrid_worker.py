"""One PyTorch worker in hybrid mode (tests/apps/pytorch/test_hybrid.py): the dense layers averaged by
all-reduce over gloo, the embedding in a PS table; trains on its half of each global batch, then prints
its dense parameters and the embedding's rows as JSON on stdout's last line."""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch import nn

from bosen.apps.pytorch import DeltaOptimizer, PSModule, ServerOptimizer
from bosen.apps.pytorch.ranks import connect

GLOBAL_BATCH = 32


def net(seed: int = 0) -> nn.Module:
    """A sparse embedding (in the PS) feeding two dense layers (all-reduced); ``seed`` draws the dense
    values, which rank 0's broadcast replaces on the other ranks."""
    torch.manual_seed(0)
    m = Net()
    torch.manual_seed(seed)
    with torch.no_grad():
        if seed:
            for p in m.head.parameters():
                p.normal_()
    return m


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(40, 4, sparse=True)
        self.head = nn.Sequential(nn.Linear(4 + 6, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.emb(ids), x], 1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: ids, dense features, labels."""
    g = torch.Generator().manual_seed(step)
    return (torch.randint(0, 40, (GLOBAL_BATCH,), generator=g), torch.randn(GLOBAL_BATCH, 6, generator=g),
            torch.randint(0, 3, (GLOBAL_BATCH,), generator=g))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--optimizer", default="server-sgd")
    args = ap.parse_args()
    client = connect(args.config)
    model = PSModule(net(seed=client.rank), client, clock_every=1, row_width=64, dense="allreduce")
    if args.optimizer == "server-sgd":
        opt: ServerOptimizer | DeltaOptimizer = ServerOptimizer(model, "sgd", lr=0.1)
    else:
        opt = DeltaOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    half = GLOBAL_BATCH // client.num_workers
    for step in range(args.steps):
        ids, x, y = batch(step)
        mine = slice(client.rank * half, (client.rank + 1) * half)
        loss = F.cross_entropy(model(ids[mine], x[mine]), y[mine])
        opt.zero_grad()
        loss.backward()
        opt.step()
    client.clock()  # staleness 0: a read now holds every worker's last push
    emb = model.sparse_tables[0]
    rows = emb.get_rows(torch.arange(emb.rows).numpy())
    dense = {n: p.detach().reshape(-1).tolist() for n, p in model.module.named_parameters() if n != "emb.weight"}
    print(json.dumps({"rank": client.rank, "dense": dense, "emb": rows.reshape(-1).tolist(),
                      "split": model.split()}), flush=True)
    model.close()
    client.close()


if __name__ == "__main__":
    main()
