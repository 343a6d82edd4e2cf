"""The wire format: a msgpack header frame followed by raw numpy buffers.

Both sides build and check messages here, so there is exactly one definition of what a valid message
is. Headers are small maps with short keys; arrays travel as separate frames with no copy on the
sending side and ``np.frombuffer`` on the receiving side. Nothing here can execute data: msgpack only
yields plain values, and every field is checked (type, range, frame count, byte length) before use.

Row ids of READ, ROWS and INC travel as int32 where every id of the message fits, else as int64
(``wire_ids``); a receiver tells the two apart by the frame's length (``ids``).

Keys: ``t`` type, ``s`` sender sequence number, ``tb`` table index, ``c`` clock, ``n`` row count,
``dt`` dtype name, ``sp`` sparse flag, ``a`` last update sequence the server has applied for the
receiving client, ``rq`` request sequence a reply answers, ``ps`` budgeted-push sequence (acknowledged by the client),
``m`` text, ``rank``, ``fp`` fingerprint, ``tf`` per-table capability flags in WELCOME (TF_*),
``v`` versioned flag (ROWS: a frame of row versions follows the values; INC: frames of version tags,
end-of-version marks and released row versions follow the updates), ``nr`` released row count,
``ph`` BYE's prepare phase (the server stops pushing to the sender and answers; the final BYE follows),
``rd`` HELLO of a joined client's read connection (a worker thread's own socket: READ in, ROWS out),
``rp`` HELLO of a replacement for a lost worker: the clock of the checkpoint it restarts from (the rank's
clock on the servers stays where the lost worker left it until the replacement passes it),
``jn`` HELLO of a worker that joins a running job as a new rank (the next one: ranks are never reused) at
that clock, a boundary no worker has passed yet (``bosen scale``; the servers grow their per-client state),
``ss`` ROWS's number among every ROWS the server sent that client, on any of its connections (a
client keeps each row's newest), ``na`` INC's "no ACK": the server acknowledges it only through the
ACK (or SCLOCK) of a later message, whose ``rq`` (``a``) covers every earlier one; ``rs`` CLOCK's
read set (``pack_read_set``); ``fr`` ROWS's freshness flag (metrics.freshness_every on: a last
frame gives, per row, how many updates of other clients its value includes; ``others_frame``),
``ms``/``mx`` PROBE_REPLY's sum and largest of the updates the probed values miss, ``w`` INC's
weights flag (freshness probes on: a last int32 frame gives, per row, the inc operations coalesced
in its update; ``UpdateBatch.weights``), ``ft`` ROWS's send time (server ``time.time()``, with ``fr``),
``u`` FLUSH's parts: one ``[table, n, dtype, sparse, weights]`` entry per table update it carries, their
frames in that order (as INC's), then the read set's frames (``rs``); FLUSH is the end-of-tick flush's
one message to a server: the updates of every table and, with ``c`` (and ``ck``, ``rs``), its clock.

Partition moves (docs/design.md, "Partitions"): ``mv`` the partition map's version a PLAN, PAUSED, MAP
or MOVE is about (an ERROR with ``mv``: the rows asked for have moved, ask again under the new map);
``op`` MOVE's step (plan, wait, export, map, abort, retire); ``x`` PLAN's cancel flag; ``ar`` the
arrays a MOVE, MOVE_REPLY or MAP carries: one ``[name, dtype, shape]`` entry per array frame, in order.
Servers joining and leaving: ``sv`` the job's servers' addresses after a MOVE plan or map (in PLAN:
clients connect to new ones) and in WELCOME (the servers the job has now, when not its config's);
``jc`` HELLO of a running client to a server added to the job: the client's clock so far.
Recovery: ``cs`` HELLO of a client rejoining a lost server's replacement: the last clock it sent
there; ``r`` LEFT's worker ranks (from whoever runs the job: they left it; answered by ACK).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack
import numpy as np
import zmq

from bosen.errors import ProtocolError

ROW_DTYPE = np.dtype(np.int64)
ID32_DTYPE = np.dtype(np.int32)  # row ids on the wire where every id of the message fits (``wire_ids``)
_ID32_MIN, _ID32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)
COL_DTYPE = np.dtype(np.int32)
PTR_DTYPE = np.dtype(np.int64)
# bfloat16 travels as the top 16 bits of a float32 (numpy has no bfloat16; uint16 is no other value type)
BFLOAT16 = np.dtype("<u2")
VALUE_DTYPES = {name: np.dtype(name) for name in ("float16", "float32", "float64", "int32", "int64")}
VALUE_DTYPES["bfloat16"] = BFLOAT16
DTYPE_NAMES = {dt: name for name, dt in VALUE_DTYPES.items()}  # numpy computes ``dtype.name`` anew each call
NARROW = (np.dtype(np.float16), BFLOAT16)  # update formats narrower than a float table, rounding kept as residual


def to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as their 16-bit patterns."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def from_bfloat16(b: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns back to float32 (exact)."""
    return (b.astype(np.uint32) << 16).view(np.float32)
