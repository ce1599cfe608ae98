"""Access control per request code (broker/acl.RULES) against a real broker: a test per row of the table, the
attacks that worked before it, and docs/security.md's copy of the table."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from halfmq.broker.acl import RECORD, RULES, SIGNATURE_ONLY, rules_markdown
from halfmq.client import Credentials
from halfmq.protocol import properties as P
from halfmq.protocol.codes import ADMIN_REQUEST_CODES, RequestCode, ResponseCode, SysFlag
from halfmq.protocol.headers import GROUP, TOPIC, SendMessageRequestHeaderV2
from halfmq.protocol.message import UniqKeyGenerator, decode_offset_msg_id
from halfmq.protocol.properties import encode_properties

from tests.support.raw import RawClient

ACL = """
accounts:
  - accessKey: admin
    secretKey: admin-secret
    admin: true
  - accessKey: app
    secretKey: app-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Allowed=PUB|SUB
      - WriteOnly=PUB
      - Secret=DENY
    groupPerms:
      - CG=SUB
      - PG=PUB
"""
APP = Credentials("app", "app-secret")
ADMIN = Credentials("admin", "admin-secret")
#: (allowed, denied) names per (kind, permission): the denied one lacks exactly that permission.
NAMES = {(TOPIC, "PUB"): ("Allowed", "Secret"), (TOPIC, "SUB"): ("Allowed", "WriteOnly"),
         (GROUP, "PUB"): ("PG", "CG"), (GROUP, "SUB"): ("CG", "Other")}
_uniq = UniqKeyGenerator()


class Signed:
    """A raw connection whose requests carry an account's AccessKey and Signature."""

    def __init__(self, raw: RawClient, creds: Credentials):
        self.raw, self.creds = raw, creds

    async def request(self, code: int, ext: dict | None = None, body: bytes = b""):
        ext = {k: str(v) for k, v in (ext or {}).items()}
        return await self.raw.request(code, self.creds.sign(ext, body), body)

    async def send(self, topic: str, body: bytes = b"m", props: dict | None = None, sys_flag: int = 0,
                   group: str = "PG", code: int = RequestCode.SEND_MESSAGE_V2):
        properties = {P.UNIQ_KEY: _uniq.next(), P.WAIT: "true", **(props or {})}
        header = SendMessageRequestHeaderV2(producerGroup=group, topic=topic, defaultTopic="TBW102",
                                            defaultTopicQueueNums=4, queueId=0, sysFlag=sys_flag, bornTimestamp=int(time.time() * 1000),
                                            flag=0, properties=encode_properties(properties))
        r = await self.request(code, header.to_ext(), body)
        assert r.code == ResponseCode.SUCCESS, r.remark
        return decode_offset_msg_id(r.ext_fields["msgId"])[1]

    async def heartbeat(self, client_id: str, producers=(), consumers: dict | None = None):
        body = {"clientID": client_id, "producerDataSet": [{"groupName": g} for g in producers],
                "consumerDataSet": [{"groupName": g, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                                     "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                                     "subscriptionDataSet": [{"topic": t, "subString": "*", "subVersion": 1}
                                                             for t in topics]}
                                    for g, topics in (consumers or {}).items()]}
        return await self.request(RequestCode.HEART_BEAT, body=json.dumps(body).encode())


