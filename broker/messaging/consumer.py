"""What a consumer may read, where a consumer group starts, and a pull: the same for a remoting pull and a gRPC
receive (whose receipts are messaging/receipts.py).

``ConsumerService.pull`` takes a ``PullRequest`` (a door's decoded pull) and answers a ``Pulled``: the records read
(stored bytes, which a remoting answer concatenates: ARCHITECTURE.md decision 2) and the queue's bounds, or why none
were (``PullStatus``); the door turns the status into its own code and decides whether to hold the pull.

A group's committed offsets are queried and committed with an ``OffsetRequest`` (``query_offset``,
``commit_offset``), and a queue's offset at a time is searched with an ``OffsetSearch`` (``search_offset``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import BrokerError, Failure
from ..names import check_group, check_topic
from ..services.clients import parse_subscription
from ..topics import TopicConfig


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NOT_FOUND = "NOT_FOUND"          #: nothing at the offset yet (the queue's end, or an empty queue read at 0)
    NO_MATCH = "NO_MATCH"            #: messages there, none passing the filter: pull again at the next offset
    OFFSET_MOVED = "OFFSET_MOVED"    #: the offset is outside the queue: go on from ``next_offset``


@dataclass(slots=True)
class PullRequest:
    """A pull of ``max_count`` messages from ``offset`` of a queue for ``group``."""
    group: str
    topic: str
    queue_id: int
    offset: int
    max_count: int
    #: the subscription the request carries, (expression type, expression); None: the group's registered one,
    #: which must be at least ``sub_version``
    expression: tuple[str | None, str | None] | None = None
    sub_version: int = 0
    #: the group's progress, committed before reading (None: none given)
    commit_offset: int | None = None


@dataclass(slots=True)
class Pulled:
    status: PullStatus
    remark: str
    next_offset: int
    min_offset: int
    max_offset: int
    records: list


@dataclass(slots=True)
class OffsetRequest:
    """A consumer group's offset of one queue, as a door decoded it: queried, or committed (``offset``)."""
    group: str
    topic: str
    queue_id: int
    #: the offset to commit (a commit only)
    offset: int = -1
    #: a query: a group with no committed offset starts at the queue's start while the queue still holds its first
    #: message (``start_offset``); False: such a query is answered OFFSET_NOT_FOUND
    from_queue_start: bool = True


@dataclass(slots=True)
class OffsetSearch:
    """The offset of a queue's first message stored at ``timestamp`` or later (``boundary`` "lower"), or of its last
    one stored at ``timestamp`` or before ("upper"); None: lower."""
    topic: str
    queue_id: int
    timestamp: int
    boundary: str | None = None


def _check_offset_names(request: OffsetRequest) -> None:
    """The group and topic of a consumer offset: they are its store key (group NUL topic NUL queueId).

    Raises:
        BrokerError: ILLEGAL_GROUP, ILLEGAL_TOPIC.
    """
    check_group(request.group, "consumerGroup")
    check_topic(request.topic, "topic")