MAX_HEADER_BYTES = 4096
MAX_HEADER_ARRAY = 1024  # longest list in a header (WELCOME's per-table flags)
VERSION_DTYPE = np.dtype(np.int64)
EOV_DTYPE = np.dtype(np.uint8)

# WELCOME "tf": one int per table, the server's word on what the table allows
TF_READ_MY_WRITES = 1  # clients may show their own updates in their cache
TF_VERSIONED = 2  # rows carry versions; updates must be tagged with the version they were computed from


class Msg(IntEnum):
    # client -> server
    HELLO = 1
    INC = 2
    READ = 3
    CLOCK = 4
    BYE = 5
    STATUS = 6
    PUSH_ACK = 7
    PROBE = 8  # freshness probe: rows read and the others' update count of the values read
    FLUSH = 9  # several tables' updates (INC parts) and optionally the sender's clock, in one message
    PAUSED = 10  # a partition move's plan: this client sends nothing more until the new map
    MOVE = 11  # a step of moving partitions, from whoever moves them (``bosen.jobs.moves``)
    LEFT = 12  # from whoever runs the job: worker ranks that left it (answered by ACK)
    SAVE = 13  # from whoever runs the job: save a checkpoint part at boundary c (ACK "ok": false if past it)
    # server -> client
    WELCOME = 20
    ROWS = 21
    SCLOCK = 22
    ACK = 23
    ERROR = 24
    BYE_OK = 25
    STATUS_REPLY = 26
    PING = 27  # liveness probe: a client that is gone makes the send fail (nothing is answered)
    PROBE_REPLY = 28
    PLAN = 29  # partitions will move: pause sends after the first clock >= c (or at once)
    MAP = 30  # the new partition map (each server sends it after its last message under the old one)
    MOVE_REPLY = 31
    LAPSED = 32  # rows whose subscription lapsed (tables.X.lapse): no more pushes; "ss" orders it as ROWS


_MSG = {int(m): m for m in Msg}

# Required header fields per type (beyond "t"), with their Python types. Optional fields are
# validated where they are read.
_INT = int
_SCHEMA: dict[Msg, dict[str, type]] = {
    Msg.HELLO: {"s": _INT, "rank": _INT, "fp": str},
    Msg.INC: {"s": _INT, "tb": _INT, "n": _INT, "dt": str, "sp": bool},
    Msg.READ: {"s": _INT, "tb": _INT, "n": _INT, "c": _INT},
    Msg.CLOCK: {"s": _INT, "c": _INT},
    Msg.BYE: {"s": _INT},
    Msg.STATUS: {"s": _INT},
    Msg.PUSH_ACK: {"s": _INT, "ps": _INT},
    Msg.PROBE: {"s": _INT, "tb": _INT, "n": _INT},
    Msg.FLUSH: {"s": _INT, "u": list},
    Msg.WELCOME: {"rq": _INT, "rank": _INT, "c": _INT},
    Msg.ROWS: {"tb": _INT, "n": _INT, "c": _INT, "a": _INT, "rq": _INT, "dt": str, "ss": _INT},
    Msg.SCLOCK: {"c": _INT, "a": _INT},
    Msg.ACK: {"rq": _INT},
    Msg.ERROR: {"rq": _INT, "m": str},
    Msg.BYE_OK: {"rq": _INT},
    Msg.STATUS_REPLY: {"rq": _INT},
    Msg.PING: {},
    Msg.PROBE_REPLY: {"rq": _INT, "n": _INT, "ms": _INT, "mx": _INT},
    Msg.PAUSED: {"s": _INT, "mv": _INT},
    Msg.MOVE: {"s": _INT, "op": str, "mv": _INT, "ar": list},
    Msg.LEFT: {"s": _INT, "r": list},
    Msg.SAVE: {"s": _INT, "c": _INT},
    Msg.PLAN: {"mv": _INT, "c": _INT},
    Msg.MAP: {"mv": _INT, "ar": list},
    Msg.MOVE_REPLY: {"rq": _INT, "ar": list},
    Msg.LAPSED: {"tb": _INT, "n": _INT, "ss": _INT},
}
# numeric dtypes an array of a MOVE, MOVE_REPLY or MAP may have (``decode_arrays``)
ARRAY_DTYPES = {np.dtype(x).str: np.dtype(x) for x in
                ("bool", "int8", "int16", "int32", "int64", "uint16", "float16", "float32", "float64")}
