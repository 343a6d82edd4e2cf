"""The worker processes of ``python -m bench.torch``: one training loop, three ways of sharing the model.

``python -m bench.torch.workers SPEC_JSON`` runs one process of one system (from the repository root,
which the bench sets as the child's directory and PYTHONPATH):

- ``ours``: a Bösen worker (``PSModule`` + ``DeltaOptimizer`` / ``ServerOptimizer``) against servers
  the bench started;
- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` over gloo (sparse embedding gradients are
  all-reduced sparse: gloo's sparse all-reduce gathers every rank's indices and values);
- ``rpc-ps`` / ``rpc-trainer``: a ``torch.distributed.rpc`` parameter server and its trainers.

Every system runs the same model (same seeded initial values), the same shard of the same data in the
same order, the same batch size, and rank 0 scores the same held-out set after the same steps; the
clock that counts is rank 0's training time, its evaluations left out. Each process writes its
results (evaluation points, bytes moved) as JSON to ``spec["out"]``.

The RPC parameter server is correct for more than one trainer. pytorch/examples#780: the example's
server held one model whose first layers ran on the server under distributed autograd, shared by all
trainers; one trainer's ``DistributedOptimizer.step()`` changed those parameters in place while another
trainer's backward still needed the values its forward had saved ("modified by an inplace operation"),
so with two or more trainers it failed or hung. Here no autograd graph reaches the server: a trainer
pulls copies (taken under the table's lock), runs forward and backward on its own copy, and pushes
gradients; the server applies each push under the lock of the table it touches (one for the dense
parameters, one for the embedding), so an update is atomic and a pull never sees half of one.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch  # the real torch: this module is bench.torch.workers, and python -m puts only the root on sys.path
import torch.nn.functional as F
from torch import nn

# -- the two tasks ---------------------------------------------------------------------------------


class CNNTask:
    """Fashion-MNIST, the CNN example's model; held-out accuracy."""

    name = "cnn"
    emb_param = None

    def __init__(self, args: dict[str, Any]) -> None:
        from bosen.apps.pytorch.examples import cnn
        self.cnn = cnn
        self.a = cnn.CNNArgs(**args)
        self.batch = self.a.batch_size

    def model(self) -> nn.Module:
        torch.manual_seed(self.a.seed)
        return self.cnn.Net()

    def data(self, rank: int, world: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        x, y = self.cnn.images(True, self.a.train_samples)
        mine = torch.arange(rank, x.shape[0], world)
        return (x[mine],), y[mine]

    def test(self, n: int | None = None) -> Any:
        return self.cnn.images(False, self.a.test_samples)  # the whole test set already

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y)

    def score(self, model: nn.Module, test: Any) -> float:
        return self.cnn.accuracy(model, *test)[0] / int(test[1].shape[0])

    def rows(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
        return None


class DLRMTask:
    """Criteo-shaped clicks, the DLRM example's model (fused embedding); held-out AUC."""

    name = "dlrm"
    emb_param = "emb.weight"

    def __init__(self, args: dict[str, Any]) -> None:
        from bosen.apps.pytorch.examples import criteo, dlrm
        self.criteo, self.dlrm = criteo, dlrm
        self.a = dlrm.DLRMArgs(**args)
        self.batch = self.a.batch_size
        if self.a.embedding != "fused":
            raise ValueError("bench: the DLRM task runs the fused embedding")
        self.offsets = torch.tensor(np.cumsum((0, *self.a.spec.cardinalities[:-1])), dtype=torch.int64)

    def model(self) -> nn.Module:
        return self.dlrm.model(self.a)

    def data(self, rank: int, world: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        s = self.criteo.shard(self.a.spec, rank, world, self.a.train_samples)
        return (torch.from_numpy(s.dense), torch.from_numpy(s.ids)), torch.from_numpy(s.labels)

    def test(self, n: int | None = None) -> Any:
        return self.criteo.generate(self.a.spec, 0, n or self.a.test_samples, self.criteo.HELDOUT)

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(out, y)

    def score(self, model: nn.Module, test: Any) -> float:
        return self.criteo.auc(self.dlrm.scores(model, test), test.labels)

    def rows(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
        return torch.unique(inputs[1] + self.offsets)


def make_task(spec: dict[str, Any]) -> CNNTask | DLRMTask:
    return (CNNTask if spec["task"] == "cnn" else DLRMTask)(spec["args"])


# -- the loop every system shares -------------------------------------------------------------------


class Loop:
    """Steps through this rank's shard; rank 0 scores the held-out set after the steps in ``evals``
    (1-based, counted over all epochs) and keeps its training time without the evaluations."""

    def __init__(self, spec: dict[str, Any], task: CNNTask | DLRMTask, rank: int, world: int) -> None:
        torch.set_num_threads(1)
        self.task, self.rank, self.world = task, rank, world
        self.inputs, self.labels = task.data(rank, world)
        self.steps = (self.labels.shape[0]) // task.batch
        self.epochs = int(spec["epochs"])
        self.evals = set(spec["evals"])
        self.test = task.test() if rank == 0 else None
        # the final metric on a larger held-out set where asked (its first samples are ``test``): the
        # evaluation's own sampling noise (about 0.004 AUC at 20,000 samples) shrinks with it
        n = spec.get("final_samples")
        self.final_test = (task.test(int(n)) if n else self.test) if rank == 0 else None
        self.points: list[dict[str, Any]] = []
        rng = np.random.default_rng(int(spec.get("seed", 0)) * 1000 + rank)
        self.orders = [torch.from_numpy(rng.permutation(self.labels.shape[0])[:self.steps * task.batch])
                       for _ in range(self.epochs)]

    def batches(self) -> Any:
        b = self.task.batch
        n = 0
        for order in self.orders:
            for i in range(self.steps):
                idx = order[i * b:(i + 1) * b]
                n += 1
                yield n, tuple(x[idx] for x in self.inputs), self.labels[idx]

    def run(self, step: Any, score: Any, ahead: Any = None) -> float:
        """``step(inputs, y)`` for every batch, ``score()`` at the evaluation points; training seconds.
        ``ahead(inputs)``, where given, is told the next batch's inputs before each step (reads ahead)."""
        t0, eval_s = time.perf_counter(), 0.0
        batches = self.batches()
        nxt = next(batches, None)
        while nxt is not None:
            n, inputs, y = nxt
            nxt = next(batches, None)
            if ahead is not None and nxt is not None:
                ahead(nxt[1])
            step(inputs, y)
            if n in self.evals and self.rank == 0:
                te = time.perf_counter()
                train_s = te - t0 - eval_s
                m = score()
                eval_s += time.perf_counter() - te
                self.points.append({"step": n, "train_s": train_s, "metric": m})
        return time.perf_counter() - t0 - eval_s


def _profile(phases: dict[str, float], step_times: list[float], model: Any, stats: dict[str, Any]) -> dict:
    """Where a worker's steps went: per phase, per segment of SEGMENT steps (and the first 40 steps, in
    ms), the module's read waits, and the client's blocked reads (background reads included)."""
    seg = [round(sum(step_times[i:i + SEGMENT]), 3) for i in range(0, len(step_times), SEGMENT)]
    waits = {k: round(getattr(model, k), 3) for k in ("pull_s", "rows_s", "settle_s", "prefault_s")}
    return {**{k: round(v, 3) for k, v in phases.items()}, **waits, "segments": seg, "segment_steps": SEGMENT,
            "first_ms": [round(t * 1000, 1) for t in step_times[:40]], "blocked_s": stats.get("blocked_s"),
            "blocked_reads": stats.get("blocked_reads")}


SEGMENT = 196  # steps per profile segment (an eighth of the DLRM epoch)


def write(spec: dict[str, Any], **fields: Any) -> None:
    Path(spec["out"]).write_text(json.dumps(fields))


# -- ours ------------------------------------------------------------------------------------------


def run_ours(spec: dict[str, Any]) -> None:
    from bosen.apps.pytorch import DeltaOptimizer, PSModule, ServerOptimizer
    from bosen.client import Client

    task = make_task(spec)
    rank, world = int(spec["rank"]), int(spec["world"])
    loop = Loop(spec, task, rank, world)
    client = Client.connect(spec["config"], rank=rank)
    model = PSModule(task.model(), client, clock_every=int(spec["clock_every"]), prefault=spec.get("prefault", True),
                     dense=spec.get("dense", "ps"))
    # start together, as DDP's and RPC's set-up does: once every worker has clocked staleness + 1
    # times, a read waits for all of them
    for _ in range(int(spec["staleness"]) + 1):
        client.clock()
    model.pull()
    opt_name, lr = spec["optimizer"], float(spec["lr"])
    if opt_name == "delta-sgd":
        opt: Any = DeltaOptimizer(model, torch.optim.SGD(model.parameters(), lr=lr))
    else:
        opt = ServerOptimizer(model, opt_name, lr=lr)

    phases = {"forward_s": 0.0, "backward_s": 0.0, "step_s": 0.0}
    step_times: list[float] = []

    def step(inputs: tuple[torch.Tensor, ...], y: torch.Tensor) -> None:
        t0 = time.perf_counter()
        loss = task.loss(model(*inputs), y)
        t1 = time.perf_counter()
        opt.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        phases["forward_s"] += t1 - t0
        phases["backward_s"] += t2 - t1
        phases["step_s"] += t3 - t2
        step_times.append(t3 - t0)

    ahead = None
    sparse = [e.module for e in model.layout.sparse]
    if spec.get("read_ahead", True) and sparse:
        def ahead(inputs: tuple[torch.Tensor, ...]) -> None:  # the next batch's rows, read during this step
            model.prefetch_rows({sparse[0]: task.rows(inputs)})

    train_s = loop.run(step, lambda: task.score(model, loop.test), ahead)
    # a barrier under SSP: once every worker is staleness + 1 clocks past its last step, rank 0 reads
    # values that hold every update of the job
    for _ in range(int(spec["staleness"]) + 1):
        client.clock()
    final = task.score(model, loop.final_test) if rank == 0 else None
    s = client.stats()
    client.close()
    # hybrid mode: the MLPs' all-reduce, counted as DDP's hook counts a dense bucket (ring all-reduce:
    # 2 (P-1)/P of the bytes each way, once a step); the client's stats hold only the PS's traffic
    ring = 0
    if model.allreduce is not None:
        ring = len(step_times) * 2 * (world - 1) * model.flat.numel() * model.flat.element_size() // world
    write(spec, points=loop.points, train_s=train_s, final=final, bytes_sent=s["bytes_sent"] + ring,
          bytes_received=s["bytes_received"] + ring, allreduce_bytes=2 * ring,
          profile=_profile(phases, step_times, model, s))


# -- DistributedDataParallel -------------------------------------------------------------------------


def run_ddp(spec: dict[str, Any]) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    task = make_task(spec)
    rank, world = int(spec["rank"]), int(spec["world"])
    loop = Loop(spec, task, rank, world)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank, world_size=world)
    net = task.model()
    if spec.get("dense_embedding"):  # dense embedding gradients, as with NCCL (no sparse all-reduce)
        for m in net.modules():
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
                m.sparse = False
    model = DDP(net)
    moved = {"sent": 0, "received": 0}

    def hook(state, bucket):  # noqa: ANN001, ANN202 - DDP checks the annotations: none, or its own types
        t = bucket.buffer()
        if t.is_sparse:
            # gloo's sparse all-reduce: every rank sends its (coalesced) rows and ids to the others
            t = t.coalesce()
            n = t._nnz() * (t.values()[0].numel() * t.element_size() + 8) * (world - 1)
        else:
            n = 2 * (world - 1) * t.numel() * t.element_size() // world  # ring all-reduce, each way
        moved["sent"] += n
        moved["received"] += n
        return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] / world)

    model.register_comm_hook(None, hook)
    lr = float(spec["lr"])
    if spec["optimizer"] == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        opt = torch.optim.Adagrad(model.parameters(), lr=lr)

    def step(inputs: tuple[torch.Tensor, ...], y: torch.Tensor) -> None:
        loss = task.loss(model(*inputs), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    if spec.get("max_steps"):  # time per step only: the first few steps warm up, the rest are timed
        warm, times = 3, []
        for n, inputs, y in loop.batches():
            t = time.perf_counter()
            step(inputs, y)
            times.append(time.perf_counter() - t)
            if n >= spec["max_steps"]:
                break
        dist.destroy_process_group()
        write(spec, step_s=float(np.median(times[warm:])), steps=len(times) - warm, bytes_sent=moved["sent"],
              bytes_received=moved["received"], points=[], final=None, train_s=sum(times))
        return
    train_s = loop.run(step, lambda: task.score(net, loop.test))
    final = task.score(net, loop.final_test) if rank == 0 else None  # replicas are equal after every step
    dist.destroy_process_group()
    write(spec, points=loop.points, train_s=train_s, final=final, bytes_sent=moved["sent"],
          bytes_received=moved["received"])


# -- torch.distributed.rpc parameter server ----------------------------------------------------------


class ParameterServer:
    """The model's dense parameters (one flat vector) and its embedding, each behind its own lock; the
    step (SGD or AdaGrad as torch's: accumulator from 0, eps 1e-10) is applied atomically per table."""

    def __init__(self, spec: dict[str, Any]) -> None:
        torch.set_num_threads(1)
        task = make_task(spec)
        net = task.model()
        params = dict(net.named_parameters())
        dense = [p for n, p in params.items() if n != task.emb_param]
        self.flat = torch.nn.utils.parameters_to_vector(dense).detach().clone()
        self.emb = params[task.emb_param].detach().clone() if task.emb_param else None
        self.adagrad = spec["optimizer"] == "adagrad"
        self.lr = float(spec["lr"])
        self.flat_sum = torch.zeros_like(self.flat)
        self.emb_sum = torch.zeros_like(self.emb) if self.emb is not None else None
        self.dense_lock, self.emb_lock = threading.Lock(), threading.Lock()
        self.done = 0
        self.done_lock = threading.Lock()

    def pull(self, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self.dense_lock:
            flat = self.flat.clone()
        if rows is None:
            return flat, None
        with self.emb_lock:
            return flat, self.emb[rows]  # advanced indexing: a copy

    def push(self, grad: torch.Tensor, rows: torch.Tensor | None, values: torch.Tensor | None) -> None:
        with self.dense_lock:
            self._step(self.flat, self.flat_sum, grad)
        if rows is not None:
            with self.emb_lock:
                w, s = self.emb[rows], self.emb_sum[rows]
                self._step(w, s, values)
                self.emb[rows], self.emb_sum[rows] = w, s

    def _step(self, x: torch.Tensor, s: torch.Tensor, g: torch.Tensor) -> None:
        if self.adagrad:
            s.addcmul_(g, g)
            x.addcdiv_(g, s.sqrt().add_(1e-10), value=-self.lr)
        else:
            x.add_(g, alpha=-self.lr)

    def finish(self) -> int:
        with self.done_lock:
            self.done += 1
            return self.done


_PS: ParameterServer | None = None


def ps_pull(rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    assert _PS is not None
    return _PS.pull(rows)


def ps_push(grad: torch.Tensor, rows: torch.Tensor | None, values: torch.Tensor | None) -> None:
    assert _PS is not None
    _PS.push(grad, rows, values)


def ps_finish() -> int:
    assert _PS is not None
    return _PS.finish()


def ps_done() -> int:
    assert _PS is not None
    return _PS.done


def _rpc_options(spec: dict[str, Any]) -> Any:
    from torch.distributed import rpc
    return rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{spec['port']}", num_worker_threads=8,
                                           rpc_timeout=300)


def run_rpc_ps(spec: dict[str, Any]) -> None:
    from torch.distributed import rpc
    global _PS
    _PS = ParameterServer(spec)
    rpc.init_rpc("ps", rank=0, world_size=int(spec["world"]) + 1, rpc_backend_options=_rpc_options(spec))
    rpc.shutdown()  # waits for every trainer
    write(spec, ok=True)


def run_rpc_trainer(spec: dict[str, Any]) -> None:
    from torch.distributed import rpc

    task = make_task(spec)
    rank, world = int(spec["rank"]), int(spec["world"])
    loop = Loop(spec, task, rank, world)
    rpc.init_rpc(f"trainer{rank}", rank=rank + 1, world_size=world + 1, rpc_backend_options=_rpc_options(spec))
    net = task.model()
    params = dict(net.named_parameters())
    dense = [p for n, p in params.items() if n != task.emb_param]
    emb = params[task.emb_param] if task.emb_param else None
    moved = {"sent": 0, "received": 0}

    def nbytes(*ts: torch.Tensor | None) -> int:
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    def pull(rows: torch.Tensor | None) -> None:
        flat, values = rpc.rpc_sync("ps", ps_pull, args=(rows,))
        moved["sent"] += nbytes(rows)
        moved["received"] += nbytes(flat, values)
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(flat, dense)
            if rows is not None:
                emb[rows] = values

    def step(inputs: tuple[torch.Tensor, ...], y: torch.Tensor) -> None:
        rows = task.rows(inputs)
        pull(rows)
        loss = task.loss(net(*inputs), y)
        net.zero_grad(set_to_none=True)
        loss.backward()
        grad = torch.nn.utils.parameters_to_vector([p.grad for p in dense])
        r = v = None
        if emb is not None:
            g = emb.grad.coalesce()
            r, v = g.indices()[0], g.values()
        rpc.rpc_sync("ps", ps_push, args=(grad, r, v))
        moved["sent"] += nbytes(grad, r, v)

    def score(test: Any = None) -> float:
        test = test if test is not None else loop.test
        rows = task.rows((torch.from_numpy(test.dense), torch.from_numpy(test.ids))) if emb is not None else None
        pull(rows)
        return task.score(net, test)

    train_s = loop.run(step, score)
    rpc.rpc_sync("ps", ps_finish)
    final = None
    if rank == 0:  # once every trainer is done, the server holds every update
        while rpc.rpc_sync("ps", ps_done) < world:
            time.sleep(0.05)
        final = score(loop.final_test)
    write(spec, points=loop.points, train_s=train_s, final=final, bytes_sent=moved["sent"],
          bytes_received=moved["received"])
    rpc.shutdown()


RUN = {"ours": run_ours, "ddp": run_ddp, "rpc-ps": run_rpc_ps, "rpc-trainer": run_rpc_trainer}

if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    spec = json.loads(sys.argv[1])
    RUN[spec["system"]](spec)
