"""Move partitions between a running job's servers (docs/design.md, "Partitions"): the steps that
``server/moves.py`` answers, driven from outside the job over each server's own socket, as
``bosen status`` asks. Synchronous, no loop.

``move_partitions(config, owner)`` gives partition ``p`` to server ``owner[p]``: server 0 tells the
clients to pause after their next clock, every server waits until each client paused (a FIFO fence:
everything sent before is applied), the servers losing partitions export their rows, every server
takes the new map with the rows it gains and tells its clients, and the clients go on under the new
map. A plan that meets clients paused on both sides of a checkpoint boundary is given up and tried
again after a short backoff, until the move's timeout (under load, or with a checkpoint every clock,
many plans may meet one); so is one that finds the servers holding rows of a table with backup workers at
different positions of its step (iteration, ranks accepted: with k_t < n each server steps on its own),
since rows of one iteration must not arrive at a server of another. The workers compute on
throughout; only their sends wait (``pause_s``).

``scale_servers(config, addresses)`` adds servers to a running job or lets the last ones go: a server
started with ``bosen-server --config CONFIG --join HOST:PORT`` takes a fair share of the partitions
(``balanced``); a server leaving hands all of its partitions to the others and exits. The job's
servers are then no longer its config's: server 0 knows them (``current_servers``).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from bosen import faults, wire
from bosen.config import Config
from bosen.errors import BosenError
from bosen.jobs import status as status_mod
from bosen.security import Security, client_socket
from bosen.wire import Msg

BACKOFF_S = (0.05, 0.5)  # wait after a plan met a checkpoint boundary: first, most (doubling)
STEP_BACKOFF_S = (0.01, 0.2)  # after one met servers at different positions of a backup step: step, most


@dataclass(frozen=True)
class MoveReport:
    version: int  # the new map's
    moved: int  # partitions that changed server
    bytes: int  # row data that travelled
    pause_s: float  # from the plan to the last server's new map: how long clients held their sends
    wait_s: float  # of which: waiting for every client to pause,
    export_s: float  # the rows of leaving partitions coming out (and over to here),
    map_s: float  # every server laying its rows out for the new map (and the rows going there)
    tries: int
    part_s: float = 0.0  # of map_s: the longest a server took to write its part of the move (checkpoints on)


class MoveCancelled(BosenError):
    """Whoever moves partitions gave the move up (the launcher stopping) before any server took the map."""


class SplitMaps(BosenError):
    """The servers follow different partition maps: a move is under way or was cut off."""


class _Mover:
    def __init__(self, servers: list[str], timeout: float, security: Security | None,
                 cancel: threading.Event | None = None) -> None:
        self.servers = servers
        self.timeout = timeout
        self.cancel = cancel
        self.ctx = zmq.Context()
        self.socks = []
        for addr in self.servers:
            s = client_socket(self.ctx, zmq.DEALER, security)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(f"tcp://{addr}")
            self.socks.append(s)
        self.seq = itertools.count(1)

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.ctx.term()

    def send(self, j: int, op: str, version: int, arrays: dict[str, np.ndarray] | None = None,
             extra: dict[str, Any] | None = None) -> int:
        seq = next(self.seq)
        self.socks[j].send_multipart(wire.encode_arrays({"t": Msg.MOVE, "s": seq, "op": op, "mv": version,
                                                         **(extra or {})}, arrays or {}))
        return seq

    def reply(self, j: int, seq: int, timeout: float | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while not self.socks[j].poll(100):  # in slices: a move given up meanwhile stops waiting
            self.check()
            if time.monotonic() > deadline:
                raise BosenError(f"server {j} ({self.servers[j]}): no answer to the partition move within {wait:g}s")
        frames = self.socks[j].recv_multipart(copy=False)
        h = wire.decode_header(frames[0])
        if h["t"] == Msg.ERROR:
            raise BosenError(f"server {j} ({self.servers[j]}) refused the partition move: {h['m']}")
        if h["t"] != Msg.MOVE_REPLY or h["rq"] != seq:
            raise BosenError(f"server {j} ({self.servers[j]}): unexpected {h['t'].name} to a partition move")
        wire.check_frames(h, len(frames) - 1)
        return h, wire.decode_arrays(h, frames[1:])  # views of the frames, which they keep alive

    def check(self) -> None:
        """MoveCancelled where whoever moves gave the move up."""
        if self.cancel is not None and self.cancel.is_set():
            raise MoveCancelled("the partition move was given up (its launcher is stopping)")

    def abort(self, version: int) -> None:
        """Give the plan up on every server (the clients resume under the old map), as far as they
        answer: a move that failed before any ``map`` must not leave the clients paused."""
        for j in range(len(self.servers)):
            try:
                self.reply(j, self.send(j, "abort", version), timeout=5.0)
            except BosenError:
                pass  # that server is lost (its replacement knows no plan) or gone: nothing to resume there

    def ask(self, j: int, op: str, version: int, arrays: dict[str, np.ndarray] | None = None,
            timeout: float | None = None, extra: dict[str, Any] | None = None
            ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return self.reply(j, self.send(j, op, version, arrays, extra), timeout)


def _steps_apart(answers: list[dict[str, Any]], config: Config) -> str | None:
    """Where the servers holding rows of a backup table are at different positions of its step
    (``BackupStep.position``: iteration, ranks accepted), which one (rows of one iteration must
    not arrive at a server of another); None where every table's servers agree."""
    seen: dict[str, list[tuple[int, list[int]]]] = {}
    for j, a in enumerate(answers):
        for table, pos in (a.get("bk") or {}).items():
            seen.setdefault(table, []).append((j, list(pos)))
    for table, where in seen.items():
        if any(pos != where[0][1] for _, pos in where[1:]):
            name = config.tables[int(table)].name if int(table) < len(config.tables) else table
            return f"table {name}: " + ", ".join(f"server {j} at iteration {p[0]} with ranks {p[1:]} accepted"
                                                 for j, p in where)
    return None