# Number of array frames after the header; INC depends on the sparse flag.
_FRAMES = {Msg.READ: 1, Msg.ROWS: 2, Msg.STATUS_REPLY: 1, Msg.PROBE: 2, Msg.LAPSED: 1}
COUNT_DTYPE = np.dtype(np.int64)  # update counts (ROWS "fr", PROBE)
WEIGHT_DTYPE = np.dtype(np.int32)  # inc operations per row of an update (INC "w")
MAX_STATUS_BYTES = 16 << 20


def encode_status(rq: int, stats: dict[str, Any]) -> list[Any]:
    """STATUS_REPLY: the stats travel as their own msgpack frame (they outgrow a header on long runs:
    per-row send-count histograms, per-client clocks)."""
    return [msgpack.packb({"t": Msg.STATUS_REPLY, "rq": rq}), msgpack.packb(stats, use_bin_type=True)]


def decode_status(frame: Any) -> dict[str, Any]:
    buf = frame.buffer if hasattr(frame, "buffer") else frame
    if len(buf) > MAX_STATUS_BYTES:
        raise ProtocolError(f"STATUS_REPLY: stats of {len(buf)} bytes exceed {MAX_STATUS_BYTES}")
    try:
        stats = msgpack.unpackb(buf, raw=False, strict_map_key=False, max_ext_len=0)
    except Exception as e:
        raise ProtocolError(f"STATUS_REPLY: stats are not valid msgpack ({type(e).__name__})") from None
    if not isinstance(stats, dict):
        raise ProtocolError("STATUS_REPLY: stats must be a map")
    return stats


def pack_header(header: dict[str, Any]) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def encode(header: dict[str, Any], *arrays: np.ndarray, owned: Any = None, frame: Any = None,
           lent: Sequence[tuple[np.ndarray, Any]] = ()) -> list[Any]:
    """Header frame plus one frame per array, each copied into a ZeroMQ-owned frame now, except
    ``owned`` (an array nobody will write again), which goes without a copy.

    Senders pass views of live memory (table rows, the cache), which must not be read after this
    returns, even if the socket queues the message for later: those are copied. The bulk of a large
    message is an array made for it (a block taken out of the update buffer, a copy of table rows),
    passed as ``owned``: pyzmq then releases it through its garbage-collector thread once sent (a
    wake-up per message), which costs less than copying a megabyte on the sending thread with the
    GIL held. Arrays below pyzmq's copy threshold (64 KiB) are copied either way. ``frame``: the
    ZeroMQ message ``owned`` lives in, sent as it is (``bosen.bufferpool``). ``lent``: more such
    (array, frame or None) pairs, for a message of several parts (FLUSH).
    """
    frames: list[Any] = [pack_header(header)]
    if lent:
        own = {id(x): f for x, f in lent}
        if owned is not None:
            own[id(owned)] = frame
        for a in arrays:
            f = own.get(id(a), False)
            data = np.ascontiguousarray(a).data
            frames.append(zmq.Frame(data, copy=True) if f is False else data if f is None else f)
        return frames
    for a in arrays:
        data = np.ascontiguousarray(a).data
        frames.append((data if frame is None else frame) if a is owned else zmq.Frame(data, copy=True))
    return frames


