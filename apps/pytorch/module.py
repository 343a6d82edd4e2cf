"""``PSModule``: a torch module whose parameters are read from the parameter server as it runs.

The module's dense parameters become views of one flat tensor (the dense table's rows end to end),
so a pull is one refresh of the table's view (client/view.py: only rows written since the last pull
are copied, into one persistent array) and one copy, and the optimizers read gradients and values in one
piece. The next step's pull starts in a background thread as soon as a step's update is pushed, so
it overlaps whatever the loop does before the next forward (loading the batch, waiting at the SSP
bound); the forward then only waits for what is left. On CUDA the copy goes through a persistent
pinned host buffer with a non-blocking transfer.

A sparse embedding (``sparse=True``) keeps its full local weight, but a forward pre-hook reads only
the rows of the ids in its input into it (on the CPU, with read-my-writes, the weight is a view's
array and only rows written since their last read are copied), and the optimizers send only the rows its sparse gradient
touches. ``prefetch_rows`` reads a coming batch's rows into the client's cache in the background, a
step ahead if asked, so that read overlaps the current step; the hook always reads through the cache,
which serves them as far as the SSP bound allows (a row read too early for its tick is read again).
The tables' process-local buffers are faulted in when the module is made (``Table.prefault``), not
by a sparse table's scattered first touches mid-run.

A ``PSEmbedding`` (embedding.py) holds no weight: this module binds it to its table, so its forward
reads the batch's distinct rows (through the cache, as above) into a leaf tensor of those rows only,
and the optimizers push that leaf's gradient rows. Memory then follows the rows touched, for
tables bigger than a worker (issue 29: 100M rows, 64-bit ids).
"""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from bosen.apps.backup import read_iterations
from bosen.apps.protocol import PSClient, PSTable, PSView, require_table
from bosen.apps.pytorch.allreduce import BUCKET_VALUES, DenseAllReduce, check_mode, process_group
from bosen.apps.pytorch.buckets import Buckets
from bosen.apps.pytorch.embedding import PSEmbedding
from bosen.apps.pytorch.layout import DEFAULT_ROW_WIDTH, Layout, Sparse
from bosen.apps.pytorch.rowcache import DeviceRowCache, fetch_through
from bosen.apps.pytorch.tables import layout_file
from bosen.errors import ConfigError, UsageError

_tick = operator.attrgetter("tick")  # the real client's main worker's tick (not in the PSClient protocol)


