"""``bosen-server --config CONFIG --rank N``: run one server daemon until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path

import uvloop

from bosen import config as config_mod
from bosen import prometheus
from bosen.errors import BosenError
from bosen.jobs import status as status_mod
from bosen.malloc import reuse_large_buffers
from bosen.security import Security
from bosen.server import sched
from bosen.server.daemon import Server
from bosen.server.moves import Joining

JOIN_TIMEOUT_S = 10.0  # server 0 of the job a --join server joins answers within this


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bosen-server", description="Run one Bösen parameter server daemon.")
    p.add_argument("--config", required=True, help="job YAML (the same file every process uses)")
    p.add_argument("--rank", type=int, default=None, help="index of this server in cluster.servers")
    p.add_argument("--join", default=None, metavar="HOST:PORT",
                   help="add a server at HOST:PORT to the running job of --config (it takes partitions when "
                        "`bosen scale` moves them; server 0 tells it the job's state)")
    p.add_argument("--bind", default=None, help="host/interface to bind (default: the host in the config)")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="start from a checkpoint: DIR/clock-N, or the newest complete one under DIR")
    p.add_argument("--recover", action="store_true",
                   help="with --resume DIR: replace a lost server of a running job from this server's newest part")
    p.add_argument("--shape-from", default=None, metavar="HOST:PORT",
                   help="with --recover in a job whose servers joined or left: take the job's servers and partition "
                        "map from the running server at HOST:PORT (its STATUS), not from the config")
    p.add_argument("--gone", default="", metavar="RANKS", help="worker ranks that already left (comma-separated)")
    p.add_argument("--hold-lost", action="store_true",
                   help="a worker lost without BYE keeps its clock until a replacement of its rank joins "
                        "(bosen launch passes it in a job with checkpoints)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def _metrics(server: Server) -> prometheus.Endpoint | None:
    """``/metrics`` (metrics.port; off when 0) on the host the server binds: its STATUS, taken on the loop."""
    port = prometheus.port_for(server.config.metrics.port, server.rank)
    if not port:
        return None
    loop, labels = asyncio.get_running_loop(), {"server": str(server.rank)}
    host = server.bind_address.removeprefix("tcp://").rpartition(":")[0]
    endpoint = prometheus.Endpoint(host, port, lambda: prometheus.server_families(
        prometheus.on_loop(loop, lambda: server.stats(histograms=False)), labels))
    logging.getLogger("bosen.server").info("metrics on http://%s:%d/metrics", host, endpoint.port)
    return endpoint


async def _run(server: Server) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop)
    loop.add_signal_handler(signal.SIGHUP, server.reload_keys)  # security.allowed_clients read again
    await server.start()
    endpoint = _metrics(server)
    try:
        await server.serve()
    finally:
        if endpoint is not None:
            endpoint.close()
        server.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s server{args.rank if args.join is None else '+'} %(levelname)s %(message)s")
    try:
        cfg = config_mod.load(args.config, args.set)
        if args.recover and not args.resume:
            raise ValueError("--recover needs --resume DIR (the job's checkpoint directory)")
        gone = tuple(int(x) for x in args.gone.split(",") if x.strip())
        if (args.rank is None) == (args.join is None):
            raise ValueError("give --rank N (a server of the config) or --join HOST:PORT (a server added to the "
                             "running job), one of them")
        join = shape = None
        if args.join is not None:
            stats = status_mod.query(cfg.cluster.servers[0], timeout=JOIN_TIMEOUT_S,
                                     security=Security.load(cfg, "client"))
            join = Joining.from_status(args.join, stats)
        if args.shape_from is not None:
            if not args.recover or args.rank is None:
                raise ValueError("--shape-from goes with --recover --rank N (replacing a lost server)")
            # as a client of the job (its keys): off loopback its servers run CURVE
            shape = Joining.of_job(status_mod.query(args.shape_from, timeout=JOIN_TIMEOUT_S,
                                                    security=Security.load(cfg, "client")))
        server = Server(cfg, args.rank if args.rank is not None else -1, bind=args.bind,
                        resume=Path(args.resume) if args.resume else None, recover=args.recover, gone=gone,
                        hold_lost=args.hold_lost, join=join, shape=shape)
    except (BosenError, ValueError) as e:
        print(f"bosen-server: {e}", file=sys.stderr)
        return 2
    reuse_large_buffers()
    # before ZeroMQ starts its I/O thread, which inherits the policy
    logging.getLogger("bosen.server").info(sched.apply_policy(cfg.cluster.server_sched))
    # What exists now (modules, numba's compiler state, the tables' Python objects) lives as long as
    # the process: keep it out of the collector's full passes, which otherwise rescan it all.
    gc.freeze()
    try:
        uvloop.run(_run(server))
    except BosenError as e:  # the metrics port
        print(f"bosen-server: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"bosen-server: cannot serve on {server.bind_address}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # zmq.ZMQError on bind, etc.
        print(f"bosen-server: {type(e).__name__}: {e} (address {server.bind_address})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    gc.freeze()  # what the kernels' first calls built since the freeze above: skip rescanning it at exit (~0.4 s)
    raise SystemExit(code)
