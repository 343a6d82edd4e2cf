"""A client's part in moving partitions between servers (docs/design.md, "Partitions"; the servers'
part is server/moves.py). Runs on the communication thread.

PLAN (from server 0): after the first clock >= ``c`` goes out on a connection (at once for ``c`` -1,
what servers send, or if one already did), that connection sends PAUSED and nothing more: its
server has then received everything this client will send under the old map. Meanwhile the workers
compute on (reads within the staleness bound need nothing new), budgeted sends stop, reads that
need a server wait, and no worker thread starts a read on its own sockets.

MAP (from every server, after everything that server sent under the old map): the messages a server
sends after its MAP wait here until every server's MAP is in and no worker's own read is in flight;
then the new map is taken: rows of moved partitions take the new owner's message numbers, every row
asked for is asked again, what the flush windows owe is routed anew, and the connections go on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bosen.client.link import ServerLink
from bosen.client.state import TableState
from bosen.errors import ProtocolError
from bosen.partition import Partition
from bosen.wire import Msg

log = logging.getLogger("bosen.client")


class MapFollower:
    def __init__(self, tables: Sequence[TableState], links: Sequence[ServerLink], partition: Partition,
                 taken: Callable[[Partition], None], replay: Callable[[ServerLink, list[Any]], None],
                 resume: Callable[[], None], classes: int | None = None) -> None:
        """``taken(map)``: the communication thread's holders of the map follow it (and the connections
        the servers after it); ``replay(link, frames)``: handle a message held back; ``resume()``: the
        flush windows go on, readers wake; ``classes``: as for ``Partition``."""
        self.tables = tables
        self.links = links
        self.partition = partition
        self._taken = taken
        self._replay = replay
        self._resume = resume
        self.version = -1  # the plan being followed (-1: none)
        self.classes = classes
        self.servers: int | None = None  # servers after the plan, if they join or leave (PLAN "sv")
        self.pause_at: int | None = None  # the clock after which the connections pause
        self.paused: set[int] = set()  # connections that sent PAUSED
        self._maps: dict[int, Any] = {}  # connection -> the owner array of its MAP
        # connection -> (it, the messages after its MAP, in order); the connection may close meanwhile
        self.held: dict[int, tuple[ServerLink, list[list[Any]]]] = {}
        # a worker's read on its own sockets: never started during a move, and the map is taken
        # only when none is in flight (its answer names rows by the old map's message numbers)
        self.gate = threading.Lock()
        self.direct_reads = 0
        self.moves = 0  # maps taken (stats)

    @property
    def moving(self) -> bool:
        return self.pause_at is not None

    def begin_direct_read(self) -> bool:
        """A worker thread may read on its own sockets (then call ``end_direct_read``)."""
        with self.gate:
            if self.pause_at is not None:
                return False
            self.direct_reads += 1
            return True

    def end_direct_read(self) -> None:
        with self.gate:
            self.direct_reads -= 1

    # -- messages --------------------------------------------------------------------------------

    def on_plan(self, link: ServerLink, h: dict[str, Any]) -> None:
        if h.get("x") is True:  # given up before any server moved anything
            if h["mv"] == self.version and not self._maps:
                log.info("partition move %d given up; going on", h["mv"])
                self._end()
            return
        with self.gate:
            self.version, self.pause_at = h["mv"], h["c"]
        self.servers = len(h["sv"]) if "sv" in h else None
        self.paused.clear()
        self._resume()  # connections already past the clock pause at once

    def should_pause(self, link: ServerLink) -> bool:
        """Whether ``link`` sends nothing now; sends its PAUSED the first time."""
        if self.pause_at is None or link.window.clock_sent < self.pause_at:
            return False
        if link.index not in self.paused:
            self.paused.add(link.index)
            if link.log is not None:  # a replacement restored from the server's move part resends what follows
                link.log.mark(self.version)
            link.send({"t": Msg.PAUSED, "mv": self.version})
        return True

    def hold(self, link: ServerLink, frames: list[Any]) -> bool:
        """Keep a message that came after ``link``'s MAP until the map is taken (True: kept)."""
        held = self.held.get(link.index, (link, None))[1]
        if held is None:
            return False
        held.append(frames)
        return True

    def on_map(self, link: ServerLink, h: dict[str, Any], owner: np.ndarray) -> None:
        if h["mv"] != self.version or self.pause_at is None:
            raise ProtocolError(f"MAP: version {h['mv']} without its plan (following {self.version})")
        self._maps[link.index] = owner.copy()
        self.held[link.index] = (link, [])
        self.try_take()

    def follow(self, new: Partition) -> None:
        """Take map ``new`` at once (joining a job whose partitions moved: nothing cached or sent yet)."""
        self._install(new, None)

    def _install(self, new: Partition, moved: np.ndarray | None) -> None:
        """Every table and the communication thread follow ``new``; after a live move (``moved``: the
        partitions that changed server) the caches start those rows again (``RowCache.moved``)."""
        for st in self.tables:
            with st.lock:
                st.partition = new
                st.cache.num_servers = new.num_servers
                if moved is not None:
                    st.cache.moved(moved)
                if not new.modular:
                    st.oplog.stop_staging()  # staged pieces are runs of one server's rows under a modular map
        self.partition = new
        self._taken(new)

    def try_take(self) -> None:
        """Take the new map if every server sent it and no worker's own read is in flight."""
        if self.pause_at is None or len(self._maps) < len(self.links):
            return
        owners = list(self._maps.values())
        if any(not np.array_equal(o, owners[0]) for o in owners[1:]):
            raise ProtocolError(f"MAP: servers sent different maps for version {self.version}")
        with self.gate:
            if self.direct_reads:
                return  # tried again when the read ends (ReadPath calls back through submit)
            self.pause_at = None
        old = self.partition
        new = Partition(self.servers or old.num_servers, old.partitions, owners[0], self.version, self.classes)
        moved = np.flatnonzero(old.owner_of != new.owner_of)
        owed = self._owed()  # before connections to servers that leave close
        self._install(new, moved)
        self._reroute(owed)
        self.moves += 1
        log.info("partition map %d taken: %d partitions moved", new.version, moved.shape[0])
        self._end()

    def _owed(self) -> dict[int, list[np.ndarray]]:
        """What the flush windows owe (rows queued by the old map), taken out of them."""
        owed: dict[int, list[np.ndarray]] = {}
        for link in self.links:
            for tb, queue in link.window.due.items():
                owed.setdefault(tb, []).extend(queue)
            link.window.due.clear()
            link.window.reads_due = None  # local rows under the old map: this tick's read set is dropped
        return owed

    def _reroute(self, owed: dict[int, list[np.ndarray]]) -> None:
        """``owed`` routed by the new map to the connections it has."""
        for tb, chunks in owed.items():
            st = self.tables[tb]
            rows = np.unique(np.concatenate(chunks))
            with st.lock:
                parts = st.by_server(rows)
            for j, rj in parts:
                self.links[j].window.owe(tb, rj)

    def _end(self) -> None:
        with self.gate:
            self.pause_at = None
        self._maps.clear()
        self.paused.clear()
        self.servers = None
        held, self.held = self.held, {}
        for link, msgs in held.values():
            for frames in msgs:
                self._replay(link, frames)
        self._resume()