def current_servers(config: Config, timeout: float = 5.0) -> list[str]:
    """The running job's servers now (those of its config, unless servers joined or left)."""
    security = Security.load(config, "client")
    return list(status_mod.query(config.cluster.servers[0], timeout=timeout, security=security)["servers"])


def current_map(config: Config, timeout: float = 5.0) -> tuple[int, np.ndarray]:
    """The partition map the job's servers follow now: (version, owner per partition)."""
    return map_of(config, current_servers(config, timeout), timeout)


def map_of(config: Config, addrs: list[str], timeout: float = 5.0) -> tuple[int, np.ndarray]:
    """The partition map the servers at ``addrs`` follow: (version, owner per partition). SplitMaps
    where they follow different versions (a client takes a map only once every server sent it)."""
    security = Security.load(config, "client")
    stats = [status_mod.query(addr, timeout=timeout, security=security) for addr in addrs]
    versions: dict[int, list[str]] = {}
    for addr, s in zip(addrs, stats, strict=True):
        versions.setdefault(s["partitions"]["version"], []).append(addr)
    if len(versions) != 1:
        each = "; ".join(f"version {v}: {', '.join(a)}" for v, a in sorted(versions.items()))
        raise SplitMaps(f"servers follow different partition maps ({each}): a move is under way or was cut off")
    return next(iter(versions)), np.asarray(stats[0]["partitions"]["owner"], dtype=np.int32)