def decode_header(frame: Any) -> dict[str, Any]:
    """Parse and check one header frame; raises ProtocolError naming what is wrong."""
    buf = frame.buffer if hasattr(frame, "buffer") else frame
    if len(buf) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(buf)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        h = msgpack.unpackb(buf, raw=False, strict_map_key=True, max_str_len=MAX_HEADER_BYTES,
                            max_bin_len=0, max_array_len=MAX_HEADER_ARRAY, max_map_len=64, max_ext_len=0)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"header is not valid msgpack ({type(e).__name__})") from None
    if not isinstance(h, dict):
        raise ProtocolError(f"header must be a map, got {type(h).__name__}")
    # Exact type checks: msgpack yields plain int, str and bool, and ``type(v) is int`` turns away
    # True (Msg(True) and Msg(1.0) would both be HELLO) without a second isinstance per field.
    t = h.get("t")
    if type(t) is not int:
        raise ProtocolError(f"unknown message type {t!r} (must be an integer)")
    msg = _MSG.get(t)  # a dict lookup: calling the enum costs microseconds on every message
    if msg is None:
        raise ProtocolError(f"unknown message type {t!r}")
    h["t"] = msg
    for key, typ in _SCHEMA[msg].items():
        if type(h.get(key)) is not typ:
            raise ProtocolError(f"{msg.name}: field {key!r} must be {typ.__name__}, got {h.get(key)!r}")
    return h


def _flag(h: dict[str, Any], key: str) -> bool:
    """An optional bool field (absent: False); anything else present is a ProtocolError."""
    v = h.get(key, False)
    if not isinstance(v, bool):
        raise ProtocolError(f"{h['t'].name}: field {key!r} must be bool, got {v!r}")
    return v


def is_versioned(h: dict[str, Any]) -> bool:
    """The optional ``v`` flag of ROWS and INC."""
    return _flag(h, "v")


def is_reader(h: dict[str, Any]) -> bool:
    """HELLO's optional ``rd``: the connection is a joined client's read connection."""
    return _flag(h, "rd")


def carries_counts(h: dict[str, Any]) -> bool:
    """ROWS's optional ``fr``: a last frame of per-row update counts of other clients follows."""
    return _flag(h, "fr")


def carries_weights(h: dict[str, Any]) -> bool:
    """INC's optional ``w``: a last frame of per-row inc operation counts (``WEIGHT_DTYPE``) follows."""
    return _flag(h, "w")


def send_time(h: dict[str, Any]) -> float | None:
    """ROWS's optional ``ft``: when the server sent its values (seconds, ``time.time()``)."""
    t = h.get("ft")
    if t is None:
        return None
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        raise ProtocolError(f"ROWS: field 'ft' must be a number, got {t!r}")
    return float(t)


def others_frame(h: dict[str, Any], frames: Sequence[Any]) -> np.ndarray | None:
    """ROWS's per-row counts of other clients' updates its values include, if it carries them."""
    if not carries_counts(h):
        return None
    counts = array(frames[-1], COUNT_DTYPE, h["n"], "ROWS update counts")
    if h["n"] and counts.min() < 0:
        raise ProtocolError("ROWS: update counts must be >= 0")
    return counts


def wants_ack(h: dict[str, Any]) -> bool:
    """Whether an INC asks for its own ACK: unless it carries ``na`` (no ACK), which a client sets
    on the messages of a burst whose later message's ACK will cover them (ACKs are cumulative)."""
    return not _flag(h, "na")


def expected_frames(h: dict[str, Any]) -> int:
    if h["t"] == Msg.INC:
        return (4 if h["sp"] else 2) + (4 if is_versioned(h) else 0) + carries_weights(h)
    if h["t"] == Msg.ROWS:
        return 2 + is_versioned(h) + carries_counts(h)
    if h["t"] == Msg.CLOCK and "rs" in h:
        return len(_read_set_entries(h))
    if h["t"] == Msg.FLUSH:
        return sum(part_frames(p) for p in flush_parts(h)) + (len(_read_set_entries(h)) if "rs" in h else 0)
    if h["t"] in (Msg.MOVE, Msg.MOVE_REPLY, Msg.MAP):
        return len(h["ar"])
    if h["t"] == Msg.WELCOME:  # the partition map, once partitions moved (``mv``): owner per partition
        return 1 if "mv" in h else 0
    return _FRAMES.get(h["t"], 0)


def encode_arrays(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Any]:
    """A message carrying named arrays of any numeric dtype and shape (MOVE, MOVE_REPLY, MAP): each
    described in the header's ``ar`` and sent as its own frame."""
    ar, data = [], []
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        if a.dtype.str not in ARRAY_DTYPES:
            raise ValueError(f"array {name!r}: dtype {a.dtype} cannot travel")
        ar.append([name, a.dtype.str, list(a.shape)])
        data.append(a)
    return encode({**header, "ar": ar}, *data)


