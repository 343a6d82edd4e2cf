"""The ``bosen`` command: ``bosen launch CONFIG``, ``bosen status CONFIG``, ``bosen scale RUN_DIR``,
``bosen data NAME``, ``bosen tables CONFIG --out DIR``, ``bosen examples [NAME [DIR]]``,
``bosen dashboard RUN_DIR|CONFIG`` and ``bosen schedule RUN_DIR... --slots W``. CONFIG is a
file or the name of an example shipped in the package (``bosen launch mf``: ``bosen.jobs.examples``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bosen import checkpoint
from bosen import config as config_mod
from bosen.apps.datasets.packaged import NAMES as DATASET_NAMES
from bosen.errors import BosenError
from bosen.jobs import examples
from bosen.jobs import status as status_mod
from bosen.security import Security, make_keys


def _launch(args: argparse.Namespace) -> int:
    from bosen.jobs.launch import Launcher

    config = examples.resolve(args.config)
    needs = examples.missing_data(config, config_mod.load(config, args.set).app.args)
    if needs is not None:
        raise BosenError(needs)
    launcher = Launcher(config, workers=args.workers, overrides=args.set, run_dir=args.run_dir,
                        timeout=args.timeout, quiet=args.quiet, plot=not args.no_plot, resume=args.resume,
                        servers=args.servers, ray=False if args.ray is None else (args.ray or True))
    return launcher.run()


def _status(args: argparse.Namespace) -> int:
    path = Path(args.config)
    run_dir = path if path.is_dir() else None  # a run directory: its config.yaml, and its micro-tasks
    cfg = config_mod.load(path / "config.yaml" if run_dir is not None else path, args.set)
    stats: list = []
    failed = False
    servers = list(cfg.cluster.servers)
    security = Security.load(cfg, "client")
    try:  # servers may have joined or left the running job: server 0 knows which it has now
        servers = status_mod.query(servers[0], timeout=args.timeout, security=security).get("servers", servers)
    except BosenError:
        pass  # reported below, as DOWN
    for addr in servers:
        try:
            stats.append(status_mod.query(addr, timeout=args.timeout, security=security))
        except BosenError as e:
            stats.append(f"   -  {addr:<22} DOWN: {e}")
            failed = True
    if args.json:
        print(json.dumps([s for s in stats if isinstance(s, dict)], indent=1))
    else:
        print(status_mod.format_table(stats))
        if run_dir is not None and cfg.checkpoint is not None:
            print(_tasks(run_dir, cfg))
    return 1 if failed else 0


def _tasks(run_dir: Path, cfg: config_mod.Config) -> str:
    """The micro-tasks per worker of the run's newest complete checkpoint, and a plan moving them."""
    assert cfg.checkpoint is not None
    base = Path(cfg.checkpoint.dir)
    base = base if base.is_absolute() else run_dir / base
    try:
        clock, parts, _ = checkpoint.newest_complete(base, len(cfg.cluster.servers), None, None, verify=False)
    except checkpoint.CheckpointError as e:
        return f"micro-tasks: no complete checkpoint yet ({e})"
    by_worker = checkpoint.tasks_by_worker(parts)
    if not by_worker:
        return f"micro-tasks: none (the app's checkpoint at clock {clock} holds its state per worker rank)"
    plan_path = run_dir / "tasks" / "plan.json"
    try:
        plan = json.loads(plan_path.read_text()) if plan_path.exists() else None
    except (OSError, ValueError):
        plan = None
    return status_mod.format_tasks(by_worker, clock, plan if isinstance(plan, dict) else None)


def _scale(args: argparse.Namespace) -> int:
    from bosen.jobs.scale import scale

    seconds = scale(args.target, workers=args.workers, servers=args.servers, timeout=args.timeout)
    print(f"done in {seconds:.2f}s")
    return 0


def _schedule(args: argparse.Namespace) -> int:
    from bosen.jobs.pollux import schedule

    moves = schedule(args.run_dirs, args.slots, interval=args.interval, p=args.p, delay=args.delay)
    print(f"pollux: every job ended; {len(moves)} moves")
    return 0


