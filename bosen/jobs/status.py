"""Ask servers for their state (``bosen status``, readiness checks in bosen.jobs.cluster). Synchronous, no loop."""

from __future__ import annotations

from typing import Any

import zmq

from bosen import security as sec
from bosen import wire
from bosen.errors import BosenError
from bosen.security import Security
from bosen.wire import Msg


def query(address: str, timeout: float = 3.0, ctx: zmq.Context | None = None,
          security: Security | None = None) -> dict[str, Any]:
    """One STATUS round trip to the server at HOST:PORT (a CURVE client with ``security``, the job's
    client keys: ``Security.load(config, "client")``); raises BosenError when it does not answer, or
    ``security.Refused`` when its security handshake fails."""
    own = ctx is None
    ctx = ctx or zmq.Context()
    sock = sec.client_socket(ctx, zmq.DEALER, security)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sec.watch(sock)
    try:
        sock.connect(f"tcp://{address}")
        sock.send_multipart(wire.encode({"t": Msg.STATUS, "s": 1}))
        if not sec.poll(sock, monitor, address, int(timeout * 1000)):
            raise BosenError(f"server at {address}: no answer within {timeout:g}s")
        frames = sock.recv_multipart()
        h = wire.decode_header(frames[0])
        if h["t"] != Msg.STATUS_REPLY or len(frames) != 2:
            raise BosenError(f"server at {address}: unexpected reply {h['t'].name}")
        return wire.decode_status(frames[1])
    finally:
        sec.unwatch(sock, monitor)
        sock.close()
        if own:
            ctx.term()


def _ask(address: str, header: dict[str, Any], timeout: float, security: Security | None) -> dict[str, Any]:
    """One request from whoever runs the job to the server at HOST:PORT, answered by ACK (its header);
    BosenError if it does not answer or refuses."""
    ctx = zmq.Context()
    sock = sec.client_socket(ctx, zmq.DEALER, security)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sec.watch(sock)
    try:
        sock.connect(f"tcp://{address}")
        sock.send_multipart(wire.encode({**header, "s": 1}))
        if not sec.poll(sock, monitor, address, int(timeout * 1000)):
            raise BosenError(f"server at {address}: no answer within {timeout:g}s")
        h = wire.decode_header(sock.recv_multipart()[0])
        if h["t"] == Msg.ERROR:
            raise BosenError(f"server at {address} refused: {h['m']}")
        if h["t"] != Msg.ACK:
            raise BosenError(f"server at {address}: unexpected reply {h['t'].name}")
        return h
    finally:
        sec.unwatch(sock, monitor)
        sock.close()
        ctx.term()


def tell_left(address: str, ranks: list[int], timeout: float = 3.0, security: Security | None = None) -> None:
    """Tell the server at HOST:PORT that worker ``ranks`` left the job (LEFT, answered by ACK)."""
    _ask(address, {"t": Msg.LEFT, "r": ranks}, timeout, security)


def ask_save(address: str, clock: int, timeout: float = 3.0, security: Security | None = None) -> bool:
    """Ask the server at HOST:PORT for a checkpoint part at boundary ``clock`` whatever its rule (SAVE):
    True if it will save it (or did), False if it passed that clock without a part."""
    return _ask(address, {"t": Msg.SAVE, "c": clock}, timeout, security).get("ok") is True


def format_table(stats: list[dict[str, Any] | str]) -> str:
    """Human-readable lines for ``bosen status``."""
    lines = [f"{'rank':>4}  {'address':<22} {'clock':>6}  {'parts':>9}  {'rows':>9}  {'MB rows':>9}  {'MB in':>9}  "
             f"{'MB out':>9}  {'msgs in':>8}  {'errors':>6}  client clocks"]
    for s in stats:
        if isinstance(s, str):
            lines.append(s)
            continue
        # rows stored (a sparse table's touched rows) and their bytes with per-row metadata
        rows = sum(t["rows"] for t in s["tables"].values())
        mb = sum(t.get("bytes", 0) for t in s["tables"].values()) / 1e6
        parts = s.get("partitions", {})  # partitions held / of all, and the map's version
        held = f"{parts.get('owned', '?')}/{parts.get('count', '?')}v{parts.get('version', '?')}"
        lines.append(f"{s['rank']:>4}  {s['address']:<22} {s['clock']:>6}  {held:>9}  {rows:>9}  {mb:>9.3f}  "
                     f"{s['bytes_in'] / 1e6:>9.3f}  "
                     f"{s['bytes_out'] / 1e6:>9.3f}  {s['msgs_in']:>8}  {s['errors']:>6}  {s['client_clocks']}")
    return "\n".join(lines)


def _spans(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    out, start = [], None
    for i, t in enumerate(ids):
        if start is None:
            start = t
        if i + 1 == len(ids) or ids[i + 1] != t + 1:
            out.append(str(start) if start == t else f"{start}-{t}")
            start = None
    return ", ".join(out)


def format_tasks(by_worker: dict[int, list[int]], clock: int, plan: dict[str, Any] | None = None) -> str:
    """Lines for ``bosen status RUN_DIR``: the micro-tasks each worker held at checkpoint ``clock``,
    and a plan that moves them (``RUN_DIR/tasks/plan.json``: from its clock on, by its owners)."""
    lines = [f"micro-tasks at the checkpoint of clock {clock}: " +
             "; ".join(f"worker {r}: {_spans(ts)}" for r, ts in by_worker.items())]
    if plan is not None and isinstance(plan.get("owners"), list) and isinstance(plan.get("clock"), int):
        owners: dict[int, list[int]] = {}
        for t, r in enumerate(plan["owners"]):
            owners.setdefault(int(r), []).append(t)
        lines.append(f"micro-tasks from clock {plan['clock']} (tasks/plan.json): " +
                     "; ".join(f"worker {r}: {_spans(ts)}" for r, ts in sorted(owners.items())))
    return "\n".join(lines)
