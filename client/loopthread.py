"""``LoopThread``: an event loop on a thread of its own, and the bridge to it from other threads.

Worker threads never touch the loop's sockets: they hand it work with ``submit`` (fire and forget)
or ``call`` (wait for a coroutine's result). The thread's owner sees its failures: one that happens
while it starts is raised by ``start``, within its timeout; one that happens later, in work handed
over with ``submit``, goes to ``on_error`` (the owner keeps it and raises it where its users will
see it).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop

from bosen.errors import BosenError

log = logging.getLogger("bosen.client")


class LoopThread:
    def __init__(self, name: str, on_error: Callable[[BosenError], None]) -> None:
        self.name = name
        self.on_error = on_error
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._start_lock = threading.Lock()
        self._abandoned = False  # start() gave up waiting: a setup that finishes later tears down

    def start(self, setup: Callable[[asyncio.AbstractEventLoop], None], teardown: Callable[[], None],
              timeout: float) -> None:
        """Run a new loop on a new thread: ``setup(loop)`` first, on that thread; ``teardown()``
        there once the loop stops. Returns once setup is done; raises what setup raised, or
        BosenError if it took longer than ``timeout`` seconds."""
        self._thread = threading.Thread(target=self._run, args=(setup, teardown), name=self.name, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            with self._start_lock:
                self._abandoned = not self._ready.is_set()
            if self._abandoned:
                raise BosenError(f"the {self.name} thread did not start within {timeout:g}s")
        if self._start_error is not None:
            self._thread.join(timeout)
            raise BosenError(f"the {self.name} thread failed to start: {self._start_error!r}") from self._start_error

    def _run(self, setup: Callable[[asyncio.AbstractEventLoop], None], teardown: Callable[[], None]) -> None:
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            setup(loop)
        except BaseException as e:
            self._start_error = e
            try:
                teardown()
            finally:
                loop.close()
                self._ready.set()
            return
        with self._start_lock:
            abandoned = self._abandoned
            if not abandoned:
                self.loop = loop
                self._ready.set()
        if abandoned:
            try:
                teardown()
            finally:
                loop.close()
            return
        try:
            loop.run_forever()
        finally:
            try:
                teardown()
            finally:
                loop.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop (after the callbacks already handed over) and wait for the thread."""
        if self.loop is not None and self.running:
            try:
                self.loop.call_soon_threadsafe(self.loop.stop)
            except RuntimeError:  # closed meanwhile
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop's thread, soon; what it raises goes to ``on_error``."""
        if self.loop is None:
            raise BosenError(f"the {self.name} thread is not running")
        self.loop.call_soon_threadsafe(self.guard, fn, args)

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run a coroutine on the loop's thread and wait for its result."""
        if self.loop is None:
            coro.close()
            raise BosenError(f"the {self.name} thread is not running")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def guard(self, fn: Callable[..., None], args: tuple) -> None:
        """Call ``fn(*args)``; an error goes to ``on_error`` instead of the loop's exception handler."""
        try:
            fn(*args)
        except BosenError as e:
            self.on_error(e)
        except Exception as e:
            log.exception("%s thread error", self.name)
            err = BosenError(f"{self.name} thread error: {e!r}")
            err.__cause__ = e
            self.on_error(err)
