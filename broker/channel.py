"""A client connection as the rest of the broker sees it: an address, a writer, and liveness."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time

from halfmq.protocol.command import RemotingCommand

log = logging.getLogger(__name__)
_ids = itertools.count(1)


class Channel:
    """Wraps one transport. Processors answer through it; services (check-back, notifications) call clients
    back through it.

    Attributes:
        remote: the peer's "ip:port".
        closed: set once the connection is gone; writes then do nothing.
    """

    __slots__ = ("id", "transport", "remote", "closed", "last_active", "client_id", "_opaque", "_pending",
                 "__weakref__")

    def __init__(self, transport, remote: str):
        self.id = next(_ids)
        self.transport = transport
        self.remote = remote
        self.closed = False
        self.last_active = time.monotonic()
        self.client_id: str | None = None  # set by the client's heartbeat
        self._opaque = itertools.count(1 << 20)
        self._pending: list[bytes] | None = None

    @property
    def writable(self) -> bool:
        return not self.closed and not self.transport.is_closing()

    def send(self, cmd: RemotingCommand) -> bool:
        """Write a command; True if it was handed to the transport.

        Writes made in one loop iteration (say, the answers to one group commit) leave together.
        """
        if not self.writable:
            return False
        pending = self._pending
        if pending is None:
            pending = self._pending = []
            asyncio.get_running_loop().call_soon(self.flush)
        # Head and body go out as separate buffers: a pull's megabyte of records is never copied again here.
        pending.append(cmd.encode_head())
        if cmd.body:
            pending.append(cmd.body)
        return True

    def flush(self) -> None:
        """Write what is pending now."""
        pending, self._pending = self._pending, None
        if pending and not self.transport.is_closing():
            self.transport.writelines(pending)

    def send_request(self, cmd: RemotingCommand) -> bool:
        """Write a broker-initiated request with an opaque from this channel's own counter."""
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        return self.send(cmd)

    def close(self) -> None:
        if not self.closed:
            self.transport.close()

    def __repr__(self) -> str:
        return f"Channel#{self.id}({self.remote}{', closed' if self.closed else ''})"
