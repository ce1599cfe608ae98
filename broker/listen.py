"""Listening sockets, as the broker and the standalone name server open them: the address a socket is bound to, and
a bind failure as one line naming the setting to change."""
from __future__ import annotations

import asyncio
import errno
import socket


def format_address(sockname) -> str:
    """HOST:PORT of a bound socket, [HOST]:PORT for IPv6: what the ready line prints, the address really bound."""
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class StartError(Exception):
    """The broker cannot start for a reason outside its configuration file's syntax (a port in use)."""


def bind_error(setting: str, host: str, port: int, exc: OSError) -> StartError:
    """One line naming the setting and the port: what an operator needs to fix a failed bind."""
    where = f"{host or '*'}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return StartError(f"{setting}={port}: port {port} is already in use on {host or 'every interface'} "
                          f"(another broker running? set {setting} to a free port, or 0 for any)")
    if exc.errno == errno.EACCES:
        return StartError(f"{setting}={port}: no permission to listen on {where} (ports below 1024 need privileges)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return StartError(f"{setting}={port}: cannot listen on {where}: {host} is not an address of this host "
                          f"(bindAddress)")
    return StartError(f"{setting}={port}: cannot listen on {where}: {exc.strerror or exc}")


async def listen(loop, factory, host: str, port: int, tls, setting: str) -> asyncio.base_events.Server:
    """Listen on ``host``. ``::`` is dual stack (IPv4 and IPv6 on one port): asyncio alone would make it
    IPv6-only (it sets IPV6_V6ONLY), so that socket is made here.

    Raises:
        StartError: the port cannot be bound (in use, no permission); names ``setting`` and the port.
    """
    try:
        if host == "::" and socket.has_dualstack_ipv6():
            sock = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1024)
            return await loop.create_server(factory, sock=sock, ssl=tls)
        return await loop.create_server(factory, host, port, reuse_address=True, ssl=tls)
    except OSError as exc:
        raise bind_error(setting, host, port, exc) from None
