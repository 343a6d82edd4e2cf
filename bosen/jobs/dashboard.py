"""``bosen dashboard RUN_DIR|CONFIG``: one web page of a job, live while it runs and after it ended.

The standard library's threaded HTTP server serves two things: ``/`` (the page, ``dashboard.html``
beside this file: inline script and SVG drawn by its own code, nothing fetched from elsewhere, as the
machines a job runs on may have no network) and ``/api/job`` (``JobView.snapshot()`` as JSON, which the
page polls every 2 s). Anything else is answered 4xx by the handler's thread and the server goes
on: an unknown path 404, a method other than GET or HEAD 405, a request line or header too long or
malformed 400/414/431 (``http.server``'s own checks), a peer that sends nothing 408 after
``REQUEST_TIMEOUT_S`` (docs/design.md, "Dashboard").
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from bosen.errors import BosenError
from bosen.jobs.jobview import JobView

log = logging.getLogger("bosen.dashboard")

REQUEST_TIMEOUT_S = 10.0
PAGE = "dashboard.html"


def page() -> bytes:
    """The page, from the package (a wheel) or the checkout."""
    return resources.files("bosen.jobs").joinpath(PAGE).read_bytes()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S  # a peer that stalls mid-request holds one thread this long at most
    server_version = "bosen-dashboard"
    default_request_version = "HTTP/1.0"  # a garbage request line's 400 has a status line (not HTTP/0.9's body)
    error_content_type = "text/plain; charset=utf-8"
    error_message_format = "%(code)d %(message)s: %(explain)s\n"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(body=False)

    def __getattr__(self, name: str) -> Any:
        """Every other method (``do_POST``, ``do_DELETE``, a made-up one) is 405, not http.server's 501."""
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self) -> None:
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        body = f"405 {self.command}: the dashboard only answers GET and HEAD\n".encode()
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _answer(self, body: bool) -> None:
        path = urlsplit(self.path).path
        if path in ("/", "/index.html"):
            data, kind = self.server.page, "text/html; charset=utf-8"
        elif path == "/api/job":
            try:
                data, kind = json.dumps(self.server.snapshot(), default=float).encode(), "application/json"
            except Exception as e:  # the page shows it and polls again; the server goes on
                log.warning("dashboard: snapshot failed: %s", e)
                self.send_error(HTTPStatus.SERVICE_UNAVAILABLE, explain=f"cannot read the job: {e}")
                return
        else:
            self.send_error(HTTPStatus.NOT_FOUND, explain=f"{path[:200]!r}: the dashboard serves / and /api/job")
            return
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # a poll every 2 s is no news
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    page: bytes
    snapshot: Callable[[], dict[str, Any]]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that failed (a peer that hung up mid-answer): one log line, not a traceback."""
        log.warning("dashboard: a request from %s failed: %s", client_address[0], sys.exc_info()[1])


class _Server6(_Server):
    address_family = socket.AF_INET6


class Dashboard:
    """The page and its JSON on ``host:port`` (0: a free port, then ``.port``) in threads of their own;
    ``close()`` stops them. ``view`` is read from several request threads (it has its own lock)."""

    def __init__(self, view: JobView, host: str = "127.0.0.1", port: int = 0) -> None:
        cls = _Server6 if ":" in host else _Server
        try:
            self._httpd = cls((host, port), _Handler)
        except OSError as e:
            raise BosenError(f"dashboard: cannot serve on {host}:{port}: {e.strerror or e}") from None
        self._httpd.page = page()
        self._httpd.snapshot = view.snapshot
        self.host = host
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="dashboard-http", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}/"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
