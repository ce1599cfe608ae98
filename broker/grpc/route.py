"""QueryRoute, Heartbeat, QueryAssignment, NotifyClientTermination and Telemetry (the settings exchange).

A route is asked for by producers and consumers alike; only a caller that may publish to the topic may have it
auto-created by asking (as a remoting send may), others get TOPIC_NOT_FOUND for a missing topic.

A broker with namesrvAddr answers QueryRoute and QueryAssignment from the name servers' merged route: every broker's
queues, each with that broker's own gRPC endpoint (its registration's grpcAddr). A client then sends to, receives
from and acknowledges at the broker that holds the queue, and that broker checks its own halves back over the
client's stream to it. (The alternative, one endpoint forwarding each request to the right broker as RocketMQ 5's
proxy does in cluster mode, would add a hop and a copy of every message to each request.) A receive naming another
broker's queue is refused (receive.py): the client's route is stale.

A Settings message is bounded (grpcTelemetryMaxSettingsBytes, grpcTelemetryMaxSettingsTopics) before anything of it
is kept, and a stream's commands are read only while its reader takes the answers (sessions.py).
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass

from halfmq.protocol.codes import Perm

from ..names import check_group, validate_topic_name
from ..namesrv.lookup import BrokerQueues, NoNameServerAnswered
from ..topics import DEFAULT_TOPIC, SEND_FORBIDDEN
from .auth import GROUP, PUB, SUB, TOPIC, Caller, authenticate, may_publish, require
from .oversized import Oversized
from .schema import AddressScheme, ClientType, Code, MessageType, Permission, pb
from .status import GrpcError, ok, status_for

log = logging.getLogger(__name__)
ALL_TYPES = (MessageType["NORMAL"], MessageType["FIFO"], MessageType["DELAY"], MessageType["TRANSACTION"])
_DECLARED = {"NORMAL": (MessageType["NORMAL"],), "FIFO": (MessageType["FIFO"],), "DELAY": (MessageType["DELAY"],),
             "TRANSACTION": (MessageType["TRANSACTION"],), "MIXED": ALL_TYPES}
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_TIMEOUT_S = 30
MAX_VERSION_CHARS = 64  #: of a client's user-agent version, kept for the admin pages
PRODUCER_MAX_ATTEMPTS = 3


def accepted_types(config) -> tuple[int, ...]:
    """What a topic's queues accept: its declared message type, every type when undeclared (item 5)."""
    return _DECLARED.get(config.message_type or "MIXED", ALL_TYPES)


def _permission(perm: int) -> int:
    read, write = bool(perm & Perm.READ), bool(perm & Perm.WRITE)
    if read and write:
        return Permission["READ_WRITE"]
    return Permission["READ"] if read else Permission["WRITE"] if write else Permission["NONE"]


def resource_name(resource, what: str) -> str:
    if not resource.name:
        raise GrpcError(Code["ILLEGAL_TOPIC" if what == TOPIC else "ILLEGAL_CONSUMER_GROUP"], f"the {what} is empty")
    return resource.name


def checked_topic(resource) -> str:
    name = resource_name(resource, TOPIC)
    try:
        validate_topic_name(name)
    except Exception as exc:
        raise GrpcError(Code["ILLEGAL_TOPIC"], str(getattr(exc, "remark", exc))) from None
    return name


def checked_group(resource) -> str:
    name = resource_name(resource, GROUP)
    try:
        check_group(name, "group")
    except Exception as exc:
        raise GrpcError(Code["ILLEGAL_CONSUMER_GROUP"], str(getattr(exc, "remark", exc))) from None
    return name


@dataclass(frozen=True, slots=True)
class Served:
    """One broker's queues of a topic as gRPC answers list them, with the endpoint that serves them."""
    broker_name: str
    endpoints: object  #: pb.Endpoints
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    types: tuple[int, ...]


