"""Quotas on what clients bring into existence: topics, subscription groups (and their retry/DLQ topics), metric
series, and the cost of group-change notifications."""
from __future__ import annotations

import asyncio
import json

from prometheus_client import generate_latest

from halfmq.broker.metrics import OTHER
from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.message import decode_offset_msg_id

from tests.support.raw import RawClient


def user_topics(broker) -> set[str]:
    return {t for t in broker.ctx.topics.topics if t not in broker.ctx.topics._system}


def back(offset: int, group: str) -> dict:
    return {"offset": offset, "group": group, "delayLevel": 0, "originMsgId": "x", "maxReconsumeTimes": 16}


async def test_auto_created_topics_stop_at_the_quota(broker_factory):
    """Attack: 20k topics in 16 s, no quota."""
    broker = await broker_factory(maxAutoCreatedTopics=3)
    c = await RawClient.connect(broker.addr)
    for i in range(3):
        assert (await c.send(f"T{i}", b"x")).code == ResponseCode.SUCCESS
    r = await c.send("T3", b"x")
    assert r.code == ResponseCode.TOPIC_NOT_EXIST and "maxAutoCreatedTopics" in r.remark, r.remark
    assert user_topics(broker) == {"T0", "T1", "T2"}
    ext = {"topic": "ByAdmin", "defaultTopic": "TBW102", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6,
           "topicFilterType": "SINGLE_TAG", "order": "false"}
    assert (await c.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)).code == ResponseCode.SUCCESS  # admins may
    c.close()


async def test_auto_created_groups_stop_at_the_quota(broker_factory):
    """Attack: one heartbeat with 3,000 consumer groups created 3,000 retry topics."""
    broker = await broker_factory(maxAutoCreatedSubscriptionGroups=3)
    c = await RawClient.connect(broker.addr)
    r = await c.heartbeat("c1", consumer_groups={f"G{i}": {"T": "*"} for i in range(50)})
    assert r.code == ResponseCode.SUCCESS  # the consumers are registered all the same
    assert len(broker.ctx.consumers.groups) == 50
    assert user_topics(broker) == {"%RETRY%G0", "%RETRY%G1", "%RETRY%G2"}
    offset = decode_offset_msg_id((await c.send("T", b"x")).ext_fields["msgId"])[1]
    r = await c.request(RequestCode.CONSUMER_SEND_MSG_BACK, back(offset, "G9"))
    assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST and "maxAutoCreatedSubscriptionGroups" in r.remark
    assert (await c.request(RequestCode.CONSUMER_SEND_MSG_BACK, back(offset, "G1"))).code == ResponseCode.SUCCESS
    for topic in ("%RETRY%G7", "%DLQ%G8"):  # named by a send: no way around the quota either
        assert (await c.send(topic, b"x")).code == ResponseCode.TOPIC_NOT_EXIST
    assert "%RETRY%G7" not in broker.ctx.topics.topics and "%DLQ%G8" not in broker.ctx.topics.topics
    c.close()


async def test_auto_create_off_creates_no_topic_a_client_names(broker_factory):
    """Attack: with autoCreateTopicEnable=false, %RETRY%/%DLQ% names still created topics (from sends and
    heartbeats). Groups follow autoCreateSubscriptionGroup, as in RocketMQ; with both off nothing is created."""
    broker = await broker_factory(autoCreateTopicEnable=False, autoCreateSubscriptionGroup=False)
    c = await RawClient.connect(broker.addr)
    assert (await c.heartbeat("c1", consumer_groups={f"G{i}": {"T": "*"} for i in range(20)})).code == 0
    for topic in ("Plain", "%RETRY%X", "%DLQ%Y", "%RETRY%G1", "%DLQ%G1"):
        r = await c.send(topic, b"x")
        assert r.code == ResponseCode.TOPIC_NOT_EXIST, (topic, r.remark)
    assert user_topics(broker) == set()
    # A group an admin created (its retry topic) is served: send-back, and the DLQ of that group.
    ext = {"defaultTopic": "TBW102", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6,
           "topicFilterType": "SINGLE_TAG", "order": "false"}
    for topic in ("Plain", "%RETRY%Known"):
        assert (await c.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {**ext, "topic": topic})).code == 0
    offset = decode_offset_msg_id((await c.send("Plain", b"x")).ext_fields["msgId"])[1]
    r = await c.request(RequestCode.CONSUMER_SEND_MSG_BACK, back(offset, "G1"))
    assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, r.remark
    assert (await c.request(RequestCode.CONSUMER_SEND_MSG_BACK, {**back(offset, "Known"), "delayLevel": -1})).code == 0
    assert user_topics(broker) == {"Plain", "%RETRY%Known", "%DLQ%Known"}
    c.close()


async def test_retry_topics_follow_the_group_rule_when_topic_auto_create_is_off(broker_factory):
    # Stock consumers need their retry topic: a heartbeat creates it through the subscription group rule.
    broker = await broker_factory(autoCreateTopicEnable=False)
    c = await RawClient.connect(broker.addr)
    assert (await c.heartbeat("c1", consumer_groups={"G": {"T": "*"}})).code == 0
    assert user_topics(broker) == {"%RETRY%G"}
    assert (await c.send("%RETRY%Other", b"x")).code == ResponseCode.TOPIC_NOT_EXIST
    c.close()


async def test_metric_labels_chosen_by_clients_are_capped(broker):
    """Attack: 3,000 made-up group names made 12,000 metric series. Default cap: 1000 values per label."""
    c = await RawClient.connect(broker.addr)
    names = [f"G{i}" for i in range(1010)]
    assert (await c.heartbeat("c1", producer_groups=names)).code == 0
    assert (await c.send("T", b"x")).code == 0
    for group in names:  # consumer offsets label the lag series by group
        c.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": "T", "queueId": 0,
                                                      "commitOffset": 0})
    assert (await c.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})).code == 0  # all read
    text = generate_latest(broker.ctx.metrics.registry).decode()
    for label, series in (("producer_group", "rocketmq_producer_connections{"),
                          ("consumer_group", "rocketmq_consumer_lag_messages{")):
        lines = [line for line in text.splitlines() if line.startswith(series)]
        values = {line.split(f'{label}="')[1].split('"')[0] for line in lines}
        assert len(values) == 1001 and OTHER in values, (label, len(values))
    producers = [line for line in text.splitlines() if line.startswith("rocketmq_producer_connections{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in producers) == 1010  # nothing lost, only grouped
    c.close()


async def test_group_change_notifications_are_coalesced(broker):
    """Attack: 2,000 consumers joining one group cost 35 s of notifications, each join notifying every member."""
    members = [await RawClient.connect(broker.addr) for _ in range(120)]
    answers = await asyncio.gather(*(m.heartbeat(f"c{i}", consumer_groups={"G": {"T": "*"}})
                                     for i, m in enumerate(members)))
    assert all(a.code == ResponseCode.SUCCESS for a in answers)
    # A last member joins: once it is notified, every change before it has been notified too.
    last = await RawClient.connect(broker.addr)
    await last.heartbeat("last", consumer_groups={"G": {"T": "*"}})
    notice = await asyncio.wait_for(last.incoming.get(), 5)
    assert notice.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
    for m in members:  # everyone hears of the change at least once
        await asyncio.wait_for(m.incoming.get(), 5)
    frames = len(members) + sum(m.incoming.qsize() for m in members)
    assert frames <= 4 * len(members), frames  # before: 121 * 122 / 2 = 7,381
    ids = json.loads((await last.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})).body)
    assert len(ids["consumerIdList"]) == 121
    for m in (*members, last):
        m.close()
