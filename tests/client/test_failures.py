"""A client's failures are sticky and loud: every worker thread sees the first one, promptly, and
nothing hangs (start-up, a lost server, close() under a read in progress)."""

import signal
import threading
import time

import numpy as np
import pytest
from conftest import wait_until

from bosen.client import Client
from bosen.client import comm as comm_mod
from bosen.client.clocks import WorkerClocks
from bosen.errors import BosenError, ClientClosed, ServerLost

COMM = {"enabled": True, "client_bandwidth_mbps": 100, "server_bandwidth_mbps": 100}


def blocked_readers(client: Client, n: int, row: int) -> tuple[list[threading.Thread], list]:
    """``n`` worker threads, each at tick 1 reading ``row``: with staleness 0 and a second client
    that never joins, each read blocks. Returns the threads and, per thread, (error or None, when
    the read ended: time.monotonic())."""
    results: list = []

    def read() -> None:
        with client.worker() as w:
            t = w.table("W")
            w.clock()
            try:
                t.get_row(row)
                results.append((None, time.monotonic()))
            except BaseException as e:
                results.append((e, time.monotonic()))

    threads = [threading.Thread(target=read, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, results


@pytest.mark.parametrize("path", ["direct", "comm"])
@pytest.mark.slow
def test_a_server_killed_while_three_threads_read_fails_all_three_within_2s(bosen_cluster, path):
    """Reads on the threads' own sockets (direct) or through the communication thread (managed
    communication on): all three raise ServerLost naming the server, and so does every later call."""
    kw = {"comm": COMM} if path == "comm" else {}
    c = bosen_cluster(2, workers=2, staleness=0, tables={"W": {"rows": 8, "cols": 4}}, **kw)
    client = Client.connect(c.path, rank=0, main_worker=False)
    try:
        threads, results = blocked_readers(client, 3, row=1)  # row 1 lives on server 1
        assert wait_until(lambda: client.stats()["blocked_reads"] == 3, timeout=20), "the reads did not block"
        time.sleep(0.2)  # the reads are on the wire
        killed = time.monotonic()
        c.stop_server(1, signal.SIGKILL)
        for t in threads:
            t.join(5)
        assert len(results) == 3, "a reading thread hung"
        for err, when in results:
            assert isinstance(err, ServerLost), f"expected ServerLost, got {err!r}"
            assert "server 1" in str(err) and c.addresses[1] in str(err)
            assert when - killed < 2.0, f"raised {when - killed:.2f}s after the kill"
        with pytest.raises(ServerLost, match="server 1"):  # sticky: a later call raises it too
            with client.worker() as w:
                w.table("W").get_row(0)
        with pytest.raises(ServerLost):
            client.close()  # it cannot leave cleanly, and says why
    finally:
        client.abort()


def test_a_failure_is_raised_in_every_thread_not_just_the_first(bosen_cluster):
    """Two threads call after a failure, one after the other: both raise it (it is not cleared)."""
    c = bosen_cluster(1, workers=1, staleness=0, tables={"W": {"rows": 4, "cols": 2}})
    client = Client.connect(c.path, rank=0, main_worker=False)
    try:
        def fail() -> None:  # work handed to the communication thread that fails there
            raise BosenError("boom")

        client._comm.submit(fail)
        assert wait_until(lambda: client._comm.error is not None, timeout=5)
        errors = []

        def call() -> None:
            with pytest.raises(BosenError, match="boom") as info:
                with client.worker() as w:
                    w.table("W").get_row(0)
            errors.append(info.value)

        for _ in range(2):
            t = threading.Thread(target=call)
            t.start()
            t.join(5)
        assert len(errors) == 2 and errors[0] is not errors[1]
        assert all(e.__cause__ is client._comm.error for e in errors), "each copy names the original as cause"
    finally:
        client.abort()


def test_a_communication_thread_that_fails_at_start_fails_connect(bosen_cluster, monkeypatch):
    c = bosen_cluster(1, workers=1, tables={"W": {"rows": 4, "cols": 2}})

    def broken(self):
        raise OSError("no sockets today")

    monkeypatch.setattr(comm_mod.LoopSocket, "start", broken)
    start = time.monotonic()
    with pytest.raises(BosenError, match="failed to start.*no sockets today"):
        Client.connect(c.path, join_timeout=5)
    assert time.monotonic() - start < 5


@pytest.mark.slow
def test_a_communication_thread_that_never_starts_fails_connect_within_its_timeout(bosen_cluster, monkeypatch):
    c = bosen_cluster(1, workers=1, tables={"W": {"rows": 4, "cols": 2}})
    release = threading.Event()
    original = comm_mod.CommThread._open

    def stuck(self, loop):
        release.wait(30)
        original(self, loop)

    monkeypatch.setattr(comm_mod.CommThread, "_open", stuck)
    start = time.monotonic()
    try:
        with pytest.raises(BosenError, match="did not start within 2s"):
            Client.connect(c.path, join_timeout=2)
        assert time.monotonic() - start < 4
    finally:
        release.set()


def test_close_waits_for_a_read_in_progress_instead_of_closing_its_sockets(bosen_cluster):
    """A thread blocked in a direct read while the client closes: it raises ClientClosed (not a
    ZeroMQ error from a socket closed under it), and close() returns promptly."""
    c = bosen_cluster(1, workers=2, staleness=0, tables={"W": {"rows": 4, "cols": 2}})
    client = Client.connect(c.path, rank=0, main_worker=False)
    threads, results = blocked_readers(client, 1, row=0)
    assert wait_until(lambda: client.stats()["blocked_reads"] == 1, timeout=20)
    time.sleep(0.2)
    start = time.monotonic()
    client.abort()
    assert time.monotonic() - start < 2
    threads[0].join(5)
    assert len(results) == 1 and isinstance(results[0][0], ClientClosed), results


def test_the_process_clock_callback_runs_outside_the_clocks_lock():
    """The callback may block (the hand-over waits for the communication thread): other workers must
    still tick meanwhile. Here the callback for clock 1 waits until another worker ticks again."""
    second_tick = threading.Event()
    seen = []

    def on_advance(c: int) -> None:
        seen.append(c)
        if c == 1:
            assert second_tick.wait(5), "another worker could not tick while the callback ran"

    clocks = WorkerClocks(on_advance)
    a, _ = clocks.join()
    b, _ = clocks.join()
    clocks.tick(b)
    t = threading.Thread(target=clocks.tick, args=(a,))  # raises the clock to 1: the callback blocks
    t.start()
    assert wait_until(lambda: seen == [1], timeout=5)
    clocks.tick(b)  # would deadlock if the callback held the lock
    second_tick.set()
    t.join(5)
    assert not t.is_alive() and clocks.clock == 1


def test_worker_counters_add_up_including_workers_that_left(bosen_cluster):
    """Worker threads count their own increments; stats() adds them up, those of workers that left too
    (here every worker has left by the time stats() is read)."""
    c = bosen_cluster(1, workers=1, staleness=4, tables={"W": {"rows": 64, "cols": 8}})
    with Client.connect(c.path, main_worker=False) as client:
        def work() -> None:
            with client.worker() as w:
                t = w.table("W")
                for _ in range(50):
                    t.inc_rows(np.arange(64), np.ones((64, 8), np.float32))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        s = client.stats()
        assert s["updates_buffered"] == 4 * 50 * 64
