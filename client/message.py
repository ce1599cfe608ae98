"""What users send and get back: Message, SendResult, MessageQueue, and received messages (MessageExt)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from halfmq.protocol import properties as P
from halfmq.protocol.message import MessageRecord as MessageExt

__all__ = ["Message", "MessageExt", "MessageQueue", "SendResult", "SendStatus"]


@dataclass
class Message:
    """A message to send.

    Attributes:
        topic: destination topic.
        body: payload bytes (str is encoded as UTF-8).
        tags: one tag, used by consumers to filter.
        keys: business keys, space separated.
        properties: user properties (names must not be reserved keys).
        delay_level: 1..18 to deliver after that level's delay; 0 = now.
        deliver_time_ms: deliver at this time (epoch ms; RocketMQ 5's timer message, TIMER_DELIVER_MS), at most
            the broker's timerMaxDelaySec ahead; None = now.
        flag: user flag stored with the message.
        check_immunity_seconds: transactional messages only: no check-back before this many seconds.
    """

    topic: str
    body: bytes | str = b""
    tags: str | None = None
    keys: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    delay_level: int = 0
    flag: int = 0
    check_immunity_seconds: int | None = None
    deliver_time_ms: int | None = None

    def __post_init__(self):
        if isinstance(self.body, str):
            self.body = self.body.encode()
        reserved = set(self.properties) & P.RESERVED_KEYS
        if reserved:
            raise ValueError(f"property names {sorted(reserved)} are reserved")

    def wire_properties(self, uniq_key: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        props = dict(self.properties)
        if self.tags:
            props[P.TAGS] = self.tags
        if self.keys:
            props[P.KEYS] = self.keys
        if self.delay_level:
            props[P.DELAY] = str(self.delay_level)
        if self.deliver_time_ms is not None:
            props[P.TIMER_DELIVER_MS] = str(self.deliver_time_ms)
        if self.check_immunity_seconds is not None:
            props[P.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(self.check_immunity_seconds)
        props[P.UNIQ_KEY] = uniq_key
        props[P.WAIT] = "true"
        if extra:
            props.update(extra)
        return props


@dataclass(frozen=True, order=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int


class SendStatus(Enum):
    SEND_OK = 0
    FLUSH_DISK_TIMEOUT = 10
    FLUSH_SLAVE_TIMEOUT = 12
    SLAVE_NOT_AVAILABLE = 11


@dataclass(frozen=True)
class SendResult:
    """Result of a send. ``msg_id`` is the client id (UNIQ_KEY); ``offset_msg_id`` the broker's."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
