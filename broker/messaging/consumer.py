"""What a consumer may read, and where a consumer group starts: the same for a remoting pull and a gRPC receive."""
from __future__ import annotations

from ..errors import BrokerError, Failure
from ..topics import TopicConfig


class ConsumerService:
    def __init__(self, ctx):
        self.ctx = ctx

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