def _data(args: argparse.Namespace) -> int:
    from bosen.apps import datasets

    where = args.out or datasets.DEFAULT_ROOT / args.name
    try:
        meta = datasets.prepare(args.name, args.out, libsvm=args.libsvm)
    except OSError as e:
        raise BosenError(f"cannot write {where}: {e.strerror or e}") from None
    shape = ", ".join(f"{k} {v}" for k, v in meta.items() if isinstance(v, int))
    print(f"{args.name}: {shape}; files in {where}: {', '.join(meta['files'].values())} "
          f"({meta['seconds']:.1f}s)")
    return 0


def _examples(args: argparse.Namespace) -> int:
    if args.name is None:
        print(examples.listing())
        print("bosen launch NAME runs one; bosen examples NAME [DIR] copies it to edit")
        return 0
    print(f"{examples.copy(args.name, args.dir)}: edit it, then bosen launch it")
    return 0


def _keys(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    files = make_keys(folder, args.clients)
    print("\n".join(f"  {f}" + ("  (secret: mode 0600)" if f.name.endswith("_secret") else "") for f in files))
    clients = ", ".join(f.name for f in files if f.name.startswith("client-") and f.name.endswith("_secret"))
    print(f"""Copy {folder / 'server.key_secret'} to the servers' machines only, and one of {clients} to each
worker machine. Then in the job's config (paths relative to the config file):
security:
  server_key: {folder / 'server.key'}            # servers read {folder / 'server.key_secret'} beside it
  client_key: {folder / 'client-0.key_secret'}   # this machine's client key (--set security.client_key=...)
  allowed_clients: [{folder / 'clients'}]        # the public keys servers accept""")
    return 0


def _tables(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bosen.jobs import app_tables

    cfg = config_mod.load(examples.resolve(args.config), args.set)  # a file, or an example's name
    if not cfg.app.tables:
        raise BosenError(f"{cfg.source}: app.tables is not set: the YAML's tables are all there is")
    out = Path(args.out)
    resolved = app_tables.resolve(cfg, out / "tables")
    try:
        config_mod.dump(resolved, out / "config.yaml")
    except OSError as e:
        raise BosenError(f"cannot write {out / 'config.yaml'}: {e.strerror or e}") from None
    shapes = ", ".join(f"{t.name} {t.rows}x{t.cols}" for t in resolved.tables)
    print(f"{out / 'config.yaml'}: tables {shapes}; start servers and workers from it")
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    import signal
    import threading

    from bosen.jobs.dashboard import Dashboard
    from bosen.jobs.jobview import JobView

    target = args.target if Path(args.target).exists() else str(examples.resolve(args.target))
    view = JobView(target)
    stop = threading.Event()
    # explicit handlers: SIGINT arrives ignored in a background job, and SIGTERM should close cleanly
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Dashboard(view, args.host, args.port) as board:
            print(f"dashboard of {view.title} on {board.url} (Ctrl-C stops it)", flush=True)
            while not stop.wait(3600):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        view.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bosen", description="Bösen parameter server tools.")
    sub = p.add_subparsers(dest="command", required=True)
    lp = sub.add_parser("launch", help="run a job locally: servers plus worker processes")
    lp.add_argument("config", help="a config file, or the name of an example (bosen examples lists them)")
    lp.add_argument("--workers", type=int, default=None, help="worker processes (default: cluster.workers)")
    lp.add_argument("--servers", type=int, default=None,
                    help="server processes on free local ports, replacing cluster.servers (one per 4 workers "
                         "serves a managed-communication job: README, 'How many servers')")
    lp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    lp.add_argument("--run-dir", default=None, help="where logs and metrics go (default: runs/APP-TIME)")
    lp.add_argument("--timeout", type=float, default=None, help="stop the job after this many seconds")
    lp.add_argument("--quiet", action="store_true", help="no progress lines")
    lp.add_argument("--no-plot", action="store_true", help="skip objective.png")
    lp.add_argument("--resume", default=None, metavar="RUN_DIR",
                    help="go on with the job of RUN_DIR from its newest complete checkpoint")
    lp.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                    help="run servers and workers as Ray actors: on the cluster at ADDRESS (`ray start --head` "
                         "prints it; `auto` finds a local one), or on a local Ray started for the job")
    lp.set_defaults(fn=_launch)
    sp = sub.add_parser("status", help="print each server's clocks, partitions, rows and traffic; given a run "
                                       "directory, also the micro-tasks each worker holds")
    sp.add_argument("config", help="the job's config, or its run directory")
    sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sp.add_argument("--timeout", type=float, default=3.0)
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=_status)
    cp = sub.add_parser("scale", help="a running job (started by bosen launch) gains or loses worker processes "
                                      "(micro-tasks move at a clock boundary) or server processes (partitions move)")
    cp.add_argument("target", metavar="RUN_DIR", help="the job's run directory (or its config.yaml there)")
    cp.add_argument("--workers", type=int, default=None, help="worker processes the job should have")
    cp.add_argument("--servers", type=int, default=None, help="server processes the job should have (new ones "
                                                               "take a fair share of the partitions; the last ones "
                                                               "leave first)")
    cp.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    cp.set_defaults(fn=_scale)
    hp = sub.add_parser("schedule", help="Pollux's scheduler: running jobs (started by bosen launch) share W worker "
                                         "slots; every interval each gets the workers that maximise the fitness of "
                                         "their speed-ups (bosen scale moves them), until every job has ended")
    hp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="the jobs' run directories")
    hp.add_argument("--slots", type=int, required=True, help="worker slots the jobs share (W)")
    hp.add_argument("--interval", type=float, default=30.0, help="seconds between decisions (default 30)")
    hp.add_argument("--p", type=float, default=-1.0, help="the fitness's power (-1: fair, 1: the mean speed-up)")
    hp.add_argument("--delay", type=float, default=6.0, help="seconds a move costs a job (the re-allocation "
                                                             "penalty's delta; default 6)")
    hp.set_defaults(fn=_schedule)
    dp = sub.add_parser("data", help="prepare a real data set that ships in a package (no network)")
    dp.add_argument("name", choices=DATASET_NAMES)
    dp.add_argument("--out", default=None, help="directory to write (default: data/NAME)")
    dp.add_argument("--libsvm", action="store_true", help="image sets: libsvm text files too")
    dp.set_defaults(fn=_data)
    tp = sub.add_parser("tables", help="declare the app's tables from its model (app.tables) into a full config")
    tp.add_argument("config", help="a config file, or the name of an example")
    tp.add_argument("--out", required=True, help="directory for config.yaml and the tables' initial values")
    tp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    tp.set_defaults(fn=_tables)
    kp = sub.add_parser("keys", help="make CURVE key pairs: one for the servers, --clients N for clients "
                                     "(security: section, README 'Running on several machines')")
    kp.add_argument("dir", help="folder for the key files (created; existing keys are never overwritten)")
    kp.add_argument("--clients", type=int, default=1, help="client key pairs to make (default 1)")
    kp.set_defaults(fn=_keys)
    ep = sub.add_parser("examples", help="list the example configs shipped in the package, or copy one")
    ep.add_argument("name", nargs="?", default=None, help="the example to copy")
    ep.add_argument("dir", nargs="?", default=".", help="where to copy it (default: this folder)")
    ep.set_defaults(fn=_examples)
    bp = sub.add_parser("dashboard", help="a web page of a job: objective, workers' clocks and blocked time, "
                                          "servers' traffic, partitions, checkpoints; live while it runs")
    bp.add_argument("target", metavar="RUN_DIR|CONFIG", help="the job's run directory (while it runs and after), "
                                                               "or its config (the servers' STATUS only)")
    bp.add_argument("--port", type=int, default=8600, help="the page's port (0: any free one; default 8600)")
    bp.add_argument("--host", default="127.0.0.1", help="the address to serve on (default 127.0.0.1: this "
                                                        "machine only)")
    bp.set_defaults(fn=_dashboard)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except (BosenError, ValueError) as e:
        print(f"bosen {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
