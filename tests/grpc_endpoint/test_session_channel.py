"""A gRPC session is the channel of its halves (check_back writes their checks to it), so it answers what a remoting
``Channel`` does: check_back's ``producer_registered`` asks every sender whether it is ``closed``."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("h2")


async def test_a_session_is_closed_while_it_has_no_live_telemetry_stream():
    from halfmq.broker.grpc.sessions import ClientSession, UnreadTotal
    from halfmq.broker.services.check_back import CheckBackService

    session = ClientSession("c1", "address 127.0.0.1", "127.0.0.1:5000", "PYTHON", 1 << 20, 1 << 20, "b1",
                            UnreadTotal(1 << 20))
    assert session.closed
    outbox = session.attach()
    assert not session.closed
    session.detach(outbox)
    assert session.closed
    # a check written to it before its stream ended is made again once its group registers a producer
    made_due = []
    service = SimpleNamespace(waiting_for_producer={}, _last_check={7: (lambda: session, 0, "%GRPC%T")},
                              states=SimpleNamespace(make_due=made_due.append))
    CheckBackService.producer_registered(service, "%GRPC%T", None)
    assert made_due == [[7]]
