"""The Docker image's health check: does this container's broker answer on the port it was configured with?

``python -m halfmq.broker.health`` finds the running ``halfmq broker`` process in /proc and loads the
configuration that process loaded — its config file, its ``HALFMQ_`` environment and its ``--KEY=VALUE`` flags —
then connects to its ``listenPort``. A fixed port in the HEALTHCHECK showed healthy or not by that port alone: a
container given another ``listenPort`` (in broker.conf, by ``-e HALFMQ_listenPort`` or as a flag after the image
name) was reported unhealthy while it served. Exit status 0 = healthy, 1 = not; the one line printed says why
(``docker inspect`` keeps it in ``.State.Health.Log``).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from .config import WILDCARDS, BrokerConfig, ConfigError, load_config

#: argv entries that start the broker: the console script, or ``python -m halfmq.broker.cli``.
_LAUNCHERS = ("halfmq", "halfmq.broker.cli")


class NotHealthy(Exception):
    pass


def broker_argv(cmdline: list[str]) -> list[str] | None:
    """The arguments after ``broker`` when ``cmdline`` runs ``halfmq broker ...``, else None."""
    for i, arg in enumerate(cmdline[:-1]):
        if os.path.basename(arg) in _LAUNCHERS and cmdline[i + 1] == "broker":
            return cmdline[i + 2:]
    return None


def find_broker(proc: Path = Path("/proc")) -> tuple[Path, list[str]]:
    """The /proc folder and broker arguments of the lowest pid whose command line runs ``halfmq broker``: in the
    image, the init (tini) that started the broker with the same arguments and environment, or else the broker."""
    pids = sorted(int(entry.name) for entry in proc.iterdir() if entry.name.isdigit())
    for pid in pids:
        try:
            cmdline = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile, or another user's
            continue
        argv = broker_argv([arg.decode(errors="replace") for arg in cmdline if arg])
        if argv is not None:
            return proc / str(pid), argv
    raise NotHealthy("no halfmq broker process is running")


def broker_config(process: Path, argv: list[str]) -> BrokerConfig:
    """The configuration the broker at ``process`` loaded, read the way ``halfmq broker`` reads it."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-c", "--config")
    args, flags = parser.parse_known_args(argv)
    environ = dict(entry.split("=", 1) for entry in
                   (process / "environ").read_bytes().decode(errors="replace").split("\0") if "=" in entry)
    path = args.config
    if path and not os.path.isabs(path):
        path = os.path.join(os.readlink(process / "cwd"), path)
    try:
        return load_config(path, flags, environ)
    except ConfigError as exc:
        raise NotHealthy(f"the broker's configuration does not load: {exc}") from None


def check(config: BrokerConfig, timeout: float = 2.0) -> str:
    """Connect to the broker port; returns the address answered, raises NotHealthy naming it."""
    if config.listenPort == 0:
        raise NotHealthy("listenPort=0 (any free port): set a fixed listenPort for the health check to use")
    host = "127.0.0.1" if config.bindAddress in WILDCARDS else config.bindAddress
    address = f"[{host}]:{config.listenPort}" if ":" in host else f"{host}:{config.listenPort}"
    try:
        socket.create_connection((host, config.listenPort), timeout).close()
    except OSError as exc:
        raise NotHealthy(f"the broker does not answer on {address} (listenPort): {exc}") from None
    return address


def main() -> int:
    try:
        process, argv = find_broker()
        address = check(broker_config(process, argv))
    except (NotHealthy, OSError) as exc:
        print(f"unhealthy: {exc}")
        return 1
    print(f"healthy: the broker answers on {address}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
