"""Who a gRPC session belongs to, who may read system topics or create topics through a route, and the bounds on
sessions and telemetry: the attacks that worked before, each against a real broker through raw grpcio calls (and
the official client as the victim)."""
from __future__ import annotations

import asyncio
import queue
import socket
import threading

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, Producer, TransactionResolution
from rocketmq.grpc_protocol import (ClientType, Code, HeartbeatRequest, NotifyClientTerminationRequest,
                                    QueryAssignmentRequest, QueryRouteRequest, ReceiveMessageRequest, TelemetryCommand)
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

from halfmq.broker.topics import HALF_TOPIC
from halfmq.protocol.codes import RequestCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.message import MessageRecord, encode_record

from .conftest import raw_call, wait_until
from .test_produce_consume import message
from .test_transactions import Checker

pytestmark = pytest.mark.grpc
ACL = """
accounts:
  - accessKey: owner
    secretKey: owner-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Secret=PUB|SUB
  - accessKey: nobody
    secretKey: nobody-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
  - accessKey: reader
    secretKey: reader-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
  - accessKey: writer
    secretKey: writer-secret
    defaultTopicPerm: PUB
    defaultGroupPerm: SUB
"""
OWNER, NOBODY, READER, WRITER = (("owner", "owner-secret"), ("nobody", "nobody-secret"),
                                 ("reader", "reader-secret"), ("writer", "writer-secret"))
FAST_CHECKS = {"transactionTimeOut": 300, "transactionCheckInterval": 300}


