"""Hybrid mode (``PSModule(..., dense="allreduce")``): the dense layers averaged by all-reduce over
gloo between real worker processes, the embedding in a PS table at staleness 0; both ranks end with
identical dense parameters that equal single-process torch on the global batch."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import WORKERS, worker

from bosen.apps.pytorch import PSModule, ServerOptimizer, declare
from bosen.client import Client

sys.path.insert(0, str(WORKERS))
import torch_hybrid_worker as hw  # noqa: E402  (tests/workers is not a package)

STEPS = 20


def reference(steps: int) -> torch.nn.Module:
    """Single-process torch: SGD lr 0.1 on each global batch's mean loss."""
    ref = hw.net()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(steps):
        ids, x, y = hw.batch(step)
        loss = F.cross_entropy(ref(ids, x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return ref


def close(got: list[float], want: torch.Tensor, what: str, rtol: float = 1e-5) -> None:
    g = torch.tensor(got, dtype=torch.float32)
    w = want.detach().reshape(-1)
    err = (g - w).abs().max().item() / w.abs().max().item()
    assert err <= rtol, f"{what}: relative difference {err:.2e}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("optimizer", ["server-sgd", "delta-sgd"])
def test_two_hybrid_workers_end_equal_and_match_single_process_torch(bosen_cluster, bosen_procs, tmp_path,
                                                                     optimizer):
    """``ServerOptimizer``: the servers step the embedding; ``DeltaOptimizer``: each worker steps its
    rows and pushes the change to an ``add`` table. Either way a step is the global batch's."""
    update = {"update": "sgd", "lr": 0.1} if optimizer == "server-sgd" else {}
    tables = declare(hw.net(), tmp_path / "t", row_width=64, dense="allreduce", **update)
    assert list(tables) == ["emb"]  # no table for the dense layers: they are all-reduced
    c = bosen_cluster(1, workers=2, staleness=0, tables=tables)  # all-reduce, not partitioning
    procs = [worker(bosen_procs, "torch_hybrid_worker.py", c.path, "--steps", STEPS, "--optimizer", optimizer)
             for _ in range(2)]
    assert bosen_procs.wait_all(procs, timeout=150) == [0, 0], [p.output()[-2000:] for p in procs]
    out = sorted((json.loads(p.output().strip().splitlines()[-1]) for p in procs), key=lambda r: r["rank"])
    assert [r["rank"] for r in out] == [0, 1]
    assert out[0]["dense"] == out[1]["dense"]  # bit-identical replicas (rank 1 started elsewhere)
    ref = reference(STEPS)
    start = hw.net()
    for name, p in ref.named_parameters():
        if name == "emb.weight":
            close(out[0]["emb"], p, name)
            continue
        close(out[0]["dense"][name], p, name)
        assert not torch.equal(p, dict(start.named_parameters())[name])  # it trained
    assert out[0]["split"]["allreduce_s"] > 0


@pytest.mark.timeout(120)
def test_one_hybrid_worker_needs_no_group_and_equals_torch(bosen_cluster, tmp_path):
    m = hw.net()
    c = bosen_cluster(1, workers=1, staleness=0, tables=declare(m, tmp_path / "t", update="sgd", lr=0.1,
                                                                 row_width=64, dense="allreduce"))
    client = Client.connect(c.path, rank=0)
    try:
        model = PSModule(m, client, clock_every=1, row_width=64, dense="allreduce")
        assert model.allreduce is not None and model.allreduce.group is None
        opt = ServerOptimizer(model, "sgd", lr=0.1)
        for step in range(STEPS):
            ids, x, y = hw.batch(step)
            loss = F.cross_entropy(model(ids, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        client.clock()
        ref = reference(STEPS)
        emb = model.sparse_tables[0].get_rows(torch.arange(40).numpy())
        close(emb.reshape(-1).tolist(), ref.emb.weight, "emb.weight")
        for (name, p), (_, q) in zip(m.head.named_parameters(), ref.head.named_parameters(), strict=True):
            close(p.detach().reshape(-1).tolist(), q, name)
        model.close()
    finally:
        client.close()


def test_an_unknown_dense_mode_names_the_argument(bosen_cluster, tmp_path):
    m = hw.net()
    with pytest.raises(ValueError, match="dense: 'nccl' is not a mode"):
        declare(m, tmp_path / "t", dense="nccl")
    c = bosen_cluster(1, workers=1, tables=declare(m, tmp_path / "t", update="sgd", lr=0.1, row_width=64))
    client = Client.connect(c.path, rank=0)
    try:
        with pytest.raises(ValueError, match="dense: 'all-reduce' is not a mode"):
            PSModule(m, client, row_width=64, dense="all-reduce")
    finally:
        client.close()


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_dlrm_in_hybrid_mode_learns_through_the_launcher(tmp_path):
    """``bosen launch`` with ``app.args.dense=allreduce``: the workers meet in the run directory
    (a file store), the MLPs are all-reduced, only the embedding has a table, and the model learns."""
    from test_dlrm import launch

    lines = launch(tmp_path / "run", "consistency.staleness=2", "app.args.train_samples=60000",
                   "app.args.evals_per_epoch=1", "app.args.dense=allreduce", timeout=140)
    clocks = [x for x in lines if x.get("kind") == "clock" and "heldout_auc" in x]
    assert clocks and clocks[-1]["workers"] == 2
    assert clocks[-1]["heldout_auc"] > 0.6, clocks[-1]
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert sorted(cfg["tables"]) == ["emb"]  # no dense table
