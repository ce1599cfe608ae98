"""What a connection owes for the requests refused for their size: a refusal that cost the broker work in
proportion to a size (a telemetry command grpc copied whole, a gzip body inflated to maxMessageSize before it was
found too large) is paid for by the connection at refusedRequestBytesPerSecond, as the remoting door reads the rest
of a refused frame at that rate. One RefusedBytes per endpoint (GrpcEndpoint.refused), keyed by the caller's
address.

Measured before: bench_hostile's grpc_gzip_bomb (a 191 KiB body inflating past maxMessageSize, sent again as soon
as it was refused) kept the event loop inflating: the good remoting client's sends fell from about 40,000 to 7,700
in 8 s and its p99 rose from 11 to 53 ms.
"""
from __future__ import annotations

import asyncio
import time


class RefusedBytes:
    """Per connection (the caller's host:port), the time until which its refused bytes are being paid for."""

    def __init__(self, bytes_per_second: int):
        self.rate = bytes_per_second
        self._until: dict[str, float] = {}

    def charge(self, peer: str, size: int) -> None:
        now = time.monotonic()
        if len(self._until) > 1024:  # paid debts go: what is kept is the connections paying now
            self._until = {p: t for p, t in self._until.items() if t > now}
        self._until[peer] = max(self._until.get(peer, now), now) + size / self.rate

    async def pay(self, peer: str, size: int) -> None:
        """Charge ``peer`` ``size`` bytes and return once it owes nothing."""
        self.charge(peer, size)
        await self.paid(peer)

    async def paid(self, peer: str) -> None:
        """Return once ``peer`` owes nothing (at once, the usual case)."""
        until = self._until.get(peer)
        if until is None:
            return
        left = until - time.monotonic()
        if left > 0:
            await asyncio.sleep(left)
        elif self._until.get(peer) == until:
            del self._until[peer]
