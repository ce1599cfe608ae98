"""A real broker with its gRPC endpoint on 127.0.0.1 port 0, driven by the official RocketMQ 5 Python client."""
from __future__ import annotations

import threading
import time

import pytest
from rocketmq import ClientConfiguration, Credentials
from rocketmq.grpc_protocol.definition_pb2 import Metric

from tests.support import rocketmq5 as official
from tests.support.broker_thread import BrokerThread

pytestmark = pytest.mark.grpc


class GrpcBroker:
    """A BrokerThread with gRPC on; ``endpoint`` is what 5.x clients are given."""

    def __init__(self, store_dir, **overrides):
        self.store_dir = store_dir
        self.overrides = {"grpcListenPort": 0, **overrides}
        self.thread = BrokerThread(store_dir, **self.overrides)

    @property
    def broker(self):
        return self.thread.broker

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.broker.grpc_port}"

    def config(self, ak: str = "", sk: str = "") -> ClientConfiguration:
        return ClientConfiguration(self.endpoint, Credentials(ak, sk), request_timeout=5)

    def call(self, coro, timeout=30):
        return self.thread.call(coro, timeout)

    def restart(self) -> None:
        self.thread.stop()
        self.thread = BrokerThread(self.store_dir, **self.overrides)

    def stop(self) -> None:
        self.thread.stop()


@pytest.fixture
def grpc_broker_factory(tmp_path):
    started: list[GrpcBroker] = []

    def start(name: str = "store", **overrides) -> GrpcBroker:
        broker = GrpcBroker(tmp_path / name, **overrides)
        started.append(broker)
        return broker

    yield start
    for broker in reversed(started):
        broker.stop()


@pytest.fixture
def grpc_broker(grpc_broker_factory) -> GrpcBroker:
    return grpc_broker_factory()


@pytest.fixture
def clients():
    """Clients to shut down at the end (started or not): ``clients(client)`` starts and returns it."""
    started = []

    def start(client):
        started.append(client)
        return official.started(client)

    yield start
    for client in reversed(started):
        if client.is_running:
            client.shutdown()
        # shutdown() leaves a push consumer's metrics exporter running (client 5.1.2): metrics off stops it
        client.client_metrics.reset_metrics(Metric(on=False))


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05):
    """Poll ``predicate`` (a condition on broker or client state) until it is true; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        threading.Event().wait(interval)


def receive_all(consumer, count: int, invisible_s: int = 30, timeout: float = 20.0) -> list:
    """Messages received until ``count`` came (receives long-poll on the broker: no sleeping here)."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"received {len(got)} of {count} messages within {timeout} s")
        got.extend(consumer.receive(32, invisible_s))
    return got


def raw_call(endpoint: str, method: str, request, ak: str = "", sk: str = "", client_id: str = "raw-client@1"):
    """One RPC with the official client's generated stub and signature metadata: the answer as the broker sent it
    (the client's own classes fold the status codes into a few exception types)."""
    import grpc
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
    from rocketmq.v5.util.signature import Signature

    config = ClientConfiguration(endpoint, Credentials(ak, sk))
    with grpc.insecure_channel(endpoint) as channel:
        call = getattr(MessagingServiceStub(channel), method)
        answer = call(request, metadata=Signature.metadata(config, client_id), timeout=10)
        return list(answer) if method in ("ReceiveMessage", "PullMessage") else answer
