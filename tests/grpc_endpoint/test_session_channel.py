"""A gRPC session is the channel of its halves (check_back writes their checks to it), so its end strands their
checks as a remoting connection's close does: check_back hears of both through ``ProducerRegistry.channel_closed``."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

pytest.importorskip("h2")


@pytest.mark.parametrize("other_producer", [False, True])
def test_a_check_a_session_left_unanswered_goes_to_its_groups_next_producer(other_producer):
    from halfmq.broker.grpc.sessions import ClientSession, UnreadTotal
    from halfmq.broker.services.check_back import CheckBackService

    session = ClientSession("c1", "address 127.0.0.1", "127.0.0.1:5000", "PYTHON", 1 << 20, 1 << 20, "b1",
                            UnreadTotal(1 << 20))
    checked = time.monotonic() + 1  # after anything the session said
    made_due = []
    live = [object()] if other_producer else []
    service = SimpleNamespace(waiting_for_producer={}, _last_check={7: (lambda: session, checked, "%GRPC%T"),
                                                                    8: (lambda: None, checked, "%GRPC%T")},
                              states=SimpleNamespace(make_due=made_due.append),
                              ctx=SimpleNamespace(producers=SimpleNamespace(live_channels=lambda group: live)))
    CheckBackService.channel_closed(service, session)
    if other_producer:  # another producer of the group answers it now
        assert made_due == [[7]] and service.waiting_for_producer == {}
    else:  # the group's next producer does (producer_registered)
        assert made_due == [] and service.waiting_for_producer == {"%GRPC%T": {7}}
        CheckBackService.producer_registered(service, "%GRPC%T", None)
        assert made_due == [[7]]
