"""RocketMQ-compatible ACL, the admin-code rule, nothing configurable over the wire, and TLS."""
from __future__ import annotations

import asyncio
import ssl
import subprocess

import pytest

from halfmq.broker.acl import signature
from halfmq.client import Credentials, Message, NoPermissionError, Producer, PullConsumer
from halfmq.protocol.codes import RequestCode, ResponseCode

from tests.support.raw import RawClient

ACL = """
accounts:
  - accessKey: admin
    secretKey: admin-secret
    admin: true
  - accessKey: app
    secretKey: app-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Allowed=PUB|SUB
      - ReadOnly=SUB
    groupPerms:
      - PG=PUB|SUB
"""


@pytest.fixture
async def acl_broker(broker_factory, tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    return await broker_factory(aclEnable=True, aclConfigFile=str(path))


def test_signature_matches_rocketmq_rule():
    # HMAC-SHA1 over the values sorted by key (Signature excluded), then the body; Base64.
    import base64
    import hashlib
    import hmac
    ext = {"b": "2", "a": "1", "AccessKey": "ak", "Signature": "ignored"}
    expected = base64.b64encode(hmac.new(b"sk", b"ak12body", hashlib.sha1).digest()).decode()
    assert signature("sk", ext, b"body") == expected


async def test_acl_permissions(acl_broker):
    app = Credentials("app", "app-secret")
    async with Producer("PG", acl_broker.namesrv_addr, credentials=app, retry_times=0) as producer:
        sent = await producer.send(Message("Allowed", b"ok"))
        assert sent.queue_offset == 0
        with pytest.raises(NoPermissionError):
            await producer.send(Message("ReadOnly", b"no"))
        with pytest.raises(NoPermissionError):
            await producer.send(Message("Unlisted", b"no"))
    async with PullConsumer("CG", acl_broker.namesrv_addr, credentials=app) as consumer:
        assert sent.queue in await consumer.fetch_subscribe_queues("Allowed")
        assert [m.body for m in (await consumer.pull(sent.queue, 0)).messages] == [b"ok"]
    wrong = Credentials("app", "not-the-secret")
    async with Producer("PG", acl_broker.namesrv_addr, credentials=wrong, retry_times=0) as producer:
        with pytest.raises(NoPermissionError, match="signature"):
            await producer.send(Message("Allowed", b"x"))
    raw = await RawClient.connect(acl_broker.addr)
    r = await raw.request(RequestCode.GET_MAX_OFFSET, {"topic": "Allowed", "queueId": 0})
    assert r.code == ResponseCode.NO_PERMISSION  # unsigned
    topic = {"topic": "New", "defaultTopic": "TBW102", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6,
             "topicFilterType": "SINGLE_TAG", "order": "false"}
    for creds, code in ((app, ResponseCode.NO_PERMISSION), (Credentials("admin", "admin-secret"), 0)):
        r = await raw.request(RequestCode.UPDATE_AND_CREATE_TOPIC, creds.sign({k: str(v) for k, v in topic.items()},
                                                                                b""))
        assert r.code == code, r.remark
    raw.close()


async def test_admin_codes_need_loopback_when_acl_is_off(broker):
    from halfmq.broker.acl import AccessValidator, is_loopback
    from halfmq.protocol.command import RemotingCommand

    assert is_loopback("127.0.0.1:5") and is_loopback("[::1]:5") and not is_loopback("10.0.0.1:5")

    class Remote:
        remote = "10.1.2.3:4567"

    with pytest.raises(Exception, match="loopback"):
        AccessValidator(None).check(Remote(), RemotingCommand(RequestCode.DELETE_TOPIC_IN_BROKER))
    AccessValidator(None).check(Remote(), RemotingCommand(RequestCode.SEND_MESSAGE_V2))  # clients are fine


async def test_no_request_changes_configuration_or_paths(broker):
    raw = await RawClient.connect(broker.addr)
    # UPDATE_BROKER_CONFIG (25), UPDATE_AND_CREATE_ACL_CONFIG (50), UPDATE_GLOBAL_WHITE_ADDRS_CONFIG (53),
    # and RocketMQ 5's UPDATE_NAMESRV_CONFIG (318): the request paths behind CVE-2023-33246 / CVE-2023-37582.
    for code in (25, 50, 53, 318):
        r = await raw.request(code, {"brokerConfigPath": "/tmp/x", "filterServerNums": "1"}, b"rocketmqHome=/tmp")
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    ns = await RawClient.connect(broker.namesrv_addr)
    r = await ns.request(318, body=b"configStorePath=/tmp/x")
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    raw.close()
    ns.close()


async def test_acl_file_errors_refuse_start(broker_factory, tmp_path):
    from halfmq.broker.acl import AclConfigError

    bad = tmp_path / "bad.yml"
    bad.write_text("accounts:\n  - accessKey: a\n    secretKey: b\n    defaultTopicPerm: MAYBE\n")
    with pytest.raises(AclConfigError, match="MAYBE"):
        await broker_factory(store_dir=tmp_path / "s1", aclEnable=True, aclConfigFile=str(bad))
    with pytest.raises(AclConfigError, match="cannot read"):
        await broker_factory(store_dir=tmp_path / "s2", aclEnable=True, aclConfigFile=str(tmp_path / "none.yml"))


async def test_tls_broker_and_client(broker_factory, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    broker = await broker_factory(tlsEnable=True, tlsServerCertPath=str(cert), tlsServerKeyPath=str(key))
    context = ssl.create_default_context(cafile=str(cert))
    async with Producer("PG", broker.namesrv_addr, tls=context) as producer, \
            PullConsumer("CG", broker.namesrv_addr, tls=context) as consumer:
        result = await producer.send(Message("Secure", b"over tls"))
        assert [m.body for m in (await consumer.pull(result.queue, 0)).messages] == [b"over tls"]
    with pytest.raises((ConnectionError, asyncio.TimeoutError)):
        plain = await RawClient.connect(broker.addr)
        await plain.request(RequestCode.GET_MAX_OFFSET, {"topic": "Secure", "queueId": 0}, timeout=2)


async def test_a_send_signed_outside_the_skew_window_is_refused(acl_broker):
    """RocketMQ 4.x signs every extField, a send's bornTimestamp among them: a captured send replayed after
    authorizationSkewSeconds (15 min) is refused, as is one signed that far ahead. Before, a captured send was
    accepted for ever. Requests that sign no time (a pull here) cannot be told from their replay."""
    import time

    from halfmq.protocol.headers import SendMessageRequestHeaderV2
    from halfmq.protocol.properties import encode_properties

    app = Credentials("app", "app-secret")
    raw = await RawClient.connect(acl_broker.addr)
    try:
        def signed_send(born_ms: int) -> dict:
            header = SendMessageRequestHeaderV2(producerGroup="PG", topic="Allowed", defaultTopic="TBW102",
                                                defaultTopicQueueNums=4, queueId=0, sysFlag=0, bornTimestamp=born_ms,
                                                flag=0, properties=encode_properties({"WAIT": "true"}))
            return app.sign({k: str(v) for k, v in header.to_ext().items()}, b"m")

        now = int(time.time() * 1000)
        for born in (now - 16 * 60_000, now + 16 * 60_000):
            r = await raw.request(RequestCode.SEND_MESSAGE_V2, signed_send(born), b"m")
            assert r.code == ResponseCode.NO_PERMISSION and "authorizationSkewSeconds" in r.remark, r.remark
        r = await raw.request(RequestCode.SEND_MESSAGE_V2, signed_send(now - 14 * 60_000), b"m")
        assert r.code == ResponseCode.SUCCESS, r.remark  # within the window: a client's clock may be off a little
    finally:
        raw.close()
