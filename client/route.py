"""Topic routes from the name server, cached and refreshed."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from halfmq.protocol.codes import Perm, RequestCode, ResponseCode
from halfmq.protocol.headers import TopicRequestHeader

from .errors import ClientError, TopicNotExistError, error_for
from .message import MessageQueue
from .remoting import ConnectionPool

DEFAULT_TOPIC = "TBW102"
DEFAULT_QUEUE_NUMS = 4  #: queues per broker of a topic a send creates (RocketMQ's defaultTopicQueueNums)


@dataclass(frozen=True)
class TopicRoute:
    topic: str
    write_queues: list[MessageQueue]
    read_queues: list[MessageQueue]
    broker_addrs: dict[str, str]  # broker name → master address
    fetched_at: float
    #: broker name → where reads go: the master, or while a broker group has none, its first follower (replicas
    #: serve reads of what every in-sync member holds)
    read_addrs: dict[str, str] | None = None

    def addr_of(self, broker_name: str) -> str:
        """The address writes to ``broker_name`` go to.

        Raises:
            ClientError: the route names no leader of that broker (a broker group between two leaders).
        """
        try:
            return self.broker_addrs[broker_name]
        except KeyError:
            raise ClientError(f"the route of {self.topic} names no leader of broker {broker_name} now") from None

    def read_addr_of(self, broker_name: str) -> str:
        return (self.read_addrs or self.broker_addrs)[broker_name]


def parse_route(topic: str, body: bytes) -> TopicRoute:
    data = json.loads(body)
    addrs, read_addrs = {}, {}
    for broker in data.get("brokerDatas") or []:
        members = {int(k): v for k, v in (broker.get("brokerAddrs") or {}).items()}
        if 0 in members:
            addrs[broker["brokerName"]] = members[0]
        if members:
            read_addrs[broker["brokerName"]] = members[min(members)]
    write, read = [], []
    for q in data.get("queueDatas") or []:
        name = q["brokerName"]
        if q["perm"] & Perm.WRITE and name in addrs:
            write += [MessageQueue(topic, name, i) for i in range(q["writeQueueNums"])]
        if q["perm"] & Perm.READ and name in read_addrs:
            read += [MessageQueue(topic, name, i) for i in range(q["readQueueNums"])]
    return TopicRoute(topic, sorted(write), sorted(read), addrs, time.monotonic(), read_addrs)


class RouteCache:
    def __init__(self, pool: ConnectionPool, namesrv: str, ttl: float = 30.0, timeout: float = 3.0):
        self.pool = pool
        self.namesrv = [a.strip() for a in namesrv.split(";") if a.strip()]
        self.ttl = ttl
        self.timeout = timeout
        self.routes: dict[str, TopicRoute] = {}

    async def fetch(self, topic: str) -> TopicRoute:
        """Ask the name server.

        Raises:
            TopicNotExistError: the name server knows no route for the topic.
        """
        last_error: Exception | None = None
        for addr in self.namesrv:
            try:
                conn = await self.pool.get(addr)
                resp = await conn.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, TopicRequestHeader(topic=topic).to_ext(),
                                          timeout=self.timeout)
            except Exception as exc:  # try the next name server
                last_error = exc
                continue
            if resp.code == ResponseCode.SUCCESS:
                route = parse_route(topic, resp.body)
                self.routes[topic] = route
                return route
            raise error_for(resp.code, resp.remark)
        raise last_error or TopicNotExistError(ResponseCode.TOPIC_NOT_EXIST, "no name server configured")

    def cached(self, topic: str) -> TopicRoute | None:
        """The route of ``topic`` if it is cached and fresh."""
        route = self.routes.get(topic)
        if route is not None and time.monotonic() - route.fetched_at < self.ttl:
            return route
        return None

    async def get(self, topic: str, auto_create: bool = False) -> TopicRoute:
        route = self.cached(topic)
        if route is not None:
            return route
        try:
            return await self.fetch(topic)
        except TopicNotExistError:
            if not auto_create:
                raise
        template = await self.get(DEFAULT_TOPIC)
        # As RocketMQ's clients: each broker that may create the topic gets up to DEFAULT_QUEUE_NUMS of its queues,
        # so a new topic is spread over the cluster, and each broker creates it on its first send.
        queues = [MessageQueue(topic, q.broker_name, q.queue_id) for q in template.write_queues
                  if q.queue_id < DEFAULT_QUEUE_NUMS]
        if len({q.broker_name for q in queues}) < 2:
            return TopicRoute(topic, queues, [], template.broker_addrs, 0.0)  # fetched_at 0: refetched next time
        # In a cluster the template is kept for the route's lifetime, as RocketMQ's clients keep it until their
        # next refresh: the real route would list only the first broker that created the topic.
        route = self.routes[topic] = TopicRoute(topic, queues, [], template.broker_addrs, time.monotonic())
        return route

    def invalidate(self, topic: str) -> None:
        self.routes.pop(topic, None)
