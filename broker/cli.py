"""``halfmq`` command line: ``halfmq broker|namesrv [-c FILE] [--KEY=VALUE ...]``, ``halfmq cluster ...``,
``halfmq admin ...``."""
from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import importlib.metadata
import logging
import os
import signal
import sys

from halfmq.store import CorruptStoreError, StoreLockedError

from .acl import AclConfigError
from .config import ConfigError, load_config
from .listen import StartError
from .loop import new_event_loop
from .server import Broker

log = logging.getLogger("halfmq")


def settle_garbage_collector() -> None:
    """Once started: what exists now lives as long as the process, so the cyclic collector stops walking it
    (gc.freeze); and collections wait for 10,000 new container objects instead of 700, so a request's objects are
    mostly freed by reference counting before one runs. Measured on a started broker: a full collection walked its
    39k objects in 23 ms (0.004 ms frozen), and the default thresholds ran 3 of them and 350 young ones per 35k sends
    (1 KiB, 64 in flight)."""
    gc.freeze()
    gc.set_threshold(10_000, 20, 100)


def store_path_error(exc: OSError, store_dir: str) -> StartError | None:
    """An OSError about the store folder, one of its parents or a file in it, as one line naming the key to fix
    (a bare ``[Errno 2] No such file or directory: '/data'`` does not say which setting named that folder)."""
    if exc.filename is None:
        return None
    store = os.path.abspath(store_dir)
    failed = os.path.abspath(os.fsdecode(exc.filename))
    if store == failed or store.startswith(failed.rstrip(os.sep) + os.sep) or failed.startswith(store + os.sep):
        return StartError(f"storePathRootDir={store_dir}: cannot create or open {failed}: "
                          f"{exc.strerror or exc}")
    return None


def stop_on_signals() -> asyncio.Event:
    """An event that SIGINT or SIGTERM sets (handlers of the running loop): what a server waits on to stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def run_broker(config) -> None:
    broker = Broker(config)
    stop = stop_on_signals()
    try:
        await broker.start()
    except OSError as exc:
        raise store_path_error(exc, config.storePathRootDir) or exc
    settle_garbage_collector()
    # Always printed, whatever logLevel: scripts and supervisors wait for this line.
    print(f"halfmq ready: broker {broker.addr} namesrv {broker.namesrv_addr or '-'} "
          f"metrics {broker.metrics_addr or '-'} grpc {broker.grpc_addr or '-'} "
          f"dashboard {broker.dashboard_addr or '-'}", flush=True)
    await stop.wait()
    await broker.stop()


def _serve(prog: str, description: str, epilog: str, load, run, argv: list[str]) -> int:
    """The broker's and the name server's command line alike: ``-c FILE`` and ``--KEY=VALUE`` flags loaded by
    ``load``, logging at the configured level, ``run(config)`` on the event loop; exit 2 for a configuration error,
    1 when it cannot start (each one line naming what to fix), 0 after a clean stop."""
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog)
    parser.add_argument("-c", "--config", help="a properties file (Java properties, RocketMQ key names)")
    args, rest = parser.parse_known_args(argv)
    try:
        config = load(args.config, rest)
    except ConfigError as exc:
        print(f"halfmq: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.logLevel, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loop = new_event_loop()
    try:
        loop.run_until_complete(run(config))
    except (ConfigError, AclConfigError) as exc:
        print(f"halfmq: configuration error: {exc}", file=sys.stderr)
        return 2
    except (StoreLockedError, CorruptStoreError, StartError, OSError) as exc:
        print(f"halfmq: cannot start: {exc}", file=sys.stderr)
        return 1
    finally:
        loop.close()
    return 0


def broker_main(argv: list[str]) -> int:
    return _serve("halfmq broker", "Run the halfmq broker.",
                  "Any configuration key can be given as --KEY=VALUE; see conf/broker.conf.", load_config, run_broker,
                  argv)


async def serve_until_signalled(server, ready) -> None:
    """Start ``server``, print ``ready()`` (scripts and supervisors wait for the line) and stop it on SIGINT or
    SIGTERM: how the name server and the dashboard run as processes of their own."""
    stop = stop_on_signals()
    await server.start()
    print(ready(), flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


async def run_namesrv(config) -> None:
    from .namesrv.server import NameServer
    server = NameServer(config)
    await serve_until_signalled(server, lambda: f"halfmq namesrv ready: {server.addr}")


def namesrv_main(argv: list[str]) -> int:
    from .namesrv.config import load_namesrv_config
    return _serve("halfmq namesrv", "Run a standalone halfmq name server.",
                  "Any key of broker/namesrv/config.py can be given as --KEY=VALUE, e.g. --listenPort=9876; "
                  "HALFMQ_NAMESRV_<KEY> variables too.", load_namesrv_config, run_namesrv, argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: halfmq broker [-c FILE] [--KEY=VALUE ...]\n       halfmq namesrv [-c FILE] [--KEY=VALUE ...]\n"
              "       halfmq cluster [--namesrvs N] [--brokers N] [--dir DIR] ... [-- BROKER FLAGS]\n"
              "       halfmq dashboard -n NAMESRV [--dashboardPort=8080] ...\n"
              "       halfmq admin COMMAND [-n NAMESRV] ...\n       halfmq --version")
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"halfmq {importlib.metadata.version('halfmq')}")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "broker":
        return broker_main(rest)
    if command == "namesrv":
        return namesrv_main(rest)
    if command == "cluster":
        from .local_cluster import cluster_main
        return cluster_main(rest)
    if command == "dashboard":
        # The dashboard is a client of the brokers too (halfmq.dashboard), handed over to by name as admin is.
        # It runs as the name server does (serve_until_signalled): the dashboard may not import the broker package.
        return importlib.import_module("halfmq.dashboard.cli").main(rest, serve_until_signalled)
    if command == "admin":
        # The admin tool is a client of the broker; the one `halfmq` entry point hands over to it by name, so the
        # broker package itself never depends on the client package.
        return importlib.import_module("halfmq.client.admin_cli").main(rest)
    print(f"halfmq: unknown command {command!r} (try: halfmq broker, halfmq namesrv, halfmq cluster, halfmq dashboard, halfmq admin)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
