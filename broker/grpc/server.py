"""The gRPC endpoint: ``apache.rocketmq.v2.MessagingService`` on grpcListenPort, served by http2.py on the broker's
loop.

Each RPC is authenticated (auth.py), handed to its service (route, send, receive) and answered with a Status
whatever happens: a failure becomes the reference's Code (status.py), never a gRPC error the 5.x clients do not
read. RPCs halfmq does not serve (PullMessage, the offset RPCs, lite topics) answer NOT_IMPLEMENTED.

A request larger than maxMessageSize + grpcRequestHeadroomBytes is refused RESOURCE_EXHAUSTED by the transport,
from its length prefix (measured before: 8 half-sent 40 MiB messages on one connection cost the broker 258 MiB).
Smaller limits per RPC are applied before parsing (oversized.py): a request that is not a send is parsed only up to
grpcRequestHeadroomBytes, a Telemetry message up to grpcTelemetryMaxSettingsBytes and its envelope.
A connection has at most grpcMaxStreamsPerConnection RPCs open at once (HTTP/2's own limit: more wait in the
client), and holds at most serverMaxInflightBytesPerConnection of incomplete requests (more wait in the client).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from ..namesrv.lookup import RouteLookup
from ..services.periodic import PeriodicTask
from ..transport import FrameBudget
from .auth import authenticate
from .convert import peer_host
from .http2 import BIDI, SERVER_STREAM, UNARY, Http2GrpcServer, Method
from .oversized import Oversized, bounded
from .receive import AUTO_RENEW_INTERVAL_S, ReceiveService, not_found
from .refused import RefusedBytes
from .route import RouteService
from .schema import SERVICE, Code, pb, rpc_names, rpc_types
from .send import SendService
from .sessions import Sessions
from .status import GrpcError, status, status_for

log = logging.getLogger(__name__)
SESSION_SCAN_INTERVAL_S = 10.0
#: what a TelemetryCommand adds around its settings, at most
TELEMETRY_ENVELOPE_BYTES = 1024


#: OpenTelemetry's metrics collector: push consumers export their client metrics to the endpoint they are given
METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


async def _discard_metrics(request: bytes, context) -> bytes:
    """Client metrics are accepted and dropped (an empty ExportMetricsServiceResponse): the broker keeps its own."""
    return b""


class GrpcEndpoint:
    def __init__(self, ctx, producer, consumer, transactions):
        self.ctx = ctx
        self.port = 0
        self.addr = ""
        self.sessions = Sessions(ctx)
        #: what each connection owes for requests refused for their size (telemetry commands, gzip bodies)
        self.refused = RefusedBytes(ctx.config.refusedRequestBytesPerSecond)
        #: with namesrvAddr, routes list the whole cluster's queues (route.py)
        self.lookup = RouteLookup(ctx.config) if ctx.config.namesrvAddr else None
        self.route = RouteService(self, producer)
        self.send = SendService(self, producer, transactions)
        self.receive = ReceiveService(self, consumer)
        self._server: Http2GrpcServer | None = None
        self._renewal: PeriodicTask | None = None
        self.requests = 0
        unary = {
            "QueryRoute": self.route.query_route,
            "Heartbeat": self.route.heartbeat,
            "QueryAssignment": self.route.query_assignment,
            "NotifyClientTermination": self.route.notify_client_termination,
            "SendMessage": self.send.send_message,
            "EndTransaction": self.send.end_transaction,
            "RecallMessage": self.send.recall_message,
            "AckMessage": self.receive.ack_message,
            "ChangeInvisibleDuration": self.receive.change_invisible_duration,
            "ForwardMessageToDeadLetterQueue": self.receive.forward_to_dead_letter_queue,
        }
        self._methods: dict[str, Method] = {}
        config = ctx.config
        for name in rpc_names():
            request_cls, response_cls, client_streams, server_streams = rpc_types(name)
            # A send may be as large as the transport lets in (maxMessageSize + headroom); a Telemetry message is
            # settings (grpcTelemetryMaxSettingsBytes, with the command around them); any other request is all
            # envelope.
            limit = (config.maxMessageSize + config.grpcRequestHeadroomBytes if name == "SendMessage" else
                     config.grpcTelemetryMaxSettingsBytes + TELEMETRY_ENVELOPE_BYTES if name == "Telemetry" else
                     config.grpcRequestHeadroomBytes)
            parse, serialize = bounded(request_cls.FromString, limit, name), response_cls.SerializeToString
            if name == "Telemetry":
                method = Method(BIDI, parse, serialize, self.route.telemetry)
            elif name == "ReceiveMessage":
                method = Method(SERVER_STREAM, parse, serialize, self._receive_message)
            elif name in unary:
                method = Method(UNARY, parse, serialize, self._unary(unary[name], response_cls))
            elif server_streams:
                method = Method(SERVER_STREAM, parse, serialize, self._not_served_stream(name, response_cls))
            else:
                method = Method(UNARY, parse, serialize, self._not_served(name, response_cls))
            self._methods[f"/{SERVICE}/{name}"] = method
        self._methods[f"/{METRICS_SERVICE}/Export"] = Method(UNARY, bytes, bytes, _discard_metrics)

    def _unary(self, serve, response_cls):
        takes_context = serve.__name__ == "send_message"

        async def call(request, context):
            self.requests += 1
            if type(request) is Oversized:
                await self._pay_for(request, context)
                return response_cls(status=request.status())
            try:
                caller = authenticate(self.ctx.acl, context)
                self.sessions.get(caller.client_id, context.peer(), caller.language)
                if takes_context:
                    return await serve(request, caller, context)
                return await serve(request, caller)
            except Exception as exc:
                return response_cls(status=status_for(exc))

        return call

    async def _receive_message(self, request, context) -> None:
        """A server-streaming handler that writes with ``context.write``: each write waits for HTTP/2's flow
        control, so a stream whose answers are not read holds its messages (bounded) instead of piling answers."""
        self.requests += 1
        if type(request) is Oversized:
            await self._pay_for(request, context)
            await context.write(pb.ReceiveMessageResponse(status=request.status()))
            return
        try:
            caller = authenticate(self.ctx.acl, context)
            self.sessions.get(caller.client_id, context.peer(), caller.language)
            delivery = await self.receive.receive_message(request, caller, context.peer())
        except Exception as exc:
            await context.write(pb.ReceiveMessageResponse(status=status_for(exc)))
            return
        if delivery is None:
            await context.write(not_found())
            return
        try:
            await self.receive.deliver(delivery, context.write)
        except Exception as exc:  # the store failed while writing: the stream still ends with a Status
            await context.write(pb.ReceiveMessageResponse(status=status_for(exc)))

    async def _pay_for(self, request: Oversized, context) -> None:
        """The transport received a refused request whole before it got here, and its answer is a few bytes:
        the connection pays for its size before it is answered (a client sending them back to back is slowed to
        refusedRequestBytesPerSecond, not served as fast as it sends)."""
        await self.refused.pay(peer_host(context.peer() or ""), request.size)

    @staticmethod
    def _not_served(name: str, response_cls):
        async def call(request, context):
            return response_cls(status=status(Code["NOT_IMPLEMENTED"], f"{name} is not served by halfmq"))

        return call

    @staticmethod
    def _not_served_stream(name: str, response_cls):
        async def call(request, context):
            yield response_cls(status=status(Code["NOT_IMPLEMENTED"], f"{name} is not served by halfmq"))

        return call

    async def start(self, listen: Callable[[Callable[[], asyncio.Protocol]], Awaitable],
                    frame_budget: FrameBudget) -> int:
        """Serve on the socket ``listen(protocol_factory)`` opens (its TLS context offering ALPN ``h2``); returns
        the bound port. Incomplete requests are charged to ``frame_budget``, the remoting connections' own."""
        config = self.ctx.config
        server = Http2GrpcServer(self._methods, max_request=config.maxMessageSize + config.grpcRequestHeadroomBytes,
                                 max_streams=config.grpcMaxStreamsPerConnection,
                                 max_held_bytes=config.serverMaxInflightBytesPerConnection,
                                 max_connections=config.serverMaxConnections, frame_budget=frame_budget)
        bound = await server.start(listen)
        self._server = server
        self._renewal = PeriodicTask("grpc-auto-renew", AUTO_RENEW_INTERVAL_S, self.receive.renew)
        self._renewal.start()
        self.port = bound
        return bound

    def close_idle(self, idle_seconds: float) -> None:
        """Close the connections whose client sent nothing for ``idle_seconds``."""
        if self._server is not None:
            self._server.close_idle(idle_seconds)

    def expire_sessions(self) -> None:
        """Forget clients without a telemetry stream that sent nothing for channelExpiredTimeout."""
        cutoff = time.monotonic() - self.ctx.config.channelExpiredTimeout / 1000
        for client_id, session in list(self.sessions.by_client.items()):
            if not session.writable and not session.heard_since(cutoff):
                self.sessions.terminated(client_id)

    async def stop(self, grace_s: float) -> None:
        if self._renewal is not None:
            await self._renewal.stop()
        self.receive.release_all()
        self.sessions.close_all()
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        if self.lookup is not None:
            await self.lookup.close()


__all__ = ["GrpcEndpoint", "GrpcError"]
