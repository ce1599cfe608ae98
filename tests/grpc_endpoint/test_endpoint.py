"""The endpoint itself: the schema it serves, its off switch, FIFO push consumption, DELAY, what is not served."""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import time

import pytest
from rocketmq import ConsumeResult, FilterExpression, MessageListener, Producer, PushConsumer
from rocketmq.grpc_protocol import Code, RecallMessageRequest, ReceiveMessageRequest
from rocketmq.grpc_protocol.service_pb2 import PullMessageRequest

from halfmq.broker.grpc import schema
from halfmq.broker.topics import TopicConfig

from .conftest import raw_call
from .test_produce_consume import message

pytestmark = pytest.mark.grpc


def test_shipped_descriptor_set_is_the_compiled_proto_files(tmp_path):
    import grpc_tools
    out = tmp_path / "fresh.binpb"
    here = os.path.dirname(schema.__file__)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "--include_imports", f"--descriptor_set_out={out}",
                    f"-I{os.path.join(here, 'proto')}",
                    f"-I{os.path.join(os.path.dirname(grpc_tools.__file__), '_proto')}",
                    "apache/rocketmq/v2/service.proto"], check=True)
    with open(schema.SCHEMA_PATH, "rb") as shipped:
        assert out.read_bytes() == shipped.read()


def test_off_switch(grpc_broker_factory):
    broker = grpc_broker_factory(grpcListenPort=-1)
    assert (broker.broker.grpc, broker.broker.grpc_port) == (None, 0)


def test_unserved_rpcs_answer_the_reference_codes(grpc_broker):
    request = PullMessageRequest()
    request.group.name, request.message_queue.topic.name = "G", "T"
    [answer] = raw_call(grpc_broker.endpoint, "PullMessage", request)
    assert answer.status.code == Code.NOT_IMPLEMENTED
    recall = RecallMessageRequest()
    recall.topic.name, recall.recall_handle = "T", "anything"
    assert raw_call(grpc_broker.endpoint, "RecallMessage", recall).status.code == Code.UNSUPPORTED


def test_bad_receives_are_refused_with_their_codes(grpc_broker, clients):
    clients(Producer(grpc_broker.config(), ("Known",))).send(message("Known", b"x"))
    request = ReceiveMessageRequest()
    request.group.name, request.message_queue.topic.name, request.batch_size = "G", "Known", 1
    [answer] = raw_call(grpc_broker.endpoint, "ReceiveMessage", request)  # no invisible duration
    assert answer.status.code == Code.ILLEGAL_INVISIBLE_TIME
    request.invisible_duration.seconds = 10
    request.batch_size = 0
    assert raw_call(grpc_broker.endpoint, "ReceiveMessage", request)[0].status.code == Code.BAD_REQUEST
    request.batch_size, request.message_queue.topic.name = 1, "Unknown"
    assert raw_call(grpc_broker.endpoint, "ReceiveMessage", request)[0].status.code == Code.TOPIC_NOT_FOUND
    assert raw_call(grpc_broker.endpoint, "ReceiveMessage", request, client_id="")[0].status.code == \
        Code.CLIENT_ID_REQUIRED


def test_delay_message_is_delivered_at_its_time(grpc_broker, clients):
    from rocketmq import SimpleConsumer
    producer = clients(Producer(grpc_broker.config(), ("Later",)))
    msg = message("Later", b"later")
    due = int(time.time()) + 2
    msg.delivery_timestamp = due
    producer.send(msg)
    consumer = clients(SimpleConsumer(grpc_broker.config(), "Patient", {"Later": FilterExpression("*")},
                                      await_duration=5))
    got = []
    while not got:
        got = consumer.receive(1, 30)
    assert abs(time.time() - due) < 1.0
    assert got[0].delivery_timestamp == due * 1000


class Recorder(MessageListener):
    def __init__(self):
        self.bodies: queue.Queue = queue.Queue()

    def consume(self, msg):
        self.bodies.put(msg.body)
        return ConsumeResult.SUCCESS


