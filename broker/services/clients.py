"""Producer and consumer registries keyed by group, fed by HEART_BEAT/UNREGISTER_CLIENT (reference §3.4, §5.6).

Channels are kept so the broker can call clients back: CHECK_TRANSACTION_STATE goes to a producer of the group,
NOTIFY_CONSUMER_IDS_CHANGED to every consumer of the group.

Producers are registered only by a heartbeat that passed access control (PUB on the group, broker/acl.py), so
the checks, which carry uncommitted bodies, reach only connections that proved they may publish for the group.

Membership changes are coalesced: a change marks the group, and one notification per member goes out when the
window after the first change closes. Notifying every member at every join made N joins cost N²/2 frames
(2,000 consumers: 35 s); a window of NOTIFY_WINDOW_S plus NOTIFY_WINDOW_PER_MEMBER_S per member bounds the
frames a joining storm costs to a few per member, and a rebalance started by the first notification sees the
members that joined within the window.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from halfmq.protocol.codes import RequestCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import GroupRequestHeader
from halfmq.protocol.message import tags_hash

from ..channel import Channel

log = logging.getLogger(__name__)
NOTIFY_WINDOW_S = 0.05
NOTIFY_WINDOW_PER_MEMBER_S = 0.0005
NOTIFY_WINDOW_MAX_S = 2.0


@dataclass
class ClientInfo:
    client_id: str
    channel: Channel
    language: int
    version: int
    last_update: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Subscription:
    topic: str
    expression: str
    tag_codes: frozenset[int] | None  # None: every message
    tags: frozenset[str] | None
    sub_version: int = 0
    expression_type: str = "TAG"


def parse_subscription(topic: str, expression: str | None, sub_version: int = 0,
                       expression_type: str | None = "TAG") -> Subscription:
    """Tag expression → Subscription (reference §6.3): "*" or empty means all, else "a || b"."""
    expr = (expression or "").strip()
    if not expr or expr == "*":
        return Subscription(topic, "*", None, None, sub_version, expression_type or "TAG")
    tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
    if not tags:
        return Subscription(topic, "*", None, None, sub_version, expression_type or "TAG")
    return Subscription(topic, expr, frozenset(tags_hash(t) for t in tags), tags, sub_version,
                        expression_type or "TAG")


class ProducerRegistry:
    def __init__(self):
        self.groups: dict[str, dict[Channel, ClientInfo]] = {}
        self._counter = 0
        self.register_listeners: list[Callable[[str, Channel], None]] = []
        #: told of every closed channel (a producer's or not: a half's sender need not have registered)
        self.close_listeners: list[Callable[[Channel], None]] = []

    def register(self, group: str, info: ClientInfo) -> None:
        """Register (or refresh: every heartbeat) a producer of ``group``. Every registration is a sign of life the
        listeners hear, not only a new one: a producer that was not reading when its group's half came due, and
        speaks again on the same connection, gets the halves that waited for it (issue 23: they waited for a new
        registration of the group that never came)."""
        self.groups.setdefault(group, {})[info.channel] = info
        for listener in self.register_listeners:
            listener(group, info.channel)

    def unregister(self, group: str, channel: Channel) -> None:
        channels = self.groups.get(group)
        if channels and channels.pop(channel, None) is not None and not channels:
            del self.groups[group]

    def channel_closed(self, channel: Channel) -> None:
        for group in list(self.groups):
            self.unregister(group, channel)
        for listener in self.close_listeners:
            listener(channel)

    def live_channels(self, group: str) -> list[Channel]:
        return [ch for ch in self.groups.get(group, {}) if ch.writable]

    def select(self, group: str, preferred: Channel | None = None) -> Channel | None:
        """The preferred channel if alive, else the next live channel of the group, round robin."""
        if preferred is not None and preferred.writable and preferred in self.groups.get(group, {}):
            return preferred
        channels = self.live_channels(group)
        if not channels:
            return None
        self._counter = (self._counter + 1) & 0x7FFFFFFF
        return channels[self._counter % len(channels)]

    def find_by_client_id(self, group: str, client_id: str) -> Channel | None:
        for channel, info in self.groups.get(group, {}).items():
            if info.client_id == client_id and channel.writable:
                return channel
        return None

    def expire(self, older_than: float) -> None:
        for group, channels in list(self.groups.items()):
            for channel, info in list(channels.items()):
                if info.last_update < older_than:
                    log.info("producer %s of group %s expired", info.client_id, group)
                    self.unregister(group, channel)


@dataclass
class ConsumerGroupInfo:
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    channels: dict[Channel, ClientInfo] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return sorted({info.client_id for ch, info in self.channels.items() if ch.writable})


class ConsumerRegistry:
    def __init__(self):
        self.groups: dict[str, ConsumerGroupInfo] = {}
        self._changed: dict[str, asyncio.TimerHandle | None] = {}  # group → its pending notification
        self.notifications_sent = 0

    def register(self, group: str, info: ClientInfo, consume_type: str, message_model: str,
                 consume_from_where: str, subscriptions: list[Subscription]) -> None:
        entry = self.groups.get(group)
        if entry is None:
            entry = self.groups[group] = ConsumerGroupInfo(group)
        entry.consume_type = consume_type
        entry.message_model = message_model
        entry.consume_from_where = consume_from_where
        changed = info.channel not in entry.channels
        entry.channels[info.channel] = info
        for sub in subscriptions:
            old = entry.subscriptions.get(sub.topic)
            if old is None or old.sub_version <= sub.sub_version:
                entry.subscriptions[sub.topic] = sub
        if changed:
            self.notify_ids_changed(group)

    def unregister(self, group: str, channel: Channel) -> None:
        entry = self.groups.get(group)
        if entry is None or entry.channels.pop(channel, None) is None:
            return
        if not entry.channels:
            del self.groups[group]
        else:
            self.notify_ids_changed(group)

    def channel_closed(self, channel: Channel) -> None:
        for group in list(self.groups):
            self.unregister(group, channel)

    def notify_ids_changed(self, group: str) -> None:
        """Tell the group's members, once the current window closes, that its membership changed."""
        if group in self._changed:
            return  # a notification is already due: it will carry this change too
        entry = self.groups.get(group)
        if entry is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (unit use): notify now
            self._changed[group] = None
            self._notify(group)
            return
        delay = min(NOTIFY_WINDOW_MAX_S, NOTIFY_WINDOW_S + NOTIFY_WINDOW_PER_MEMBER_S * len(entry.channels))
        self._changed[group] = loop.call_later(delay, self._notify, group)

    def _notify(self, group: str) -> None:
        self._changed.pop(group, None)
        entry = self.groups.get(group)
        if entry is None:
            return
        header = GroupRequestHeader(consumerGroup=group).to_ext()
        for channel in entry.channels:
            if channel.writable:
                channel.send_request(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, flag=2,
                                                     ext_fields=dict(header)))
                self.notifications_sent += 1

    def close(self) -> None:
        """Cancel the notifications still due (shutdown)."""
        for handle in self._changed.values():
            if handle is not None:
                handle.cancel()
        self._changed.clear()

    def subscription(self, group: str, topic: str) -> Subscription | None:
        entry = self.groups.get(group)
        return entry.subscriptions.get(topic) if entry else None

    def client_ids(self, group: str) -> list[str]:
        entry = self.groups.get(group)
        return entry.client_ids() if entry else []

    def expire(self, older_than: float) -> None:
        for group, entry in list(self.groups.items()):
            for channel, info in list(entry.channels.items()):
                if info.last_update < older_than:
                    log.info("consumer %s of group %s expired", info.client_id, group)
                    self.unregister(group, channel)
