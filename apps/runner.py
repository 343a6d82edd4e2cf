"""Entry point shared by every app's ``python -m bosen.apps.<name>``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Callable, Mapping

from bosen.client import Client
from bosen.errors import BosenError


def run_app(train: Callable[[Client, Mapping[str, Any]], None], argv: list[str] | None = None) -> None:
    """Connect (config from --config or $BOSEN_CONFIG), run ``train(client, app.args)``, close.

    Exits with status 2 and a one-line message on a configuration or argument error, so the
    launcher can show it instead of a traceback.
    """
    p = argparse.ArgumentParser(description="Run one worker process of a Bösen job.")
    p.add_argument("--config", default=os.environ.get("BOSEN_CONFIG"), help="job YAML (default: $BOSEN_CONFIG)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--rank", type=int, default=None, help="worker rank (default: $BOSEN_RANK or assigned)")
    args = p.parse_args(argv)
    if not args.config:
        p.error("no config: pass --config or set BOSEN_CONFIG")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s worker %(levelname)s %(message)s")
    try:
        client = Client.connect(args.config, rank=args.rank, overrides=args.set)
    except (BosenError, ValueError) as e:
        sys.exit(f"worker: {e}")
    try:
        train(client, client.config.app.args)
    except (BosenError, ValueError) as e:
        client.abort()
        sys.exit(f"worker {client.rank}: {type(e).__name__}: {e}")
    client.close()
