"""Partial recovery: what a client resends to a lost server's replacement, and how it rejoins it.

With checkpoints on, every link keeps a ``ResendLog``: every INC and CLOCK sent to its server since
that server's newest durable checkpoint. When the server is lost, its replacement restarts from that
checkpoint (at clock C, ``--resume DIR --recover``); ``Recovery.run`` rejoins it, resends what the
log holds from C on, waits until it has applied that, and has the rows cached from it read anew.
Meanwhile nothing else goes to that server, and workers wait only where they need it. A replacement
that does not come, or comes without the checkpoint this process kept its updates for, fails the
client with the reason (docs/recovery.md).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bosen import wire
from bosen.client.lifecycle import Lifecycle
from bosen.client.link import LinkState, ServerLink
from bosen.client.state import TableState
from bosen.errors import BosenError, ServerError, ServerLost
from bosen.partition import Partition

log = logging.getLogger("bosen.client")
# A lost server's replacement must welcome us within RECOVERY_TIMEOUT_S, and apply what we resend
# within it too.
RECOVERY_TIMEOUT_S = 120.0


_UPDATES = (wire.Msg.INC, wire.Msg.FLUSH)  # messages that carry updates (acknowledged as such)


class ResendLog:
    """Every INC, FLUSH and CLOCK sent to one server since its newest durable checkpoint, as (the last
    clock sent before it, its header, its array frames). ``floor``: the clock from which the log
    is complete. ``marks``: where this client paused for a partition move (its PAUSED), by map
    version: a server saves a part as partitions move, and a replacement restored from it lacks what
    came after the mark."""

    def __init__(self) -> None:
        self.entries: deque[tuple[int, dict[str, Any], list[Any]]] = deque()
        self.floor = 0
        self.dropped = 0  # entries ever dropped from the front (marks count from the log's start)
        self.marks: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def record(self, clock_sent: int, header: dict[str, Any], payload: list[Any]) -> None:
        """A message just encoded; kept if a replacement would need it. The header itself is kept:
        a flush window adds the clock to its pass's last message after this."""
        if header["t"] in (wire.Msg.INC, wire.Msg.CLOCK, wire.Msg.FLUSH):
            self.entries.append((clock_sent, header, payload))

    def forget(self, durable: int) -> None:
        """The server's checkpoint at clock ``durable`` is on disk: what was sent before that clock
        went out is in it, and need not be kept for a replacement."""
        if durable <= self.floor:
            return
        while self.entries and self.entries[0][0] < durable:
            self.entries.popleft()
            self.dropped += 1
        self.floor = durable
        self.marks = {v: at for v, at in self.marks.items() if at >= self.dropped}

    def since(self, clock: int) -> list[tuple[int, dict[str, Any], list[Any]]]:
        """What a replacement restarted from its checkpoint at ``clock`` lacks (older entries are
        dropped for good)."""
        while self.entries and self.entries[0][0] < clock:
            self.entries.popleft()
            self.dropped += 1
        return list(self.entries)

    def mark(self, version: int) -> None:
        """This client's PAUSED for partition map ``version`` goes now, after every entry so far."""
        self.marks[version] = self.dropped + len(self.entries)

    def after_mark(self, version: int) -> list[tuple[int, dict[str, Any], list[Any]]] | None:
        """What a replacement restored from its part of the move to map ``version`` lacks: what was
        sent after the PAUSED of that move (None: no such mark kept; a process that started after the
        move sent everything after it, ``since``)."""
        at = self.marks.get(version)
        if at is None or at < self.dropped:
            return None
        return list(itertools.islice(self.entries, at - self.dropped, None))


def resend(link: ServerLink, since: int, moved: int | None = None) -> tuple[int, int, int]:
    """Send again, in order and renumbered, what ``link``'s log holds from clock ``since`` on, or
    where the replacement restored its part of the move to map ``moved``, what followed this client's
    PAUSED of that move (if it paused for it); the last update asks for an ACK. Returns the number of
    that update (0: none), and the messages and bytes resent (what the log keeps besides, before a
    move's mark, is not). Nothing sent before is counted in flight any more: the lost server will
    never acknowledge it."""
    assert isinstance(link.log, ResendLog)
    link.reset_inflight()
    after = link.log.after_mark(moved) if moved is not None else None
    entries = after if after is not None else link.log.since(since)
    final = max((k for k, e in enumerate(entries) if e[1]["t"] in _UPDATES), default=-1)
    last_inc = total = 0
    c = link.counters
    for k, (_, header, payload) in enumerate(entries):
        link.seq += 1
        header["s"] = link.seq
        if k == final:
            header.pop("na", None)
            last_inc = link.seq
        frames = [wire.pack_header(header), *payload]
        nbytes = sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)
        c["msgs_sent"] += 1
        c["bytes_sent"] += nbytes
        c["bytes_resent"] += nbytes
        total += nbytes
        if link.bucket is not None:
            link.bucket.charge(nbytes)
        link.transmit(frames)
        if header["t"] in _UPDATES:
            link.sent_update(nbytes)
    return last_inc, len(entries), total


