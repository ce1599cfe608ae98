"""Topic configurations: system topics, auto-creation and its quotas, persistence. Name rules live in names.py.

What a client can bring into existence, and how much of it:

- a topic it sends to, when ``autoCreateTopicEnable`` and while the broker holds fewer than
  ``maxAutoCreatedTopics`` user topics (admin-created ones count too; an admin can always create more);
- a subscription group, i.e. the group's ``%RETRY%`` topic (the broker keeps no other per-group record, so the
  retry topic *is* the group's existence, as RocketMQ's heartbeat creates it through the subscription group):
  created on a heartbeat or a send-back when ``autoCreateSubscriptionGroup`` and while fewer than
  ``maxAutoCreatedSubscriptionGroups`` groups exist. A heartbeat beyond that still registers the consumer (its
  send-backs are refused GROUP_NOT_FOUND, answered SUBSCRIPTION_GROUP_NOT_EXIST as RocketMQ's are);
- a group's ``%DLQ%`` topic, only for a group that exists;
- a send that *names* a ``%RETRY%`` topic creates it only when ``autoCreateTopicEnable`` as well: with it off, no
  topic a client names comes into existence (retry topics then come only from the group rule above, and a DLQ
  only for a group that exists).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass

from halfmq.protocol import properties as P
from halfmq.protocol.codes import Perm
from halfmq.store.lifecycle import DeleteTopic
from halfmq.store.ops import PutTopic

from .errors import BrokerError, Failure
from .names import DLQ_PREFIX, RETRY_PREFIX, validate_topic_name  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

#: how long a send that created its topic waits for the name servers to hear of it before it answers anyway (one
#: that is slow or cut off must not hold the send past a client's timeout)
ANNOUNCE_WAIT_S = 1.0
DEFAULT_TOPIC = "TBW102"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC = "rmq_sys_wheel_timer"  #: RocketMQ 5's: timer messages wait here for their delivery time
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"

#: Topics producers may not send to (reference §3.1 step 3).
SEND_FORBIDDEN = frozenset({SCHEDULE_TOPIC, HALF_TOPIC, OP_HALF_TOPIC, CHECK_MAX_TIME_TOPIC, SELF_TEST_TOPIC,
                            OFFSET_MOVED_EVENT, TIMER_TOPIC})
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
    #: RocketMQ 5's message.type attribute: NORMAL, FIFO, DELAY, TRANSACTION or MIXED; None (undeclared): any type
    message_type: str | None = None

    def __post_init__(self) -> None:
        # Read by every send and pull: plain attributes (not properties, a call each), not fields (not stored).
        object.__setattr__(self, "queue_nums", max(self.read_queue_nums, self.write_queue_nums))
        object.__setattr__(self, "readable", bool(self.perm & Perm.READ))
        object.__setattr__(self, "writable", bool(self.perm & Perm.WRITE))


MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
_DELAY_KEYS = (P.DELAY, P.TIMER_DELIVER_MS, P.TIMER_DELAY_SEC, P.TIMER_DELAY_MS, P.START_DELIVER_TIME)


def message_type(props: dict[str, str]) -> str:
    """A message's type as the reference reads it from its properties (first match wins)."""
    if props.get(P.TRAN_MSG) == "true":
        return "TRANSACTION"
    if any(key in props for key in _DELAY_KEYS):
        return "DELAY"
    if P.SHARDING_KEY in props:
        return "FIFO"
    return "NORMAL"


def check_message_type(config: TopicConfig | None, props: dict[str, str]) -> None:
    """A topic that declares its message type takes only that type (the reference's check); an undeclared or
    MIXED topic takes every type, so 4.x clients keep working unchanged.

    Raises:
        BrokerError: TYPE_CONFLICT naming both types.
    """
    if config is None or config.message_type in (None, "MIXED"):
        return
    actual = message_type(props)
    if actual != config.message_type:
        raise BrokerError(Failure.TYPE_CONFLICT, f"TopicMessageType validate failed, the expected type is "
                          f"{config.message_type}, but actual type is {actual} (topic {config.name})")


def apply_attributes(text: str | None, current: str | None) -> str | None:
    """The message type after an updateTopic's attributes ("+message.type=FIFO", "-message.type"); RocketMQ's
    other topic attributes are not supported here.

    Raises:
        BrokerError: BAD_REQUEST naming an unknown attribute or type.
    """
    kept = current
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        op, rest = item[0], item[1:]
        key, _, value = rest.partition("=")
        if op not in "+-" or key != "message.type":
            raise BrokerError(Failure.BAD_REQUEST, f"topic attribute {item!r} is not supported (only "
                              f"+message.type=TYPE and -message.type)")
        if op == "-":
            kept = None
        elif value not in MESSAGE_TYPES:
            raise BrokerError(Failure.BAD_REQUEST, f"message.type {value!r} is not one of "
                              f"{', '.join(MESSAGE_TYPES)}")
        else:
            kept = value
    return kept