def decode_arrays(h: dict[str, Any], frames: Sequence[Any]) -> dict[str, np.ndarray]:
    """The named arrays of a message built by ``encode_arrays``, each checked (name, dtype, shape,
    byte length) and viewed without a copy."""
    what = h["t"].name
    out: dict[str, np.ndarray] = {}
    for i, entry in enumerate(h["ar"]):
        if (not isinstance(entry, list) or len(entry) != 3 or type(entry[0]) is not str
                or type(entry[1]) is not str or not isinstance(entry[2], list)
                or not all(type(d) is int and d >= 0 for d in entry[2])):
            raise ProtocolError(f"{what}: array entry {i} must be [name, dtype, shape], got {entry!r}")
        name, dt, shape = entry
        dtype = ARRAY_DTYPES.get(dt)
        if dtype is None:
            raise ProtocolError(f"{what}: array {name!r} has dtype {dt!r}, not one that may travel")
        count = int(np.prod(shape)) if shape else 1
        out[name] = array(frames[i], dtype, count, f"{what} array {name!r}").reshape(shape)
    return out


def check_frames(h: dict[str, Any], arrays: int) -> None:
    """``arrays`` array frames follow the header: as many as the header says, or a ProtocolError."""
    want = expected_frames(h)
    if arrays != want:
        raise ProtocolError(f"{h['t'].name}: expected {want} array frames, got {arrays}")


def array(frame: Any, dtype: np.dtype, count: int, what: str) -> np.ndarray:
    """View a frame as ``count`` items of ``dtype``; the byte length must match exactly."""
    buf = frame.buffer if hasattr(frame, "buffer") else frame
    nbytes = len(buf) if not isinstance(buf, memoryview) else buf.nbytes
    if nbytes != count * dtype.itemsize:
        raise ProtocolError(f"{what}: frame has {nbytes} bytes, expected {count} x {dtype.name}")
    return np.frombuffer(buf, dtype=dtype, count=count)


def wire_ids(rows: np.ndarray) -> np.ndarray:
    """Row ids as a message carries them: int32 where every id fits (half the bytes; an id is a ninth
    of a 16-float32 row's bytes on the wire), else as they are (int64, e.g. hashed 64-bit ids).
    ``ids`` tells the two apart by the frame's length."""
    if rows.shape[0] and rows.dtype == ROW_DTYPE and _ID32_MIN <= rows.min() and rows.max() <= _ID32_MAX:
        return rows.astype(ID32_DTYPE)
    return rows


def ids(frame: Any, count: int, what: str) -> np.ndarray:
    """``count`` row ids from a frame of int64 or int32 ids (``wire_ids``: 8 or 4 bytes each), as int64."""
    buf = frame.buffer if hasattr(frame, "buffer") else frame
    nbytes = len(buf) if not isinstance(buf, memoryview) else buf.nbytes
    if count and nbytes == count * ID32_DTYPE.itemsize:
        return np.frombuffer(buf, dtype=ID32_DTYPE, count=count).astype(ROW_DTYPE)
    return array(frame, ROW_DTYPE, count, what)


def _widen(values: np.ndarray) -> np.ndarray:
    """bfloat16 updates become float32 here, so that no procedure sees bit patterns."""
    return from_bfloat16(values) if values.dtype == BFLOAT16 else values


def value_dtype(name: str) -> np.dtype:
    try:
        return VALUE_DTYPES[name]
    except KeyError:
        raise ProtocolError(f"unknown dtype {name!r}") from None


