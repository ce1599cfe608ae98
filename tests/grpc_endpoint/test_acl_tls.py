"""The gRPC endpoint's ACL (the 5.x clients' MQv2-HMAC-SHA1 signature, the plain_acl.yml accounts) and TLS."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import Code, QueryRouteRequest
from rocketmq.v5.exception import ForbiddenException

from .conftest import raw_call, receive_all
from .test_produce_consume import message

pytestmark = pytest.mark.grpc
ACL = """
accounts:
  - accessKey: app
    secretKey: app-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Allowed=PUB|SUB
      - ReadOnly=SUB
"""


@pytest.fixture
def acl_broker(grpc_broker_factory, tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    return grpc_broker_factory(aclEnable=True, aclConfigFile=str(path))


def send_error(broker, clients, topic: str, ak: str, sk: str) -> Exception | None:
    producer = clients(Producer(broker.config(ak, sk), (topic,)))
    try:
        producer.send(message(topic, b"x"))
    except Exception as exc:  # the client wraps the broker's status in its own exception types
        return exc
    return None


def test_acl_on_grants_and_refuses_by_account(acl_broker, clients):
    assert send_error(acl_broker, clients, "Allowed", "app", "app-secret") is None
    consumer = clients(SimpleConsumer(acl_broker.config("app", "app-secret"), "Readers",
                                      {"Allowed": FilterExpression("*")}, await_duration=2))
    [msg] = receive_all(consumer, 1)
    consumer.ack(msg)
    # a subscribe-only account creates no topic by asking its route: the topic exists, and the send is refused
    acl_broker.call(acl_broker.broker.ctx.topics.ensure_for_send("ReadOnly", "TBW102", 0))
    assert isinstance(send_error(acl_broker, clients, "ReadOnly", "app", "app-secret"), ForbiddenException)
    assert route_code(acl_broker, "Allowed", "app", "not-the-secret") == Code.UNAUTHORIZED
    assert route_code(acl_broker, "Allowed", "", "") == Code.UNAUTHORIZED      # unsigned
    assert route_code(acl_broker, "Denied", "app", "app-secret") == Code.FORBIDDEN
    assert route_code(acl_broker, "ReadOnly", "app", "app-secret") == Code.OK  # a consumer may ask its route


def route_code(broker, topic: str, ak: str, sk: str) -> int:
    request = QueryRouteRequest()
    request.topic.name = topic
    return raw_call(broker.endpoint, "QueryRoute", request, ak, sk).status.code


def test_acl_off_serves_unsigned_clients(grpc_broker, clients):
    assert send_error(grpc_broker, clients, "Open", "", "") is None


TLS_CLIENT = textwrap.dedent("""
    import sys
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
    config = ClientConfiguration(sys.argv[1], Credentials(), request_timeout=5)
    producer = Producer(config, ("Secure",), tls_enable=True)
    producer.startup()
    msg = Message(); msg.topic = "Secure"; msg.body = b"over tls"
    producer.send(msg)
    consumer = SimpleConsumer(config, "SecureReaders", {"Secure": FilterExpression("*")}, await_duration=2,
                              tls_enable=True)
    consumer.startup()
    got = []
    while not got:
        got = consumer.receive(1, 30)
    consumer.ack(got[0])
    print("received", got[0].body.decode())
    consumer.shutdown(); producer.shutdown()
""")


def test_tls_with_the_broker_certificates(grpc_broker_factory, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    broker = grpc_broker_factory(tlsEnable=True, tlsServerCertPath=str(cert), tlsServerKeyPath=str(key))
    # The client trusts the system roots only; grpc takes another root file from this variable.
    env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(cert)}
    done = subprocess.run([sys.executable, "-c", TLS_CLIENT, broker.endpoint], env=env, capture_output=True,
                          text=True, timeout=120)
    assert "received over tls" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]


def test_a_call_signed_outside_the_skew_window_is_refused(acl_broker):
    """A captured authorization header replays for ever unless its signed x-mq-date-time is checked: calls signed
    more than authorizationSkewSeconds (15 min) from the broker's clock, either way, are refused UNAUTHORIZED, and a
    signature that does not cover x-mq-date-time too. Before, a 16 minutes old signature was served."""
    import hashlib
    import hmac
    import time

    import grpc
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    def route_status(date_time: str, signed_headers: str = "x-mq-date-time"):
        metadata = (("x-mq-client-id", "replayed@1"), ("x-mq-date-time", date_time))
        signed = "".join(dict(metadata)[name] for name in signed_headers.split(";"))
        signature = hmac.new(b"app-secret", signed.encode(), hashlib.sha1).hexdigest()
        metadata += (("authorization", f"MQv2-HMAC-SHA1 Credential=app, SignedHeaders={signed_headers}, "
                                       f"Signature={signature}"),)
        request = QueryRouteRequest()
        request.topic.name = "Allowed"
        with grpc.insecure_channel(acl_broker.endpoint) as channel:
            return MessagingServiceStub(channel).QueryRoute(request, metadata=metadata, timeout=10).status

    def at(offset_s: float) -> str:
        return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() + offset_s))

    for offset in (-16 * 60, 16 * 60):
        status = route_status(at(offset))
        assert status.code == Code.UNAUTHORIZED and "authorizationSkewSeconds" in status.message, status
    assert route_status("yesterday").code == Code.UNAUTHORIZED
    no_time = route_status(at(0), "x-mq-client-id")  # a valid signature of no time
    assert no_time.code == Code.UNAUTHORIZED and "x-mq-date-time" in no_time.message, no_time
    assert route_status(at(-14 * 60)).code == Code.OK