class TopicManager:
    """In-memory view of the topic table, written through to the store."""

    def __init__(self, store, default_queue_nums: int, auto_create: bool, delay_levels: int,
                 max_topics: int = 1000, auto_create_groups: bool = True, max_groups: int = 1000):
        self.store = store
        self.auto_create = auto_create
        self.max_topics = max_topics
        self.auto_create_groups = auto_create_groups
        self.max_groups = max_groups
        self.topics: dict[str, TopicConfig] = {}
        #: called after a topic is created, changed or deleted (the broker re-registers with its name servers); one
        #: may return an awaitable, done once the change reached where it goes
        self.change_listeners: list = []
        self._counts = {_USER: 0, _GROUP: 0, _DLQ: 0}  # topics held, by _kind
        self._system = {
            DEFAULT_TOPIC: TopicConfig(DEFAULT_TOPIC, default_queue_nums, default_queue_nums,
                                       Perm.READ | Perm.WRITE | (Perm.INHERIT if auto_create else 0)),
            HALF_TOPIC: TopicConfig(HALF_TOPIC, 1, 1),
            OP_HALF_TOPIC: TopicConfig(OP_HALF_TOPIC, 1, 1),
            CHECK_MAX_TIME_TOPIC: TopicConfig(CHECK_MAX_TIME_TOPIC, 1, 1),
            SCHEDULE_TOPIC: TopicConfig(SCHEDULE_TOPIC, delay_levels, delay_levels),
            TIMER_TOPIC: TopicConfig(TIMER_TOPIC, 1, 1),
            SELF_TEST_TOPIC: TopicConfig(SELF_TEST_TOPIC, 1, 1),
            OFFSET_MOVED_EVENT: TopicConfig(OFFSET_MOVED_EVENT, 1, 1),
        }

    def load(self) -> None:
        for name, raw in self.store.topics().items():
            self._add(TopicConfig(**raw))
        for config in self._system.values():
            self._add(config)

    def _add(self, config: TopicConfig) -> None:
        if config.name not in self.topics:
            kind = _kind(config.name)
            if kind is not None:
                self._counts[kind] += 1
        self.topics[config.name] = config

    def _remove(self, name: str) -> bool:
        if self.topics.pop(name, None) is None:
            return False
        kind = _kind(name)
        if kind is not None:
            self._counts[kind] -= 1
        return True

    def reload(self, names) -> None:
        """Topics the store changed behind this table (a follower's replicated records): read them again."""
        for name in names:
            raw = self.store.get_topic(name)
            if raw is not None:
                self._add(TopicConfig(**raw))
            elif name not in self._system:
                self._remove(name)
        self._changed()

    @property
    def user_topic_count(self) -> int:
        return self._counts[_USER]

    @property
    def group_count(self) -> int:
        return self._counts[_GROUP]

    def get(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)

    async def put(self, config: TopicConfig, announce: bool = False) -> None:
        """Create or replace a topic; every new topic (admin, auto-created, retry, DLQ) passes here. With
        ``announce``, returns once the listeners are done too (at most ANNOUNCE_WAIT_S).

        Raises:
            BrokerError: ILLEGAL_TOPIC for a name that names.py refuses.
        """
        # Retry and DLQ topics are named after a client's group: checked here as well, whoever asks for one.
        validate_topic_name(config.name)
        previous = self.topics.get(config.name)
        self._add(config)
        try:
            await self.store.submit(PutTopic(config.name, asdict(config)))
        except BaseException:
            # Not stored (a follower refuses writes, a full store): the table stays as the store has it.
            if self.topics.get(config.name) is config:
                if previous is None:
                    self._remove(config.name)
                else:
                    self._add(previous)
            raise
        told = self._changed()
        if announce and told:
            await asyncio.wait(told, timeout=ANNOUNCE_WAIT_S)

    async def delete(self, name: str) -> bool:
        if name in SYSTEM_TOPICS:
            raise BrokerError(Failure.ILLEGAL_TOPIC, f"The topic[{name}] is conflict with system topic.")
        if name not in self.topics:
            return False
        self.store.forget_topic(name, await self.store.submit(DeleteTopic(name)))
        self._remove(name)
        self._changed()
        return True

    def _changed(self) -> list:
        """Tells the listeners; what they returned to await, for a caller that answers only once they are done."""
        return [told for told in (listener() for listener in self.change_listeners) if told is not None]

    async def ensure_for_send(self, name: str, default_topic: str, default_queue_nums: int) -> TopicConfig:
        """The topic's config, creating it from the template topic when allowed (reference §3.1 step 4).

        Raises:
            BrokerError: TOPIC_NOT_FOUND when the topic is unknown and cannot be created.
        """
        config = self.topics.get(name)
        if config is not None:
            return config
        if name.startswith(DLQ_PREFIX):
            # Where a retry send past its last reconsume goes: an existing group's, bounded by the group quota.
            return await self.ensure_dlq(name[len(DLQ_PREFIX):], Failure.TOPIC_NOT_FOUND)
        if not self.auto_create:
            raise BrokerError(Failure.TOPIC_NOT_FOUND,
                              f"topic[{name}] not exist, apply first please! (autoCreateTopicEnable=false)")
        if name.startswith(RETRY_PREFIX):
            return await self.ensure_group(name[len(RETRY_PREFIX):], Failure.TOPIC_NOT_FOUND)
        template = self.topics.get(default_topic or DEFAULT_TOPIC) or self.topics[DEFAULT_TOPIC]
        if not template.perm & Perm.INHERIT:
            raise BrokerError(Failure.TOPIC_NOT_FOUND,
                              f"topic[{name}] not exist, apply first please!")
        if self.user_topic_count >= self.max_topics:
            raise BrokerError(Failure.TOPIC_NOT_FOUND,
                              f"topic[{name}] not exist, and the broker already holds {self.user_topic_count} "
                              f"topics, the most it creates automatically (maxAutoCreatedTopics)")
        queues = max(1, min(default_queue_nums if default_queue_nums > 0 else template.write_queue_nums,
                            template.write_queue_nums))
        config = TopicConfig(name, queues, queues, template.perm & ~Perm.INHERIT)
        log.info("auto-created topic %s with %d queues", name, queues)
        # As RocketMQ registers a topic its send created before answering: a consumer started once the send is
        # acknowledged finds the topic's route on the name servers.
        await self.put(config, announce=True)
        return config

    def group_exists(self, group: str) -> bool:
        return RETRY_PREFIX + group in self.topics

    def may_create_group(self) -> bool:
        return self.auto_create_groups and self.group_count < self.max_groups

    async def ensure_group(self, group: str, failure: Failure = Failure.GROUP_NOT_FOUND) -> TopicConfig:
        """The group's retry topic (one queue), creating the group when the quota allows.

        Raises:
            BrokerError: ``failure`` when the group does not exist and may not be created.
        """
        name = RETRY_PREFIX + group
        config = self.topics.get(name)
        if config is not None:
            return config
        if not self.auto_create_groups:
            raise BrokerError(failure, f"subscription group[{group}] not exist (autoCreateSubscriptionGroup=false)")
        if self.group_count >= self.max_groups:
            raise BrokerError(failure, f"subscription group[{group}] not exist, and the broker already holds "
                                       f"{self.group_count} groups, the most it creates automatically "
                                       f"(maxAutoCreatedSubscriptionGroups)")
        config = TopicConfig(name, 1, 1)
        await self.put(config)
        return config

    async def ensure_dlq(self, group: str, failure: Failure = Failure.GROUP_NOT_FOUND) -> TopicConfig:
        """The group's dead-letter topic (one queue): only for a group that exists.

        Raises:
            BrokerError: ``failure`` when the group does not exist.
        """
        name = DLQ_PREFIX + group
        config = self.topics.get(name)
        if config is not None:
            return config
        if not self.group_exists(group):
            raise BrokerError(failure, f"subscription group[{group}] not exist: no dead-letter topic for it")
        config = TopicConfig(name, 1, 1)
        await self.put(config)
        return config

    def user_topics(self) -> list[str]:
        return sorted(self.topics)


_USER, _GROUP, _DLQ = "user", "group", "dlq"


def _kind(name: str) -> str | None:
    """What a topic counts against: a group's retry or DLQ topic, a user topic, or nothing (system topics)."""
    if name in SYSTEM_TOPICS:
        return None
    if name.startswith(RETRY_PREFIX):
        return _GROUP
    if name.startswith(DLQ_PREFIX):
        return _DLQ
    return _USER
