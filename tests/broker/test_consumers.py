"""Consumer-side commands: offsets, heartbeats, group membership, send-back to retry and DLQ, locks."""
from __future__ import annotations

import asyncio
import json

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.message import decode_records

from tests.support.raw import RawClient


async def test_consumer_offsets_query_update_and_survive_restart(broker_factory, tmp_path):
    store = tmp_path / "s"
    broker = await broker_factory(store_dir=store)
    c = await RawClient.connect(broker.addr)
    q = {"consumerGroup": "G", "topic": "T", "queueId": 0}
    r = await c.request(RequestCode.QUERY_CONSUMER_OFFSET, q)
    assert r.code == ResponseCode.SUCCESS and r.ext_fields["offset"] == "0"  # never-truncated queue: start at 0
    r = await c.request(RequestCode.QUERY_CONSUMER_OFFSET, {**q, "setZeroIfNotFound": "false"})
    assert r.code == ResponseCode.QUERY_NOT_FOUND
    assert (await c.request(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 42})).code == 0
    c.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "queueId": 1, "commitOffset": 7})
    r = await c.request(RequestCode.QUERY_CONSUMER_OFFSET, q)
    assert r.ext_fields["offset"] == "42"
    c.close()
    await broker.stop()
    broker = await broker_factory(store_dir=store)
    c = await RawClient.connect(broker.addr)
    assert (await c.request(RequestCode.QUERY_CONSUMER_OFFSET, q)).ext_fields["offset"] == "42"
    r = await c.request(RequestCode.QUERY_CONSUMER_OFFSET, {**q, "queueId": 1})
    assert r.ext_fields["offset"] == "7"  # oneway updates are flushed at shutdown
    c.close()


async def test_pull_with_commit_offset_flag_stores_the_offset(broker):
    c = await RawClient.connect(broker.addr)
    await c.send("T", b"x")
    ext = {"consumerGroup": "G", "topic": "T", "queueId": 0, "queueOffset": 0, "maxMsgNums": 32, "sysFlag": 1 | 4,
           "commitOffset": 5, "suspendTimeoutMillis": 0, "subVersion": 0, "subscription": "*"}
    assert (await c.request(RequestCode.PULL_MESSAGE, ext)).code == ResponseCode.SUCCESS
    r = await c.request(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "G", "topic": "T", "queueId": 0})
    assert r.ext_fields["offset"] == "5"
    c.close()


async def test_max_min_and_search_offsets(broker):
    c = await RawClient.connect(broker.addr)
    for i in range(3):
        await c.send("T", str(i).encode())
    q = {"topic": "T", "queueId": 0}
    assert (await c.request(RequestCode.GET_MAX_OFFSET, q)).ext_fields["offset"] == "3"
    assert (await c.request(RequestCode.GET_MIN_OFFSET, q)).ext_fields["offset"] == "0"
    r = await c.request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": 0})
    assert r.ext_fields["offset"] == "0"
    r = await c.request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": 2 ** 62})
    assert r.ext_fields["offset"] == "3"
    r = await c.request(RequestCode.GET_EARLIEST_MSG_STORETIME, q)
    assert int(r.ext_fields["timestamp"]) > 0
    c.close()


async def test_heartbeat_registers_consumers_and_notifies_membership_changes(broker):
    a = await RawClient.connect(broker.addr)
    b = await RawClient.connect(broker.addr)
    assert (await a.heartbeat("client-a", consumer_groups={"G": {"T": "*"}})).code == 0
    await b.heartbeat("client-b", consumer_groups={"G": {"T": "*"}})
    notice = await asyncio.wait_for(a.incoming.get(), 5)
    assert notice.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and notice.ext_fields["consumerGroup"] == "G"
    assert notice.is_oneway
    r = await a.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
    assert json.loads(r.body)["consumerIdList"] == ["client-a", "client-b"]
    b.close()
    await asyncio.wait_for(a.incoming.get(), 5)  # b's disconnect is announced too
    r = await a.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
    assert json.loads(r.body)["consumerIdList"] == ["client-a"]
    r = await a.request(RequestCode.UNREGISTER_CLIENT, {"clientID": "client-a", "consumerGroup": "G"})
    assert r.code == 0
    r = await a.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
    assert r.code == ResponseCode.SYSTEM_ERROR and "no consumer" in r.remark
    a.close()


async def test_pull_uses_heartbeat_subscription_when_not_given(broker):
    c = await RawClient.connect(broker.addr)
    await c.send("T", b"a", tags="A")
    await c.send("T", b"b", tags="B")
    r = await c.pull("T", 0, 0, group="G", sys_flag=0)
    assert r.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
    await c.heartbeat("cid", consumer_groups={"G": {"T": "B"}})
    r = await c.pull("T", 0, 0, group="G", sys_flag=0)
    assert [m.body for m in decode_records(r.body)] == [b"b"]
    c.close()