def endpoints(host: str, port: int):
    """A gRPC address as routes advertise it."""
    ends = pb.Endpoints()
    try:
        version = ipaddress.ip_address(host).version
        ends.scheme = AddressScheme["IPv4"] if version == 4 else AddressScheme["IPv6"]
    except ValueError:
        ends.scheme = AddressScheme["DOMAIN_NAME"]
    ends.addresses.add(host=host, port=port)
    return ends


class RouteService:
    def __init__(self, endpoint, producer):
        self.endpoint = endpoint
        self.ctx = endpoint.ctx
        self.sessions = endpoint.sessions
        self.producer = producer
        self.lookup = endpoint.lookup  #: with namesrvAddr, the cluster's routes (broker/namesrv/lookup.py)

    def endpoints(self):
        """This gRPC endpoint as routes advertise it (brokerIP1 or the bound address, and the gRPC port)."""
        return endpoints(self.ctx.config.advertised_ip, self.endpoint.port)

    @staticmethod
    def message_queue(topic: str, served: Served, queue_id: int, namespace: str = ""):
        mq = pb.MessageQueue()
        mq.topic.name = topic
        mq.topic.resource_namespace = namespace
        mq.id = queue_id
        mq.permission = _permission(served.perm)
        mq.broker.name = served.broker_name
        mq.broker.id = 0
        mq.broker.endpoints.CopyFrom(served.endpoints)
        mq.accept_message_types.extend(served.types)
        return mq

    async def served(self, topic: str, create: bool) -> list[Served]:
        """Every broker's queues of ``topic``: this broker's alone, or with namesrvAddr the cluster's. ``create``:
        the caller may publish, and a missing topic is created as a send creates it.

        Raises:
            GrpcError: TOPIC_NOT_FOUND; INTERNAL_SERVER_ERROR when no name server answers.
        """
        if self.lookup is not None:
            return await self._served_by_cluster(topic, create)
        config = self.ctx.topics.get(topic)
        if config is None:
            if not create:  # only a sender may create a topic, as a remoting send would
                raise GrpcError(Code["TOPIC_NOT_FOUND"], f"topic {topic} does not exist")
            config = await self.producer.topic_for_send(topic)
        return [Served(self.ctx.config.brokerName, self.endpoints(), config.read_queue_nums, config.write_queue_nums,
                       config.perm, accepted_types(config))]

    async def _served_by_cluster(self, topic: str, create: bool) -> list[Served]:
        brokers = await self._cluster_route(topic)
        # Routes carry no message type: a topic is declared alike on every broker of a cluster (mqadmin updateTopic
        # -c), so this broker's declaration stands for all; one it does not hold is taken as undeclared.
        local = self.ctx.topics.get(topic)
        types = accepted_types(local) if local is not None else ALL_TYPES
        if brokers is None:
            if not create:
                raise GrpcError(Code["TOPIC_NOT_FOUND"], f"topic {topic} does not exist (no name server knows it)")
            # As RocketMQ's clients do with a new topic in a cluster: every broker that may create topics (its
            # TBW102 inherits) gets the topic's queues, and each creates the topic on its first send.
            brokers = [BrokerQueues(b.broker_name, b.write_queue_nums, b.write_queue_nums, b.perm & ~Perm.INHERIT,
                                    b.grpc) for b in await self._cluster_route(DEFAULT_TOPIC) or ()
                       if b.perm & Perm.INHERIT]
            if not brokers:
                raise GrpcError(Code["TOPIC_NOT_FOUND"], f"topic {topic} does not exist, and no broker of the "
                                                         f"cluster creates topics (autoCreateTopicEnable=false)")
        # A broker without a gRPC endpoint cannot serve these clients: its queues are left out.
        served = [Served(b.broker_name, endpoints(*b.grpc), b.read_queue_nums, b.write_queue_nums, b.perm, types)
                  for b in brokers if b.grpc is not None]
        if not served:
            raise GrpcError(Code["TOPIC_NOT_FOUND"], f"no broker holding topic {topic} serves RocketMQ 5 clients "
                                                     f"(grpcListenPort)")
        return served

    async def _cluster_route(self, topic: str) -> tuple[BrokerQueues, ...] | None:
        try:
            return await self.lookup.route(topic)
        except NoNameServerAnswered as exc:
            raise GrpcError(Code["INTERNAL_SERVER_ERROR"], str(exc)) from None

    async def query_route(self, request, caller: Caller):
        topic = checked_topic(request.topic)
        publisher = topic not in SEND_FORBIDDEN and may_publish(caller, topic)
        if not publisher:
            require(caller, (TOPIC, topic, SUB))
        namespace = request.topic.resource_namespace
        response = pb.QueryRouteResponse(status=ok())
        for served in await self.served(topic, create=publisher):
            for queue_id in range(max(served.read_queue_nums, served.write_queue_nums)):
                response.message_queues.append(self.message_queue(topic, served, queue_id, namespace))
        return response

    async def query_assignment(self, request, caller: Caller):
        """Every readable queue of the topic, to every consumer of the group: with receipts, consumers of a group
        share queues safely (a message is invisible to the others while one holds it)."""
        topic, group = checked_topic(request.topic), checked_group(request.group)
        require(caller, (GROUP, group, SUB), (TOPIC, topic, SUB))
        namespace = request.topic.resource_namespace
        response = pb.QueryAssignmentResponse(status=ok())
        for served in await self.served(topic, create=False):
            if served.perm & Perm.READ:
                for queue_id in range(served.read_queue_nums):
                    response.assignments.add().message_queue.CopyFrom(
                        self.message_queue(topic, served, queue_id, namespace))
        return response

    async def heartbeat(self, request, caller: Caller):
        session = self.sessions.get(caller.client_id)
        if request.HasField("group") and request.group.name:
            group = checked_group(request.group)
            require(caller, (GROUP, group, SUB))
            await self.ctx.topics.ensure_group(group)
        self.sessions.heartbeat(session)
        return pb.HeartbeatResponse(status=ok())

    async def notify_client_termination(self, request, caller: Caller):
        session = self.sessions.get(caller.client_id)  # the caller's own: FORBIDDEN for another's
        self.sessions.terminated(session.client_id)
        return pb.NotifyClientTerminationResponse(status=ok())

    # --- Telemetry ---
    async def telemetry(self, request_iterator, context):
        """The client's settings in, the broker's settings (and later its commands) out, on one stream."""
        try:
            caller = authenticate(self.ctx.acl, context)
            session = self.sessions.get(caller.client_id, context.peer(), caller.language)
        except GrpcError as exc:
            yield pb.TelemetryCommand(status=status_for(exc))
            return
        outbox = session.attach()
        reader = asyncio.ensure_future(self._read_commands(request_iterator, caller, session, outbox))
        try:
            while True:
                item = await outbox.get()
                if item is None:
                    break
                command, size = item
                yield command
                session.written(outbox, size)
        finally:
            reader.cancel()
            if session.detach(outbox):
                self.sessions.closed(session)

    async def _read_commands(self, request_iterator, caller: Caller, session, outbox) -> None:
        try:
            async for command in request_iterator:
                session.heard()
                if type(command) is Oversized:  # never parsed (oversized.py): refused as too large settings are
                    session.queue(outbox, pb.TelemetryCommand(status=command.status()))
                    await session.room(outbox)
                    # grpc received and copied it whole before it got here, and its refusal is a few bytes that
                    # never fill the stream's unread bound: a client sending such commands back to back was read
                    # as fast as it sent (4 MiB each, measured: another client's remoting sends halved, a gRPC
                    # client's p99 went from 60 to 290 ms). Not read again until its bytes are paid for.
                    await self.endpoint.refused.pay(caller.remote, command.size)
                elif command.HasField("settings"):
                    try:
                        reply = await self.settings(command.settings, caller, session)
                    except Exception as exc:  # answered on the stream; the stream goes on
                        reply = pb.TelemetryCommand(status=status_for(exc))
                    session.queue(outbox, reply)
                    await session.room(outbox)  # a client that does not take its answers is not read further
                # thread stack traces and verify results answer commands halfmq never sends: nothing to do
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away mid-read
            log.debug("telemetry stream of %s ended: %s", session.client_id, exc)
        outbox.put_nowait(None)

    async def settings(self, settings, caller: Caller, session):
        """The broker's answer to a client's settings: what it may send, or how it consumes."""
        cfg = self.ctx.config
        size, most_bytes = settings.ByteSize(), cfg.grpcTelemetryMaxSettingsBytes
        if size > most_bytes:
            raise GrpcError(Code["PAYLOAD_TOO_LARGE"], f"the settings are {size} bytes, more than "
                                                       f"grpcTelemetryMaxSettingsBytes {most_bytes}")
        named, most_topics = len(settings.publishing.topics) + len(settings.subscription.subscriptions), \
            cfg.grpcTelemetryMaxSettingsTopics
        if named > most_topics:
            raise GrpcError(Code["PAYLOAD_TOO_LARGE"], f"the settings name {named} topics, more than "
                                                       f"grpcTelemetryMaxSettingsTopics {most_topics}")
        # The one thing kept of a client's settings besides its topics: its version, which operators see (bounded).
        session.version = settings.user_agent.version[:MAX_VERSION_CHARS]
        reply = pb.Settings()
        reply.CopyFrom(settings)
        reply.request_timeout.seconds = max(settings.request_timeout.seconds, 3)
        kind = settings.client_type
        if kind == ClientType["PRODUCER"] or settings.HasField("publishing"):
            topics = [checked_topic(t) for t in settings.publishing.topics]
            # the stream gets this topic's transaction checks, with uncommitted bodies: PUB is needed
            require(caller, *((TOPIC, topic, PUB) for topic in topics))
            reply.publishing.max_body_size = cfg.maxMessageSize
            reply.publishing.validate_message_type = True
            reply.backoff_policy.Clear()
            reply.backoff_policy.max_attempts = PRODUCER_MAX_ATTEMPTS
            backoff = reply.backoff_policy.exponential_backoff
            backoff.initial.FromMilliseconds(10)
            backoff.max.FromMilliseconds(1000)
            backoff.multiplier = 2.0
            self.sessions.declares(session, topics)
        elif settings.HasField("subscription"):
            sub = settings.subscription
            group = checked_group(sub.group)
            topics = [checked_topic(entry.topic) for entry in sub.subscriptions]
            require(caller, (GROUP, group, SUB), *((TOPIC, topic, SUB) for topic in topics))
            await self.ctx.topics.ensure_group(group)
            configs = [self.ctx.topics.get(topic) for topic in topics]
            reply.subscription.fifo = any(c is not None and c.message_type == "FIFO" for c in configs)
            reply.subscription.receive_batch_size = RECEIVE_BATCH_SIZE
            if not sub.HasField("long_polling_timeout") or sub.long_polling_timeout.seconds <= 0:
                reply.subscription.long_polling_timeout.seconds = LONG_POLLING_TIMEOUT_S
            reply.backoff_policy.Clear()
            reply.backoff_policy.max_attempts = cfg.grpcMaxDeliveryAttempts
            backoff = reply.backoff_policy.exponential_backoff
            backoff.initial.FromMilliseconds(1000)
            backoff.max.FromMilliseconds(60_000)
            backoff.multiplier = 2.0
        else:
            raise GrpcError(Code["UNRECOGNIZED_CLIENT_TYPE"], f"client type {kind} is not served")
        reply.metric.Clear()
        if kind == ClientType["PUSH_CONSUMER"]:
            # The 5.1.2 Python push consumer registers gauges with its meter provider whatever the setting, and
            # fails without one: it gets metrics on, exported here and discarded (server.py's metrics sink).
            reply.metric.on = True
            reply.metric.endpoints.CopyFrom(self.endpoints())
        return pb.TelemetryCommand(status=ok(), settings=reply)
