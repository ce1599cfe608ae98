"""Typed custom headers (extFields) of every command halfmq serves or sends (reference §3).

Each header is a slotted dataclass. ``from_ext`` validates a request's extFields: a missing
required field or a malformed number raises ``HeaderError`` (answered with SYSTEM_ERROR). ``to_ext``
renders the header back to string extFields. Field metadata ``key`` gives the wire name when it differs
from the attribute name (SEND_MESSAGE_V2's one-letter keys). ``RESOURCES`` names the fields that carry the topic
or group a request acts on: access control (broker/acl.py) reads exactly those keys, the ones the processor
routes by, so the two cannot disagree about which field names the topic.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import ClassVar, TypeVar, get_type_hints

from .errors import HeaderError

T = TypeVar("T", bound="Header")
#: Resource kinds a header field can name (``Header.RESOURCES`` values).
TOPIC, GROUP = "topic", "group"
_INT64 = (-(2 ** 63), 2 ** 63)
_BOOLS = {"true": True, "false": False}
#: the decimal spellings of the integers most header fields carry (queue ids, flags, counts), and their values
_SMALL_INTS = {str(i): i for i in range(1024)}


def _parse(name: str, kind: type, text: str):
    if kind is str:
        return text
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0", ""):
            return False
        raise HeaderError(f"header field {name!r} is not a boolean: {text!r}")
    try:
        value = int(text.strip())
    except ValueError:
        raise HeaderError(f"header field {name!r} is not an integer: {text!r}") from None
    if not _INT64[0] <= value < _INT64[1]:
        raise HeaderError(f"header field {name!r} is out of range: {text!r}")
    return value


def _make_decoder(cls) -> Callable[[dict[str, str]], Header]:
    """``cls.from_ext`` as straight-line code over its fields, made once per class (as dataclasses make __init__):
    every request decodes a header, and a loop over the field specs cost 2.6 us for END_TRANSACTION's seven fields
    against 1.1 us. Per field: absent → HeaderError when required, else the default; a str as it is; a small int
    (a queue id, a flag) from a table, another int or a bool in its common spelling without _parse's checks (int()
    takes any string of decimal digits), else _parse. The header is made without its __init__ (it only assigns
    the fields, each given here): keyword arguments cost SEND_MESSAGE_V2's fourteen fields 0.3 us more."""
    namespace = {"cls": cls, "HeaderError": HeaderError, "_parse": _parse, "_BOOLS": _BOOLS,
                 "_small": _SMALL_INTS.get, "_new": object.__new__}
    lines = ["def decode(ext):", "    get = ext.get"]
    assignments = []
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    for i, (name, key, kind, required) in enumerate(cls._field_specs()):
        text = f"v{i}"
        if kind is str:
            convert = None
        elif kind is int:
            convert = (f"small if (small := _small({text})) is not None else int({text}) if {text}.isdecimal() "
                       f"and len({text}) < 19 else _parse({key!r}, int, {text})")
        elif kind is bool:
            convert = f"_BOOLS[{text}] if {text} in _BOOLS else _parse({key!r}, bool, {text})"
        else:
            namespace[f"kind{i}"] = kind
            convert = f"_parse({key!r}, kind{i}, {text})"
        lines.append(f"    {text} = get({key!r})")
        if required:
            message = f"the custom header field {key!r} ({name}) is required"
            lines += [f"    if {text} is None:", f"        raise HeaderError({message!r})"]
            if convert:
                lines.append(f"    {text} = {convert}")
        else:
            if defaults[name] is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{name}: an optional header field needs a default")
            namespace[f"default{i}"] = defaults[name]
            lines += [f"    if {text} is None:", f"        {text} = default{i}"]
            if convert:
                lines += ["    else:", f"        {text} = {convert}"]
        assignments.append(f"    header.{name} = {text}")
    lines += ["    header = _new(cls)", *assignments, "    return header"]
    exec("\n".join(lines), namespace)  # noqa: S102 - source built above from the class's own field specs only
    return namespace["decode"]


