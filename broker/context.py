"""What processors and services share: configuration, store, registries and the broker's identity."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .config import BrokerConfig
from .services.clients import ConsumerRegistry, ProducerRegistry
from .services.long_poll import LongPollService
from .services.offsets import ConsumerOffsetManager
from .topics import TopicManager


def now_ms() -> int:
    """The broker clock; every timing decision uses it, never a producer's bornTimestamp."""
    return int(time.time() * 1000)


@dataclass
class BrokerContext:
    config: BrokerConfig
    store: object
    topics: TopicManager
    offsets: ConsumerOffsetManager
    producers: ProducerRegistry = field(default_factory=ProducerRegistry)
    consumers: ConsumerRegistry = field(default_factory=ConsumerRegistry)
    long_poll: LongPollService = field(default_factory=LongPollService)
    store_host: str = "127.0.0.1:10911"
    broker_addr: str = "127.0.0.1:10911"
    schedule: object = None
    timers: object = None
    transactions: object = None
    check_back: object = None
    retention: object = None
    metrics: object = None
    #: broker/acl.AccessValidator: processors ask it about the records they read (check_record).
    acl: object = None
