"""Entry point shared by every app's ``python -m bosen.apps.<name>``: connect, train, close, exit."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from bosen.client import Client
from bosen.errors import BosenError

EXIT_FAILED = 1  # the job failed while it ran (a server lost, a read timed out, ...)
EXIT_USAGE = 2  # the job as given cannot run: bad command line, config, app.args or input data


def run_app(train: Callable[[Client, Mapping[str, Any]], None], argv: list[str] | None = None) -> None:
    """Connect (config from --config or $BOSEN_CONFIG), run ``train(client, app.args)``, close.

    A configuration or argument error (a ValueError, which ConfigError and DataError are) exits with
    status 2 and a one-line message, so the launcher can show it instead of a traceback; any other
    BosenError exits with status 1 and a one-line message. Other exceptions are bugs and keep their
    traceback.
    """
    p = argparse.ArgumentParser(description="Run one worker process of a Bösen job.")
    p.add_argument("--config", default=os.environ.get("BOSEN_CONFIG"), help="job YAML (default: $BOSEN_CONFIG)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--rank", type=int, default=None, help="worker rank (default: $BOSEN_RANK or assigned)")
    args = p.parse_args(argv)
    if not args.config:
        p.error("no config: pass --config or set BOSEN_CONFIG")  # exits with status 2 too
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s worker %(levelname)s %(message)s")
    try:
        client = Client.connect(args.config, rank=args.rank, overrides=args.set)
    except (BosenError, ValueError) as e:
        _exit(e, "worker")
    try:
        train(client, client.config.app.args)
    except (BosenError, ValueError) as e:
        client.abort()
        _exit(e, f"worker {client.rank}")
    client.close()


def _exit(e: Exception, who: str) -> NoReturn:
    print(f"{who}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE if isinstance(e, ValueError) else EXIT_FAILED)
