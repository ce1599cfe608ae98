"""Every complete request read before a connection closes is carried out (issue 23): a stock producer sends its
transaction decision oneway right before it shuts down, and a consumer its offsets."""
from __future__ import annotations

import json

import pytest

from halfmq.protocol.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.message import decode_records

from tests.broker.test_transactions import GROUP, end_ext, send_half
from tests.support.raw import RawClient


def _frame(code: int, ext: dict, body: bytes = b"", oneway: bool = False, opaque: int = 1_000) -> bytes:
    return RemotingCommand(code, opaque, FLAG_ONEWAY if oneway else 0, ext_fields={k: str(v) for k, v in ext.items()},
                           body=body).encode()


@pytest.mark.parametrize("frames_before", [0, 8, 40])
async def test_a_oneway_decision_written_just_before_the_close_is_applied(broker, frames_before):
    """The decision comes behind ``frames_before`` heartbeats in one write, then the connection closes."""
    producer = await RawClient.connect(broker.addr)
    halves = [await send_half(producer, body=f"tx{i}".encode()) for i in range(5)]
    heartbeat = json.dumps({"clientID": "closing@1", "producerDataSet": [{"groupName": GROUP}],
                            "consumerDataSet": []}).encode()
    burst = [_frame(RequestCode.HEART_BEAT, {}, heartbeat, opaque=2_000 + i) for i in range(frames_before)]
    burst += [_frame(RequestCode.END_TRANSACTION, end_ext(r, offset, 8), oneway=True, opaque=3_000 + i)
              for i, (r, offset) in enumerate(halves)]
    producer.transport.write(b"".join(burst))
    producer.close()
    await producer.closed.wait()
    consumer = await RawClient.connect(broker.addr)
    try:
        got = []
        while len(got) < len(halves):
            answer = await consumer.pull("TX", 0, len(got), suspend_ms=5_000, timeout=10)
            assert answer.code == ResponseCode.SUCCESS, (answer.code, answer.remark, len(got))
            got += decode_records(answer.body)
        assert sorted(m.body for m in got) == [f"tx{i}".encode() for i in range(5)]
    finally:
        consumer.close()


async def test_a_oneway_offset_written_just_before_the_close_is_kept(broker):
    consumer = await RawClient.connect(broker.addr)
    heartbeat = json.dumps({"clientID": "leaving@1", "producerDataSet": [], "consumerDataSet": []}).encode()
    burst = [_frame(RequestCode.HEART_BEAT, {}, heartbeat, opaque=2_000 + i) for i in range(16)]
    burst.append(_frame(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "Leaving", "topic": "Kept",
                                                             "queueId": 0, "commitOffset": 42}, oneway=True))
    consumer.transport.write(b"".join(burst))
    consumer.close()
    await consumer.closed.wait()
    again = await RawClient.connect(broker.addr)
    try:
        answer = await again.request(RequestCode.QUERY_CONSUMER_OFFSET,
                                     {"consumerGroup": "Leaving", "topic": "Kept", "queueId": 0})
        assert (answer.code, answer.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "42")
    finally:
        again.close()