async def test_send_back_goes_to_retry_then_dlq(broker_factory):
    broker = await broker_factory(messageDelayLevel="10ms 10ms 10ms 10ms")
    c = await RawClient.connect(broker.addr)
    sent = await c.send("T", b"payload", tags="x")
    from halfmq.protocol.message import decode_offset_msg_id
    _h, offset = decode_offset_msg_id(sent.ext_fields["msgId"])
    arrived = asyncio.Event()
    broker.store.add_arrival_listener(lambda t, q, m: arrived.set() if t == "%RETRY%G" else None)
    r = await c.request(RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": offset, "group": "G", "delayLevel": 0,
                                                             "maxReconsumeTimes": 16})
    assert r.code == ResponseCode.SUCCESS, r.remark
    await asyncio.wait_for(arrived.wait(), 5)  # delivered from the schedule topic after its delay
    (retry,) = decode_records((await c.pull("%RETRY%G", 0, 0)).body)
    assert retry.body == b"payload" and retry.reconsume_times == 1
    assert retry.properties["RETRY_TOPIC"] == "T" and "DELAY" not in retry.properties
    r = await c.request(RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": retry.physical_offset, "group": "G",
                                                             "delayLevel": 0, "maxReconsumeTimes": 1})
    assert r.code == ResponseCode.SUCCESS
    (dead,) = decode_records((await c.pull("%DLQ%G", 0, 0)).body)
    assert dead.body == b"payload" and dead.properties["RETRY_TOPIC"] == "T"
    r = await c.request(RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": 10 ** 9, "group": "G", "delayLevel": 0})
    assert r.code == ResponseCode.SYSTEM_ERROR
    c.close()


async def test_delayed_message_is_delivered_after_its_level(broker_factory):
    broker = await broker_factory(messageDelayLevel="20ms 40ms")
    c = await RawClient.connect(broker.addr)
    arrived = asyncio.Event()
    broker.store.add_arrival_listener(lambda t, q, m: arrived.set() if t == "TD" else None)
    r = await c.send("TD", b"later", props={"DELAY": "2"})
    assert r.code == ResponseCode.SUCCESS
    assert (await c.pull("TD", 0, 0)).code == ResponseCode.PULL_NOT_FOUND
    await asyncio.wait_for(arrived.wait(), 5)
    (msg,) = decode_records((await c.pull("TD", 0, 0)).body)
    assert msg.body == b"later" and msg.store_timestamp > 0
    c.close()


async def test_lock_and_unlock_queues(broker):
    a, b = await RawClient.connect(broker.addr), await RawClient.connect(broker.addr)
    await a.heartbeat("a", consumer_groups={"G": {"T": "*"}})
    await b.heartbeat("b", consumer_groups={"G": {"T": "*"}})
    mq = {"topic": "T", "brokerName": "broker-a", "queueId": 0}
    body = lambda cid: json.dumps({"consumerGroup": "G", "clientId": cid, "mqSet": [mq]}).encode()  # noqa: E731
    r = await a.request(RequestCode.LOCK_BATCH_MQ, body=body("a"))
    assert json.loads(r.body)["lockOKMQSet"] == [mq]
    r = await b.request(RequestCode.LOCK_BATCH_MQ, body=body("b"))
    assert json.loads(r.body)["lockOKMQSet"] == []
    await a.request(RequestCode.UNLOCK_BATCH_MQ, body=body("a"))
    r = await b.request(RequestCode.LOCK_BATCH_MQ, body=body("b"))
    assert json.loads(r.body)["lockOKMQSet"] == [mq]
    a.close()
    b.close()


async def test_a_client_cannot_lock_or_unlock_for_another_client_id(broker):
    """Attack: UNLOCK then LOCK naming the holder's clientId stole orderly consumption of its queues."""
    owner, thief = await RawClient.connect(broker.addr), await RawClient.connect(broker.addr)
    await owner.heartbeat("owner", consumer_groups={"G": {"T": "*"}})
    await thief.heartbeat("thief", consumer_groups={"G": {"T": "*"}})
    mq = {"topic": "T", "brokerName": "broker-a", "queueId": 0}
    body = lambda cid: json.dumps({"consumerGroup": "G", "clientId": cid, "mqSet": [mq]}).encode()  # noqa: E731
    assert json.loads((await owner.request(RequestCode.LOCK_BATCH_MQ, body=body("owner"))).body)["lockOKMQSet"]
    for code in (RequestCode.UNLOCK_BATCH_MQ, RequestCode.LOCK_BATCH_MQ):
        r = await thief.request(code, body=body("owner"))
        assert r.code == ResponseCode.NO_PERMISSION and "clientId owner" in r.remark, r.remark
    r = await thief.request(RequestCode.LOCK_BATCH_MQ, body=body("thief"))
    assert json.loads(r.body)["lockOKMQSet"] == []  # the owner still holds it
    owner.close()
    thief.close()


async def test_topic_admin(broker):
    c = await RawClient.connect(broker.addr)
    ext = {"topic": "Admin1", "defaultTopic": "TBW102", "readQueueNums": 3, "writeQueueNums": 3, "perm": 6,
           "topicFilterType": "SINGLE_TAG", "order": "false"}
    assert (await c.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)).code == 0
    assert broker.ctx.topics.get("Admin1").read_queue_nums == 3
    r = await c.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {**ext, "topic": "TBW102"})
    assert r.code == ResponseCode.SYSTEM_ERROR and "system topic" in r.remark
    r = await c.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {**ext, "readQueueNums": 0})
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert (await c.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Admin1"})).code == 0
    assert broker.ctx.topics.get("Admin1") is None
    c.close()
