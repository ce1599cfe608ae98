"""``halfmq dashboard -n <name servers>``: the dashboard of a cluster, as a process of its own."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from .server import DashboardServer
from .settings import DashboardSettings


def parse(argv: list[str]) -> DashboardSettings:
    parser = argparse.ArgumentParser(prog="halfmq dashboard", description="Serve the halfmq dashboard of a cluster.")
    parser.add_argument("-n", "--namesrv", required=True, help="name servers, HOST:PORT;HOST:PORT (or one broker's "
                                                               "address: it answers routes too)")
    parser.add_argument("--dashboardPort", type=int, default=8080, help="HTTP port (0 = any free port)")
    parser.add_argument("--dashboardBindAddress", default="", help="interface to listen on; empty = 127.0.0.1 "
                                                                   "unless --aclEnable=true, then 0.0.0.0")
    parser.add_argument("--aclEnable", choices=("true", "false"), default="false",
                        help="the brokers check ACL: only their admin accounts may sign in")
    parser.add_argument("--logLevel", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    args = parser.parse_args(argv)
    if not 0 <= args.dashboardPort <= 65535:
        parser.error(f"--dashboardPort: {args.dashboardPort} is outside 0..65535")
    acl = args.aclEnable == "true"
    logging.basicConfig(level=args.logLevel, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return DashboardSettings(namesrv=args.namesrv, host=args.dashboardBindAddress or ("0.0.0.0" if acl else
                                                                                      "127.0.0.1"),
                             port=args.dashboardPort, acl=acl)


def main(argv: list[str], serve_until_signalled) -> int:
    """``serve_until_signalled(server, ready)``: how the ``halfmq`` command runs a server until SIGINT or SIGTERM."""
    settings = parse(argv)
    server = DashboardServer(settings)
    try:
        asyncio.run(serve_until_signalled(server, lambda: f"halfmq dashboard ready: http://{server.addr}/"))
    except OSError as exc:
        print(f"halfmq: cannot start the dashboard: --dashboardPort={settings.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0
