"""A client connection as the rest of the broker sees it: an address, a writer, liveness, and how far its reader is
behind (``unread_bytes``: what the broker wrote that the client has not shown it took)."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time

from halfmq.protocol.command import RemotingCommand

log = logging.getLogger(__name__)
_ids = itertools.count(1)
#: Answers are gathered for one write per loop iteration, but never more than this many bytes: then they are written
#: at once, so the transport's write buffer (and its pause_writing) sees a large answer as soon as it exists.
FLUSH_AT = 256 << 10


class Channel:
    """Wraps one transport. Processors answer through it; services (check-back, notifications) call clients
    back through it.

    Attributes:
        remote: the peer's "ip:port".
        closed: set once the connection is gone; writes then do nothing.
    """

    __slots__ = ("id", "transport", "remote", "closed", "last_active", "client_id", "_opaque", "_pending",
                 "_pending_size", "_callback_bytes", "_callback_since", "sender", "__weakref__")

    def __init__(self, transport, remote: str):
        self.id = next(_ids)
        self.transport = transport
        self.remote = remote
        self.closed = False
        self.last_active = time.monotonic()
        self.client_id: str | None = None  # set by the client's heartbeat
        #: who its sends are made as (processors/send.py ``RemotingSender``), kept while they are made alike
        self.sender = None
        self._opaque = itertools.count(1 << 20)
        self._pending: list[bytes] | None = None
        self._pending_size = 0
        # Broker-initiated requests (check-backs) written since the client last sent anything: a client that reads
        # them answers (END_TRANSACTION) or at least heartbeats; one that does not, did not read them.
        self._callback_bytes = 0
        self._callback_since = 0.0

    @property
    def writable(self) -> bool:
        return not self.closed and not self.transport.is_closing()

    @property
    def unread_bytes(self) -> int:
        """Bytes written to this client that it has not shown it read: the transport's write buffer and answers not
        handed to it yet, plus the broker's own requests (check-backs) sent since the client last sent anything.

        The socket buffers on both ends hide a stalled reader (a SIGSTOPped producer's kernel still takes a few
        hundred KiB), so the broker's own requests count as unread until the client speaks again.
        """
        unread = self._pending_size + self.transport.get_write_buffer_size()
        if self._callback_bytes and self.last_active < self._callback_since:
            unread += self._callback_bytes
        return unread

    def heard_since(self, when: float) -> bool:
        """True if the client sent anything after ``when`` (time.monotonic())."""
        return self.last_active > when

    def send(self, cmd: RemotingCommand) -> bool:
        """Write a command; True if it was handed to the transport.

        Writes made in one loop iteration (say, the answers to one group commit) leave together.
        """
        if not self.writable:
            return False
        head = cmd.encode_head()  # first: a header that cannot be framed raises before anything is queued
        pending = self._pending
        if pending is None:
            pending = self._pending = []
            asyncio.get_running_loop().call_soon(self.flush)
        # Head and body go out as separate buffers: a pull's megabyte of records is never copied again here.
        pending.append(head)
        size = self._pending_size + len(head)
        if cmd.body:
            pending.append(cmd.body)
            size += len(cmd.body)
        self._pending_size = size
        if size > FLUSH_AT:
            self.flush()
        return True

    def flush(self) -> None:
        """Write what is pending now."""
        pending, self._pending = self._pending, None
        self._pending_size = 0
        if pending and not self.transport.is_closing():
            self.transport.writelines(pending)

    def send_request(self, cmd: RemotingCommand) -> bool:
        """Write a broker-initiated request with an opaque from this channel's own counter."""
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        if not self.send(cmd):
            return False
        now = time.monotonic()
        if self.last_active >= self._callback_since:  # the client spoke since the last ones: count afresh
            self._callback_bytes = 0
            self._callback_since = now
        self._callback_bytes += len(cmd.body) + 64
        return True

    def close(self) -> None:
        if not self.closed:
            self.transport.close()

    def __repr__(self) -> str:
        return f"Channel#{self.id}({self.remote}{', closed' if self.closed else ''})"
