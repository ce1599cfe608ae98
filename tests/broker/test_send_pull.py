"""Send and pull against a real broker: round trips, batches, filtering, validation, long polling."""
from __future__ import annotations

import asyncio
import json

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.message import BatchItem, decode_offset_msg_id, decode_records, encode_batch
from halfmq.protocol.properties import encode_properties

from tests.support.raw import RawClient


async def test_send_then_pull_returns_identical_message(broker):
    c = await RawClient.connect(broker.addr)
    r = await c.send("T1", b"hello", tags="TagA", keys="k1 k2", props={"myprop": "v1"})
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert r.ext_fields["queueId"] == "0" and r.ext_fields["queueOffset"] == "0"
    host, offset = decode_offset_msg_id(r.ext_fields["msgId"])
    assert host == broker.ctx.store_host and offset == 0
    p = await c.pull("T1", 0, 0)
    assert p.code == ResponseCode.SUCCESS, p.remark
    (msg,) = decode_records(p.body)
    assert msg.body == b"hello" and msg.topic == "T1" and msg.tags == "TagA" and msg.keys == "k1 k2"
    assert msg.properties["myprop"] == "v1" and "WAIT" not in msg.properties
    assert msg.properties["CLUSTER"] == "DefaultCluster"
    assert msg.queue_offset == 0 and msg.physical_offset == offset
    assert p.ext_fields["nextBeginOffset"] == "1" and p.ext_fields["maxOffset"] == "1"
    c.close()


async def test_v1_send_and_consecutive_offsets(broker):
    c = await RawClient.connect(broker.addr)
    ext = {"producerGroup": "PG", "topic": "T1", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
           "queueId": 1, "sysFlag": 0, "bornTimestamp": 5, "flag": 7, "properties": encode_properties({"TAGS": "x"})}
    offsets = []
    for _ in range(3):
        r = await c.request(RequestCode.SEND_MESSAGE, ext, b"v1")
        assert r.code == ResponseCode.SUCCESS, r.remark
        offsets.append(int(r.ext_fields["queueOffset"]))
    assert offsets == [0, 1, 2]
    msgs = decode_records((await c.pull("T1", 1, 0)).body)
    assert [m.flag for m in msgs] == [7, 7, 7] and [m.queue_offset for m in msgs] == [0, 1, 2]
    c.close()


async def test_batch_send_gets_consecutive_offsets_and_ids(broker):
    c = await RawClient.connect(broker.addr)
    body = encode_batch([BatchItem(f"m{i}".encode(), encode_properties({"UNIQ_KEY": f"U{i}", "TAGS": "b"}))
                         for i in range(5)])
    r = await c.send("TB", body, code=RequestCode.SEND_BATCH_MESSAGE)
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert len(r.ext_fields["msgId"].split(",")) == 5
    msgs = decode_records((await c.pull("TB", 0, 0)).body)
    assert [m.body for m in msgs] == [f"m{i}".encode() for i in range(5)]
    assert [m.properties["UNIQ_KEY"] for m in msgs] == [f"U{i}" for i in range(5)]
    c.close()


async def test_batch_messages_inherit_the_batch_properties_they_do_not_have_in_order(broker):
    # A message's own properties come first, then the batch's it does not override, in the batch's order: the
    # stored property text is the same whether the broker merges maps or joins texts (send.py's two ways).
    c = await RawClient.connect(broker.addr)
    body = encode_batch([BatchItem(b"m0", encode_properties({"a": "1"})),
                         BatchItem(b"m1", encode_properties({"myprop": "own", "WAIT": "false", "b": "2"}))])
    r = await c.send("TBP", body, tags="outerTag", props={"myprop": "outer"}, code=RequestCode.SEND_BATCH_MESSAGE)
    assert r.code == ResponseCode.SUCCESS, r.remark
    first, second = decode_records((await c.pull("TBP", 0, 0)).body)
    assert list(first.properties.items()) == [("a", "1"), ("TAGS", "outerTag"), ("myprop", "outer"),
                                              ("CLUSTER", "DefaultCluster")]
    assert list(second.properties.items()) == [("myprop", "own"), ("b", "2"), ("TAGS", "outerTag"),
                                               ("CLUSTER", "DefaultCluster")]
    c.close()


async def test_transactional_message_in_batch_is_refused(broker):
    c = await RawClient.connect(broker.addr)
    body = encode_batch([BatchItem(b"x", encode_properties({"TRAN_MSG": "true"}))])
    r = await c.send("TB", body, code=RequestCode.SEND_BATCH_MESSAGE)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL
    c.close()


async def test_tag_filter_skips_other_tags(broker):
    c = await RawClient.connect(broker.addr)
    for tag in ("A", "B", "A", "C"):
        await c.send("TF", tag.encode(), tags=tag)
    p = await c.pull("TF", 0, 0, expression="A || C")
    assert [m.body for m in decode_records(p.body)] == [b"A", b"A", b"C"]
    p = await c.pull("TF", 0, 3, expression="B")
    assert p.code == ResponseCode.PULL_RETRY_IMMEDIATELY and p.ext_fields["nextBeginOffset"] == "4"
    c.close()