@dataclass
class UpdateBatch:
    """Increments for some rows of one table: dense ``values[n, cols]`` or CSR (indptr, cols, values).

    Versioned tables (docs/design.md, "Versioning protocol") add ``tags`` (the row version each update
    was computed from), ``eov`` (the update is the sender's last one of that version: it releases the
    version) and ``rel_rows``/``rel_tags`` (row versions the sender releases without an update). Rows
    may repeat; entries apply in order.
    """

    rows: np.ndarray
    values: np.ndarray
    indptr: np.ndarray | None = None
    cols: np.ndarray | None = None
    tags: np.ndarray | None = None
    eov: np.ndarray | None = None
    rel_rows: np.ndarray | None = None
    rel_tags: np.ndarray | None = None
    weights: np.ndarray | None = None  # per row, the inc operations it coalesces (freshness probes on)

    @property
    def sparse(self) -> bool:
        return self.indptr is not None

    @property
    def versioned(self) -> bool:
        return self.tags is not None

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The message's array frames, in wire order."""
        indptr, cols, tags = self.indptr, self.cols, self.tags
        rows = wire_ids(self.rows)
        if indptr is None:
            base: tuple[np.ndarray, ...] = (rows, self.values)
        else:
            assert cols is not None  # CSR: indptr and cols come together
            base = (rows, indptr, cols, self.values)
        if tags is not None:
            eov, rel_rows, rel_tags = self.eov, self.rel_rows, self.rel_tags
            assert eov is not None and rel_rows is not None and rel_tags is not None  # versioned: all four together
            base = (*base, tags, eov, rel_rows, rel_tags)
        return base if self.weights is None else (*base, self.weights)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())


def decode_update(h: dict[str, Any], frames: Sequence[Any], ncols: int, dtype: np.dtype) -> UpdateBatch:
    """Arrays of an INC message, checked against the table's geometry (rows are range-checked later)."""
    n = h["n"]
    if n < 0:
        raise ProtocolError(f"INC: negative row count {n}")
    wire_dt = value_dtype(h["dt"])
    if wire_dt != dtype and not (wire_dt in NARROW and dtype.kind == "f"):
        raise ProtocolError(f"INC: dtype {h['dt']} does not match the table's {dtype.name}")
    rows = ids(frames[0], n, "INC rows")
    if not h["sp"]:
        batch = UpdateBatch(rows, _widen(array(frames[1], wire_dt, n * ncols, "INC values")).reshape(n, ncols))
        rest = frames[2:]
    else:
        indptr = array(frames[1], PTR_DTYPE, n + 1, "INC indptr")
        if indptr[0] != 0 or np.any(np.diff(indptr) < 0):
            raise ProtocolError("INC: indptr must start at 0 and never decrease")
        nnz = int(indptr[-1])
        cols = array(frames[2], COL_DTYPE, nnz, "INC cols")
        if nnz and (cols.min() < 0 or cols.max() >= ncols):
            raise ProtocolError(f"INC: column index out of range [0, {ncols})")
        batch = UpdateBatch(rows, _widen(array(frames[3], wire_dt, nnz, "INC values")), indptr, cols)
        rest = frames[4:]
    if is_versioned(h):
        nr = h.get("nr")
        if not isinstance(nr, int) or isinstance(nr, bool) or nr < 0:
            raise ProtocolError(f"INC: field 'nr' must be a count >= 0, got {nr!r}")
        batch.tags = array(rest[0], VERSION_DTYPE, n, "INC tags")
        eov = array(rest[1], EOV_DTYPE, n, "INC end-of-version marks")
        if n and eov.max() > 1:
            raise ProtocolError("INC: end-of-version marks must be 0 or 1")
        batch.eov = eov.view(np.bool_)
        batch.rel_rows = array(rest[2], ROW_DTYPE, nr, "INC released rows")
        batch.rel_tags = array(rest[3], VERSION_DTYPE, nr, "INC released versions")
        if (n and batch.tags.min() < 0) or (nr and batch.rel_tags.min() < 0):
            raise ProtocolError("INC: row versions must be >= 0")
    if carries_weights(h):
        weights = array(frames[-1], WEIGHT_DTYPE, n, "INC weights")
        if n and weights.min() < 0:
            raise ProtocolError("INC: weights must be >= 0")
        batch.weights = weights
    return batch


# -- FLUSH: the end-of-tick flush's updates of several tables (and the clock) in one message ----------
# "u" lists the parts: [table, n, dtype name, sparse, weights]; each part's frames are an INC's (rows,
# values; or rows, indptr, cols, values; then the weights frame if flagged). Versioned updates never
# travel in a FLUSH (they carry version frames; the client sends them at once, as INC).
MAX_FLUSH_PARTS = 256


def flush_part(header: dict[str, Any]) -> list[Any]:
    """The ``u`` entry of an INC ``header`` (``client/encode.inc_header``) carried in a FLUSH."""
    if header.get("v"):
        raise ValueError("versioned updates travel as INC, not in a FLUSH")
    return [header["tb"], header["n"], header["dt"], header["sp"], header.get("w", False)]


