"""CONSUMER_SEND_MSG_BACK copies only committed, consumable records (never a half, a rolled-back or discarded one,
or any system topic's record), with and without ACL."""
from __future__ import annotations

import asyncio

from halfmq.client import Credentials
from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.message import decode_offset_msg_id, decode_records

from tests.broker.test_acl_rules import ACL, Signed
from tests.broker.test_transactions import arrival_event, end_ext, send_half
from tests.support.raw import RawClient


def back(offset: int, group: str = "G") -> dict:
    # delayLevel -1: straight to the group's DLQ, which anyone with SUB on the group can pull.
    return {"offset": offset, "group": group, "delayLevel": -1, "originMsgId": "x", "maxReconsumeTimes": 16}


async def test_send_back_refuses_everything_but_committed_messages(broker_factory):
    broker = await broker_factory(transactionTimeOut=10, transactionCheckInterval=10, transactionCheckMax=1)
    c = await RawClient.connect(broker.addr)
    plain = decode_offset_msg_id((await c.send("T", b"plain")).ext_fields["msgId"])[1]
    _r, pending = await send_half(c, topic="T", body=b"pending", group="PG_A",
                                  props={P.CHECK_IMMUNITY_TIME_IN_SECONDS: "3600"})  # stays pending
    r_rolled, rolled = await send_half(c, topic="T", body=b"rolled back", group="PG_A")
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r_rolled, rolled, 12, "PG_A"))).code == 0
    r_done, done = await send_half(c, topic="T", body=b"committed", group="PG_A")
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r_done, done, 8, "PG_A"))).code == 0
    committed = broker.store.get_half(done).committed_offset
    delayed = decode_offset_msg_id((await c.send("T", b"delayed", props={P.DELAY: "18"})).ext_fields["msgId"])[1]
    # A half whose producer never answers is discarded into TRANS_CHECK_MAX_TIME_TOPIC.
    producer = await RawClient.connect(broker.addr)
    await producer.heartbeat("p", producer_groups=["PG_B"])
    discarded_event = arrival_event(broker, "TRANS_CHECK_MAX_TIME_TOPIC")
    r_lost, lost = await send_half(producer, topic="T", body=b"discarded", group="PG_B")
    await asyncio.wait_for(producer.incoming.get(), 5)  # the check, answered UNKNOW as stock producers do
    producer.oneway(RequestCode.END_TRANSACTION, end_ext(r_lost, lost, 0, "PG_B", from_check=True))
    await asyncio.wait_for(discarded_event.wait(), 5)
    discarded = broker.store.get_half(lost).discarded_offset
    assert discarded is not None

    for offset in (pending, rolled, done, lost, discarded, delayed):
        r = await c.request(RequestCode.CONSUMER_SEND_MSG_BACK, back(offset))
        assert r.code == ResponseCode.MESSAGE_ILLEGAL and "not a consumable message" in r.remark, (offset, r.remark)
    for offset in (plain, committed):
        assert (await c.request(RequestCode.CONSUMER_SEND_MSG_BACK, back(offset))).code == ResponseCode.SUCCESS
    dlq = decode_records((await c.pull("%DLQ%G", 0, 0, group="G")).body)
    assert sorted(m.body for m in dlq) == [b"committed", b"plain"]
    assert broker.store.get_half(pending).pending  # untouched
    c.close()
    producer.close()


async def test_send_back_with_acl_copies_no_half_even_for_an_admin(broker_factory, tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    broker = await broker_factory(aclEnable=True, aclConfigFile=str(path))
    app = Signed(await RawClient.connect(broker.addr), Credentials("app", "app-secret"))
    admin = Signed(await RawClient.connect(broker.addr), Credentials("admin", "admin-secret"))
    half = await admin.send("Allowed", b"uncommitted", props={P.TRAN_MSG: "true", P.PGROUP: "PG"}, sys_flag=4)
    r = await app.request(RequestCode.CONSUMER_SEND_MSG_BACK, back(half, "CG"))
    assert r.code == ResponseCode.NO_PERMISSION and "system topic" in r.remark, r.remark
    r = await admin.request(RequestCode.CONSUMER_SEND_MSG_BACK, back(half, "CG"))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL, r.remark
    plain = await admin.send("Allowed", b"plain")
    assert (await app.request(RequestCode.CONSUMER_SEND_MSG_BACK, back(plain, "CG"))).code == ResponseCode.SUCCESS
    app.raw.close()
    admin.raw.close()