async def test_pull_offset_edge_cases(broker):
    c = await RawClient.connect(broker.addr)
    await c.send("TE", b"x")
    assert (await c.pull("TE", 0, 1)).code == ResponseCode.PULL_NOT_FOUND
    over = await c.pull("TE", 0, 9)
    assert over.code == ResponseCode.PULL_OFFSET_MOVED and over.ext_fields["nextBeginOffset"] == "1"
    empty = await c.pull("TE", 1, 0)
    assert empty.code == ResponseCode.PULL_NOT_FOUND
    assert (await c.pull("TE", 1, 5)).code == ResponseCode.PULL_OFFSET_MOVED
    assert (await c.pull("NOPE", 0, 0)).code == ResponseCode.TOPIC_NOT_EXIST
    bad_queue = await c.pull("TE", 99, 0)
    assert bad_queue.code == ResponseCode.SYSTEM_ERROR and "queueId" in bad_queue.remark
    c.close()


def held_event(broker) -> asyncio.Event:
    """An event set when the broker holds a pull (instrumentation around the real service)."""
    event = asyncio.Event()
    service = broker.ctx.long_poll
    original = service.hold

    def hold(pull, timeout_s):
        original(pull, timeout_s)
        event.set()

    service.hold = hold
    return event


async def test_long_poll_is_woken_by_a_send(broker):
    c = await RawClient.connect(broker.addr)
    p = await c.send("TL", b"first")
    assert p.code == ResponseCode.SUCCESS
    producer = await RawClient.connect(broker.addr)
    was_held = held_event(broker)
    held = asyncio.ensure_future(c.pull("TL", 0, 1, suspend_ms=20_000, timeout=10))
    await asyncio.wait_for(was_held.wait(), 5)
    assert not held.done()
    await producer.send("TL", b"second")
    r = await asyncio.wait_for(held, 5)
    assert r.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(r.body)] == [b"second"]
    c.close()
    producer.close()


async def test_long_poll_times_out_with_not_found(broker):
    c = await RawClient.connect(broker.addr)
    await c.send("TL2", b"x")
    r = await c.pull("TL2", 0, 1, suspend_ms=50, timeout=5)
    assert r.code == ResponseCode.PULL_NOT_FOUND
    c.close()


async def test_validation_errors_get_codes_and_remarks(broker_factory):
    broker = await broker_factory(autoCreateTopicEnable=False, maxMessageSize=16)
    c = await RawClient.connect(broker.addr)
    r = await c.send("NotThere", b"x")
    assert r.code == ResponseCode.TOPIC_NOT_EXIST and "NotThere" in r.remark
    r = await c.send("bad topic!", b"x")
    assert r.code == ResponseCode.SYSTEM_ERROR and "illegal" in r.remark
    r = await c.send("RMQ_SYS_TRANS_HALF_TOPIC", b"x")
    assert r.code == ResponseCode.NO_PERMISSION
    r = await c.send("TBW102", b"x" * 17)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "maxMessageSize" in r.remark
    r = await c.request(RequestCode.SEND_MESSAGE_V2, {"a": "PG"})
    assert r.code == ResponseCode.SYSTEM_ERROR and "'b'" in r.remark
    r = await c.request(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "T", "c": "TBW102", "d": "x", "e": 0,
                                                     "f": 0, "g": 0, "h": 0})
    assert r.code == ResponseCode.SYSTEM_ERROR and "integer" in r.remark
    r = await c.request(9999)
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "9999" in r.remark
    r = await c.request(RequestCode.HEART_BEAT, body=b"{not json")
    assert r.code == ResponseCode.SYSTEM_ERROR and "JSON" in r.remark
    r = await c.request(RequestCode.HEART_BEAT, body=b'{"consumerDataSet":' + b"[" * 100_000)
    assert r.code == ResponseCode.SYSTEM_ERROR and "nested too deeply" in r.remark
    assert (await c.send("TBW102", b"ok")).code == ResponseCode.SUCCESS
    c.close()


async def test_binary_header_requests_are_answered_in_binary(broker):
    from halfmq.protocol.codes import SerializeType

    c = await RawClient.connect(broker.addr)
    r = await c.request(RequestCode.GET_MAX_OFFSET, {"topic": "X", "queueId": 0},
                        serialize_type=SerializeType.ROCKETMQ)
    assert r.serialize_type == SerializeType.ROCKETMQ and r.ext_fields["offset"] == "0"
    c.close()


async def test_name_server_routes(broker):
    ns = await RawClient.connect(broker.namesrv_addr)
    r = await ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
    route = json.loads(r.body)
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": broker.ctx.broker_addr}
    assert route["queueDatas"][0]["perm"] == 7
    r = await ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Unknown"})
    assert r.code == ResponseCode.TOPIC_NOT_EXIST
    c = await RawClient.connect(broker.addr)
    await c.heartbeat("cid-1", consumer_groups={"G1": {"T9": "*"}})
    r = await ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "%RETRY%G1"})
    assert r.code == ResponseCode.SUCCESS and json.loads(r.body)["queueDatas"][0]["writeQueueNums"] == 1
    info = json.loads((await ns.request(RequestCode.GET_BROKER_CLUSTER_INFO)).body)
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
    topics = json.loads((await ns.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)).body)["topicList"]
    assert "%RETRY%G1" in topics
    ns.close()
    c.close()


async def test_a_header_nested_too_deeply_closes_only_its_connection(broker):
    from halfmq.protocol.frame import encode_frame

    hostile, good = await RawClient.connect(broker.addr), await RawClient.connect(broker.addr)
    hostile.transport.write(encode_frame(0, b'{"code":10,"extFields":{"a":' + b"[" * 100_000))
    await asyncio.wait_for(hostile.closed.wait(), 5)
    assert (await good.send("TBW102", b"still served")).code == ResponseCode.SUCCESS
    good.close()
