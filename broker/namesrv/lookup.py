"""A broker's lookups of the cluster's routes, for its gRPC endpoint: RocketMQ 5 clients ask one broker for a
topic's route, and a broker with ``namesrvAddr`` answers with every broker's queues, as the name servers merge them.

A route is asked of the name servers in turn (the one that answered last first; the next when one is down or does
not know the topic, as a name server that just restarted knows nothing until the brokers register again) and kept
for ROUTE_TTL_S: RocketMQ 5 clients refresh their routes every 30 s, and a broker that leaves the name servers is
out of the answers here within ROUTE_TTL_S of that. Concurrent lookups of one topic share one request.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import TopicRequestHeader

from ..log_limit import LimitedLog
from .link import NamesrvLink, parse_namesrv_addrs, signed

log = logging.getLogger(__name__)
ROUTE_TTL_S = 5.0
#: a name server that does not answer within this is passed over: a client's whole request is 3 s by default
REQUEST_TIMEOUT_S = 2.0
#: topics whose routes are kept; each lookup of a topic not kept asks a name server
MAX_CACHED_ROUTES = 10_000


class NoNameServerAnswered(Exception):
    """No name server of namesrvAddr answered a route lookup; the message names each and why."""


@dataclass(frozen=True, slots=True)
class BrokerQueues:
    """One broker's queues of a topic, and where it serves RocketMQ 5 clients (None: it does not)."""
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    grpc: tuple[str, int] | None


def parse_route(body: bytes, limited: LimitedLog) -> tuple[BrokerQueues, ...]:
    """The brokers of a TopicRouteData (JSON), each master's gRPC endpoint from ``grpcAddrs``.

    Raises:
        ValueError: the body is not a TopicRouteData.
    """
    try:
        route = json.loads(body)
        grpc_addrs = {data["brokerName"]: (data.get("grpcAddrs") or {}).get("0") for data in route["brokerDatas"]}
        brokers = []
        for data in route["queueDatas"]:
            name = data["brokerName"]
            brokers.append(BrokerQueues(name, int(data["readQueueNums"]), int(data["writeQueueNums"]),
                                        int(data["perm"]), _grpc_endpoint(name, grpc_addrs.get(name), limited)))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a topic route: {type(exc).__name__}: {exc}") from None
    return tuple(brokers)


def _grpc_endpoint(broker_name: str, addr, limited: LimitedLog) -> tuple[str, int] | None:
    if not addr:
        return None
    try:
        (endpoint,) = parse_namesrv_addrs(str(addr))  # the same HOST:PORT form
    except ValueError:
        # One broker's bad registration leaves that broker out, not the whole route.
        limited.log(logging.WARNING, f"grpcAddr {broker_name}", "broker %s registered gRPC endpoint %r, which is "
                    "not HOST:PORT: its queues are left out of gRPC routes", broker_name, str(addr)[:100])
        return None
    return endpoint


class RouteLookup:
    """Routes from the name servers of ``config.namesrvAddr``, signed with namesrvAccessKey when it is set."""

    def __init__(self, config):
        self.links = [NamesrvLink(addr.strip()) for addr in config.namesrvAddr.split(";") if addr.strip()]
        self.config = config
        self._first = 0  #: the name server that answered last is asked first
        self._cache: OrderedDict[str, tuple[float, tuple[BrokerQueues, ...] | None]] = OrderedDict()
        self._pending: dict[str, asyncio.Future] = {}
        self._limited = LimitedLog(log)

    async def route(self, topic: str) -> tuple[BrokerQueues, ...] | None:
        """Every broker's queues of ``topic`` (None: no name server knows the topic).

        Raises:
            NoNameServerAnswered: every name server is down, silent or refused the request.
        """
        kept = self._cache.get(topic)
        if kept is not None and time.monotonic() - kept[0] < ROUTE_TTL_S:
            return kept[1]
        pending = self._pending.get(topic)
        if pending is None:
            pending = self._pending[topic] = asyncio.ensure_future(self._fetch(topic))
            pending.add_done_callback(lambda done: self._settled(topic, done))
        # a caller that goes away (its client cancelled) does not cancel the others' lookup
        return await asyncio.shield(pending)

    def _settled(self, topic: str, done: asyncio.Future) -> None:
        self._pending.pop(topic, None)
        if not done.cancelled():
            done.exception()  # retrieved: its callers got it, or none was left to

    async def _fetch(self, topic: str) -> tuple[BrokerQueues, ...] | None:
        failures, unknown = [], False
        count = len(self.links)
        for step in range(count):
            index = (self._first + step) % count
            link = self.links[index]
            try:
                answer = await link.request(self._request(topic), REQUEST_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError) as exc:
                failures.append(f"{link.addr}: {str(exc) or type(exc).__name__}")
                continue
            if answer.code == ResponseCode.TOPIC_NOT_EXIST:
                unknown = True
                continue
            if answer.code != ResponseCode.SUCCESS:
                failures.append(f"{link.addr}: answered code {answer.code} {answer.remark or ''}".rstrip())
                continue
            try:
                brokers = parse_route(answer.body or b"", self._limited)
            except ValueError as exc:
                failures.append(f"{link.addr}: {exc}")
                continue
            self._first = index
            self._keep(topic, brokers)
            return brokers
        if unknown:
            self._keep(topic, None)
            return None
        message = f"no name server of namesrvAddr answered the route of {topic}: {'; '.join(failures)}"
        self._limited.log(logging.WARNING, "no name server", "%s", message)
        raise NoNameServerAnswered(message)

    def _request(self, topic: str) -> RemotingCommand:
        return signed(RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                      ext_fields=TopicRequestHeader(topic=topic).to_ext()), self.config)

    def _keep(self, topic: str, brokers: tuple[BrokerQueues, ...] | None) -> None:
        now = time.monotonic()
        self._cache[topic] = (now, brokers)
        self._cache.move_to_end(topic)
        # oldest first: expired entries and those beyond the bound go
        while self._cache:
            oldest, (kept_at, _brokers) = next(iter(self._cache.items()))
            if now - kept_at < ROUTE_TTL_S and len(self._cache) <= MAX_CACHED_ROUTES:
                break
            del self._cache[oldest]

    async def close(self) -> None:
        for pending in list(self._pending.values()):
            pending.cancel()
        await asyncio.gather(*(link.close() for link in self.links))
