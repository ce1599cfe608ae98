"""What processors and services share: configuration, store, registries and the broker's identity.

``Broker.start`` (broker/server.py) is the one place that builds it: the tables first (topics, offsets), then each
service, which keeps the context it is given to reach the others. The fields are typed, so a reader and a type
checker see what each one is; the services are set once, in the order ``Broker._start_services`` builds them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .config import BrokerConfig
from .services.clients import ConsumerRegistry, ProducerRegistry
from .services.long_poll import LongPollService
from .services.offsets import ConsumerOffsetManager
from .topics import TopicManager

if TYPE_CHECKING:  # the services import this module: their types only for annotations
    from halfmq.store import MessageStore

    from .acl import AccessValidator
    from .metrics import BrokerMetrics
    from .replication.member import GroupMember
    from .services.check_back import CheckBackService
    from .services.retention import RetentionService
    from .services.schedule import ScheduleService
    from .services.timers import TimerService
    from .services.transaction import TransactionStates


def now_ms() -> int:
    """The broker clock; every timing decision uses it, never a producer's bornTimestamp."""
    return int(time.time() * 1000)


@dataclass
class BrokerContext:
    config: BrokerConfig
    store: MessageStore
    topics: TopicManager
    offsets: ConsumerOffsetManager
    producers: ProducerRegistry = field(default_factory=ProducerRegistry)
    consumers: ConsumerRegistry = field(default_factory=ConsumerRegistry)
    long_poll: LongPollService = field(default_factory=LongPollService)
    store_host: str = "127.0.0.1:10911"
    broker_addr: str = "127.0.0.1:10911"
    schedule: ScheduleService | None = None
    timers: TimerService | None = None
    transactions: TransactionStates | None = None
    check_back: CheckBackService | None = None
    retention: RetentionService | None = None
    metrics: BrokerMetrics | None = None
    #: processors ask it about the records they read (check_record)
    acl: AccessValidator | None = None
    #: the broker's role in its broker group (broker/replication/member.py), once started
    member: GroupMember | None = None
