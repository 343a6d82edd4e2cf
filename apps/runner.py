"""Entry point shared by every app's ``python -m bosen.apps.<name>``: connect, train, close, exit."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from bosen import config as config_mod
from bosen.apps import microtasks
from bosen.client import Client
from bosen.config import Config
from bosen.errors import BosenError

EXIT_FAILED = 1  # the job failed while it ran (a server lost, a read timed out, ...)
EXIT_USAGE = 2  # the job as given cannot run: bad command line, config, app.args or input data


def run_app(train: Callable[..., None], argv: list[str] | None = None,
            prepare: Callable[[Config], Any] | None = None) -> None:
    """Load the config (from --config or $BOSEN_CONFIG), connect, run ``train(client, app.args)``, close.

    An app whose data takes time to load passes ``prepare(config)``: it runs before the process
    joins the servers and ``train(client, app.args, prepared)`` gets what it returned. A worker that
    ``bosen scale`` starts ahead of its boundary (``$BOSEN_JOIN=ahead``) prepares while the job runs
    on, says it is ready, and joins at the clock the scaler then names (apps/microtasks.py), so the
    running workers do not wait at the boundary for a process to start and load its data.

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
        config = config_mod.load(args.config, args.set)
        prepared = prepare(config) if prepare is not None else None
        if microtasks.join_ahead():
            _await_boundary(args.rank)
        client = Client.connect(config, rank=args.rank)
    except (BosenError, ValueError) as e:
        rank = args.rank if args.rank is not None else os.environ.get("BOSEN_RANK")
        _exit(e, "worker" if rank is None else f"worker {rank}")
    try:
        if prepare is not None:
            train(client, client.config.app.args, prepared)
        else:
            train(client, client.config.app.args)
    except (BosenError, ValueError) as e:
        client.abort()
        _exit(e, f"worker {client.rank}")
    client.close()
    # The process ends here: keep what it built (numba's compiler state, torch's modules) out of the
    # collector's passes at interpreter exit, which otherwise rescan it all (~0.4 s of CPU per worker).
    gc.freeze()


def _await_boundary(rank: int | None) -> None:
    """A joiner started ahead: ready, then wait for its clock; from then on it is an ordinary joiner
    (``$BOSEN_JOIN`` = that clock, read by the client and the app)."""
    plan, folder = microtasks.run_plan()
    rank = rank if rank is not None else int(os.environ.get("BOSEN_RANK", -1))
    if folder is None or rank < 0:
        raise BosenError("BOSEN_JOIN=ahead needs BOSEN_RUN_DIR and a rank: only `bosen scale` starts such workers")
    microtasks.ready(folder, rank)
    os.environ["BOSEN_JOIN"] = str(microtasks.await_join(folder, rank))


def _exit(e: Exception, who: str) -> NoReturn:
    print(f"{who}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE if isinstance(e, ValueError) else EXIT_FAILED)