class PSModule(nn.Module):
    """Wraps ``module``; ``clock_every``: optimizer steps per clock tick (the SSP unit of staleness);
    0: the training loop ends each tick itself (:meth:`clock`), as a worker running micro-tasks does,
    whose steps per tick follow the tasks it owns.

    ``device``: where the module is expected to be (e.g. ``Ranks.device()``); a module elsewhere is
    an error rather than a silent copy. ``prefetch``: read the next step's dense parameters in the
    background right after each push (off: read them in ``forward``). ``prefault``: fault in the
    client's buffers of the sparse tables now (seconds in ``prefault_s``), where a run would otherwise
    fault a page with nearly every row of its first steps. ``device_cache_rows``: keep up to that many
    rows of each ``PSEmbedding`` on the module's device (rowcache.py), reused while the SSP bound
    allows, so repeated ids do not cross the host each step (0: off).
    """

    def __init__(self, module: nn.Module, client: PSClient, clock_every: int = 1, *, prefix: str = "",
                 row_width: int = DEFAULT_ROW_WIDTH, device: str | torch.device | None = None,
                 prefetch: bool = True, prefault: bool = True, dense: str = "ps", overlap: bool = False,
                 bucket_values: int = BUCKET_VALUES, device_cache_rows: int = 0) -> None:
        super().__init__()
        if not isinstance(clock_every, int) or clock_every < 0:
            raise ValueError(f"clock_every: must be a positive integer (or 0: the loop calls clock()), "
                             f"got {clock_every!r}")
        self.dense = check_mode(dense)
        self.module = module
        self.client = client
        self.clock_every = clock_every
        self.layout = layout = Layout.of(module, prefix, row_width)
        if not isinstance(device_cache_rows, int) or device_cache_rows < 0:
            raise ValueError(f"device_cache_rows: must be a non-negative integer, got {device_cache_rows!r}")
        if device_cache_rows and not layout.sparse:
            raise ValueError("device_cache_rows: the device cache holds sparse embedding rows, and the model has "
                             "none (a PSEmbedding, or an nn.Embedding with sparse=True)")
        if device_cache_rows and not isinstance(getattr(client, "tick", None), int):
            raise ConfigError("device_cache_rows: the client does not say its tick, which the cache's SSP rule needs")
        need = "PSModule keeps the model's parameters in it (declare the tables with bosen.apps.pytorch.declare)"
        self.table = require_table(client, layout.table, need) if layout.slots and dense == "ps" else None
        self.sparse_tables = [require_table(client, e.table, need) for e in layout.sparse]
        self._check_tables()
        self.prefault_s = 0.0
        if prefault:
            for t in self.sparse_tables:
                touch = getattr(t, "prefault", None)  # the real client's tables have it
                if touch is not None:
                    self.prefault_s += touch()[1]
        self.device = self._device(device)
        named = dict(module.named_parameters())
        dtype = getattr(torch, layout.dtype)
        n = layout.rows * layout.row_width
        self.flat = torch.zeros(n, dtype=dtype, device=self.device)
        self.params: list[nn.Parameter] = []  # the dense ones, in layout order
        with torch.no_grad():
            for s in layout.slots:
                p = named[s.name]
                view = self.flat[s.offset:s.offset + s.numel].view(s.shape)
                view.copy_(p)
                p.data = view  # the parameter now lives in the flat tensor
                self.params.append(p)
        modules = dict(module.named_modules())
        # the sparse embeddings with a local weight (nn.Embedding / nn.EmbeddingBag), by index in
        # layout.sparse, and the PSEmbeddings, which hold only the rows of the current batch
        self.local: dict[int, nn.Parameter] = {i: named[e.param] for i, e in enumerate(layout.sparse)
                                               if not e.remote}
        self.remote: dict[int, PSEmbedding] = {}
        # the PSEmbeddings' rows kept on the device, by index in layout.sparse (device_cache_rows)
        self.device_caches: dict[int, DeviceRowCache] = {}
        # a sparse embedding on the CPU whose table shows this process's writes: its weight *is* the
        # array of a read-only view of every row (client/view.py), so the forward's read of a batch's
        # rows copies only those written since they were last read, straight into the weight
        self._row_views: dict[int, PSView] = {}
        # a sparse nn.Embedding's weight, when device_cache_rows is on and it is not such a view (on
        # CUDA; or a table with a server-side optimizer): the clock each row's value is valid for, so
        # the forward reads again only the rows too old for the SSP bound (the weight holds every row:
        # no bound on the rows kept); weight_hits counts the rows it did not read
        self._weight_clocks: dict[int, np.ndarray] = {}
        self.weight_hits = 0
        for i, (e, t) in enumerate(zip(layout.sparse, self.sparse_tables, strict=True)):
            if device_cache_rows and getattr(t, "versioned", False):
                raise ConfigError(f"device_cache_rows: table {t.name} applies {t.update}, whose updates are "
                                  "tagged with the version of the client's copy of a row; a device copy may "
                                  "be older than that: leave the device cache off for it")
            if e.remote:
                emb = modules[e.module]
                assert isinstance(emb, PSEmbedding)
                if device_cache_rows:
                    self.device_caches[i] = DeviceRowCache(device_cache_rows, e.cols, getattr(torch, layout.dtype),
                                                           self.device)
                emb.bind(self._lookup(i, e, t))
                self.remote[i] = emb
                continue
            w = self.local[i]
            if self.device.type == "cpu" and getattr(t, "read_my_writes", False):
                rv = t.view(np.arange(e.rows, dtype=np.int64), base=False)
                w.data = torch.from_numpy(rv.values)
                self._row_views[i] = rv
            elif device_cache_rows and not getattr(t, "read_my_writes", False):
                # (a local torch optimizer, read-my-writes, steps the weight itself: left as it is)
                self._weight_clocks[i] = np.full(e.rows, -1, dtype=np.int64)
            modules[e.module].register_forward_pre_hook(self._embedding_hook(i, e, t, w))
        cuda = self.device.type == "cuda"
        self._host = torch.empty(n, dtype=dtype, pin_memory=True) if cuda and n else None
        self._copied: Any = None  # the CUDA event of the last transfer out of the pinned buffer
        self._rows = np.arange(layout.rows, dtype=np.int64)
        # the dense table's rows as this worker last read them (client/view.py): a pull copies only rows
        # written since into one persistent array, where a read of the whole table allocated a new one
        self._dense = self.table.view(self._rows) if self.table is not None else None
        # a dense table with backup workers (docs/design.md, "Backup workers"): each pull reads an
        # iteration's value and moves the tick up to it; nothing is read ahead (the next value does not
        # exist before this worker's gradient, or another's, makes it)
        self.backup = self._backup_config(dense)
        self.iteration = -1  # the iteration of the values last pulled (backup tables)
        # backup tables: per embedding, one row of each partition (row p is in partition p), read with the
        # dense rows at each pull and pushed (zero where the batch did not touch it) with each gradient,
        # so every server of the table hears every worker's gradient of every iteration it computes
        self._probes: dict[int, np.ndarray] = {}
        if self.backup is not None:
            if clock_every != 1 or overlap or device_cache_rows:
                raise ConfigError(f"{client.config.source}: the model's tables have backup workers: one step per "
                                  "iteration (clock_every=1), the whole gradient at once (overlap=False), no "
                                  "device cache (device_cache_rows=0)")
            prefetch = False
            parts = getattr(getattr(client.config, "cluster", None), "num_partitions", 1)
            self._probes = {i: np.arange(min(parts, e.rows), dtype=np.int64) for i, e in enumerate(layout.sparse)}
        self.prefetch = prefetch
        # one background reader, owned here. Its reads run beside the forward's own row reads (the
        # client serves one worker's reads from several threads: a row asked for by one is waited for
        # by the other), but every read in flight is waited for before a push, so increments and
        # clocks never overlap a read of this module's.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="bosen-prefetch")
        self._next: Future[np.ndarray] | None = None
        self._ahead: list[Future[np.ndarray]] = []  # row reads into the cache (prefetch_rows)
        self.steps = 0
        self.pulled = False  # the dense parameters were pulled since the last push (``push(changed=True)``)
        self.pull_s = 0.0  # seconds spent reading parameters (waiting at the SSP bound included)
        self.rows_s = 0.0  # of which reading embedding rows in the forward
        self.settle_s = 0.0  # seconds a push waited for reads in flight
        self.rows_pulled = 0  # embedding rows read
        self.rows_pushed = 0  # embedding rows sent
        self.push_s = 0.0  # seconds spent sending updates (per-bucket pushes during backward included)
        slots = [(s.offset, s.numel) for s in layout.slots]
        # hybrid mode: the dense gradients averaged by all-reduce, the dense step taken here
        self.allreduce: DenseAllReduce | None = None
        if dense == "allreduce" and layout.slots:
            group = process_group(client.rank, client.num_workers, self.device, str(client.config.source))
            self.allreduce = DenseAllReduce(self.params, slots, self.flat, group, client.num_workers, bucket_values)
            self.allreduce.broadcast(self.flat)  # every rank starts from rank 0's values, as DDP does
        # PS mode with overlap: each bucket of dense gradients (whole rows) is pushed from the backward
        # hooks once the backward has produced all of it; ServerOptimizer pushes only the rest
        self.overlap = bool(overlap) and self.table is not None
        self._grads = torch.zeros(n, dtype=dtype)  # the dense gradients on the host, as pushed
        self._pushed: Buckets | None = None
        if self.overlap:
            self._pushed = Buckets(slots, n, self._push_bucket, size=bucket_values, align=layout.row_width)
            # each bucket's rows leave at once (Table.send_rows), not with the clock; False keeps them
            # in the update buffer until the clock (what overlap did before: the bench's comparison)
            self.send_buckets = True
            for k, p in enumerate(self.params):
                p.register_post_accumulate_grad_hook(self._push_hook(k))
            self._grads_zeroed = False

    # -- the training loop's side ------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.pull()
        return self.module(*args, **kwargs)

    def pull(self, on_clock: Callable[[], bool] | None = None, skipping: Callable[[int], None] | None = None) -> None:
        """Read the dense parameters, as fresh as the table's staleness bound requires, into the module
        (what a prefetch read, else a read now). On synchronous tables ``on_clock`` is called after
        each clock a worker whose gradient was dropped catches up with (``read_iterations``), ``skipping``
        with the iteration before it, and
        ``iteration`` is the iteration the next gradient is of (the embeddings' probe rows included)."""
        if self.table is None and self.backup is None:
            return
        t0 = time.perf_counter()
        ahead, self._next = self._next, None
        if self.backup is not None:
            reads = [(cast(Any, self.table), self._rows)] if self.table is not None else []
            reads += [(cast(Any, self.sparse_tables[i]), rows) for i, rows in self._probes.items()]
            got, self.iteration = read_iterations(cast(Any, self.client), reads, on_clock, skipping)
            if self.table is None:
                self.pulled = True
                self.pull_s += time.perf_counter() - t0
                return
            values = got[0]
        else:
            values = ahead.result() if ahead is not None else self._fetch()
        with torch.no_grad():
            if self._host is None:
                self.flat.copy_(torch.from_numpy(values).view(-1))
            else:  # the prefetch staged the values in pinned memory: only the transfer is left
                self.flat.copy_(self._host, non_blocking=True)
                self._copied = torch.cuda.Event()
                self._copied.record()
        self.pulled = True
        self.pull_s += time.perf_counter() - t0

    def _fetch(self) -> np.ndarray:
        """Read the dense rows (the prefetch thread's job); on CUDA also copy them into the pinned host
        buffer, once the last transfer out of it has finished, so the pull only starts a transfer."""
        assert self._dense is not None  # a dense table has its view
        values = self._dense.refresh()
        if self._host is not None:
            if self._copied is not None:
                self._copied.synchronize()
            self._host.copy_(torch.from_numpy(values).view(-1))
        return values

    def prefetch_rows(self, ids: Mapping[str, torch.Tensor]) -> None:
        """Start reading the rows a coming batch needs, by ids per sparse embedding (its module name in
        the model, as in ``layout.sparse``), into the client's cache in the background. Call it for the
        next batch before the current one's forward, and the read overlaps the whole step: its forward
        reads through the cache, which serves what was read as far as the SSP bound allows; a row read
        too early for the tick it is used in (or not announced) is read then. On backup tables it does
        nothing: the next iteration's rows do not exist before this step's gradient (or another's)."""
        self._raise_failed()
        if self.backup is not None:
            return
        index = {e.module: i for i, e in enumerate(self.layout.sparse)}
        for name, x in ids.items():
            if name not in index:
                raise KeyError(f"prefetch_rows: {name!r} is not a sparse embedding of the model "
                               f"(they are: {', '.join(index) or 'none'})")
            i = index[name]
            rows = self._check_ids(self.layout.sparse[i], x)
            cache = self.device_caches.get(i)
            clocks = self._weight_clocks.get(i)
            if (cache is not None or clocks is not None) and rows.numel():
                # rows the device cache (or the weight) will serve at the next step's tick need no read ahead
                need = self._need(self.sparse_tables[i], ahead=1)
                if cache is not None:
                    rows = rows[~cache.valid(rows.to(self.device), need).cpu()]
                elif clocks is not None:
                    rows = rows[torch.from_numpy(clocks[rows.numpy()] < need)]
            if rows.numel():  # as fresh as the next step needs them: read once, not again there
                self._ahead.append(self._pool.submit(self.sparse_tables[i].get_rows, rows.numpy(), 1))

    def _need(self, table: PSTable, ahead: int = 0) -> int:
        """The oldest clock a read at this worker's tick (plus ``ahead``) may see of ``table``."""
        return max(int(_tick(self.client)) + ahead - table.staleness, 0)

    def _check_ids(self, e: Sparse, ids: torch.Tensor) -> torch.Tensor:
        return self._check_rows(e, torch.unique(ids.detach()).cpu())

    def _check_rows(self, e: Sparse, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (sorted), if they are ids of ``e``'s table; an IndexError naming them if not."""
        if rows.numel() and (int(rows[0]) < 0 or int(rows[-1]) >= e.rows):
            raise IndexError(f"embedding {e.module}: ids must be in [0, {e.rows}), got {int(rows[0])}.."
                             f"{int(rows[-1])}")
        return rows

    def _settle(self) -> None:
        """Wait for the reads in flight (a dense read's result is kept for the next pull); a read that
        failed raises here, at the next use of the tables."""
        ahead, self._ahead = self._ahead, []
        for future in [self._next, *ahead]:
            error = future.exception() if future is not None else None
            if error is not None:
                self._next = None
                raise error

    def _raise_failed(self) -> None:
        """Raise the failure of a row read that already ended, without waiting for the others."""
        for k, future in enumerate(self._ahead):
            if future.done() and future.exception() is not None:
                del self._ahead[k]
                raise future.exception()  # type: ignore[misc]

    def _embedding_hook(self, i: int, e: Sparse, table: PSTable, weight: nn.Parameter) -> Any:
        def pull_rows(module: nn.Module, inputs: tuple[Any, ...]) -> None:
            ids = inputs[0]
            if not isinstance(ids, torch.Tensor):
                return  # the embedding's own forward will complain
            t0 = time.perf_counter()
            self._raise_failed()
            rows = self._check_ids(e, ids)
            # through the cache: rows a read-ahead brought are served from there where fresh enough
            view = self._row_views.get(i)
            clocks = self._weight_clocks.get(i)
            r = rows.numpy()
            if view is not None:
                view.refresh(r)  # into the weight: only rows written since their last read
            elif clocks is not None:  # only the rows whose copy in the weight is too old
                need = self._need(table)
                r = r[clocks[r] < need]
                self.weight_hits += rows.numel() - r.shape[0]
                values, valid = fetch_through(table, lambda: need)(torch.from_numpy(r))
                clocks[r] = valid.numpy()
                with torch.no_grad():
                    weight[torch.from_numpy(r).to(weight.device)] = values.to(weight.device, non_blocking=True)
            else:
                values = torch.from_numpy(table.get_rows(r))
                with torch.no_grad():
                    weight[rows.to(weight.device)] = values.to(weight.device, non_blocking=True)
            self.rows_pulled += r.shape[0]
            dt = time.perf_counter() - t0
            self.pull_s += dt
            self.rows_s += dt
        return pull_rows

    def _lookup(self, i: int, e: Sparse, table: PSTable) -> Any:
        """What a PSEmbedding reads its batch's distinct, sorted ids with: their rows, read through
        the cache (a read-ahead's rows served from there), as a new tensor on the model's device."""
        cache = self.device_caches.get(i)
        if cache is not None:
            return self._cached_lookup(e, table, cache)

        def lookup(rows: torch.Tensor) -> torch.Tensor:
            t0 = time.perf_counter()
            self._raise_failed()
            rows = self._check_rows(e, rows.detach().cpu())
            values = torch.from_numpy(table.get_rows(rows.numpy()))
            if self.device.type != "cpu":
                values = values.to(self.device, non_blocking=True)
            self.rows_pulled += rows.numel()
            dt = time.perf_counter() - t0
            self.pull_s += dt
            self.rows_s += dt
            return values
        return lookup

    def _cached_lookup(self, e: Sparse, table: PSTable, cache: DeviceRowCache) -> Any:
        """``_lookup`` through a device cache: the rows it holds fresh enough for this tick from
        there, the others read through the client in one ``get_rows`` with the clock each value is
        valid for (``Table.get_rows_clocked``)."""
        fetch = fetch_through(table, lambda: self._need(table))

        def lookup(rows: torch.Tensor) -> torch.Tensor:
            t0 = time.perf_counter()
            self._raise_failed()
            rows = rows.detach()
            if rows.numel() and (int(rows[0]) < 0 or int(rows[-1]) >= e.rows):
                self._check_rows(e, rows[[0, -1]].cpu())  # raises, naming them
            misses = cache.misses
            values = cache.read(rows, self._need(table), fetch)
            self.rows_pulled += cache.misses - misses
            dt = time.perf_counter() - t0
            self.pull_s += dt
            self.rows_s += dt
            return values
        return lookup

    # -- the optimizers' side ----------------------------------------------------------------------

    def gradients(self, out: torch.Tensor) -> bool:
        """The dense parameters' gradients into ``out`` (flat, on the host; zeros where a parameter has
        none); whether any had one."""
        have = False
        for s, p in zip(self.layout.slots, self.params, strict=True):
            g = p.grad
            seg = out[s.offset:s.offset + s.numel]
            if g is None:
                seg.zero_()
                continue
            if g.is_sparse:
                raise UsageError(f"parameter {s.name} has a sparse gradient, but it lives in the dense table "
                                 f"{self.layout.table!r}: build its nn.Embedding with sparse=False")
            seg.copy_(g.reshape(-1))
            have = True
        return have

    def sparse_gradients(self) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """Per sparse embedding with a gradient: (its index, touched rows, their gradient rows)."""
        out = []
        for i, e in enumerate(self.layout.sparse):
            if i in self.remote:
                got = self.remote[i].gradient()
                if got is not None:
                    out.append((i, got[0].cpu(), got[1].cpu()))
                continue
            g = self.local[i].grad
            if g is None:
                continue
            if not g.is_sparse:
                raise UsageError(f"sparse and dense gradients mixed on table {e.table}: {e.param} got a dense "
                                 "gradient (is its weight also used outside the embedding?)")
            g = g.coalesce()
            out.append((i, g.indices()[0].cpu(), g.values().cpu()))
        return out

    def values(self) -> np.ndarray:
        """A host copy of the current dense parameters, flat."""
        return self.flat.detach().cpu().numpy().copy()

    def push(self, block: np.ndarray | None, rows: Sequence[tuple[int, torch.Tensor, torch.Tensor]] = (), *,
             changed: bool = False) -> None:
        """Send one update: ``block`` for every dense row, ``rows`` (index, rows, values) for sparse
        embeddings (gradients or deltas, as the tables' procedure takes); end the clock tick every
        ``clock_every`` steps. ``changed`` (an ``add`` table, in place of ``block``): send how the
        dense parameters changed since the pull, in one compiled pass (the view's push: no copies
        before and after, no subtraction)."""
        t0 = time.perf_counter()
        self._settle()
        self.settle_s += time.perf_counter() - t0
        if block is not None and self._pushed is not None:
            raise UsageError("push(block): this module pushes its dense gradients per bucket (overlap=True)")
        if changed and self._dense is not None:
            if not self.pulled:
                raise UsageError("push(changed=True) needs a pull since the last push: the change is "
                                 "measured against the values pulled")
            with torch.no_grad():
                torch.from_numpy(self._dense.values).view(-1).copy_(self.flat)
            self._dense.push()
        elif block is not None and self.table is not None:
            self.table.inc_rows(self._rows, block.reshape(self.layout.rows, self.layout.row_width))
        for i, r, v in self._with_probes(rows):
            self.sparse_tables[i].inc_rows(r.numpy(), v.numpy())
            self.rows_pushed += r.numel()
            cache = self.device_caches.get(i)
            if cache is not None and getattr(self.sparse_tables[i], "read_my_writes", False):
                cache.add(r, v)  # read-my-writes: the device copies show the push as the client's cache does
        for emb in self.remote.values():
            emb.clear()  # this step's rows are pushed: the next forward reads them again
        self.pulled = False
        self.steps += 1
        if self.clock_every and self.steps % self.clock_every == 0:
            self.client.clock()
        self.push_s += time.perf_counter() - t0
        if self.prefetch and self.table is not None:
            # a read started before this push may miss it (read-my-writes): read again
            self._next = self._pool.submit(self._fetch)

    def _with_probes(self, rows: Sequence[tuple[int, torch.Tensor, torch.Tensor]]
                     ) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """Backup tables: each embedding's gradient rows with its probe rows (zeros where the batch did
        not touch them), so every server of the table gets a gradient from this worker, even one
        holding none of the rows touched (else it could not tell that gradient from a catch-up clock's
        none, and would wait for it)."""
        if not self._probes:
            return list(rows)
        out, seen = [], set()
        for i, r, v in rows:
            seen.add(i)
            probes = self._probes.get(i)
            if probes is not None:
                extra = torch.from_numpy(np.setdiff1d(probes, r.numpy(), assume_unique=True))
                if extra.numel():
                    r = torch.cat([r, extra])
                    v = torch.cat([v, v.new_zeros((extra.numel(), v.shape[1]))])
            out.append((i, r, v))
        for i, probes in self._probes.items():
            if i not in seen:
                e = self.layout.sparse[i]
                dtype = getattr(torch, self.layout.dtype)
                out.append((i, torch.from_numpy(probes), torch.zeros((probes.shape[0], e.cols), dtype=dtype)))
        return out

    # -- overlap: dense gradients pushed per bucket from the backward pass ---------------------------

    def _push_hook(self, k: int) -> Any:
        o, n = self.layout.slots[k].offset, self.layout.slots[k].numel

        def ready(p: torch.Tensor) -> None:
            if p.grad is None or p.grad.is_sparse:
                return  # gradients() names a sparse gradient of a dense parameter
            t0 = time.perf_counter()
            self._zero_grads()
            self._grads[o:o + n].copy_(p.grad.reshape(-1))  # from the GPU: waits for this gradient only
            assert self._pushed is not None
            self._pushed.ready(k)
            self.push_s += time.perf_counter() - t0
        return ready

    def _zero_grads(self) -> None:
        if not self._grads_zeroed:  # a parameter without a gradient this step pushes zeros
            self._grads.zero_()
            self._grads_zeroed = True
            t0 = time.perf_counter()
            self._settle()  # no push overlaps a read in flight (the first bucket of a step waits)
            self.settle_s += time.perf_counter() - t0

    def _push_bucket(self, b: int, lo: int, hi: int) -> None:
        assert self.table is not None
        w = self.layout.row_width
        rows = self._rows[lo // w:hi // w]
        self.table.inc_rows(rows, self._grads[lo:hi].numpy().reshape(-1, w))
        if self.send_buckets:
            self.table.send_rows(rows)  # its bytes leave during the rest of the backward

    def push_rest(self) -> bool:
        """Overlap mode: push the dense buckets the backward hooks have not (parameters without a
        gradient: zeros); whether any dense parameter had a gradient this step."""
        assert self._pushed is not None
        t0 = time.perf_counter()
        had = any(self._pushed.seen)
        self._zero_grads()
        self._pushed.flush()
        self._grads_zeroed = False
        self.push_s += time.perf_counter() - t0
        return had

    def sync(self) -> None:
        """Hybrid mode, before the optimizer's step: the dense gradients averaged over the workers; the
        embeddings' gradients divided by the workers, since the servers add every worker's push: a step
        then follows the mean gradient of the global batch, as DDP's does."""
        if self.allreduce is None or self.allreduce.group is None:
            return
        self.allreduce.wait()
        scale = 1.0 / self.allreduce.world
        for w in self.local.values():
            if w.grad is not None:
                w.grad.mul_(scale)
        for emb in self.remote.values():
            emb.scale_grad(scale)

    def split(self) -> dict[str, float]:
        """Where this module's time went so far, in seconds: waiting for dense and embedding reads
        (``pull_s``), sending updates (``push_s``, per-bucket pushes included; ``settle_s`` of it waited
        for reads in flight), and in hybrid mode waiting for all-reduces after the backward."""
        return {"pull_s": self.pull_s, "push_s": self.push_s, "settle_s": self.settle_s,
                "allreduce_s": self.allreduce.allreduce_s if self.allreduce is not None else 0.0,
                "steps": float(self.steps)}

    def clock(self) -> None:
        """End the clock tick now (a module built with ``clock_every=0``). The reads in flight are
        waited for first (no clock overlaps a read), and the dense read ahead is started again after
        the tick, so the next step's values meet the new tick's staleness bound."""
        if self.clock_every:
            raise UsageError(f"clock(): this module ends a tick every {self.clock_every} steps itself "
                             "(build it with clock_every=0 to end them from the training loop)")
        t0 = time.perf_counter()
        self._settle()
        self.client.clock()
        self.push_s += time.perf_counter() - t0
        if self.prefetch and self.table is not None:
            self._next = self._pool.submit(self._fetch)

    def resume(self) -> int:
        """Checkpoints save this module's step count (the client's checkpoint hook); in a job resumed
        from one, the count comes back and is returned: the steps the training loop has done (0 in a
        job that did not resume). The parameters come back from the tables. A local torch optimizer's
        own state (momentum buffers) is not saved: it starts again empty."""

        def state() -> dict[str, np.ndarray]:
            return {"steps": np.array([self.steps]), **self.dense_state()}
        self.client.checkpoint_state(state)
        saved = self.client.restored_state()
        if saved is not None:
            if "steps" not in saved:
                raise UsageError(f"the checkpoint this job resumes from holds no step count (it holds: "
                                 f"{', '.join(sorted(saved)) or 'nothing'})")
            self.steps = int(saved["steps"][0])
            self.load_dense_state(saved)
        return self.steps

    def dense_state(self) -> dict[str, np.ndarray]:
        """What of this module a worker's checkpoint must hold besides the tables: in hybrid mode the
        dense values (no table holds them: every rank saves its identical copy), else nothing. A loop
        that registers its own checkpoint state (micro-tasks) adds these arrays to it."""
        return {"dense": self.values()} if self.allreduce is not None else {}

    def load_dense_state(self, saved: Mapping[str, np.ndarray]) -> None:
        """Put back what :meth:`dense_state` saved (nothing outside hybrid mode)."""
        if self.allreduce is None:
            return
        if "dense" not in saved or saved["dense"].size != self.flat.numel():
            raise UsageError("the checkpoint this job resumes from holds no dense parameters of this "
                             "model (was it saved with dense='ps', or by another model?)")
        with torch.no_grad():
            self.flat.copy_(torch.from_numpy(saved["dense"]))

    def close(self) -> None:
        """Stop the background reader (a read in flight finishes first)."""
        self._settle()
        self._pool.shutdown(wait=True)

    # -- checks ------------------------------------------------------------------------------------

    def _check_tables(self) -> None:
        lay = self.layout
        source = self.client.config.source
        cfg = self.config_entry
        init = getattr(cfg, "init", None)
        saved = layout_file(init.file, lay.table) if init is not None and init.kind == "file" else None
        if saved is not None and saved.is_file():
            diff = lay.differences(json.loads(saved.read_text()))
            if diff:
                raise ConfigError(f"{source}: the model's parameters changed since its tables were made ({saved}): "
                                  + "; ".join(diff[:3]) + ("; ..." if len(diff) > 3 else ""))
        for t, (rows, cols, what) in zip([self.table, *self.sparse_tables],
                                         [(lay.rows, lay.row_width, f"model's {lay.numel:,} dense parameters"),
                                          *((e.rows, e.cols, f"model's embedding {e.param}") for e in lay.sparse)],
                                         strict=True):
            if t is None:
                continue
            if np.dtype(t.dtype) != np.dtype(lay.dtype):
                raise ConfigError(f"{source}: table {t.name} is {t.dtype}; the model's parameters are {lay.dtype}")
            if t.cols != cols:
                raise ConfigError(f"{source}: table {t.name} has {t.cols} cols; the {what} need rows of "
                                  f"{cols} values")
            if t.rows < rows:
                raise ConfigError(f"{source}: table {t.name} is too small: {t.rows} rows x {t.cols} hold "
                                  f"{t.rows * t.cols:,} values; the {what} need {rows} rows")
            if t.rows > rows:
                raise ConfigError(f"{source}: table {t.name} has {t.rows} rows; the {what} fill {rows}: "
                                  "was it made for another model?")
        ups = {t.update for t in [self.table, *self.sparse_tables] if t is not None}
        if len(ups) > 1:
            raise ConfigError(f"{source}: the model's tables apply different procedures ({', '.join(sorted(ups))}); "
                              "one optimizer steps them all")

    def _backup_config(self, dense: str) -> Any:
        """The ``backup`` entry of the model's tables (docs/design.md, "Backup workers"), the same on
        every one of them, or None; a ConfigError where some tables have it and others do not."""
        lookup = getattr(self.client.config, "table", None)
        if not callable(lookup):
            return None
        names = ([self.layout.table] if self.table is not None else []) + [t.name for t in self.sparse_tables]
        found = {n: getattr(lookup(n), "backup", None) for n in names}
        have = {n for n, b in found.items() if b is not None}
        if not have:
            return None
        source = self.client.config.source
        if have != set(names) or len({found[n] for n in names}) > 1:
            raise ConfigError(f"{source}: a synchronous model needs the same backup entry on every table of it; "
                              + "; ".join(f"{n}: {found[n]}" for n in names)
                              + " (declare(..., backup=...) gives it to all)")
        if dense != "ps":
            raise ConfigError(f"{source}: backup tables with dense='allreduce': hybrid mode steps the dense part "
                              "by all-reduce, not on a synchronous table; use dense='ps'")
        return found[names[0]]

    def _device(self, want: str | torch.device | None) -> torch.device:
        devices = sorted({str(p.device) for p in self.module.parameters() if p.requires_grad})
        if len(devices) > 1:
            raise ConfigError(f"model on unexpected devices: parameters on {', '.join(devices)}; "
                              "move the whole model to one device first")
        have = torch.device(devices[0])
        w = torch.device(want) if want is not None else None
        if w is not None and (w.type != have.type or (w.index is not None and w.index != have.index)):
            raise ConfigError(f"model on unexpected device: its parameters are on {have}, expected {want}; "
                              f"call model.to({str(want)!r}) before PSModule")
        return have

    @property
    def config_entry(self) -> Any:
        """The config entry of the model's first table (all its tables share procedure and step size),
        where the client exposes its config's tables (the real client does); else None."""
        lay = self.layout
        table = getattr(self.client.config, "table", None)
        if not callable(table):
            return None
        if self.table is not None:
            return table(lay.table)
        return table(lay.sparse[0].table) if lay.sparse else None

    @property
    def update(self) -> str | None:
        """The stored procedure every table of the model applies (None: hybrid mode without embeddings)."""
        t = self.table or (self.sparse_tables[0] if self.sparse_tables else None)
        return t.update if t is not None else None