@pytest.fixture
async def acl_broker(broker_factory, tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    return await broker_factory(aclEnable=True, aclConfigFile=str(path))


@pytest.fixture
async def clients(acl_broker):
    app_raw, admin_raw = await RawClient.connect(acl_broker.addr), await RawClient.connect(acl_broker.addr)
    yield Signed(app_raw, APP), Signed(admin_raw, ADMIN)
    app_raw.close()
    admin_raw.close()


def _perm(perm: int) -> str:
    return "PUB" if perm == 4 else "SUB"


def _header_ext(rule, names: dict[str, str]) -> dict[str, str]:
    """Every required field of the rule's header filled in, the resource fields from ``names`` (key → name).

    Decoys: both spellings of a send's topic carry an allowed topic unless the rule routes by them, so a check of
    the wrong key (code 10 checked by ``b``) lets the request through and the test fails."""
    ext = {"topic": "Allowed", "b": "Allowed"}
    for _name, key, kind, required in rule.header._field_specs():
        if required and key not in ext:
            ext[key] = "0" if kind is int else "false" if kind is bool else "x"
    ext.update(names)
    return ext


async def _request(rule, app: Signed, admin: Signed, deny: int | None):
    """The rule's request from ``app``: every resource allowed, except the need at index ``deny`` (if any)."""
    names = {}
    record_topic = "Allowed"
    for index, need in enumerate(rule.needs):
        allowed, denied = NAMES[(need.kind, _perm(need.perm))]
        name = denied if index == deny else allowed
        if need.where == RECORD:
            record_topic = name
        else:
            names[need.header_key or need.where] = name
    code = rule.code
    if code == RequestCode.HEART_BEAT:
        producer, consumer, topic = (names[n.where] for n in rule.needs)
        return await app.heartbeat("c1", [producer], {consumer: [topic]})
    if code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        group, topic = (names[n.where] for n in rule.needs)
        assert (await app.heartbeat("c1", [], {"CG": ["Allowed"]})).code == ResponseCode.SUCCESS
        body = {"consumerGroup": group, "clientId": "c1", "mqSet": [{"topic": topic, "brokerName": "b", "queueId": 0}]}
        return await app.request(code, body=json.dumps(body).encode())
    ext = _header_ext(rule, names)
    if any(need.transactional_only for need in rule.needs):  # a half message, so that every need applies
        group = names[rule.header.wire_key("producerGroup")]
        ext[rule.header.wire_key("properties")] = encode_properties(
            {P.UNIQ_KEY: _uniq.next(), P.TRAN_MSG: "true", P.PGROUP: group})
        ext[rule.header.wire_key("sysFlag")] = str(SysFlag.TRANSACTION_PREPARED_TYPE)
    if code == RequestCode.QUERY_MESSAGE:
        await admin.send(ext["topic"], props={P.KEYS: "K"})
        ext.update(key="K", maxNum=4, endTimestamp=2 ** 62)
    elif code in (RequestCode.VIEW_MESSAGE_BY_ID, RequestCode.CONSUMER_SEND_MSG_BACK):
        ext["offset"] = await admin.send(record_topic)  # a record of the topic the need names
    elif code == RequestCode.END_TRANSACTION:  # a half of the topic the need names, of the group the header names
        group = ext["producerGroup"]
        ext["commitLogOffset"] = await admin.send(record_topic, props={P.TRAN_MSG: "true", P.PGROUP: group},
                                                  sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE, group=group)
        ext["commitOrRollback"] = "8"
    return await app.request(code, ext)


@pytest.mark.parametrize("code", sorted(RULES), ids=lambda c: RULES[c].code.name)
async def test_each_row_of_the_acl_table(clients, code):
    """Each resource a row names, when the account lacks its permission, refuses the request; with every one
    granted, the request is served (whatever else the processor makes of it)."""
    app, admin = clients
    rule = RULES[code]
    allowed = await _request(rule, app, admin, None)
    assert allowed.code != ResponseCode.NO_PERMISSION, allowed.remark
    for index, need in enumerate(rule.needs):
        if rule.code == RequestCode.QUERY_MESSAGE and need.where == RECORD:
            continue  # the records answered are the queried topic's: the header row above is that check
        refused = await _request(rule, app, admin, index)
        assert refused.code == ResponseCode.NO_PERMISSION, (need, refused.code, refused.remark)


async def test_every_code_served_has_exactly_one_rule(broker):
    served = set(broker.dispatcher.handlers) | set(broker.namesrv_dispatcher.handlers)
    kinds = (set(RULES), set(ADMIN_REQUEST_CODES), set(SIGNATURE_ONLY))
    for code in served:
        assert sum(code in kind for kind in kinds) == 1, RequestCode(code).name


def test_the_security_page_shows_the_table_the_code_enforces():
    page = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    assert rules_markdown() in page


# --- the attacks -------------------------------------------------------------------------------------------------
async def test_send_message_v1_is_checked_by_the_topic_it_is_stored_in(acl_broker, clients):
    """Attack: SEND_MESSAGE (10) with `b` naming an allowed topic and `topic` another one stored into the other."""
    app, _admin = clients
    ext = _header_ext(RULES[RequestCode.SEND_MESSAGE], {"topic": "Secret", "b": "Allowed", "queueId": "-1"})
    ext["producerGroup"] = "PG"
    r = await app.request(RequestCode.SEND_MESSAGE, ext, b"sneaked")
    assert r.code == ResponseCode.NO_PERMISSION and "Secret" in r.remark, r.remark
    assert acl_broker.ctx.topics.get("Secret") is None


async def test_view_query_and_send_back_do_not_read_other_topics(acl_broker, clients):
    """Attack: VIEW_MESSAGE_BY_ID, QUERY_MESSAGE and CONSUMER_SEND_MSG_BACK read any topic's records."""
    app, admin = clients
    secret = await admin.send("Secret", b"confidential", props={P.KEYS: "K"})
    assert (await app.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": secret})).code == ResponseCode.NO_PERMISSION
    query = {"topic": "Secret", "key": "K", "maxNum": 4, "beginTimestamp": 0, "endTimestamp": 2 ** 62}
    assert (await app.request(RequestCode.QUERY_MESSAGE, query)).code == ResponseCode.NO_PERMISSION
    back = {"offset": secret, "group": "CG", "delayLevel": -1, "originMsgId": "x", "maxReconsumeTimes": 16}
    assert (await app.request(RequestCode.CONSUMER_SEND_MSG_BACK, back)).code == ResponseCode.NO_PERMISSION
    assert acl_broker.ctx.topics.get("%DLQ%CG") is None  # nothing was copied
    pull = {"consumerGroup": "CG", "topic": "%RETRY%Other", "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
            "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0, "subVersion": 0, "subscription": "*"}
    r = await app.request(RequestCode.PULL_MESSAGE, pull)  # another group's retry topic
    assert r.code == ResponseCode.NO_PERMISSION and "Other" in r.remark, r.remark


async def test_system_topic_records_are_for_admins_only(acl_broker, clients):
    app, admin = clients
    half = await admin.send("Allowed", b"uncommitted", props={P.TRAN_MSG: "true", P.PGROUP: "PG"},
                            sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)
    r = await app.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": half})
    assert r.code in (ResponseCode.NO_PERMISSION, ResponseCode.SYSTEM_ERROR) and b"uncommitted" not in r.body
    delayed = await admin.send("Allowed", b"later", props={P.DELAY: "18"})  # stored in SCHEDULE_TOPIC_XXXX
    r = await app.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": delayed})
    assert r.code == ResponseCode.NO_PERMISSION and "system topic" in r.remark, r.remark
    assert (await admin.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": delayed})).code == ResponseCode.SUCCESS
    pull = {"consumerGroup": "CG", "topic": "SCHEDULE_TOPIC_XXXX", "queueId": 17, "queueOffset": 0, "maxMsgNums": 32,
            "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0, "subVersion": 0, "subscription": "*"}
    assert (await app.request(RequestCode.PULL_MESSAGE, pull)).code == ResponseCode.NO_PERMISSION


async def test_a_heartbeat_cannot_join_another_producer_group(acl_broker, clients):
    """Attack: declaring oneself a producer of someone else's group got its CHECK_TRANSACTION_STATE (bodies of
    uncommitted messages). Only a connection that proved PUB on the group is registered as its producer."""
    app, _admin = clients
    r = await app.heartbeat("spy", producers=["CG"])  # app has SUB on CG, not PUB
    assert r.code == ResponseCode.NO_PERMISSION and "CG" in r.remark, r.remark
    r = await app.heartbeat("spy", producers=["Victim"], consumers={"CG": ["Allowed"]})
    assert r.code == ResponseCode.NO_PERMISSION
    assert "Victim" not in acl_broker.ctx.producers.groups and "CG" not in acl_broker.ctx.consumers.groups
    assert (await app.heartbeat("app", producers=["PG"])).code == ResponseCode.SUCCESS
    assert list(acl_broker.ctx.producers.groups) == ["PG"]


async def test_a_half_message_cannot_join_another_groups_transactions(acl_broker, clients):
    """A half's checks go to its group's producers, and its sender is checked first: sending one needs PUB on
    the group, as deciding it (END_TRANSACTION) does."""
    app, _admin = clients
    props = {P.UNIQ_KEY: _uniq.next(), P.TRAN_MSG: "true", P.PGROUP: "CG"}
    header = SendMessageRequestHeaderV2(producerGroup="CG", topic="Allowed", defaultTopic="TBW102",
                                        defaultTopicQueueNums=4, queueId=0, sysFlag=SysFlag.TRANSACTION_PREPARED_TYPE,
                                        bornTimestamp=int(time.time() * 1000), flag=0, properties=encode_properties(props))
    r = await app.request(RequestCode.SEND_MESSAGE_V2, header.to_ext(), b"half")
    assert r.code == ResponseCode.NO_PERMISSION and "group CG" in r.remark, r.remark
    assert acl_broker.store.pending_halves_count() == 0
    await app.send("Allowed", b"plain", group="CG")  # succeeds: a plain message does not name the group's rights
