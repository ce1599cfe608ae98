"""Whose group a remoting request may name: the gRPC endpoint's internal groups (%GRPC%<topic>) are never a remoting
client's, and a half is filed under the producer group its request was authorised for (single and batch halves).
Each test is an attack that worked before, against a real broker."""
from __future__ import annotations

import json
import time

import pytest

from halfmq.broker.grpc.sessions import transaction_group
from halfmq.client import Credentials
from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode, ResponseCode, SysFlag
from halfmq.protocol.headers import EndTransactionRequestHeader, SendMessageRequestHeaderV2
from halfmq.protocol.message import BatchItem, UniqKeyGenerator, encode_batch
from halfmq.protocol.properties import encode_properties

from tests.support.raw import RawClient

from .test_acl_rules import Signed

ACL = """
accounts:
  - accessKey: app
    secretKey: app-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: PUB|SUB
    topicPerms:
      - Allowed=PUB|SUB
      - Secret=DENY
    groupPerms:
      - PG_V=DENY
"""
APP = Credentials("app", "app-secret")
INTERNAL = transaction_group("Secret")
_uniq = UniqKeyGenerator()


@pytest.fixture
async def app(broker_factory, tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    broker = await broker_factory(aclEnable=True, aclConfigFile=str(path))
    raw = await RawClient.connect(broker.addr)
    yield Signed(raw, APP), broker
    raw.close()


class Unsigned:
    """A raw connection with ACL off, with Signed's ``request``."""

    def __init__(self, raw: RawClient):
        self.raw = raw

    async def request(self, code: int, ext: dict | None = None, body: bytes = b""):
        return await self.raw.request(code, {k: str(v) for k, v in (ext or {}).items()}, body)


@pytest.fixture
async def open_client(broker):
    raw = await RawClient.connect(broker.addr)
    yield Unsigned(raw)
    raw.close()


def _send_ext(group: str, topic: str = "Allowed", props: dict | None = None, sys_flag: int = 0) -> dict:
    properties = {P.UNIQ_KEY: _uniq.next(), P.WAIT: "true", **(props or {})}
    return SendMessageRequestHeaderV2(producerGroup=group, topic=topic, defaultTopic="TBW102", defaultTopicQueueNums=4,
                                      queueId=0, sysFlag=sys_flag, bornTimestamp=int(time.time() * 1000), flag=0,
                                      properties=encode_properties(properties)).to_ext()


def _requests_naming(group: str) -> dict[str, tuple[int, dict, bytes]]:
    """A request of each kind that names ``group``: (code, extFields, body)."""
    def body(data) -> bytes:
        return json.dumps(data).encode()

    end = EndTransactionRequestHeader(producerGroup=group, tranStateTableOffset=0, commitLogOffset=0,
                                      commitOrRollback=0, fromTransactionCheck=True, msgId="m").to_ext()
    return {
        "heartbeat producer": (RequestCode.HEART_BEAT, {}, body({"clientID": "c1", "producerDataSet": [
            {"groupName": group}]})),
        "heartbeat consumer": (RequestCode.HEART_BEAT, {}, body({"clientID": "c1", "consumerDataSet": [
            {"groupName": group, "subscriptionDataSet": [{"topic": "Allowed", "subString": "*"}]}]})),
        "end transaction": (RequestCode.END_TRANSACTION, end, b""),
        "send": (RequestCode.SEND_MESSAGE_V2, _send_ext(group), b"m"),
        "unregister": (RequestCode.UNREGISTER_CLIENT, {"clientID": "c1", "producerGroup": group}, b""),
        "pull": (RequestCode.PULL_MESSAGE, {"consumerGroup": group, "topic": "Allowed", "queueId": 0,
                                            "queueOffset": 0, "maxMsgNums": 1, "sysFlag": 0, "commitOffset": 0,
                                            "suspendTimeoutMillis": 0, "subVersion": 0}, b""),
        "lock": (RequestCode.LOCK_BATCH_MQ, {}, body({"consumerGroup": group, "clientId": "c1", "mqSet": [
            {"topic": "Allowed", "brokerName": "b", "queueId": 0}]})),
        "retry topic": (RequestCode.SEND_MESSAGE_V2, _send_ext("PG", topic="%RETRY%" + group), b"m"),
    }


@pytest.mark.parametrize("kind", sorted(_requests_naming("G")))
async def test_grpc_internal_groups_are_refused_to_remoting_clients_with_acl(app, kind):
    client, broker = app
    code, ext, body = _requests_naming(INTERNAL)[kind]
    answer = await client.request(code, ext, body)
    assert answer.code == ResponseCode.NO_PERMISSION, (answer.code, answer.remark)
    assert "%GRPC%" in answer.remark
    assert INTERNAL not in broker.ctx.producers.groups


@pytest.mark.parametrize("kind", sorted(_requests_naming("G")))
async def test_grpc_internal_groups_are_refused_to_remoting_clients_without_acl(broker, open_client, kind):
    code, ext, body = _requests_naming(INTERNAL)[kind]
    answer = await open_client.request(code, ext, body)
    assert answer.code == ResponseCode.NO_PERMISSION, (answer.code, answer.remark)
    assert INTERNAL not in broker.ctx.producers.groups


async def test_a_half_is_filed_under_the_group_it_was_authorised_for(app):
    """PGROUP naming another group than the header's producerGroup (the one ACL checked) is refused: before, the
    half was filed under PGROUP and that group's producers got its check."""
    client, broker = app
    ext = _send_ext("PG_A", props={P.TRAN_MSG: "true", P.PGROUP: "PG_V"}, sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)
    answer = await client.request(RequestCode.SEND_MESSAGE_V2, ext, b"half")
    assert answer.code != ResponseCode.SUCCESS, answer.remark
    assert "PG_V" in answer.remark
    assert [state.group for _offset, state in broker.store.iter_halves()] == []
    ok = _send_ext("PG_A", props={P.TRAN_MSG: "true", P.PGROUP: "PG_A"}, sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)
    assert (await client.request(RequestCode.SEND_MESSAGE_V2, ok, b"half")).code == ResponseCode.SUCCESS
    assert [state.group for _offset, state in broker.store.iter_halves()] == ["PG_A"]


async def test_a_batch_half_needs_pub_on_its_producer_group(app):
    client, broker = app
    items = [BatchItem(body=b"one", properties=encode_properties({P.UNIQ_KEY: _uniq.next()}))]
    ext = _send_ext("PG_V", props={P.TRAN_MSG: "true", P.PGROUP: "PG_V"}, sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)
    answer = await client.request(RequestCode.SEND_BATCH_MESSAGE, ext, encode_batch(items))
    assert answer.code == ResponseCode.NO_PERMISSION, (answer.code, answer.remark)
    assert [state.group for _offset, state in broker.store.iter_halves()] == []


ADMIN_AND_APP = ACL + """
  - accessKey: root
    secretKey: root-secret
    admin: true
"""


async def test_a_decision_needs_pub_on_the_halfs_topic(broker_factory, tmp_path):
    """An account denied a topic, with the default group grant, named another account's producer group and its
    half's offsets in END_TRANSACTION and committed the half into the topic (found by the fuzzer)."""
    path = tmp_path / "plain_acl.yml"
    path.write_text(ADMIN_AND_APP)
    broker = await broker_factory(aclEnable=True, aclConfigFile=str(path))
    admin_raw, app_raw = await RawClient.connect(broker.addr), await RawClient.connect(broker.addr)
    try:
        admin, app = Signed(admin_raw, Credentials("root", "root-secret")), Signed(app_raw, APP)
        half = await admin.send("Secret", b"CLASSIFIED", group="PG_ROOT",
                                props={P.TRAN_MSG: "true", P.PGROUP: "PG_ROOT"},
                                sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)
        end = EndTransactionRequestHeader(producerGroup="PG_ROOT", tranStateTableOffset=0, commitLogOffset=half,
                                          commitOrRollback=8, fromTransactionCheck=False, msgId="m").to_ext()
        answer = await app.request(RequestCode.END_TRANSACTION, end)
        assert answer.code == ResponseCode.NO_PERMISSION and "Secret" in answer.remark
        assert broker.store.get_half(half).pending and broker.store.max_offset("Secret", 0) == 0
        assert (await admin.request(RequestCode.END_TRANSACTION, end)).code == ResponseCode.SUCCESS
        assert broker.store.max_offset("Secret", 0) == 1
    finally:
        admin_raw.close()
        app_raw.close()