class Recovery:
    """Rejoins lost servers' replacements for one client (on the communication thread). It reaches
    the connection through the callables the communication thread gives it: ``reconnect(link)``
    (a fresh socket), ``hello(link)`` (HELLO, answered by WELCOME), ``pump(link)`` (the flush goes
    on), ``notify()`` (wake blocked readers) and ``fail(err)``."""

    def __init__(self, tables: Sequence[TableState], life: Lifecycle,
                 reconnect: Callable[[ServerLink], None], hello: Callable[[ServerLink], Awaitable[dict[str, Any]]],
                 pump: Callable[[ServerLink], None], notify: Callable[[], None],
                 fail: Callable[[BosenError], None], partition: Callable[[], Partition]) -> None:
        """``partition()``: the partition map the client follows now."""
        self.tables = tables
        self._partition = partition
        self.life = life
        self._reconnect = reconnect
        self._hello = hello
        self._pump = pump
        self._notify = notify
        self._fail = fail

    def possible(self, link: ServerLink) -> bool:
        """Whether losing ``link``'s server can be recovered from: its log is kept (checkpoints on)
        and no table is versioned (row versions held by the lost server cannot be replayed)."""
        return link.log is not None and all(st.vlog is None for st in self.tables)

    async def run(self, link: ServerLink) -> None:
        """Rejoin ``link``'s replacement, resend, wait until applied, read its rows anew. Failures
        fail the client with the reason."""
        try:
            await self._run(link)
        except BosenError as e:
            self._fail(e)
        except Exception as e:
            log.exception("recovering %s failed", link)
            err = BosenError(f"recovering {link} failed: {e!r}")
            err.__cause__ = e
            self._fail(err)

    async def _run(self, link: ServerLink) -> None:
        assert isinstance(link.log, ResendLog)
        link.fail_requests(BosenError(f"{link} was lost; waiting for its replacement"))
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        # a new connection (what the old one queued was for the lost server); the HELLO waits in it
        # until a replacement listens at the address
        self._reconnect(link)
        try:
            h = await self._hello(link)
        except ServerError as e:
            raise ServerLost(f"{link} was lost and came back refusing this client: {e}") from None
        except BosenError:
            raise ServerLost(f"{link} was lost and no replacement answered within {RECOVERY_TIMEOUT_S:g}s") \
                from None
        since = h.get("rc")
        if not isinstance(since, int) or isinstance(since, bool):
            raise ServerLost(f"{link} was lost and came back without its checkpoint (start the replacement "
                             "with --resume DIR --recover): the updates it had are gone")
        version = self._partition().version
        if h.get("mv", 0) != version:
            raise ServerLost(f"{link} came back from a checkpoint saved under partition map {h.get('mv', 0)}, but "
                             f"the job follows map {version} (partitions moved since): resume the whole job from "
                             "its checkpoint")
        if since < link.log.floor:
            raise ServerLost(f"{link} came back from its checkpoint at clock {since}, but this client kept "
                             f"its updates only from clock {link.log.floor} on: they cannot be replayed")
        for st in self.tables:  # read anew from the replacement (and so subscribed to it)
            with st.lock:
                st.inflight[link.index].entries.clear()
                st.cache.forget_server(link.index, self._partition())
        moved = h.get("rf")  # restored from its part of a partition move: resend what followed our PAUSED of it
        moved = moved if isinstance(moved, int) and not isinstance(moved, bool) else None
        last, msgs, nbytes = resend(link, since, moved)
        log.warning("%s is back from its %s: resent %d messages (%d bytes)", link,
                    f"part of the move to partition map {moved} (clock {since})" if moved is not None
                    else f"checkpoint at clock {since}", msgs, nbytes)
        while link.acked_seq < last:  # applied (held past a boundary, until the others catch up)
            if self.life.failed:
                return
            if time.monotonic() > deadline:
                raise ServerLost(f"{link}'s replacement did not apply the resent updates within "
                                 f"{RECOVERY_TIMEOUT_S:g}s")
            await asyncio.sleep(0.005)
        for st in self.tables:  # acknowledged: nothing resent is in flight any more
            with st.lock:
                st.inflight[link.index].entries.clear()
        link.state = LinkState.JOINED
        self._notify()
        self._pump(link)