def balanced(owner: np.ndarray, servers: int) -> np.ndarray:
    """A map over ``servers`` servers that moves as few partitions of ``owner`` as it can: each server
    ends with P // servers partitions or one more (the first P % servers servers)."""
    owner = np.asarray(owner, dtype=np.int32)
    p = owner.shape[0]
    if not 1 <= servers <= p:
        raise ValueError(f"{servers} servers for {p} partitions: need between 1 and {p}")
    target = np.full(servers, p // servers, dtype=np.int64)
    target[:p % servers] += 1
    new = owner.copy()
    free: list[int] = []  # partitions to place: on servers that leave, or over their server's share
    held = np.zeros(servers, dtype=np.int64)
    for i, j in enumerate(owner):
        if j < servers and held[j] < target[j]:
            held[j] += 1
        else:
            free.append(i)
    for j in range(servers):
        while held[j] < target[j]:
            new[free.pop()] = j
            held[j] += 1
    return new


def move_partitions(config: Config, owner: np.ndarray, timeout: float = 60.0,
                    servers: list[str] | None = None, cancel: threading.Event | None = None) -> MoveReport:
    """Give partition ``p`` to server ``owner[p]`` in the running job of ``config``. ``servers``: the
    job's servers after the move, when servers join (started with ``--join``, at the end of the list)
    or leave (the last ones; they then own nothing and exit). ``cancel``: set, the move is given up
    (MoveCancelled) if no server has taken the new map yet. A move that fails before the map gives
    its plan up on every server, so the clients resume as they were."""
    version, old = current_map(config)
    now = current_servers(config)
    after = now if servers is None else list(servers)
    common = min(len(now), len(after))
    if after[:common] != now[:common] or not after:
        raise ValueError(f"servers: join or leave at the end of the job's list ({', '.join(now)}); "
                         f"got {', '.join(after) or 'none'}")
    owner = np.asarray(owner, dtype=np.int32)
    n = len(after)
    if owner.shape != old.shape or (owner.shape[0] and (owner.min() < 0 or owner.max() >= n)):
        raise ValueError(f"owner: one server in [0, {n}) for each of the {old.shape[0]} partitions")
    everyone = after if len(after) > len(now) else now  # the new servers, or those leaving, take part
    extra: dict[str, Any] = {"sv": after} if after != now else {}
    new = version + 1
    mover = _Mover(everyone, timeout, Security.load(config, "client"), cancel)
    tries = held_tries = 0
    planned = False
    try:
        fault = faults.from_env(only=("hold-move",))  # tests only: hold before the plan ($BOSEN_FAULT)
        if fault is not None:
            fault.before_plan(mover.check)
        start = time.monotonic()
        backoff = BACKOFF_S[0]
        while True:
            tries += 1
            t0 = time.perf_counter()
            planned = True
            mover.ask(0, "plan", new, extra=extra)
            seqs = [mover.send(j, "wait", new) for j in range(len(everyone))]
            answers = [mover.reply(j, seq)[0] for j, seq in enumerate(seqs)]
            wait_s = time.perf_counter() - t0
            held = any(a.get("held") for a in answers)
            apart = None if held else _steps_apart(answers, config)
            if not held and apart is None:
                break
            mover.ask(0, "abort", new)  # clients paused on both sides of a checkpoint boundary, or mid-step
            for j in range(1, len(everyone)):
                mover.ask(j, "abort", new)
            planned = False
            if held:
                held_tries += 1
            pause = backoff if held else min(STEP_BACKOFF_S[0] * tries, STEP_BACKOFF_S[1])
            spent = time.monotonic() - start
            if spent + pause > timeout:
                raise BosenError(f"partitions could not move within {timeout:g}s: {tries} plans in {spent:.1f}s, "
                                 f"{held_tries} met a checkpoint boundary between the workers' clocks, "
                                 f"{tries - held_tries} servers at different positions of a backup table's step"
                                 f"{f' (last: {apart})' if apart else ''}")
            mover.check()
            time.sleep(pause)
            if held:
                backoff = min(2 * backoff, BACKOFF_S[1])
        incoming: list[dict[str, np.ndarray]] = [{} for _ in range(len(everyone))]
        nbytes = 0
        t1 = time.perf_counter()
        asked = {}  # every server that loses partitions exports at once
        for j in range(len(everyone)):
            leaving = np.flatnonzero((old == j) & (owner != j))
            if leaving.shape[0]:
                asked[j] = mover.send(j, "export", new, {"parts": leaving.astype(np.int64)})
        for j, seq in asked.items():
            _, rows = mover.reply(j, seq)
            nbytes += sum(a.nbytes for a in rows.values())
            for name, arr in rows.items():  # "tI.rows" etc.: split by the new owner of each row
                table, _, field = name.partition(".")
                if field.startswith("whole."):  # of the giver's whole shard: to each server it gives rows
                    for k in np.unique(owner[rows[f"{table}.rows"] % old.shape[0]]):
                        incoming[int(k)].setdefault(name, arr)  # from the first giver (all at one position)
                    continue
                group = f"{table}.{field.partition('.')[0]}.row"  # "copy.*", "hold.*": by their own "row"
                ids = rows[group] if "." in field and group in rows else rows[f"{table}.rows"]
                dest = owner[ids % old.shape[0]]
                axis = 1 if field == "applied_by" else 0
                for k in np.unique(dest):
                    got = incoming[int(k)]
                    part = arr if (dest == k).all() else np.take(arr, np.flatnonzero(dest == k), axis=axis)
                    got[name] = part if name not in got else np.concatenate([got[name], part], axis=axis)
        t2 = time.perf_counter()
        mover.check()
        planned = False  # from here on the servers take the new map: nothing to give up
        seqs = []
        for j in range(len(everyone)):
            seqs.append(mover.send(j, "map", new, {"owner": owner, **incoming[j]}, extra))
            if j == 0 and fault is not None:  # tests only: a move cut off with server 0 alone on the new map
                fault.mid_map(lambda: _answered(mover, 0, seqs[0]))
        part_s = 0.0
        for j, seq in enumerate(seqs):  # every server lays its rows out at once
            part_s = max(part_s, float(mover.reply(j, seq)[0].get("ps", 0.0)))
        pause_s = time.perf_counter() - t0
        if fault is not None:
            fault.after_map()
        retiring = [mover.send(j, "retire", new) for j in range(n, len(everyone))]
        for j, seq in enumerate(retiring, start=n):  # each answers once every client said BYE to it
            mover.reply(j, seq)
    except BaseException:
        if planned:
            mover.abort(new)
        raise
    finally:
        mover.close()
    return MoveReport(version=new, moved=int(np.count_nonzero(old != owner)), bytes=nbytes, pause_s=pause_s,
                      wait_s=wait_s, export_s=t2 - t1, map_s=t0 + pause_s - t2, tries=tries, part_s=part_s)


def _answered(mover: _Mover, j: int, seq: int) -> None:
    mover.reply(j, seq)


def retire_servers(config: Config, addrs: list[str], version: int, timeout: float = 10.0) -> dict[str, str]:
    """Ask the servers at ``addrs``, which own no partition under the job's map any more (a scale-in
    whose move failed after its map), to leave: each answers once every client has said BYE to it
    (clients do once they take a map without it), then exits. The addresses that did not answer
    within ``timeout`` seconds (one deadline for all) or refused, each with why."""
    if not addrs:
        return {}
    mover = _Mover(addrs, timeout, Security.load(config, "client"))
    failed: dict[str, str] = {}
    try:
        seqs = [mover.send(j, "retire", version) for j in range(len(addrs))]
        deadline = time.monotonic() + timeout
        for j, seq in enumerate(seqs):
            try:
                mover.reply(j, seq, timeout=max(deadline - time.monotonic(), 0.1))
            except BosenError as e:
                failed[addrs[j]] = str(e)
    finally:
        mover.close()
    return failed


def scale_servers(config: Config, servers: list[str], timeout: float = 60.0,
                  cancel: threading.Event | None = None) -> MoveReport:
    """The running job of ``config`` goes on with ``servers``: the current ones and new ones (each
    started with ``bosen-server --config CONFIG --join ADDRESS`` and answering), or the first of the
    current ones (the others hand their partitions off and exit). Each server ends with a fair share
    of the partitions (``balanced``). ``cancel``: as for ``move_partitions``."""
    now = current_servers(config)
    if len(servers) == len(now):
        raise ValueError(f"the job runs on {len(now)} servers already")
    for addr in servers[len(now):]:
        try:
            status_mod.query(addr, timeout=min(timeout, 5.0), security=Security.load(config, "client"))
        except BosenError as e:
            raise BosenError(f"server {addr} does not answer: start it with `bosen-server --config "
                             f"{config.source} --join {addr}` first ({e})") from None
    _, owner = current_map(config)
    return move_partitions(config, balanced(owner, len(servers)), timeout, servers=servers, cancel=cancel)
