"""PullConsumer: the application drives pulls and offsets itself."""
from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from enum import Enum

from halfmq.protocol.codes import PullSysFlag, RequestCode, ResponseCode
from halfmq.protocol.headers import (ConsumerSendMsgBackRequestHeader, GroupRequestHeader, PullMessageRequestHeader,
                                     QueryConsumerOffsetRequestHeader, QueueRequestHeader, SearchOffsetRequestHeader,
                                     UpdateConsumerOffsetRequestHeader)
from halfmq.protocol.message import decode_records

from .errors import ConnectionClosedError, RequestTimeoutError, error_for
from .instance import ClientInstance, Startable
from .message import MessageExt, MessageQueue
from .remoting import Credentials


class PullStatus(Enum):
    FOUND = 0
    NO_NEW_MSG = 19
    NO_MATCHED_MSG = 20
    OFFSET_ILLEGAL = 21


@dataclass
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt]


def parse_expression(expression: str | None) -> set[str] | None:
    """Tag expression → the set of tags it accepts, None for every message."""
    expr = (expression or "").strip()
    if not expr or expr == "*":
        return None
    tags = {t.strip() for t in expr.split("||") if t.strip()}
    return tags or None


class PullConsumer(Startable):
    """An asyncio pull consumer.

    Args:
        group: consumer group (offsets are kept per group).
        namesrv: name server address(es).
    """

    def __init__(self, group: str, namesrv: str, client_ip: str = "127.0.0.1", request_timeout: float = 3.0,
                 credentials: Credentials | None = None, tls: ssl.SSLContext | None = None):
        self.group = group
        self.instance = ClientInstance(namesrv, client_ip, request_timeout, credentials, tls)
        self.request_timeout = request_timeout

    async def start(self) -> None:
        self.instance.start()

    async def close(self) -> None:
        await self.instance.close()

    async def fetch_subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of a topic.

        Raises:
            TopicNotExistError: the name server does not know the topic.
        """
        return list((await self.instance.routes.fetch(topic)).read_queues)

    async def _conn(self, queue: MessageQueue):
        route = await self.instance.routes.get(queue.topic)
        return await self.instance.pool.get(route.read_addr_of(queue.broker_name))

    async def _request(self, queue: MessageQueue, code: int, ext: dict, timeout: float | None = None, body=b""):
        try:
            conn = await self._conn(queue)
            return await conn.request(code, {k: str(v) for k, v in ext.items()}, body,
                                      timeout or self.request_timeout)
        except (ConnectionClosedError, RequestTimeoutError):
            # The broker is gone or hangs (a broker group's leader, say): the next request asks the name servers
            # again, whose route then names a member that answers.
            self.instance.routes.invalidate(queue.topic)
            raise

    async def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32, expression: str = "*",
                   suspend_ms: int = 0, timeout: float | None = None, commit_offset: int | None = None
                   ) -> PullResult:
        """Pull messages of ``queue`` from ``offset``.

        Args:
            suspend_ms: let the broker hold the request up to this long when there is nothing new.
            commit_offset: also store this consumer offset on the broker.

        Raises:
            BrokerError: any other response than found / no new / no matched / offset illegal.
        """
        status, next_offset, low, high, body = await self.pull_raw(queue, offset, max_nums, expression, suspend_ms,
                                                                   timeout, commit_offset)
        messages = decode_records(body) if body else []
        tags = parse_expression(expression)
        if tags is not None:  # the broker filters by hash code; collisions are removed here
            messages = [m for m in messages if m.properties.get("TAGS") in tags]
        return PullResult(status, next_offset, low, high, messages)

    async def pull_raw(self, queue: MessageQueue, offset: int, max_nums: int = 32, expression: str = "*",
                       suspend_ms: int = 0, timeout: float | None = None, commit_offset: int | None = None
                       ) -> tuple[PullStatus, int, int, int, bytes]:
        """As pull, but the messages stay encoded: (status, next offset, min offset, max offset, stored records
        as one bytes object). For readers with their own decoder; tags are filtered by hash only."""
        sys_flag = PullSysFlag.SUBSCRIPTION
        if suspend_ms:
            sys_flag |= PullSysFlag.SUSPEND
        if commit_offset is not None:
            sys_flag |= PullSysFlag.COMMIT_OFFSET
        ext = PullMessageRequestHeader(
            consumerGroup=self.group, topic=queue.topic, queueId=queue.queue_id, queueOffset=offset,
            maxMsgNums=max_nums, sysFlag=sys_flag, commitOffset=commit_offset or 0, suspendTimeoutMillis=suspend_ms,
            subVersion=0, subscription=expression or "*", expressionType="TAG").to_ext()
        wait = timeout or (suspend_ms / 1000 + self.request_timeout)
        resp = await self._request(queue, RequestCode.PULL_MESSAGE, ext, wait)
        try:
            status = PullStatus(resp.code)
        except ValueError:
            raise error_for(resp.code, resp.remark) from None
        ext = resp.ext_fields
        return (status, int(ext.get("nextBeginOffset", offset)), int(ext.get("minOffset", 0)),
                int(ext.get("maxOffset", 0)), resp.body if status is PullStatus.FOUND else b"")

    async def query_offset(self, queue: MessageQueue) -> int | None:
        """The group's stored offset for ``queue``, or None when the broker has none."""
        header = QueryConsumerOffsetRequestHeader(consumerGroup=self.group, topic=queue.topic, queueId=queue.queue_id)
        resp = await self._request(queue, RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext())
        if resp.code != ResponseCode.SUCCESS:
            return None
        return int(resp.ext_fields["offset"])

    async def update_offset(self, queue: MessageQueue, offset: int) -> None:
        """Store the group's offset for ``queue`` (durable when this returns)."""
        header = UpdateConsumerOffsetRequestHeader(consumerGroup=self.group, topic=queue.topic,
                                                   queueId=queue.queue_id, commitOffset=offset)
        resp = await self._request(queue, RequestCode.UPDATE_CONSUMER_OFFSET, header.to_ext())
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)

    async def _offset(self, queue: MessageQueue, code: int, timestamp: int | None = None) -> int:
        if timestamp is None:
            header = QueueRequestHeader(topic=queue.topic, queueId=queue.queue_id)
        else:
            header = SearchOffsetRequestHeader(topic=queue.topic, queueId=queue.queue_id, timestamp=timestamp)
        resp = await self._request(queue, code, header.to_ext())
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)
        return int(resp.ext_fields["offset"])

    async def max_offset(self, queue: MessageQueue) -> int:
        return await self._offset(queue, RequestCode.GET_MAX_OFFSET)

    async def min_offset(self, queue: MessageQueue) -> int:
        return await self._offset(queue, RequestCode.GET_MIN_OFFSET)

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms``."""
        return await self._offset(queue, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, timestamp_ms)

    async def consumer_ids(self, topic: str) -> list[str]:
        """Client ids of the live consumers of this group (as the broker of ``topic`` sees them)."""
        route = await self.instance.routes.get(topic)
        conn = await self.instance.pool.get(next(iter(route.broker_addrs.values())))
        resp = await conn.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                  GroupRequestHeader(consumerGroup=self.group).to_ext(),
                                  timeout=self.request_timeout)
        if resp.code != ResponseCode.SUCCESS:
            return []
        return list(json.loads(resp.body).get("consumerIdList", []))

    async def send_back(self, msg: MessageExt, delay_level: int = 0, max_reconsume_times: int = 16) -> None:
        """Return a message to the broker for later redelivery (via %RETRY%group, %DLQ%group at the end)."""
        # The broker that stored it: the request names the message by that broker's commit-log offset.
        conn = await self.instance.pool.get(msg.store_host)
        header = ConsumerSendMsgBackRequestHeader(
            offset=msg.physical_offset, group=self.group, delayLevel=delay_level, originMsgId=msg.msg_id,
            originTopic=msg.topic, maxReconsumeTimes=max_reconsume_times)
        resp = await conn.request(RequestCode.CONSUMER_SEND_MSG_BACK, header.to_ext(), timeout=self.request_timeout)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)