def _render(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def req(key: str | None = None, default=dataclasses.MISSING):
    """A required field (absent → HeaderError)."""
    return field(default=default, metadata={"key": key, "required": True})


def opt(default=None, key: str | None = None):
    """An optional field."""
    return field(default=default, metadata={"key": key, "required": False})


class Header:
    """Mixin giving dataclass headers their extFields codec."""

    _specs: ClassVar[tuple]
    #: attribute → TOPIC or GROUP: the fields naming the resources the request acts on.
    RESOURCES: ClassVar[dict[str, str]] = {}

    @classmethod
    def wire_key(cls, attribute: str) -> str:
        """The extFields key of ``attribute`` (``b`` for SEND_MESSAGE_V2's topic)."""
        for name, key, _kind, _required in cls._field_specs():
            if name == attribute:
                return key
        raise KeyError(f"{cls.__name__} has no field {attribute!r}")

    @classmethod
    def _field_specs(cls):
        specs = cls.__dict__.get("_specs_cache")
        if specs is None:
            hints = get_type_hints(cls)
            specs = []
            for f in dataclasses.fields(cls):
                kind = hints[f.name]
                args = getattr(kind, "__args__", None)
                if args:  # "int | None" → int
                    kind = next(a for a in args if a is not type(None))
                specs.append((f.name, f.metadata.get("key") or f.name, kind, f.metadata.get("required", False)))
            specs = tuple(specs)
            cls._specs_cache = specs
        return specs

    @classmethod
    def from_ext(cls: type[T], ext: dict[str, str]) -> T:
        """Decode from extFields.

        Raises:
            HeaderError: a required field is missing or a field is malformed.
        """
        # The first call makes the class's decoder and puts it in this method's place, for the class alone.
        decode = _make_decoder(cls)
        cls.from_ext = staticmethod(decode)
        return decode(ext)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "from_ext" not in cls.__dict__:  # a subclass of a decoded header makes its own decoder, not its parent's
            cls.from_ext = Header.__dict__["from_ext"]

    def to_ext(self) -> dict[str, str]:
        out = {}
        for name, key, _kind, _required in self._field_specs():
            value = getattr(self, name)
            if value is not None:
                out[key] = _render(value)
        return out


@dataclass(slots=True, kw_only=True)
class SendMessageRequestHeader(Header):
    """SEND_MESSAGE (10) with the long names."""

    RESOURCES: ClassVar[dict[str, str]] = {"topic": TOPIC, "producerGroup": GROUP}
    producerGroup: str = req()
    topic: str = req()
    defaultTopic: str = req(default="TBW102")
    defaultTopicQueueNums: int = req(default=4)
    queueId: int = req()
    sysFlag: int = req(default=0)
    bornTimestamp: int = req(default=0)
    flag: int = req(default=0)
    properties: str | None = opt()
    reconsumeTimes: int | None = opt()
    unitMode: bool | None = opt()
    maxReconsumeTimes: int | None = opt()
    batch: bool | None = opt()
    brokerName: str | None = opt()


@dataclass(slots=True, kw_only=True)
class SendMessageRequestHeaderV2(Header):
    """SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320): the same fields under one-letter keys."""

    RESOURCES: ClassVar[dict[str, str]] = {"topic": TOPIC, "producerGroup": GROUP}
    producerGroup: str = req("a")
    topic: str = req("b")
    defaultTopic: str = req("c")
    defaultTopicQueueNums: int = req("d")
    queueId: int = req("e")
    sysFlag: int = req("f")
    bornTimestamp: int = req("g")
    flag: int = req("h")
    properties: str | None = opt(key="i")
    reconsumeTimes: int | None = opt(key="j")
    unitMode: bool | None = opt(key="k")
    maxReconsumeTimes: int | None = opt(key="l")
    batch: bool | None = opt(key="m")
    brokerName: str | None = opt(key="n")

    def to_v1(self) -> SendMessageRequestHeader:
        return SendMessageRequestHeader(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


@dataclass(slots=True, kw_only=True)
class SendMessageResponseHeader(Header):
    msgId: str = req()
    queueId: int = req()
    queueOffset: int = req()
    transactionId: str | None = opt()
    MSG_REGION: str | None = opt()
    TRACE_ON: str | None = opt()


@dataclass(slots=True, kw_only=True)
class PullMessageRequestHeader(Header):
    RESOURCES: ClassVar[dict[str, str]] = {"topic": TOPIC, "consumerGroup": GROUP}
    consumerGroup: str = req()
    topic: str = req()
    queueId: int = req()
    queueOffset: int = req()
    maxMsgNums: int = req()
    sysFlag: int = req()
    commitOffset: int = req()
    suspendTimeoutMillis: int = req()
    subVersion: int = req()
    subscription: str | None = opt()
    expressionType: str | None = opt()


@dataclass(slots=True, kw_only=True)
class PullMessageResponseHeader(Header):
    suggestWhichBrokerId: int = req()
    nextBeginOffset: int = req()
    minOffset: int = req()
    maxOffset: int = req()


@dataclass(slots=True, kw_only=True)
class EndTransactionRequestHeader(Header):
    RESOURCES: ClassVar[dict[str, str]] = {"producerGroup": GROUP}
    producerGroup: str = req()
    tranStateTableOffset: int = req()
    commitLogOffset: int = req()
    commitOrRollback: int = req()
    msgId: str = req()
    # transactionId before fromTransactionCheck: to_ext renders in field order, the order halfmq's client sent them.
    transactionId: str | None = opt()
    fromTransactionCheck: bool | None = opt()


@dataclass(slots=True, kw_only=True)
class CheckTransactionStateRequestHeader(Header):
    tranStateTableOffset: int = req()
    commitLogOffset: int = req()
    msgId: str | None = opt()
    transactionId: str | None = opt()
    offsetMsgId: str | None = opt()
    topic: str | None = opt()
    bname: str | None = opt()


@dataclass(slots=True, kw_only=True)
class QueryConsumerOffsetRequestHeader(Header):
    RESOURCES: ClassVar[dict[str, str]] = {"topic": TOPIC, "consumerGroup": GROUP}
    consumerGroup: str = req()
    topic: str = req()
    queueId: int = req()
    setZeroIfNotFound: bool | None = opt()


@dataclass(slots=True, kw_only=True)
class UpdateConsumerOffsetRequestHeader(Header):
    RESOURCES: ClassVar[dict[str, str]] = {"topic": TOPIC, "consumerGroup": GROUP}
    consumerGroup: str = req()
    topic: str = req()
    queueId: int = req()
    commitOffset: int = req()


@dataclass(slots=True, kw_only=True)
class QueueRequestHeader(Header):
    """GET_MAX_OFFSET, GET_MIN_OFFSET and GET_EARLIEST_MSG_STORETIME."""

    RESOURCES: ClassVar[dict[str, str]] = {"topic": TOPIC}
    topic: str = req()
    queueId: int = req()


@dataclass(slots=True, kw_only=True)
class SearchOffsetRequestHeader(Header):
    RESOURCES: ClassVar[dict[str, str]] = {"topic": TOPIC}
    topic: str = req()
    queueId: int = req()
    timestamp: int = req()
    boundaryType: str | None = opt()


@dataclass(slots=True, kw_only=True)
class OffsetResponseHeader(Header):
    offset: int = req()


@dataclass(slots=True, kw_only=True)
class TimestampResponseHeader(Header):
    timestamp: int = req()


@dataclass(slots=True, kw_only=True)
class ViewMessageRequestHeader(Header):
    offset: int = req()


@dataclass(slots=True, kw_only=True)
class UnregisterClientRequestHeader(Header):
    RESOURCES: ClassVar[dict[str, str]] = {"producerGroup": GROUP, "consumerGroup": GROUP}
    clientID: str = req()
    producerGroup: str | None = opt()
    consumerGroup: str | None = opt()


@dataclass(slots=True, kw_only=True)
class ConsumerSendMsgBackRequestHeader(Header):
    RESOURCES: ClassVar[dict[str, str]] = {"group": GROUP}
    offset: int = req()
    group: str = req()
    delayLevel: int = req()
    originMsgId: str | None = opt()
    originTopic: str | None = opt()
    unitMode: bool | None = opt()
    maxReconsumeTimes: int | None = opt()


@dataclass(slots=True, kw_only=True)
class GroupRequestHeader(Header):
    """GET_CONSUMER_LIST_BY_GROUP and NOTIFY_CONSUMER_IDS_CHANGED."""

    RESOURCES: ClassVar[dict[str, str]] = {"consumerGroup": GROUP}
    consumerGroup: str = req()


@dataclass(slots=True, kw_only=True)
class TopicRequestHeader(Header):
    """GET_ROUTEINFO_BY_TOPIC, DELETE_TOPIC_IN_BROKER."""

    RESOURCES: ClassVar[dict[str, str]] = {"topic": TOPIC}
    topic: str = req()


@dataclass(slots=True, kw_only=True)
class CreateTopicRequestHeader(Header):
    topic: str = req()
    defaultTopic: str = req(default="TBW102")
    readQueueNums: int = req()
    writeQueueNums: int = req()
    perm: int = req()
    topicFilterType: str = req(default="SINGLE_TAG")
    topicSysFlag: int | None = opt()
    order: bool = req(default=False)
    attributes: str | None = opt()  #: RocketMQ 5: "+message.type=FIFO" adds or replaces, "-message.type" removes


@dataclass(slots=True, kw_only=True)
class ResumeCheckHalfMessageRequestHeader(Header):
    msgId: str = req()


@dataclass(slots=True, kw_only=True)
class QueryMessageRequestHeader(Header):
    """QUERY_MESSAGE (12): messages of a topic by key."""

    RESOURCES: ClassVar[dict[str, str]] = {"topic": TOPIC}
    topic: str = req()
    key: str = req()
    maxNum: int = req()
    beginTimestamp: int = req()
    endTimestamp: int = req()


@dataclass(slots=True, kw_only=True)
class ConnectionListRequestHeader(Header):
    """GET_PRODUCER_CONNECTION_LIST (204) uses producerGroup; GET_CONSUMER_CONNECTION_LIST (203) consumerGroup."""

    RESOURCES: ClassVar[dict[str, str]] = {"producerGroup": GROUP, "consumerGroup": GROUP}
    producerGroup: str | None = opt()
    consumerGroup: str | None = opt()


@dataclass(slots=True, kw_only=True)
class ConsumeStatsRequestHeader(Header):
    RESOURCES: ClassVar[dict[str, str]] = {"consumerGroup": GROUP, "topic": TOPIC}
    consumerGroup: str = req()
    topic: str | None = opt()


@dataclass(slots=True, kw_only=True)
class HalfStatusRequestHeader(Header):
    """HALFMQ_GET_HALF_STATUS / HALFMQ_GET_TRANSACTION_RECORDS: one page of at most ``limit`` rows (the broker bounds
    it too), from where the previous page ended: ``after`` is that answer's ``next`` (absent: the first page).
    ``order``: "due" (HALF_STATUS's default: next check soonest first) or "store" (RECORDS' default: oldest first),
    "-" before it for the reverse; ``state``: RECORDS of one status only (PREPARED, COMMITTED, ROLLED_BACK,
    DISCARDED)."""

    limit: int | None = opt()
    after: str | None = opt()
    order: str | None = opt()
    state: str | None = opt()


@dataclass(slots=True, kw_only=True)
class TopicStatsRequestHeader(Header):
    """HALFMQ_GET_TOPIC_STATS: one page of at most ``limit`` of the broker's topics in name order, after the name
    ``after``, those whose name contains ``contains`` and whose kind is one of ``kinds`` (comma-separated NORMAL,
    RETRY, DLQ, SYSTEM; absent: every kind); or, with ``topic``, that topic alone, with its queues' last store
    times."""

    limit: int | None = opt()
    after: str | None = opt()
    contains: str | None = opt()
    kinds: str | None = opt()
    topic: str | None = opt()


@dataclass(slots=True, kw_only=True)
class GroupListRequestHeader(Header):
    """HALFMQ_GET_CONSUMER_GROUPS / HALFMQ_GET_PRODUCER_GROUPS: one page of at most ``limit`` of the broker's groups in
    name order, after the name ``after``, those whose name contains ``contains`` (any case); or, with ``group``, that
    group alone."""

    limit: int | None = opt()
    after: str | None = opt()
    contains: str | None = opt()
    group: str | None = opt()


@dataclass(slots=True, kw_only=True)
class DeleteSubscriptionGroupRequestHeader(Header):
    """DELETE_SUBSCRIPTIONGROUP (207); UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200) carries the group in its JSON
    body (RocketMQ's SubscriptionGroupConfig)."""

    RESOURCES: ClassVar[dict[str, str]] = {"groupName": GROUP}
    groupName: str = req()
    removeOffset: bool | None = opt()


@dataclass(slots=True, kw_only=True)
class RegisterBrokerRequestHeader(Header):
    """REGISTER_BROKER (103): the body is RocketMQ's RegisterBrokerBody in JSON (``compressed`` false).
    ``grpcAddr`` is halfmq's: where the broker serves RocketMQ 5 clients (absent: it does not); so is ``epoch``, the
    leadership a broker group's leader registers at (RocketMQ 5's stateVersion: the higher one wins)."""

    brokerName: str = req()
    brokerAddr: str = req()
    clusterName: str = req()
    haServerAddr: str = req(default="")
    brokerId: int = req()
    heartbeatTimeoutMillis: int | None = opt()
    compressed: bool = req(default=False)
    bodyCrc32: int = req(default=0)
    grpcAddr: str | None = opt()
    epoch: int | None = opt()


@dataclass(slots=True, kw_only=True)
class RegisterBrokerResponseHeader(Header):
    haServerAddr: str | None = opt()
    masterAddr: str | None = opt()


@dataclass(slots=True, kw_only=True)
class UnregisterBrokerRequestHeader(Header):
    """UNREGISTER_BROKER (104)."""

    brokerName: str = req()
    brokerAddr: str = req()
    clusterName: str = req()
    brokerId: int = req()


@dataclass(slots=True, kw_only=True)
class DeleteTopicFromNamesrvRequestHeader(Header):
    """DELETE_TOPIC_IN_NAMESRV (216): the topic on every broker, or on those of ``clusterName``."""

    topic: str = req()
    clusterName: str | None = opt()


@dataclass(slots=True, kw_only=True)
class GetTopicsByClusterRequestHeader(Header):
    """GET_TOPICS_BY_CLUSTER (224)."""

    cluster: str = req()
