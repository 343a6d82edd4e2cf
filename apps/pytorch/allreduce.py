"""Hybrid mode's dense half: the dense parameters' gradients averaged over the workers by all-reduce
(``PSModule(..., dense="allreduce")``), while the embeddings stay in PS tables.

Production recommenders (PERSIA, TorchRec, HugeCTR) train this way: dense layers are small and every
worker needs all of them every step, which a synchronous all-reduce does in one round of
2 (P - 1) / P of their bytes each way, with no server in between; embeddings are large and each step
touches few of their rows, which a parameter server serves. Gradients are all-reduced per bucket
(buckets.py) from hooks as the backward pass produces them, so the reduction overlaps the rest of the
backward; ``wait`` averages them into each parameter's ``.grad`` and a local torch optimizer then takes
the same step on every rank.

The process group is this module's own (``torch.distributed`` is left uninitialized: no global
state), built from the ranks the PS assigned (``client.rank``, ``client.num_workers``): gloo on the
CPU, NCCL on CUDA, meeting at ``MASTER_ADDR:MASTER_PORT`` when the environment names one (torchrun,
Slurm scripts), else at a file store in the job's run directory (``bosen launch``) or beside its
config (workers started by hand on one machine). One worker needs no group and reduces nothing.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bosen.apps.pytorch.buckets import Buckets
from bosen.errors import ConfigError

DENSE_MODES = ("ps", "allreduce")
BUCKET_VALUES = 25 * (1 << 20) // 4  # DDP's default bucket: 25 MiB of float32
RENDEZVOUS_FILE = "torch-dense-group"  # the file store's name in the run directory


def check_mode(dense: str) -> str:
    """``dense`` if it is a known mode; else a ValueError naming the argument and the modes."""
    if dense not in DENSE_MODES:
        raise ValueError(f"dense: {dense!r} is not a mode (one of {', '.join(repr(m) for m in DENSE_MODES)}): "
                         "'ps' keeps the dense parameters in a PS table, 'allreduce' averages their "
                         "gradients over the workers by all-reduce")
    return dense


def process_group(rank: int, world: int, device: torch.device, config_path: str | Path | None,
                  env: Mapping[str, str] | None = None, timeout_s: float = 300.0) -> Any:
    """This job's workers as a ``torch.distributed`` process group of their own (None for one worker):
    gloo on the CPU, NCCL on CUDA; the rendezvous as the module docstring says."""
    if world <= 1:
        return None
    env = os.environ if env is None else env
    timeout = datetime.timedelta(seconds=timeout_s)
    store: Any
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, rank == 0, timeout)
    else:
        where = env.get("BOSEN_RUN_DIR") or (str(Path(config_path).resolve().parent) if config_path else None)
        if not where:
            raise ConfigError("dense='allreduce' needs a place where the workers meet: set MASTER_ADDR and "
                              "MASTER_PORT, or run under bosen launch (BOSEN_RUN_DIR), or connect with a "
                              "config file")
        store = dist.FileStore(str(Path(where) / RENDEZVOUS_FILE), world)
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        if hasattr(opts, "_timeout"):
            opts._timeout = timeout
        return dist.ProcessGroupNCCL(dist.PrefixStore("bosen-dense", store), rank, world, opts)
    pg = dist.ProcessGroupGloo(dist.PrefixStore("bosen-dense", store), rank, world, timeout)
    return pg


class DenseAllReduce:
    """Averages the gradients of ``params`` (views of ``flat`` at ``slots``: (offset, numel)) over
    ``group`` from backward hooks, a bucket of about ``bucket_values`` values at a time."""

    def __init__(self, params: Sequence[torch.nn.Parameter], slots: Sequence[tuple[int, int]],
                 flat: torch.Tensor, group: Any, world: int, bucket_values: int = BUCKET_VALUES) -> None:
        self.params = list(params)
        self.slots = list(slots)
        self.group = group
        self.world = world
        self.grad = torch.zeros_like(flat)  # every dense gradient, end to end, as the buckets send them
        self._works: list[Any] = []
        self._lock = threading.Lock()
        self.buckets = Buckets(self.slots, flat.numel(), self._send, size=bucket_values)
        self.allreduce_s = 0.0  # seconds waited for reductions still running after the backward
        if group is not None:
            for k, p in enumerate(self.params):
                p.register_post_accumulate_grad_hook(self._hook(k))
        self._zeroed = False

    def broadcast(self, flat: torch.Tensor) -> None:
        """Rank 0's values into every rank's ``flat`` (as DDP does when it wraps a model)."""
        if self.group is not None:
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            self.group.broadcast([flat], opts).wait()

    def _hook(self, k: int) -> Any:
        o, n = self.slots[k]

        def ready(p: torch.Tensor) -> None:
            if p.grad is None or p.grad.is_sparse:
                return  # wait() names a sparse gradient
            self._zero_once()
            self.grad[o:o + n].copy_(p.grad.reshape(-1))
            self.buckets.ready(k)
        return ready

    def _zero_once(self) -> None:
        with self._lock:
            if not self._zeroed:  # a parameter without a gradient this step sends zeros
                self.grad.zero_()
                self._zeroed = True

    def _send(self, b: int, lo: int, hi: int) -> None:
        if hi > lo:
            self._works.append(self.group.allreduce([self.grad[lo:hi]]))

    def wait(self) -> None:
        """Finish this step's reductions and put the averages into the parameters' ``.grad``."""
        if self.group is None:
            return
        t0 = time.perf_counter()
        self._zero_once()  # a step where no parameter had a gradient still takes part (zeros)
        for k, p in enumerate(self.params):  # gradients the hooks did not see (accumulated by hand)
            if p.grad is not None and not self.buckets.seen[k] and not p.grad.is_sparse:
                o, n = self.slots[k]
                self.grad[o:o + n].copy_(p.grad.reshape(-1))
        self.buckets.flush()
        works, self._works = self._works, []
        for w in works:
            w.wait()
        self.grad.div_(self.world)
        for (o, n), p in zip(self.slots, self.params, strict=True):
            p.grad = self.grad[o:o + n].view(p.shape).clone()
        self._zeroed = False
        self.allreduce_s += time.perf_counter() - t0