def test_push_consumer_gets_a_fifo_group_in_order(grpc_broker, clients):
    grpc_broker.call(grpc_broker.broker.ctx.topics.put(TopicConfig("Sequence", 4, 4, message_type="FIFO")))
    producer = clients(Producer(grpc_broker.config(), ("Sequence",)))
    for i in range(20):
        producer.send(message("Sequence", f"{i}".encode(), group=f"g{i % 2}"))
    recorder = Recorder()
    clients(PushConsumer(grpc_broker.config(), "Sequencers", recorder, {"Sequence": FilterExpression("*")}))
    bodies = [int(recorder.bodies.get(timeout=30)) for _ in range(20)]
    for group in (0, 1):
        mine = [b for b in bodies if b % 2 == group]
        assert mine == sorted(mine), bodies


def test_send_refusals_answer_the_reference_codes(grpc_broker_factory):
    from rocketmq.grpc_protocol import Encoding, MessageType, SendMessageRequest
    broker = grpc_broker_factory(timerMaxDelaySec=60, maxBatchMessageCount=2)

    def request(count: int = 1, **system) -> SendMessageRequest:
        req = SendMessageRequest()
        for _ in range(count):
            msg = req.messages.add()
            msg.topic.name, msg.body = "Refusals", b"x"
            msg.system_properties.message_id = "01TEST"
            msg.system_properties.body_encoding = Encoding.IDENTITY
            msg.system_properties.message_type = system.get("message_type", MessageType.NORMAL)
            for key, value in system.items():
                if key == "delivery_timestamp":
                    msg.system_properties.delivery_timestamp.seconds = value
                elif key != "message_type":
                    setattr(msg.system_properties, key, value)
        return req

    def send(count: int = 1, **system) -> int:
        return raw_call(broker.endpoint, "SendMessage", request(count, **system)).status.code

    assert send() == Code.OK
    assert send(count=3) == Code.BAD_REQUEST                                            # beyond maxBatchMessageCount
    an_hour_ahead = int(time.time()) + 3600                                             # timerMaxDelaySec is 60
    assert send(message_type=MessageType.DELAY, delivery_timestamp=an_hour_ahead) == Code.ILLEGAL_DELIVERY_TIME
    assert send(message_type=MessageType.FIFO) == Code.ILLEGAL_MESSAGE_GROUP          # FIFO without a group
    assert send(message_group="g") == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE         # a group on a NORMAL message
    broker.call(broker.broker.ctx.topics.put(TopicConfig("Refusals", 4, 4, message_type="FIFO")))
    assert send() == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE                           # the topic declares FIFO
    assert send(message_type=MessageType.FIFO, message_group="g") == Code.OK


WITHOUT_GRPC = """
import sys
sys.modules["h2"] = None  # as if the grpc extra were not installed
from halfmq.broker.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_the_grpc_extra_the_broker_serves_remoting_and_says_why(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WITHOUT_GRPC, "broker", "--bindAddress=127.0.0.1", "--listenPort=0",
                             "--namesrvListenPort=-1", "--metricsPromExporterPort=-1", "--grpcListenPort=0", "--dashboardPort=-1",
                             f"--storePathRootDir={tmp_path / 'store'}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "halfmq ready" in line:
                break
        output = "".join(lines)
        assert "halfmq ready" in output and "grpc -" in output, output
        assert "RocketMQ 5 (gRPC) clients are not served" in output and "halfmq[grpc]" in output, output
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


async def test_a_grpc_port_in_use_is_a_start_error_naming_the_key(grpc_broker, broker_factory, tmp_path):
    from halfmq.broker.server import StartError
    port = grpc_broker.broker.grpc_port
    with pytest.raises(StartError, match=f"grpcListenPort={port}"):
        await broker_factory(store_dir=tmp_path / "second", grpcListenPort=port)
