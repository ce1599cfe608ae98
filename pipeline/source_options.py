"""The "halfmq" source's options, read and checked once (spark-sql-kafka's names and meanings): which queues, where
to start and stop, how much per trigger, what to do when data is lost. Every malformed value is an OptionError
naming its option."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .broker_io import DEFAULT_PULL_TIMEOUT_S, parse_queue_key, queue_key
from .options import OptionError, namesrv_option

#: Kafka's special offsets in the JSON form of startingOffsets / endingOffsets.
KAFKA_EARLIEST, KAFKA_LATEST = -2, -1
#: Spark's time strings (JavaUtils.timeStringAsMs): a number and a unit, milliseconds when there is none.
_DURATION = re.compile(r"\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*", re.IGNORECASE)
_UNIT_MS = {"us": 0.001, "ms": 1, None: 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
#: Kafka's maxTriggerDelay default.
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000
_SELECTORS = ("subscribe", "subscribePattern", "assign")
_ENDING = ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp")

#: A queue position: "earliest", "latest" or {topic: {queue: offset}} (Kafka's -2/-1 kept as given); a queue is
#: named "brokerName:queueId", or by its queue id alone on a topic of one broker (resolved against the routes).
OffsetSpec = str | dict[str, dict[str, int]]


@dataclass(frozen=True)
class Bound:
    """Where a read starts (or ends): by offsets, or by store time (the first message stored at or after it),
    for every queue (``timestamp``) or per queue (``timestamps``, the other queues by ``offsets``)."""

    offsets: OffsetSpec
    timestamp: int | None = None
    timestamps: dict[str, dict[str, int]] | None = None


@dataclass(frozen=True)
class SourceOptions:
    namesrv: str
    subscribe: tuple[str, ...] = ()
    pattern: re.Pattern | None = None
    assign: dict[str, tuple[str, ...]] | None = None
    starting: Bound = Bound("earliest")
    ending: Bound = Bound("latest")
    max_per_trigger: int | None = None
    min_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    tags: str = "*"
    poll_timeout_s: float = DEFAULT_PULL_TIMEOUT_S


def source_options(options: dict[str, str], streaming: bool) -> SourceOptions:
    """The checked options of a batch read or a stream (option keys lower-cased, as Spark hands them over)."""
    given = [name for name in _SELECTORS if options.get(name.lower(), "").strip()]
    if len(given) != 1:
        raise OptionError(f"exactly one of 'subscribe', 'subscribePattern' and 'assign' says what to read; "
                          f"{'none' if not given else ', '.join(repr(n) for n in given)} given")
    if streaming:  # as in Kafka; a batch read ignores the trigger options, so batch and stream can share them
        for name in _ENDING:
            if name.lower() in options:
                raise OptionError(f"option '{name}' is for batch reads only (a stream has no end), as in Kafka")
    delay = options.get("maxtriggerdelay")
    if delay is not None and "minoffsetspertrigger" not in options:
        raise OptionError("option 'maxTriggerDelay' only bounds how long minOffsetsPerTrigger waits: set that too")
    return SourceOptions(
        namesrv=namesrv_option(options),
        subscribe=_topics(options.get("subscribe", "")),
        pattern=_pattern(options.get("subscribepattern")),
        assign=_assign(options.get("assign")),
        starting=_bound(options, "starting", "latest" if streaming else "earliest"),
        ending=_bound(options, "ending", "latest"),
        max_per_trigger=_count(options, "maxOffsetsPerTrigger"),
        min_per_trigger=_count(options, "minOffsetsPerTrigger"),
        max_trigger_delay_ms=DEFAULT_MAX_TRIGGER_DELAY_MS if delay is None else duration_ms(delay, "maxTriggerDelay"),
        min_partitions=_count(options, "minPartitions"),
        fail_on_data_loss=_boolean(options, "failOnDataLoss", True),
        tags=options.get("tags", "*") or "*",
        poll_timeout_s=_poll_timeout_s(options))


def _poll_timeout_s(options: dict[str, str]) -> float:
    timeout_ms = _count(options, "kafkaConsumer.pollTimeoutMs")
    return DEFAULT_PULL_TIMEOUT_S if timeout_ms is None else timeout_ms / 1000


def _topics(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _pattern(text: str | None) -> re.Pattern | None:
    if not text or not text.strip():
        return None
    try:
        return re.compile(text.strip())
    except re.error as exc:
        raise OptionError(f"option 'subscribePattern': {text!r} is not a regular expression ({exc})") from None


def queue_ref(text) -> str:
    """A queue as an option names it, written one way: "brokerName:queueId", or a bare queue id. ValueError if it
    is neither."""
    broker, queue_id = parse_queue_key(text)
    return str(queue_id) if broker is None else queue_key(broker, queue_id)


def _ref_order(ref: str) -> tuple[str, int]:
    broker, queue_id = parse_queue_key(ref)
    return broker or "", queue_id


def _assign(text: str | None) -> dict[str, tuple[str, ...]] | None:
    if not text or not text.strip():
        return None
    try:
        raw = json.loads(text)
        assigned = {str(topic): tuple(sorted({queue_ref(q) for q in queues}, key=_ref_order))
                    for topic, queues in raw.items() if isinstance(queues, list)}
        if len(assigned) != len(raw):
            raise ValueError
    except (ValueError, AttributeError, TypeError):
        raise OptionError(f"option 'assign': {text!r} is not JSON like {{\"topic\": [\"broker-a:0\", 1]}} "
                          f"(queues: brokerName:queueId, or a queue id on a topic of one broker)") from None
    if not any(assigned.values()):
        raise OptionError("option 'assign' lists no queue")
    return assigned


def _bound(options: dict[str, str], side: str, default: str) -> Bound:
    """startingOffsets / startingOffsetsByTimestamp / startingTimestamp (or ending...): as in Kafka, a global
    timestamp wins over per-queue timestamps, which win over offsets (for the queues they name)."""
    name = f"{side}Offsets"
    text = (options.get(name.lower()) or default).strip()
    offsets: OffsetSpec = text if text in ("earliest", "latest") else _queue_json(text, name)
    if offsets == "earliest" and side == "ending":
        raise OptionError("option 'endingOffsets': earliest is not an end, as in Kafka")
    if isinstance(offsets, dict):
        for topic, queues in offsets.items():
            for ref, offset in queues.items():
                if offset == KAFKA_EARLIEST and side == "ending":
                    raise OptionError(f"option '{name}': -2 (earliest) is not allowed as an ending offset "
                                      f"({topic}/{ref}), as in Kafka")
                if offset < 0 and offset not in (KAFKA_EARLIEST, KAFKA_LATEST):
                    raise OptionError(f"option '{name}': offset {offset} of {topic}/{ref} is negative "
                                      f"(only -2 = earliest and -1 = latest are, as in Kafka)")
    timestamp = _count(options, f"{side}Timestamp", allow_zero=True)
    by_timestamp = options.get(f"{side}OffsetsByTimestamp".lower())
    timestamps = None if by_timestamp is None else _queue_json(by_timestamp, f"{side}OffsetsByTimestamp")
    if timestamps is not None and any(t < 0 for qs in timestamps.values() for t in qs.values()):
        raise OptionError(f"option '{side}OffsetsByTimestamp': timestamps are milliseconds since the epoch, "
                          f"not negative")
    return Bound(offsets, timestamp, timestamps)


def _queue_json(text: str, name: str) -> dict[str, dict[str, int]]:
    try:
        raw = json.loads(text)
        return {str(topic): {queue_ref(q): int(v) for q, v in queues.items()} for topic, queues in raw.items()}
    except (ValueError, AttributeError, TypeError):
        raise OptionError(f"option '{name}': {text!r} is not earliest, latest or JSON like "
                          f"{{\"topic\": {{\"broker-a:0\": 42}}}} (a queue id alone on a topic of one broker)") \
            from None


def _count(options: dict[str, str], name: str, allow_zero: bool = False) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0 or (value == 0 and not allow_zero):
        raise OptionError(f"option '{name}' is not a {'non-negative' if allow_zero else 'positive'} integer: "
                          f"{text!r}")
    return value


def _boolean(options: dict[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise OptionError(f"option '{name}' is not true or false: {text!r}")
    return text.strip().lower() == "true"


def duration_ms(text: str, name: str) -> int:
    """A Spark time string ("15m", "30s", "500ms", "500": milliseconds) in milliseconds."""
    match = _DURATION.fullmatch(text)
    if not match:
        raise OptionError(f"option '{name}' is not a duration like 15m, 30s or 500ms: {text!r}")
    return int(int(match.group(1)) * _UNIT_MS[match.group(2) and match.group(2).lower()])
