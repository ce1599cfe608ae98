"""Topic configurations: system topics, auto-creation and persistence. Name rules live in names.py."""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from halfmq.protocol.codes import Perm, ResponseCode
from halfmq.store.ops import DeleteTopic, PutTopic

from .errors import BrokerError
from .names import DLQ_PREFIX, RETRY_PREFIX, validate_topic_name  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

DEFAULT_TOPIC = "TBW102"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"

#: Topics producers may not send to (reference §3.1 step 3).
SEND_FORBIDDEN = frozenset({SCHEDULE_TOPIC, HALF_TOPIC, OP_HALF_TOPIC, CHECK_MAX_TIME_TOPIC, SELF_TEST_TOPIC,
                            OFFSET_MOVED_EVENT})
SYSTEM_TOPICS = SEND_FORBIDDEN | {DEFAULT_TOPIC}


@dataclass(frozen=True)
class TopicConfig:
    name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = Perm.READ | Perm.WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    @property
    def queue_nums(self) -> int:
        return max(self.read_queue_nums, self.write_queue_nums)

    @property
    def readable(self) -> bool:
        return bool(self.perm & Perm.READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & Perm.WRITE)


class TopicManager:
    """In-memory view of the topic table, written through to the store."""

    def __init__(self, store, default_queue_nums: int, auto_create: bool, delay_levels: int):
        self.store = store
        self.auto_create = auto_create
        self.topics: dict[str, TopicConfig] = {}
        self._system = {
            DEFAULT_TOPIC: TopicConfig(DEFAULT_TOPIC, default_queue_nums, default_queue_nums,
                                       Perm.READ | Perm.WRITE | (Perm.INHERIT if auto_create else 0)),
            HALF_TOPIC: TopicConfig(HALF_TOPIC, 1, 1),
            OP_HALF_TOPIC: TopicConfig(OP_HALF_TOPIC, 1, 1),
            CHECK_MAX_TIME_TOPIC: TopicConfig(CHECK_MAX_TIME_TOPIC, 1, 1),
            SCHEDULE_TOPIC: TopicConfig(SCHEDULE_TOPIC, delay_levels, delay_levels),
            SELF_TEST_TOPIC: TopicConfig(SELF_TEST_TOPIC, 1, 1),
            OFFSET_MOVED_EVENT: TopicConfig(OFFSET_MOVED_EVENT, 1, 1),
        }

    def load(self) -> None:
        for name, raw in self.store.topics().items():
            self.topics[name] = TopicConfig(**raw)
        self.topics.update(self._system)

    def get(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)

    async def put(self, config: TopicConfig) -> None:
        """Create or replace a topic; every new topic (admin, auto-created, retry, DLQ) passes here.

        Raises:
            BrokerError: SYSTEM_ERROR for a name that names.py refuses.
        """
        # Retry and DLQ topics are named after a client's group: checked here as well, whoever asks for one.
        validate_topic_name(config.name)
        self.topics[config.name] = config
        await self.store.submit(PutTopic(config.name, asdict(config)))

    async def delete(self, name: str) -> bool:
        if name in SYSTEM_TOPICS:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"The topic[{name}] is conflict with system topic.")
        if self.topics.pop(name, None) is None:
            return False
        await self.store.submit(DeleteTopic(name))
        return True

    async def ensure_for_send(self, name: str, default_topic: str, default_queue_nums: int) -> TopicConfig:
        """The topic's config, creating it from the template topic when allowed (reference §3.1 step 4).

        Raises:
            BrokerError: TOPIC_NOT_EXIST when the topic is unknown and cannot be created.
        """
        config = self.topics.get(name)
        if config is not None:
            return config
        if name.startswith(RETRY_PREFIX) or name.startswith(DLQ_PREFIX):
            return await self.ensure_single_queue(name)
        template = self.topics.get(default_topic or DEFAULT_TOPIC) or self.topics[DEFAULT_TOPIC]
        if not (self.auto_create and template.perm & Perm.INHERIT):
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST,
                              f"topic[{name}] not exist, apply first please!")
        queues = max(1, min(default_queue_nums if default_queue_nums > 0 else template.write_queue_nums,
                            template.write_queue_nums))
        config = TopicConfig(name, queues, queues, template.perm & ~Perm.INHERIT)
        log.info("auto-created topic %s with %d queues", name, queues)
        await self.put(config)
        return config

    async def ensure_single_queue(self, name: str) -> TopicConfig:
        """Retry and DLQ topics: one read/write queue."""
        config = self.topics.get(name)
        if config is None:
            config = TopicConfig(name, 1, 1)
            await self.put(config)
        return config

    def user_topics(self) -> list[str]:
        return sorted(self.topics)