@pytest.fixture
def acl_file(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    return str(path)


def non_loopback_address() -> str:
    """This host's address on its default route (the broker listens on every interface in those tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        except OSError:
            pytest.skip("no non-loopback IPv4 interface")
        address = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("no non-loopback IPv4 interface")
    return address


def channel_to(target: str) -> grpc.Channel:
    """A channel with a connection of its own (grpc shares connections between equal channels by default)."""
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def metadata(target: str, client_id: str, creds=("", "")):
    return Signature.metadata(ClientConfiguration(target, Credentials(*creds)), client_id)


def unary(channel, target: str, method: str, request, client_id: str, creds=("", "")):
    call = getattr(MessagingServiceStub(channel), method)
    answer = call(request, metadata=metadata(target, client_id, creds), timeout=10)
    return list(answer) if method == "ReceiveMessage" else answer


class Stream:
    """A raw Telemetry stream: commands are sent with ``send``; a reader thread queues what the broker sends (None
    once the stream ended), unless ``read`` is False (a client that never reads its replies)."""

    def __init__(self, target: str, client_id: str, creds=("", ""), read: bool = True):
        self.channel = channel_to(target)
        self.requests: queue.Queue = queue.Queue()
        self.responses: queue.Queue = queue.Queue()
        self.call = MessagingServiceStub(self.channel).Telemetry(iter(self.requests.get, None),
                                                                 metadata=metadata(target, client_id, creds))
        if read:
            self.start_reading()

    def start_reading(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for command in self.call:
                self.responses.put(command)
        except grpc.RpcError:
            pass
        self.responses.put(None)

    def send(self, command) -> None:
        self.requests.put(command)

    def next(self, timeout: float = 20.0):
        return self.responses.get(timeout=timeout)

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def streams():
    opened: list[Stream] = []

    def open_stream(*args, **kw) -> Stream:
        stream = Stream(*args, **kw)
        opened.append(stream)
        return stream

    yield open_stream
    for stream in opened:
        stream.close()


def producer_settings(topics, user_agent_bytes: int = 0) -> TelemetryCommand:
    command = TelemetryCommand()
    command.settings.client_type = ClientType.PRODUCER
    for topic in topics:
        command.settings.publishing.topics.add(name=topic)
    command.settings.user_agent.hostname = "h" * user_agent_bytes
    return command


def route(channel, target, topic: str, client_id: str = "route@1", creds=("", "")):
    request = QueryRouteRequest()
    request.topic.name = topic
    return unary(channel, target, "QueryRoute", request, client_id, creds)


# --- 1. a session belongs to whoever opened it ---

def test_another_account_cannot_take_a_producers_telemetry_and_its_checks(grpc_broker_factory, acl_file, clients,
                                                                          streams):
    broker = grpc_broker_factory(aclEnable=True, aclConfigFile=acl_file, **FAST_CHECKS)
    checker = Checker(TransactionResolution.COMMIT)
    victim = clients(Producer(broker.config(*OWNER), ("Secret",), checker))
    victim.send(message("Secret", b"uncommitted secret"), victim.begin_transaction())
    attacker = streams(broker.endpoint, victim.client_id, NOBODY)
    first = attacker.next()
    assert first is not None and first.status.code == Code.FORBIDDEN, first
    assert checker.checked.get(timeout=20).body == b"uncommitted secret"  # the check still reaches its producer


def test_another_account_cannot_end_a_clients_stream(grpc_broker_factory, acl_file, streams):
    broker = grpc_broker_factory(aclEnable=True, aclConfigFile=acl_file)
    victim = streams(broker.endpoint, "victim@1", OWNER)
    victim.send(producer_settings(["Secret"]))
    assert victim.next().status.code == Code.OK
    with channel_to(broker.endpoint) as channel:
        answer = unary(channel, broker.endpoint, "NotifyClientTermination", NotifyClientTerminationRequest(),
                       "victim@1", NOBODY)
    assert answer.status.code == Code.FORBIDDEN
    victim.send(producer_settings(["Secret"]))  # the stream is still the victim's, and open
    assert victim.next().status.code == Code.OK


def test_acl_off_a_client_id_belongs_to_its_address(grpc_broker_factory, streams):
    broker = grpc_broker_factory(bindAddress="0.0.0.0")
    victim = streams(broker.endpoint, "victim@1")
    victim.send(producer_settings(["Pay"]))
    assert victim.next().status.code == Code.OK
    other = f"{non_loopback_address()}:{broker.broker.grpc_port}"
    attacker = streams(other, "victim@1")
    first = attacker.next()
    assert first is not None and first.status.code == Code.FORBIDDEN, first
    with channel_to(other) as channel:
        answer = unary(channel, other, "NotifyClientTermination", NotifyClientTerminationRequest(), "victim@1")
    assert answer.status.code == Code.FORBIDDEN
    victim.send(producer_settings(["Pay"]))
    assert victim.next().status.code == Code.OK
    # the same address (another connection of the client, say to another advertised endpoint) is the client
    again = streams(broker.endpoint, "victim@1")
    again.send(producer_settings(["Pay"]))
    assert again.next().status.code == Code.OK


def test_a_producer_gets_checks_once_it_heartbeats_not_when_its_settings_arrive(grpc_broker_factory, clients,
                                                                               streams):
    """The official clients send their settings while they start, and the Python client drops a check that comes
    before it runs ("producer is not running": a CI failure of the restart test, which then waited for the next
    interval). A producer is registered for its topics' checks by its heartbeat, the first a second after start,
    as RocketMQ's proxy does."""
    broker = grpc_broker_factory(transactionTimeOut=300, transactionCheckInterval=60_000)
    first = clients(Producer(broker.config(), ("Ship",), Checker(TransactionResolution.ROLLBACK)))
    first.send(message("Ship", b"ship order 8"), first.begin_transaction())
    first.shutdown()
    waiting = broker.broker.ctx.check_back.waiting_for_producer
    wait_until(lambda: waiting.get("%GRPC%Ship"))
    starting = streams(broker.endpoint, "starting@1")
    starting.send(producer_settings(["Ship"]))
    assert starting.next().status.code == Code.OK
    with pytest.raises(queue.Empty):
        starting.next(timeout=2)  # settings alone: no check yet
    assert waiting.get("%GRPC%Ship")
    with channel_to(broker.endpoint) as channel:
        answer = unary(channel, broker.endpoint, "Heartbeat", HeartbeatRequest(client_type=ClientType.PRODUCER),
                       "starting@1")
    assert answer.status.code == Code.OK
    check = starting.next()
    assert check is not None and check.HasField("recover_orphaned_transaction_command"), check
    assert check.recover_orphaned_transaction_command.message.body == b"ship order 8"


# --- 3. system topics are read by loopback clients only when ACL is off, through gRPC as through remoting ---

def test_acl_off_system_topics_are_for_loopback_clients_only(grpc_broker_factory, clients):
    broker = grpc_broker_factory(bindAddress="0.0.0.0", transactionTimeOut=60_000)
    producer = clients(Producer(broker.config(), ("Pay",), Checker(TransactionResolution.COMMIT)))
    producer.send(message("Pay", b"uncommitted"), producer.begin_transaction())
    other = f"{non_loopback_address()}:{broker.broker.grpc_port}"
    with channel_to(other) as channel:
        assert route(channel, other, HALF_TOPIC).status.code == Code.FORBIDDEN
        assignment = QueryAssignmentRequest()
        assignment.topic.name, assignment.group.name = HALF_TOPIC, "Readers"
        assert unary(channel, other, "QueryAssignment", assignment, "reader@1").status.code == Code.FORBIDDEN
        receive = ReceiveMessageRequest(batch_size=32, auto_renew=False)
        receive.group.name = "Readers"
        receive.message_queue.topic.name = HALF_TOPIC
        receive.message_queue.id = 0
        receive.filter_expression.expression = "*"
        receive.invisible_duration.seconds = 30
        receive.long_polling_timeout.seconds = 1
        answers = unary(channel, other, "ReceiveMessage", receive, "reader@1")
        assert [a.status.code for a in answers if a.HasField("status")] == [Code.FORBIDDEN]
        assert not any(a.HasField("message") for a in answers)
    with channel_to(broker.endpoint) as channel:  # a loopback client is the operator's, as for remoting
        assert route(channel, broker.endpoint, HALF_TOPIC, "local@1").status.code == Code.OK


# --- 4. only a caller allowed to publish may create a topic by asking its route ---

def test_a_subscribe_only_route_query_creates_no_topic(grpc_broker_factory, acl_file):
    broker = grpc_broker_factory(aclEnable=True, aclConfigFile=acl_file)
    answer = raw_call(broker.endpoint, "QueryRoute", _route_request("NotYetThere"), *READER, client_id="reader@1")
    assert answer.status.code == Code.TOPIC_NOT_FOUND
    assert broker.broker.ctx.topics.get("NotYetThere") is None
    answer = raw_call(broker.endpoint, "QueryRoute", _route_request("NotYetThere"), *WRITER, client_id="writer@1")
    assert answer.status.code == Code.OK and answer.message_queues
    assert broker.broker.ctx.topics.get("NotYetThere") is not None


def _route_request(topic: str) -> QueryRouteRequest:
    request = QueryRouteRequest()
    request.topic.name = topic
    return request


# --- 5. bounds on client ids, sessions and telemetry ---

def test_client_id_obeys_the_remoting_rule(grpc_broker):
    with channel_to(grpc_broker.endpoint) as channel:
        answer = route(channel, grpc_broker.endpoint, "Pay", "c" * 256)
    assert answer.status.code == Code.BAD_REQUEST
    assert "x-mq-client-id" in answer.status.message
    assert not grpc_broker.broker.grpc.sessions.by_client


def test_client_ids_per_address_and_in_all_are_bounded(grpc_broker_factory):
    broker = grpc_broker_factory(grpcMaxClientIdsPerOwner=3, grpcMaxClientIds=5, bindAddress="0.0.0.0")
    other = f"{non_loopback_address()}:{broker.broker.grpc_port}"
    with channel_to(broker.endpoint) as local, channel_to(other) as remote:
        codes = [route(local, broker.endpoint, "Pay", f"client@{i}").status.code for i in range(4)]
        assert codes == [Code.OK] * 3 + [Code.TOO_MANY_REQUESTS]
        assert route(local, broker.endpoint, "Pay", "client@0").status.code == Code.OK  # a known one goes on
        codes = [route(remote, other, "Pay", f"remote@{i}").status.code for i in range(3)]
        assert codes == [Code.OK] * 2 + [Code.TOO_MANY_REQUESTS]  # 5 in all
    assert len(broker.broker.grpc.sessions.by_client) == 5


def test_oversized_settings_are_refused(grpc_broker_factory, streams):
    grpc_broker = grpc_broker_factory(refusedRequestBytesPerSecond=1 << 30)  # no pause after the refusal
    stream = streams(grpc_broker.endpoint, "big@1")
    stream.send(producer_settings(["Pay"], user_agent_bytes=4 << 20))
    refused = stream.next()  # before it is parsed (before: parsed whole, each time, then refused)
    assert refused.status.code == Code.PAYLOAD_TOO_LARGE and "this broker parses" in refused.status.message
    stream.send(producer_settings([f"T{i}" for i in range(1001)]))
    answer = stream.next()
    assert answer.status.code == Code.PAYLOAD_TOO_LARGE and "1001" in answer.status.message
    session = grpc_broker.broker.grpc.sessions.by_client["big@1"]
    assert not session.producer_topics
    stream.send(producer_settings(["Pay"]))  # the stream goes on
    assert stream.next().status.code == Code.OK


def test_refused_commands_are_read_no_faster_than_their_bytes_are_paid_for(grpc_broker_factory, streams):
    # Before: 4 MiB settings back to back were each copied by grpc and refused at once, as fast as the client sent
    # them (another client's remoting sends halved, a gRPC client's p99 went from 60 to 290 ms).
    broker = grpc_broker_factory(refusedRequestBytesPerSecond=64 << 10)  # a 2 MiB command: 32 s unread
    stream = streams(broker.endpoint, "flood@1")
    for _ in range(3):
        stream.send(producer_settings(["Pay"], user_agent_bytes=2 << 20))
    assert stream.next().status.code == Code.PAYLOAD_TOO_LARGE
    with pytest.raises(queue.Empty):
        stream.next(timeout=3)  # the second is not read before the first is paid for


def test_replies_a_client_does_not_read_are_bounded(grpc_broker_factory, streams):
    bound = 64 << 10
    broker = grpc_broker_factory(grpcTelemetryMaxUnreadBytes=bound)
    stream = streams(broker.endpoint, "deaf@1", read=False)
    reply_size = 100 << 10
    for index in range(200):  # 20 MB of replies the client does not read
        command = producer_settings(["Pay"], user_agent_bytes=reply_size)
        command.settings.user_agent.version = str(index)
        stream.send(command)

    def queued() -> int:
        session = broker.broker.grpc.sessions.by_client.get("deaf@1")
        outbox = getattr(session, "_outbox", None)
        return sum(item[0].ByteSize() for item in list(getattr(outbox, "_queue", ())) if item)

    def settled() -> bool:
        session = broker.broker.grpc.sessions.by_client.get("deaf@1")
        # the broker stopped reading the stream (its replies are over the bound), or it let them pile up
        return session is not None and (getattr(session, "full", False) or queued() > 4 * bound)

    wait_until(settled)
    assert queued() <= bound + 2 * reply_size

    async def check_to_deaf_stream() -> bool:
        """The check offered while the stream is full, in the same step of the broker's loop as the look: grpc may
        still take a reply or two off the outbox between a look from this thread and the offer (a CI flake)."""
        check = RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE, body=bytes(encode_record(MessageRecord("Pay"))),
                                ext_fields={"commitLogOffset": "0", "tranStateTableOffset": "0"})
        session = broker.broker.grpc.sessions.by_client["deaf@1"]
        deadline = asyncio.get_running_loop().time() + 20
        while not session.full:  # full again once grpc's buffers hold what they take: the client never reads
            assert asyncio.get_running_loop().time() < deadline, "the unread stream never stayed full"
            await asyncio.sleep(0.01)
        return session.send_request(check)

    assert broker.call(check_to_deaf_stream()) is False  # not queued: the scheduler sends it again later
    stream.start_reading()  # the broker reads the stream again as its replies are taken: nothing is lost
    versions = [stream.next().settings.user_agent.version for _ in range(200)]
    assert versions == [str(index) for index in range(200)]


