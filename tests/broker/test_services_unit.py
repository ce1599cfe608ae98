"""The broker's services alone: no socket, no broker, no store. Each test drives one service through its own
methods with plain stand-ins for what the rest of the broker hands it (a channel is any object with ``writable``),
so a rule of the service is pinned where it lives, in milliseconds."""
from __future__ import annotations

import asyncio

import pytest

from halfmq.broker.errors import BrokerError
from halfmq.broker.services.clients import ClientInfo, ProducerRegistry, parse_subscription
from halfmq.broker.services.long_poll import ANY_QUEUE, HeldPull, LongPollService
from halfmq.protocol.codes import ResponseCode
from halfmq.protocol.message import tags_hash


class FakeChannel:
    """What the registries ask of a connection: is it still writable."""

    def __init__(self, name: str, writable: bool = True):
        self.name, self.writable = name, writable

    def __repr__(self) -> str:
        return self.name


# --- LongPollService --------------------------------------------------------------------------------------------
async def test_a_held_pull_wakes_when_its_queue_grows_past_its_offset_and_not_before():
    service, channel = LongPollService(), FakeChannel("c")
    woken = service.hold(HeldPull("T", 1, offset=5, channel=channel), timeout_s=60)
    service.on_arrival("T", 1, 5)  # the queue holds offsets below 5: nothing new for this pull
    service.on_arrival("T", 2, 9)  # another queue
    assert not woken.done() and service.total == 1
    service.on_arrival("T", 1, 6)
    assert woken.done() and woken.result() is True
    assert service.total == 0 and not service.held and not service.by_channel


async def test_a_pull_for_any_queue_of_its_topic_wakes_on_any_arrival_or_wake_topic():
    service = LongPollService()
    first = service.hold(HeldPull("T", ANY_QUEUE, offset=-1, channel=FakeChannel("a")), timeout_s=60)
    second = service.hold(HeldPull("T", ANY_QUEUE, offset=-1, channel=FakeChannel("b")), timeout_s=60)
    service.on_arrival("T", 3, 1)
    assert first.done() and second.done()
    third = service.hold(HeldPull("T", ANY_QUEUE, offset=-1, channel=FakeChannel("c")), timeout_s=60)
    service.wake_topic("T")
    assert third.done() and service.total == 0


async def test_held_pulls_are_bounded_per_connection_and_in_all():
    service, channel = LongPollService(max_per_connection=2, max_total=3), FakeChannel("c")
    for offset in range(2):
        service.hold(HeldPull("T", 0, offset, channel), timeout_s=60)
    with pytest.raises(BrokerError) as refused:
        service.hold(HeldPull("T", 0, 9, channel), timeout_s=60)
    assert refused.value.code == ResponseCode.SYSTEM_BUSY and "longPollingMaxHeldPerConnection=2" in refused.value.remark
    service.hold(HeldPull("T", 0, 0, FakeChannel("other")), timeout_s=60)
    with pytest.raises(BrokerError) as refused:
        service.hold(HeldPull("T", 0, 0, FakeChannel("third")), timeout_s=60)
    assert "longPollingMaxHeld=3" in refused.value.remark
    service.release_all()


async def test_a_held_pull_is_answered_at_its_timeout():
    service = LongPollService()
    woken = service.hold(HeldPull("T", 0, 0, FakeChannel("c")), timeout_s=0.01)
    assert await asyncio.wait_for(woken, 5) is True
    assert service.total == 0


async def test_a_closed_connections_pulls_are_cancelled_and_others_kept():
    service, gone, kept = LongPollService(), FakeChannel("gone"), FakeChannel("kept")
    cancelled = [service.hold(HeldPull("T", 0, n, gone), timeout_s=60) for n in range(3)]
    waiting = service.hold(HeldPull("T", 0, 0, kept), timeout_s=60)
    service.channel_closed(gone)
    assert all(f.cancelled() for f in cancelled) and not waiting.done()
    assert service.total == 1 and list(service.by_channel) == [kept]
    service.drop(next(iter(service.held[("T", 0)])))
    assert service.total == 0 and not service.held


# --- ProducerRegistry and subscriptions -----------------------------------------------------------------------------
def test_the_sender_is_chosen_while_it_is_writable_else_another_live_producer():
    registry = ProducerRegistry()
    sender, other, stalled = FakeChannel("sender"), FakeChannel("other"), FakeChannel("stalled", writable=False)
    for channel in (sender, other, stalled):
        registry.register("G", ClientInfo(f"id-{channel.name}", channel, 0, 0))
    assert registry.select("G", preferred=sender) is sender
    sender.writable = False
    assert {registry.select("G", preferred=sender) for _ in range(4)} == {other}
    assert registry.find_by_client_id("G", "id-other") is other
    assert registry.find_by_client_id("G", "id-sender") is None  # not writable
    registry.channel_closed(other)
    assert registry.select("G") is None and registry.live_channels("G") == []


def test_every_registration_is_a_sign_of_life_the_listeners_hear():
    registry, heard = ProducerRegistry(), []
    registry.register_listeners.append(lambda group, channel: heard.append((group, channel.name)))
    channel = FakeChannel("c")
    registry.register("G", ClientInfo("id", channel, 0, 0))
    registry.register("G", ClientInfo("id", channel, 0, 0))  # a heartbeat on the same connection
    assert heard == [("G", "c"), ("G", "c")]


def test_producers_not_heard_from_expire():
    registry = ProducerRegistry()
    registry.register("G", ClientInfo("old", FakeChannel("old"), 0, 0, last_update=10.0))
    registry.register("G", ClientInfo("new", FakeChannel("new"), 0, 0, last_update=20.0))
    registry.expire(older_than=15.0)
    assert [info.client_id for info in registry.groups["G"].values()] == ["new"]


@pytest.mark.parametrize("expression, tags", [("*", None), ("", None), (None, None), ("a || b", {"a", "b"}),
                                              (" a ||  ", {"a"}), ("||", None)])
def test_a_tag_expression_becomes_the_tags_and_their_codes(expression, tags):
    sub = parse_subscription("T", expression)
    assert sub.tags == (frozenset(tags) if tags else None)
    assert sub.tag_codes == (frozenset(tags_hash(t) for t in tags) if tags else None)