class ConsumerService:
    def __init__(self, ctx):
        self.ctx = ctx
        self.max_count = ctx.config.maxTransferCountOnMessageInMemory
        self.max_bytes = ctx.config.maxTransferBytesOnMessageInMemory

    def pull(self, request: PullRequest) -> Pulled:
        """Read a queue for a group: its records from ``request.offset`` that pass the group's filter, at most
        maxTransferCountOnMessageInMemory of them and about maxTransferBytesOnMessageInMemory.

        Raises:
            BrokerError: TOPIC_NOT_FOUND, FORBIDDEN, BAD_REQUEST (readable_topic, check_queue), UNSUPPORTED_FILTER,
                NO_SUBSCRIPTION, STALE_SUBSCRIPTION (tag_codes).
        """
        ctx = self.ctx
        topic, queue_id, offset = request.topic, request.queue_id, request.offset
        self.check_queue(self.readable_topic(topic), queue_id)
        if ctx.store.reads_held is not None:
            raise BrokerError(Failure.NOT_REPLICATED, ctx.store.reads_held)
        tag_codes = self.tag_codes(request)
        if request.commit_offset is not None:
            ctx.offsets.commit(request.group, topic, queue_id, request.commit_offset)
        store = ctx.store
        min_offset = store.min_offset(topic, queue_id)
        max_offset = store.max_offset(topic, queue_id)
        records: list = []
        if max_offset == 0:
            status = PullStatus.OFFSET_MOVED if offset != 0 else PullStatus.NOT_FOUND
            next_offset, remark = 0, "NO_MESSAGE_IN_QUEUE"
        elif offset < min_offset:
            status, next_offset, remark = PullStatus.OFFSET_MOVED, min_offset, "OFFSET_TOO_SMALL"
        elif offset == max_offset:
            status, next_offset, remark = PullStatus.NOT_FOUND, offset, "OFFSET_OVERFLOW_ONE"
        elif offset > max_offset:
            status, next_offset, remark = PullStatus.OFFSET_MOVED, max_offset, "OFFSET_OVERFLOW_BADLY"
        else:
            wanted = max(1, min(request.max_count, self.max_count))
            records, next_offset = store.read_queue(topic, queue_id, offset, wanted, tag_codes, self.max_bytes)
            if records:
                status, remark = PullStatus.FOUND, "FOUND"
                if ctx.metrics is not None:
                    ctx.metrics.message_out(topic, request.group, len(records), sum(map(len, records)))
            else:
                status, remark = PullStatus.NO_MATCH, "NO_MATCHED_MESSAGE"
        return Pulled(status, remark, next_offset, min_offset, max_offset, records)

    def tag_codes(self, request: PullRequest):
        """The tag codes a pull reads (None: every message): the request's expression, else the group's registered
        subscription.

        Raises:
            BrokerError: UNSUPPORTED_FILTER (not a tag expression), NO_SUBSCRIPTION, STALE_SUBSCRIPTION.
        """
        if request.expression is not None:
            expression_type, expression = request.expression
            if (expression_type or "TAG") != "TAG":
                raise BrokerError(Failure.UNSUPPORTED_FILTER,
                                  f"The broker does not support consumer to filter message by {expression_type}")
            return parse_subscription(request.topic, expression).tag_codes
        sub = self.ctx.consumers.subscription(request.group, request.topic)
        if sub is None:
            raise BrokerError(Failure.NO_SUBSCRIPTION,
                              f"the consumer's subscription not exist, group: {request.group}")
        if sub.sub_version < request.sub_version:
            raise BrokerError(Failure.STALE_SUBSCRIPTION, "the consumer's subscription not latest")
        return sub.tag_codes

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min offset, max offset) of a queue."""
        store = self.ctx.store
        return store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)

    def readable_topic(self, topic: str) -> TopicConfig:
        """The config of a topic consumers may read.

        Raises:
            BrokerError: TOPIC_NOT_FOUND, FORBIDDEN (the topic's permission has no READ).
        """
        config = self.ctx.topics.get(topic)
        if config is None:
            raise BrokerError(Failure.TOPIC_NOT_FOUND, f"topic[{topic}] not exist, apply first please!")
        if not config.readable:
            raise BrokerError(Failure.FORBIDDEN, f"the topic[{topic}] pulling message is forbidden")
        return config

    @staticmethod
    def check_queue(config: TopicConfig, queue_id: int) -> None:
        """A queue consumers may read.

        Raises:
            BrokerError: BAD_REQUEST naming the topic's read queues.
        """
        if queue_id < 0 or queue_id >= config.read_queue_nums:
            raise BrokerError(Failure.BAD_REQUEST, f"queueId[{queue_id}] is illegal, topic:[{config.name}] "
                                                   f"readQueueNums:[{config.read_queue_nums}]")

    def query_offset(self, request: OffsetRequest) -> int:
        """Where ``request.group`` reads its queue from (``start_offset``).

        Raises:
            BrokerError: ILLEGAL_GROUP, ILLEGAL_TOPIC; OFFSET_NOT_FOUND, a group with no committed offset that does
                not start at the queue's start.
        """
        _check_offset_names(request)
        offset = self.start_offset(request.group, request.topic, request.queue_id, request.from_queue_start)
        if offset is None:
            raise BrokerError(Failure.OFFSET_NOT_FOUND,
                              "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return offset

    def commit_offset(self, request: OffsetRequest, durable: bool = True):
        """Commit ``request.offset`` as the group's progress in its queue: in memory (flushed periodically), or
        ``durable``: an awaitable done once it is stored.

        Raises:
            BrokerError: ILLEGAL_GROUP, ILLEGAL_TOPIC (nothing committed).
        """
        _check_offset_names(request)
        offsets = self.ctx.offsets
        if not durable:
            offsets.commit(request.group, request.topic, request.queue_id, request.offset)
            return None
        return offsets.commit_durable(request.group, request.topic, request.queue_id, request.offset)

    def search_offset(self, request: OffsetSearch) -> int:
        """The queue offset ``request`` searches for.

        Raises:
            BrokerError: BAD_REQUEST, a boundary that is neither lower nor upper.
        """
        boundary = (request.boundary or "lower").lower()
        if boundary not in ("lower", "upper"):
            raise BrokerError(Failure.BAD_REQUEST, f"boundaryType {request.boundary!r} is not lower or upper")
        return self.ctx.store.offset_for_timestamp(request.topic, request.queue_id, request.timestamp, boundary)

    def start_offset(self, group: str, topic: str, queue_id: int, from_queue_start: bool = True) -> int | None:
        """Where ``group`` reads ``queue_id`` of ``topic`` from: its committed offset; else (``from_queue_start``)
        the queue's start while the queue still holds its first message (the reference's rule, so a new group sees
        everything sent before it came); else None, for the protocol's own choice (a 4.x client's CONSUME_FROM_*,
        a 5.x receive's end of the queue)."""
        committed = self.ctx.offsets.get(group, topic, queue_id)
        if committed is not None and committed >= 0:
            return committed
        if from_queue_start and self.ctx.store.min_offset(topic, queue_id) <= 0:
            return 0
        return None
