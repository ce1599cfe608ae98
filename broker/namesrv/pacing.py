"""How often one connection may register a broker with a name server.

A registration carries the broker's whole topic table (up to ``namesrvMaxTopicsPerBroker`` topics, megabytes of
JSON) and is parsed in full; with ACL off anyone may send one. Each connection gets a token bucket, so one client
sending registrations as fast as it can costs the name server a bounded share of its time and other brokers are
still heard. A broker's own Registrar (registration.py) never registers more than once per
``MIN_REGISTER_GAP_S`` on a link, well inside the bucket."""
from __future__ import annotations

import time

REGISTRATIONS_PER_SECOND = 20.0
BURST = 40  #: a broker's start and a burst of topic changes pass at once


class RegistrationPace:
    """Token buckets of the connections that registered, forgotten when they close."""

    def __init__(self, rate: float = REGISTRATIONS_PER_SECOND, burst: int = BURST):
        self.rate, self.burst = rate, burst
        self._buckets: dict[object, tuple[float, float]] = {}  # channel -> (tokens, when counted)

    def allow(self, channel) -> bool:
        now = time.monotonic()
        tokens, then = self._buckets.get(channel, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        if tokens < 1.0:
            self._buckets[channel] = (tokens, now)
            return False
        self._buckets[channel] = (tokens - 1.0, now)
        return True

    def forget(self, channel) -> None:
        self._buckets.pop(channel, None)