def test_replies_no_client_reads_are_bounded_for_the_whole_broker(grpc_broker_factory, streams):
    """Each stream's unread replies were bounded, not all of them together: N sessions could hold N ×
    grpcTelemetryMaxUnreadBytes (10,000 × 4 MiB). Above grpcTelemetryMaxUnreadBytesTotal no stream with replies of
    its own untaken is read further: six deaf streams of 4.5 MB of replies each hold about the total, not six
    times their own bound (12 MiB before), and every reply still arrives once they read."""
    per_stream, total, reply_size, count = 2 << 20, 256 << 10, 100 << 10, 45
    broker = grpc_broker_factory(grpcTelemetryMaxUnreadBytes=per_stream, grpcTelemetryMaxUnreadBytesTotal=total)
    deaf = [streams(broker.endpoint, f"deaf{n}@1", read=False) for n in range(6)]
    for stream in deaf:
        for index in range(count):
            command = producer_settings(["Pay"], user_agent_bytes=reply_size)
            command.settings.user_agent.version = str(index)
            stream.send(command)

    def sessions():
        return [broker.broker.grpc.sessions.by_client.get(f"deaf{n}@1") for n in range(6)]

    def queued() -> int:
        return sum(item[0].ByteSize() for session in sessions() if session is not None
                   for item in list(getattr(session._outbox, "_queue", ())) if item)

    wait_until(lambda: all(s is not None and s.full for s in sessions()) or queued() > 4 << 20, timeout=60)
    assert queued() <= 4 << 20, queued()
    for stream in deaf:
        stream.start_reading()
    for stream in deaf:
        assert [stream.next().settings.user_agent.version for _ in range(count)] == [str(i) for i in range(count)]
