"""The sink's broker calls, against a real broker (no Spark needed)."""
from __future__ import annotations

import socket

import pytest

from halfmq.client.errors import ClientError
from halfmq.pipeline.sink_io import batch_committed, mark_batch_committed


def unused_loopback_addr() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_batch_counts_as_committed_only_on_the_brokers_word(live_broker):
    assert batch_committed(live_broker.namesrv_addr, "sink-a", 7) is False
    mark_batch_committed(live_broker.namesrv_addr, "PG_SINK", "sink-a", 7)
    assert batch_committed(live_broker.namesrv_addr, "sink-a", 7) is True
    assert batch_committed(live_broker.namesrv_addr, "sink-b", 7) is False
    # No answer is not "not committed": publishing the batch again could duplicate it.
    with pytest.raises(ClientError):
        batch_committed(unused_loopback_addr(), "sink-a", 8)
