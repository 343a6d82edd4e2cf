"""Job configuration: YAML in, validated frozen objects out.

The dataclasses below are the single source of truth for every knob and its default. The loader
walks them generically, so an unknown key, a wrong type or an impossible value is reported with the
dotted key and the file it came from, before any process starts work.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import json
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from bosen.errors import ConfigError


def check(cond: bool, msg: str) -> None:
    """Raise ValueError(msg) unless ``cond``: the one value check of every config dataclass and of
    the apps' ``app.args``. ``msg`` starts with the key (``"lr: must be > 0"``); from_dict() prefixes
    the section, load() the file."""
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class ClusterConfig:
    """Where the servers listen, how many worker processes make up the job, and how a server process
    asks the OS to schedule it (``server/sched.py``)."""

    servers: tuple[str, ...]
    workers: int = 1
    server_sched: Literal["batch", "normal"] = "batch"
    # rows are split into this many partitions, mapped to servers (bosen/partition.py); None: a few
    # hundred, a multiple of the servers (``partition.default_partitions``)
    partitions: int | None = None

    def __post_init__(self) -> None:
        check(len(self.servers) >= 1, "servers: at least one server address is required")
        for i, s in enumerate(self.servers):
            host, sep, port = s.rpartition(":")
            check(bool(sep) and bool(host) and port.isdigit() and int(port) < 65536,
                   f"servers[{i}]: {s!r} is not HOST:PORT")
        fixed = [s for s in self.servers if not s.endswith(":0")]  # port 0: the launcher picks one
        check(len(set(fixed)) == len(fixed), "servers: duplicate address")
        check(self.workers >= 1, "workers: must be >= 1")
        if self.partitions is not None:
            check(len(self.servers) <= self.partitions <= MAX_PARTITIONS,
                  f"partitions: must be between the number of servers ({len(self.servers)}) and {MAX_PARTITIONS}")
            # the map a job starts with must be modular (partition p on server p mod S, bosen/partition.py)
            check(self.partitions % len(self.servers) == 0,
                  f"partitions: {self.partitions} is not a multiple of the number of servers ({len(self.servers)})")

    @property
    def num_partitions(self) -> int:
        return self.partitions if self.partitions is not None else default_partitions(len(self.servers))


@dataclass(frozen=True)
class ConsistencyConfig:
    """Bounded staleness (SSP) defaults for all tables."""

    staleness: int = 2
    read_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        check(self.staleness >= 0, "staleness: must be >= 0 (0 = BSP)")
        check(self.read_timeout_s > 0, "read_timeout_s: must be > 0")


@dataclass(frozen=True)
class CommConfig:
    """Managed communication. A job without a ``comm:`` section runs plain bounded staleness ("BS")."""

    enabled: bool = True
    client_bandwidth_mbps: float = 200.0
    server_bandwidth_mbps: float = 200.0
    client_send_rows: int = 100
    server_push_rows: int = 100
    priority: Literal["random", "round_robin", "absolute", "relative"] = "relative"
    wire_dtype: Literal["float32", "float16", "bfloat16"] = "float32"  # updates of float tables (residual kept)
    # budgeted pushes go to the subscribers that read the row in their last tick (each CLOCK carries
    # the rows its client read), or to every subscriber; the clock-advance push goes to all either way
    push_to: Literal["readers", "subscribers"] = "subscribers"
    max_unacked: int = 200
    idle_ms: float = 2.0

    def __post_init__(self) -> None:
        check(self.client_bandwidth_mbps > 0, "client_bandwidth_mbps: must be > 0")
        check(self.server_bandwidth_mbps > 0, "server_bandwidth_mbps: must be > 0")
        check(self.client_send_rows >= 1, "client_send_rows: must be >= 1")
        check(self.server_push_rows >= 1, "server_push_rows: must be >= 1")
        check(self.max_unacked >= 1, "max_unacked: must be >= 1")
        check(self.idle_ms > 0, "idle_ms: must be > 0")


INIT_KINDS = ("constant", "normal", "uniform", "file")
# ``rows`` of a sparse table declared without it: any non-negative int64 id below it
UNBOUNDED = 2**63 - 1
DEFAULT_PARTITIONS = 256  # cluster.partitions when not set: rounded down to a multiple of the servers
MAX_PARTITIONS = 1 << 16


def default_partitions(num_servers: int) -> int:
    """``cluster.partitions`` when the config leaves it out: a few hundred, a multiple of the servers
    (so that the map a job starts with is modular, bosen/partition.py), at least one per server."""
    return max(num_servers, DEFAULT_PARTITIONS // num_servers * num_servers)


@dataclass(frozen=True)
class InitConfig:
    """How a table's rows start: exactly one of zeros / constant / normal (std) / uniform ([lo, hi]) /
    file (a ``.npy`` array of shape (rows, cols): values made elsewhere, e.g. a model's own
    initialization, which a seeded generator on the servers cannot reproduce)."""

    zeros: bool = False
    constant: float | None = None
    normal: float | None = None
    uniform: tuple[float, float] | None = None
    file: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        chosen = [k for k in INIT_KINDS if getattr(self, k) is not None]
        check(len(chosen) <= 1 and not (chosen and self.zeros),
               "init: choose one of zeros, constant, normal, uniform, file")
        if self.file is not None:
            check(self.file.endswith(".npy"), f"file: {self.file!r} must be a .npy file")
        if self.normal is not None:
            check(self.normal >= 0, "normal: the standard deviation must be >= 0")
        if self.uniform is not None:
            check(self.uniform[0] <= self.uniform[1], "uniform: needs [low, high] with low <= high")

    @property
    def kind(self) -> str:
        for k in INIT_KINDS:
            if getattr(self, k) is not None:
                return k
        return "zeros"


@dataclass(frozen=True)
class BackupConfig:
    """A synchronous table with backup workers (DBW, Xu et al. 2021; docs/design.md, "Backup workers"):
    its servers step at iteration t from the first ``k_t`` of the workers' gradients of w_t and drop
    the rest of that iteration. ``mode``: ``static`` (k_t = ``k``), ``dynamic`` (the paper's k_t, from
    gradient statistics and round-trip times, ``bosen/backup.py``) or ``blind`` (B-DBW: k_t maximizes
    k / T_k). Learning rate: ``lr`` is the step at k = n (the workers); ``static`` steps with
    ``lr * k / n`` (the proportional rule), ``dynamic`` and ``blind`` with ``lr`` whatever k_t is, as
    in the paper. ``window``: D, the iterations the gradient statistics are averaged over (the paper's
    D = 5 was too noisy with the servers' gradient-only estimate of L: bench/dbw);
    ``memory``: per iteration, the weight round-trip samples keep (older ones fade)."""

    mode: Literal["dynamic", "static", "blind"] = "dynamic"
    k: int | None = None  # static only: gradients per step
    lr: float = 0.1
    window: int = 20
    memory: float = 0.9

    def __post_init__(self) -> None:
        if self.mode == "static":
            check(self.k is not None, "k: mode static needs k, the gradients each step waits for")
        else:
            check(self.k is None, f"k: only mode static takes k (mode {self.mode} chooses k_t itself)")
        if self.k is not None:
            check(type(self.k) is int and self.k >= 1, f"k: must be an integer >= 1, got {self.k!r}")
        check(self.lr > 0, f"lr: must be > 0, got {self.lr!r}")
        check(type(self.window) is int and self.window >= 1, f"window: must be an integer >= 1, got {self.window!r}")
        check(0 < self.memory <= 1, f"memory: must be in (0, 1], got {self.memory!r}")


def follows_workers(cfg: BackupConfig, workers: int) -> bool:
    """Every worker's gradient is applied at every step (static k = the job's ``workers``): the
    synchronous SGD whose worker count can change (``bosen scale``), k following it."""
    return cfg.mode == "static" and cfg.k == workers


@dataclass(frozen=True)
class TableConfig:
    """One shared table: ``rows`` x ``cols`` values, partitioned by row.

    ``storage: dense`` (the default) keeps every row from the start; ``sparse`` keeps only the rows
    touched (``bosen.rowmap``), for tables far bigger than what is used: its ``rows`` is an upper
    bound on the ids, or absent (``UNBOUNDED``: any id in [0, 2**63 - 1))."""

    name: str
    rows: int
    cols: int
    dtype: Literal["float32", "float64", "int32", "int64"] = "float32"
    staleness: int | None = None  # None: consistency.staleness
    update: str = "add"  # stored procedure: built-in name or "package.module:Class"
    update_args: Mapping[str, Any] = field(default_factory=dict)
    init: InitConfig = field(default_factory=InitConfig)
    read_my_writes: bool | None = None  # None: the stored procedure decides (add: on)
    # how this table's updates travel (float tables; the rounding residual stays in the client's
    # buffer and goes out later, the servers keep full precision); None: comm.wire_dtype under managed
    # communication, else the table's own dtype
    wire_dtype: Literal["float32", "float16", "bfloat16"] | None = None
    storage: Literal["dense", "sparse"] = "dense"
    # the most rows of this table one client process caches: past it, the least recently used rows
    # that nothing refers to are evicted (client/slots.py); None: every row touched stays cached
    cache_rows: int | None = None
    # false: servers never push this table's rows; a reader pulls a row again once its cached value
    # is too old for the SSP rule (sparse embeddings read by many, each row rarely: no subscriptions)
    push: bool = True
    # a reader's subscription to a row lapses after this many of its clocks without a read of the row:
    # the servers stop pushing it there and the client forgets its cached value (a later read pulls it
    # again); 0: never (every row read once is pushed to its reader for the job's life)
    lapse: int = 0
    # a synchronous table whose servers step from the first k_t of the workers' gradients (DBW);
    # None: a plain SSP table
    backup: BackupConfig | None = None

    def __post_init__(self) -> None:
        if self.backup is not None:
            # synchronous and pulled: a reader waits for the iteration it needs, nothing is pushed
            check(self.staleness in (None, 0), f"staleness: a backup table is synchronous (0), got {self.staleness}")
            check(self.update == "add", f"update: a backup table's servers take raw gradients and step with "
                                        f"backup.lr themselves; leave update out (got {self.update!r})")
            check(self.read_my_writes is not True, "read_my_writes: a backup table's clients send gradients, "
                                                   "not their own writes")
            check(self.storage == "dense", "storage: a backup table must be dense")
            check(self.dtype.startswith("float"), f"dtype: a backup table needs a float dtype, got {self.dtype}")
            check(self.wire_dtype in (None, self.dtype), f"wire_dtype: a backup table's gradients travel unrounded "
                  f"(a rounding residual would go out with the next iteration's gradient), got {self.wire_dtype}")
            object.__setattr__(self, "push", False)
        check(self.rows >= 1, "rows: must be >= 1")
        check(self.rows <= UNBOUNDED, f"rows: must be <= 2**63 - 1 (int64 row ids), got {self.rows}")
        check(self.storage in ("dense", "sparse"), f"storage: expected dense or sparse, got {self.storage!r}")
        if self.storage == "sparse":
            check(self.init.kind != "file" or self.bounded,
                  "init.file: a sparse table without rows has no array of every row; use zeros, constant, normal "
                  "or uniform")
        if self.wire_dtype not in (None, "float32"):
            check(self.dtype.startswith("float"), f"wire_dtype: {self.wire_dtype} needs a float table, "
                                                  f"table is {self.dtype}")
        check(self.cols >= 1, "cols: must be >= 1")
        check(type(self.lapse) is int and self.lapse >= 0, f"lapse: clocks without a read, an integer >= 0 "
                                                            f"(0: never), got {self.lapse!r}")
        check(not (self.lapse and not self.push), "lapse: subscriptions lapse on a table whose rows are pushed; "
                                                  "with push: false nothing is subscribed")
        if self.cache_rows is not None:
            check(type(self.cache_rows) is int and self.cache_rows >= 1,
                  f"cache_rows: must be an integer >= 1, got {self.cache_rows!r}")
        if self.staleness is not None:
            check(self.staleness >= 0, "staleness: must be >= 0")
        if self.dtype.startswith("int") and self.init.kind in ("normal", "uniform"):
            raise ValueError(f"init: {self.init.kind} init needs a float dtype, table is {self.dtype}")

    @property
    def bounded(self) -> bool:
        """The table has a row count (dense, or sparse with ``rows`` given)."""
        return self.rows < UNBOUNDED

    @property
    def shows_own_writes(self) -> bool:
        """Read-my-writes: on by default only for plain addition, whose effect the client can mirror."""
        if self.backup is not None:
            return False
        return self.update == "add" if self.read_my_writes is None else self.read_my_writes


@dataclass(frozen=True)
class AppConfig:
    """The worker program ``bosen launch`` runs: ``python -m MODULE`` with ``args`` in its config.

    ``tables``: ``package.module:function`` that declares tables from the app's model,
    ``function(args, out_dir) -> {name: table settings}`` (``bosen.jobs.app_tables``); the launcher and
    ``bosen tables`` call it before any server starts, so nobody writes one YAML entry per tensor.
    """

    module: str = ""
    tables: str = ""
    args: Mapping[str, Any] = field(default_factory=dict)


_NO_COMM = CommConfig(enabled=False)


@dataclass(frozen=True)
class MetricsConfig:
    """Measurements that cost traffic, off by default. ``freshness_every``: each worker probes one
    read in N for content freshness, how many updates of other processes the servers had applied
    that the values it read do not include (docs/design.md, "Freshness probes"); 0 = off. Pushes
    and replies then carry per-row update counts, so servers and clients must agree (fingerprint).
    ``profile``: every thread (workers, the communication thread, each server's loop) times its
    phases, wall and CPU (``bosen.phases``), reported by ``Client.stats`` and server STATUS.
    ``port``: Prometheus ``/metrics`` over HTTP (``bosen.prometheus``, docs/metrics.md): the launcher
    serves the job on ``port``, server rank R on ``port + 1 + R``; 0 = off."""

    freshness_every: int = 0
    profile: bool = False
    port: int = 0

    def __post_init__(self) -> None:
        check(self.freshness_every >= 0, "freshness_every: must be >= 0 (0 = off)")
        check(0 <= self.port <= 65535, f"port: {self.port} is not a TCP port (1-65535; 0 = off)")


@dataclass(frozen=True)
class CheckpointConfig:
    """Consistent checkpoints (``bosen.checkpoint``). Clocks that are multiples of ``every_clocks``
    are checkpoint boundaries: clients cut their update stream there, and servers save their shards
    as of strictly after the clock before. By default every boundary is saved; with ``every_s`` only
    the first boundary after that many seconds since the last save, and with ``mttf_s`` after Young's
    interval √(2·Ts·Tf/N) (Ts: the measured time to save, Tf: a machine's mean time to failure,
    N: the job's processes)."""

    every_clocks: int = 10
    dir: str = "checkpoints"  # relative paths are relative to the run directory
    keep: int = 2  # newest complete checkpoints kept (a resume's: not stale by a take-back); older ones deleted
    every_s: float | None = None
    mttf_s: float | None = None
    # SCAR's priority checkpoints: each save writes this fraction r of every shard's rows, chosen by
    # ``policy`` against the server's in-memory running checkpoint (bosen/scar.py); over 1/r saves
    # that is the bytes of one full checkpoint
    priority_fraction: float = 1.0
    policy: Literal["priority", "round_robin", "random"] = "priority"

    def __post_init__(self) -> None:
        check(self.every_clocks >= 1, "every_clocks: must be >= 1")
        check(0.0 < self.priority_fraction <= 1.0, "priority_fraction: must be in (0, 1]")
        check(bool(self.dir), "dir: must not be empty")
        check(self.keep >= 1, "keep: must be >= 1")
        check(self.every_s is None or self.every_s > 0, "every_s: must be > 0")
        check(self.mttf_s is None or self.mttf_s > 0, "mttf_s: must be > 0")
        check(self.every_s is None or self.mttf_s is None, "every_s, mttf_s: choose at most one")

    def interval_s(self, save_s: float, processes: int) -> float:
        """Seconds to wait between saves: 0 (every boundary), ``every_s``, or Young's interval."""
        if self.mttf_s is not None:
            return math.sqrt(2.0 * save_s * self.mttf_s / max(processes, 1))
        return self.every_s or 0.0


@dataclass(frozen=True)
class RayConfig:
    """What ``bosen launch --ray`` asks Ray for (``bosen.jobs.ray``): one placement-group bundle per
    server and per worker process, with these CPUs, GPUs and custom resources (``server_resources``:
    e.g. ``{"ps": 1}`` keeps servers on nodes started with ``ray start --resources '{"ps": 8}'``), and
    how the bundles are spread over the nodes (Ray's placement strategies)."""

    server_cpus: float = 1.0
    worker_cpus: float = 1.0
    worker_gpus: float = 0.0
    server_resources: Mapping[str, float] = field(default_factory=dict)
    worker_resources: Mapping[str, float] = field(default_factory=dict)
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "SPREAD"

    def __post_init__(self) -> None:
        check(self.server_cpus >= 0, "server_cpus: must be >= 0")
        check(self.worker_cpus >= 0, "worker_cpus: must be >= 0")
        check(self.worker_gpus >= 0, "worker_gpus: must be >= 0")
        for key in ("server_resources", "worker_resources"):
            for name, amount in getattr(self, key).items():
                check(isinstance(name, str) and name not in ("CPU", "GPU", "memory"),
                      f"{key}.{name}: a custom resource name (CPUs and GPUs have their own keys)")
                check(not isinstance(amount, bool) and isinstance(amount, (int, float)) and amount > 0,
                      f"{key}.{name}: expected a number > 0, got {amount!r}")
        bundle = self.server_cpus + sum(self.server_resources.values())
        check(bundle > 0, "server_cpus: a server's bundle must ask for something (CPUs or a custom resource)")
        bundle = self.worker_cpus + self.worker_gpus + sum(self.worker_resources.values())
        check(bundle > 0, "worker_cpus: a worker's bundle must ask for something (CPUs, GPUs or a custom resource)")


@dataclass(frozen=True)
class SecurityConfig:
    """CURVE encryption and authentication of every connection (``bosen.security``). ``mode``: auto is
    on when any of ``cluster.servers`` is not a loopback address, on always, off never (a loopback-only
    job, or a network the user trusts). Key files are ZeroMQ certificates (``bosen keys DIR`` makes
    them): ``server_key`` the servers' public one (servers read the secret beside it,
    ``server_key + "_secret"``), ``client_key`` this client's secret one, ``allowed_clients`` the
    client public key files, or folders of ``*.key`` files, a server accepts. Relative paths are
    relative to the config file."""

    mode: Literal["auto", "on", "off"] = "auto"
    server_key: str = ""
    client_key: str = ""
    allowed_clients: tuple[str, ...] = ()


@dataclass(frozen=True)
class Config:
    cluster: ClusterConfig
    tables: tuple[TableConfig, ...]
    consistency: ConsistencyConfig = field(default_factory=ConsistencyConfig)
    comm: CommConfig = _NO_COMM
    app: AppConfig = field(default_factory=AppConfig)
    checkpoint: CheckpointConfig | None = None  # None: no checkpoints
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    ray: RayConfig = field(default_factory=RayConfig)  # used only by ``bosen launch --ray``
    security: SecurityConfig = field(default_factory=SecurityConfig)
    source: str = "<dict>"

    def __post_init__(self) -> None:
        for t in self.tables:
            if t.backup is not None and self.comm.enabled and t.wire_dtype is None:
                check(self.comm.wire_dtype == t.dtype,
                      f"tables.{t.name}.backup: the table's gradients must travel unrounded, and comm.wire_dtype "
                      f"sends {t.dtype} updates as {self.comm.wire_dtype} (a rounding residual would go out with the "
                      f"next iteration's gradient): under managed communication a backup table's dtype must be "
                      f"comm.wire_dtype")

    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"no table {name!r} in {self.source}; tables: {', '.join(t.name for t in self.tables)}")

    def staleness_of(self, t: TableConfig) -> int:
        if t.backup is not None:
            return 0  # synchronous: an iteration's value
        return self.consistency.staleness if t.staleness is None else t.staleness

    def to_dict(self) -> dict[str, Any]:
        """Plain data that load() turns back into an equal Config (used for run directories)."""
        d = _plain(self)
        d.pop("source")
        d["tables"] = {t.pop("name"): t for t in d["tables"]}
        if not self.comm.enabled:
            d["comm"] = {"enabled": False}
        if self.checkpoint is None:
            d.pop("checkpoint")
        if self.metrics == MetricsConfig():
            d.pop("metrics")
        if self.ray == RayConfig():
            d.pop("ray")
        if self.security == SecurityConfig():
            d.pop("security")
        return d

    def require_tables(self) -> None:
        """Servers and clients need the tables themselves: a config whose app declares them must first
        go through ``bosen tables`` (``bosen launch`` does that on its own)."""
        if not self.tables:
            raise ConfigError(f"{self.source}: no tables yet: app.tables ({self.app.tables}) declares them from the "
                              "model; start from the config that `bosen tables CONFIG --out DIR` writes")

    def fingerprint(self) -> str:
        """Hash of what server and client must agree on, checked when a client joins."""
        d = self.to_dict()
        core = {"servers": d["cluster"]["servers"], "workers": d["cluster"]["workers"], "tables": d["tables"]}
        if self.metrics.freshness_every:  # ROWS then carry update counts: both sides must expect them
            core["freshness"] = True
        return hashlib.sha1(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [_plain(x) for x in obj]
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


# ----------------------------------------------------------------------------------------------
# generic validation


_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return the frozen, typed value."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, key)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if len(errors) == 1 else f"{key}: {value!r} does not fit {_type_name(tp)}")
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{key}: {value!r} is not one of {', '.join(map(str, args))}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ValueError(f"{key}: expected a list of {len(args)} items, got {len(value)}")
        return tuple(_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin in (collections.abc.Mapping, dict) or tp is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        return types.MappingProxyType(dict(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-6 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{key}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported annotation {tp!r} for {key}")


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and missing required ones.

    ``where`` is the dotted prefix used in messages (e.g. ``app.args``). Raises ValueError; load()
    turns that into a ConfigError naming the file. Apps use this for their own ``app.args``.
    """
    prefix = f"{where}." if where else ""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{where or 'config'}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        known = ", ".join(sorted(k for k in fields if k != "name"))
        raise ValueError(f"{prefix}{unknown[0]}: unknown key (known: {known})")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], prefix + name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{prefix}{name}: required key is missing")
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ValueError(f"{prefix}{e}") from None


def _init_from(value: Any, key: str, base: Path | None) -> InitConfig:
    if value is None or value == "zeros":
        return InitConfig(zeros=True)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return InitConfig(constant=float(value))
    init = from_dict(InitConfig, value, key)
    if init.file is not None and base is not None and not Path(init.file).is_absolute():
        init = dataclasses.replace(init, file=str(base / init.file))  # relative to the config file
    return init


def _table_from(name: str, value: Any, base: Path | None = None) -> TableConfig:
    key = f"tables.{name}"
    if not isinstance(value, Mapping):
        raise ValueError(f"{key}: expected a mapping with rows and cols, got {value!r}")
    value = dict(value)
    if value.get("storage") == "sparse" and value.get("rows") is None:
        value["rows"] = UNBOUNDED  # 64-bit keys
    init = _init_from(value.pop("init", None), f"{key}.init", base)
    t = from_dict(TableConfig, {**value, "name": name}, key) if "name" not in value else None
    if t is None:
        raise ValueError(f"{key}.name: unknown key (the table's name is its key)")
    try:
        return dataclasses.replace(t, init=init)
    except ValueError as e:
        raise ValueError(f"{key}.{e}") from None


def _security_from(value: Any, base: Path | None) -> SecurityConfig:
    """The ``security`` section, its key paths made absolute (relative to the config file), so the
    copy in a run directory names the same files."""
    if isinstance(value, Mapping) and isinstance(value.get("allowed_clients"), str):
        value = {**value, "allowed_clients": [value["allowed_clients"]]}  # one file or folder
    sec = from_dict(SecurityConfig, value, "security")
    if base is None:
        return sec

    def absolute(p: str) -> str:
        return p if not p or Path(p).is_absolute() else str(base / p)

    return dataclasses.replace(sec, server_key=absolute(sec.server_key), client_key=absolute(sec.client_key),
                               allowed_clients=tuple(absolute(p) for p in sec.allowed_clients))


def set_dotted(data: dict, key: str, value: Any) -> None:
    """Apply one ``--set a.b.c=value`` override to raw config data."""
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {key}: {p} is not a section")
        node = nxt
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. comm.priority=random")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {text!r}: value is not valid YAML: {e}") from None
    return key, value


def build(data: Mapping[str, Any], source: str = "<dict>", overrides: Any = ()) -> Config:
    """Validate raw config data (already parsed YAML) into a Config."""
    data = json.loads(json.dumps(data)) if data is not None else {}  # deep copy, plain types
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    for item in overrides:
        key, value = parse_override(item) if isinstance(item, str) else item
        set_dotted(data, key, value)
    try:
        allowed = {"cluster", "consistency", "comm", "tables", "app", "checkpoint", "metrics", "ray", "security"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown key (known: {', '.join(sorted(allowed))})")
        if "cluster" not in data:
            raise ValueError("cluster: required section is missing")
        tables = data.get("tables") or {}
        declared = isinstance(data.get("app"), Mapping) and bool(data["app"].get("tables"))
        if not tables and not declared:
            raise ValueError("tables: at least one table is required (or app.tables: a function that declares "
                             "them from the model)")
        if not isinstance(tables, Mapping):
            raise ValueError("tables: expected a mapping of table name to its settings")
        comm = data.get("comm")
        base = Path(source).resolve().parent if Path(source).is_file() else None
        return Config(
            cluster=from_dict(ClusterConfig, data["cluster"], "cluster"),
            consistency=from_dict(ConsistencyConfig, data.get("consistency"), "consistency"),
            comm=_NO_COMM if comm is None else from_dict(CommConfig, comm, "comm"),
            tables=tuple(_table_from(str(n), v, base) for n, v in tables.items()),
            app=from_dict(AppConfig, data.get("app"), "app"),
            checkpoint=None if data.get("checkpoint") is None else from_dict(CheckpointConfig, data["checkpoint"],
                                                                             "checkpoint"),
            metrics=from_dict(MetricsConfig, data.get("metrics"), "metrics"),
            ray=from_dict(RayConfig, data.get("ray"), "ray"),
            security=_security_from(data.get("security"), base),
            source=source,
        )
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None


def load(path_or_data: str | os.PathLike[str] | Mapping[str, Any] | Config, overrides: Any = ()) -> Config:
    """Load a YAML file (or plain mapping) and apply ``key=value`` overrides."""
    if isinstance(path_or_data, Config):
        if overrides:
            return build(path_or_data.to_dict(), path_or_data.source, overrides)
        return path_or_data
    if isinstance(path_or_data, Mapping):
        return build(path_or_data, "<dict>", overrides)
    path = Path(path_or_data)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    return build(data, str(path), overrides)


def dump(config: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
