"""One half that cannot be turned into a check never stops the check-back for the others (issue 23)."""
from __future__ import annotations

import asyncio
import logging

from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode, ResponseCode, SysFlag
from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import decode_record

from halfmq.broker.topics import CHECK_MAX_TIME_TOPIC
from tests.broker.test_transactions import arrival_event, send_half
from tests.support.raw import RawClient


async def _largest_half(client: RawClient, group: str) -> tuple[int, int]:
    """A half whose properties are within a few bytes of the record's 32 KiB limit: (its offset, the size)."""
    size = 32_767
    while True:
        props = {P.TRAN_MSG: "true", P.PGROUP: group, "big": "x" * size}
        answer = await client.send("TX", b"heavy", group=group, props=props,
                                   sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)
        if answer.code == ResponseCode.SUCCESS:
            from halfmq.protocol.message import decode_offset_msg_id
            return decode_offset_msg_id(answer.ext_fields["msgId"])[1], size
        size -= 4


async def _checks(client: RawClient, count: int, timeout: float = 10.0) -> dict[int, object]:
    got = {}
    while len(got) < count:
        cmd = await asyncio.wait_for(client.incoming.get(), timeout)
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            got[int(cmd.ext_fields["commitLogOffset"])] = cmd
    return got


async def test_a_half_too_large_for_its_check_count_is_checked_without_it_and_others_are_checked(
        broker_factory, caplog):
    broker = await broker_factory(transactionTimeOut=50, transactionCheckInterval=60_000)
    producer = await RawClient.connect(broker.addr)
    try:
        await producer.heartbeat("heavy", producer_groups=["PG_HEAVY", "PG_LIGHT"])
        heavy, size = await _largest_half(producer, "PG_HEAVY")
        _r, light = await send_half(producer, group="PG_LIGHT")
        with caplog.at_level(logging.ERROR):
            checks = await _checks(producer, 2)
        assert set(checks) == {heavy, light}
        shown = decode_record(checks[heavy].body)
        assert shown.properties["big"] == "x" * size and P.TRANSACTION_CHECK_TIMES not in shown.properties
        assert decode_record(checks[light].body).properties[P.TRANSACTION_CHECK_TIMES] == "1"
        assert not [r for r in caplog.records if "check pass failed" in r.getMessage()]
    finally:
        producer.close()


async def test_a_half_no_check_can_be_made_of_is_discarded_alone_and_counted(broker_factory, monkeypatch):
    """A half that cannot be turned into a check at all (before: an undecodable compressed body shown to a gRPC
    producer; no request can store one now, so the fault is injected) is discarded alone, resumable, and counted;
    the other halves of the pass are checked."""
    from tests.broker.test_metrics import scrape
    broker = await broker_factory(transactionTimeOut=50, transactionCheckInterval=60_000, metricsPromExporterPort=0)
    producer = await RawClient.connect(broker.addr)
    try:
        await producer.heartbeat("p", producer_groups=["PG_BAD", "PG_GOOD"])
        _r, bad = await send_half(producer, group="PG_BAD")
        _r, good = await send_half(producer, group="PG_GOOD")
        service = broker.ctx.check_back
        real = service._send_check

        def send_check(channel, offset, state, raw):
            if offset == bad:
                raise MessageFormatError("injected: the half cannot be shown as a message")
            return real(channel, offset, state, raw)

        monkeypatch.setattr(service, "_send_check", send_check)
        # The pass writes the check before its discard is stored: waiting for "the next pass" after the check
        # came raced with the pass still under way, and the next one is an interval (60 s) away.
        discarded = arrival_event(broker, CHECK_MAX_TIME_TOPIC)
        checks = await _checks(producer, 1)
        assert set(checks) == {good}
        await asyncio.wait_for(discarded.wait(), 5)
        assert broker.store.get_half(bad).status.value == "DISCARDED"
        assert (await scrape(broker))["halfmq_check_backs_poisoned_total"] == 1
    finally:
        producer.close()