def flush_parts(h: dict[str, Any]) -> list[dict[str, Any]]:
    """FLUSH's parts as INC headers (for ``decode_update``); a ProtocolError names a malformed entry."""
    u = h["u"]
    if not 0 < len(u) <= MAX_FLUSH_PARTS:
        raise ProtocolError(f"FLUSH: field 'u' must list 1 to {MAX_FLUSH_PARTS} parts, got {len(u)}")
    parts = []
    for k, e in enumerate(u):
        if (type(e) is not list or len(e) != 5 or type(e[0]) is not int or type(e[1]) is not int
                or type(e[2]) is not str or type(e[3]) is not bool or type(e[4]) is not bool):
            raise ProtocolError(f"FLUSH: part {k} must be [table, count, dtype, sparse, weights], got {e!r}")
        parts.append({"t": Msg.INC, "tb": e[0], "n": e[1], "dt": e[2], "sp": e[3], "w": e[4]})
    return parts


def part_frames(p: dict[str, Any]) -> int:
    """Array frames of one FLUSH part."""
    return (4 if p["sp"] else 2) + p["w"]


# -- read sets (CLOCK's "rs") -------------------------------------------------------------------
# Under managed communication a client's CLOCK tells the server which of its rows the client read in
# the tick(s) just ended, so that budgeted pushes go to the subscribers that will read a row next.
# "rs" is a list of [table, n], one frame each: n >= 0 local row indices (int64), or n = -1 a bitmap
# over the server's local rows (np.packbits), whichever is smaller. A table not listed: nothing read.
_BITMAP = -1


def pack_read_set(reads: Sequence[tuple[int, np.ndarray, int]]) -> tuple[list[list[int]], list[np.ndarray]]:
    """``reads``: (table, sorted local indices read, the server's local row count) per table with reads;
    returns CLOCK's ``rs`` and its frames."""
    entries: list[list[int]] = []
    arrays: list[np.ndarray] = []
    for tb, local, nlocal in reads:
        if local.shape[0] * ROW_DTYPE.itemsize <= (nlocal + 7) // 8:
            entries.append([tb, int(local.shape[0])])
            arrays.append(local.astype(ROW_DTYPE, copy=False))
        else:
            mask = np.zeros(nlocal, dtype=bool)
            mask[local] = True
            entries.append([tb, _BITMAP])
            arrays.append(np.packbits(mask))
    return entries, arrays


def _read_set_entries(h: dict[str, Any]) -> list[tuple[int, int]]:
    rs = h["rs"]
    if type(rs) is not list or not all(type(e) is list and len(e) == 2 and all(type(x) is int for x in e)
                                       for e in rs):
        raise ProtocolError(f"{h['t'].name}: field 'rs' must be a list of [table, count] pairs, got {rs!r}")
    return [(e[0], e[1]) for e in rs]


def read_set(h: dict[str, Any], frames: Sequence[Any], local_rows: Sequence[int]) -> list[np.ndarray] | None:
    """CLOCK's (or FLUSH's) read set as the sorted local rows read per table (``local_rows``: the
    server's local row counts); None if the message carries none. ``frames``: the read set's own."""
    if "rs" not in h:
        return None
    what = h["t"].name
    reads: list[list[np.ndarray]] = [[] for _ in local_rows]
    for (tb, n), frame in zip(_read_set_entries(h), frames, strict=True):
        if not 0 <= tb < len(reads):
            raise ProtocolError(f"{what}: read set names table {tb}, which does not exist")
        nlocal = local_rows[tb]
        if n == _BITMAP:
            bits = array(frame, np.dtype(np.uint8), (nlocal + 7) // 8, f"{what} read set")
            reads[tb].append(np.flatnonzero(np.unpackbits(bits, count=nlocal)))
        elif n >= 0:
            local = array(frame, ROW_DTYPE, n, f"{what} read set")
            if n and (local.min() < 0 or local.max() >= nlocal):
                raise ProtocolError(f"{what}: read set row out of range [0, {nlocal}) for table {tb}")
            reads[tb].append(local)
        else:
            raise ProtocolError(f"{what}: read set count {n} for table {tb} (must be >= 0, or -1: a bitmap)")
    return [np.unique(np.concatenate(r)) if r else np.empty(0, dtype=np.int64) for r in reads]
