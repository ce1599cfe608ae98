"""The "halfmq" Spark data source (PySpark's Python Data Source API), with spark-sql-kafka's options.

What to read, exactly one of: ``subscribe`` (comma-separated topics), ``subscribePattern`` (a regular expression
matched against the whole name of every user topic, looked up again before every batch of a stream so new topics
are picked up), ``assign`` (JSON ``{"topic": ["broker-a:0", "broker-b:1"]}``). A topic has queues on every broker
of its route; options and offsets name a queue "brokerName:queueId" (a queue id alone names the queue of a topic
whose queues of that id are on one broker, the form of offsets written before the source read several brokers).
Where to start and stop: ``startingOffsets`` / ``endingOffsets`` (``earliest``, ``latest`` or JSON
``{"topic": {"broker-a:0": 42}}`` where, as in Kafka, -2 means earliest and -1 latest),
``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp`` (JSON ``{"topic": {"broker-a:0": ms}}``) and
``startingTimestamp`` / ``endingTimestamp`` (ms, every queue): a time means the first message the broker stored at
or after it (the queue's end when there is none); a global time wins over per-queue times, which win over offsets.
Ending options are for batch reads only. Streams: ``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger`` with
``maxTriggerDelay`` (a batch waits for that many new messages, at most that long). ``minPartitions`` splits queues
into offset ranges, as Kafka splits topic partitions. ``failOnDataLoss`` (default true) is checked at the start and
before every batch of a stream, and again by every task: messages deleted below a query's position, a deleted
topic or queue, offsets gone backwards fail the query with an error naming them; with false they are skipped
(a deleted topic is dropped, a queue whose offsets went backwards is read again from its start).
``kafkaConsumer.pollTimeoutMs`` bounds how long a task waits for one pull. ``tags`` is a tag expression.

Only committed messages are ever read: half messages live in the broker's half topic until committed.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)

from . import broker_io
from .broker_io import DataLossError, QueueBounds, parse_queue_key, queue_label
from .options import SINK_OPTIONS, SOURCE_OPTIONS, OptionError, parse_options
from .sink import HalfmqStreamWriter, HalfmqWriter
from .source_options import KAFKA_EARLIEST, KAFKA_LATEST, Bound, SourceOptions, source_options

log = logging.getLogger(__name__)

SCHEMA = ("topic string, broker_name string, queue_id int, queue_offset long, msg_id string, keys string, "
          "tags string, body binary, properties map<string,string>, born_timestamp timestamp, "
          "store_timestamp timestamp")

#: {topic: {queue key ("brokerName:queueId"): bounds}}
Bounds = dict[str, dict[str, QueueBounds]]
#: Offsets as Spark keeps them (JSON): {"topic": {"brokerName:queueId": offset}}.
Offsets = dict[str, dict[str, int]]


@dataclass
class QueueRange(InputPartition):
    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int


class HalfmqDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "halfmq"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> HalfmqBatchReader:
        return HalfmqBatchReader(source_options(parse_options(self.options, SOURCE_OPTIONS, 'source'), False))

    def streamReader(self, schema) -> HalfmqStreamReader:
        return HalfmqStreamReader(source_options(parse_options(self.options, SOURCE_OPTIONS, 'source'), True))

    def writer(self, schema, overwrite: bool) -> HalfmqWriter:
        return HalfmqWriter(parse_options(self.options, SINK_OPTIONS, 'sink'))

    def streamWriter(self, schema, overwrite: bool) -> HalfmqStreamWriter:
        return HalfmqStreamWriter(parse_options(self.options, SINK_OPTIONS, 'sink'))


def _highs(bounds: Bounds) -> Offsets:
    return {topic: {key: b.high for key, b in queues.items()} for topic, queues in bounds.items()}


def _resolve(topic: str, refs, keys, what: str) -> tuple[dict[str, str], list[str]]:
    """The key of the queue among ``keys`` (a topic's queues now) each ref names, and the refs that name none. A
    bare queue id names the topic's queue of that id when one broker has it; when several do it is ambiguous: an
    OptionError saying ``what`` named it."""
    by_id: dict[int, list[str]] = {}
    for key in keys:
        by_id.setdefault(parse_queue_key(key)[1], []).append(key)
    found: dict[str, str] = {}
    missing: list[str] = []
    for ref in refs:
        broker, queue_id = parse_queue_key(ref)
        matches = [key for key in by_id.get(queue_id, ()) if broker is None or parse_queue_key(key)[0] == broker]
        if len(matches) > 1:
            raise OptionError(f"{what}: queue {ref} of topic {topic!r} is on several brokers "
                              f"({', '.join(sorted(matches))}): name one, as brokerName:queueId")
        if matches:
            found[ref] = matches[0]
        else:
            missing.append(ref)
    return found, missing


def _by_key(topic: str, spec: dict[str, int], keys, what: str) -> dict[str, int]:
    """A topic's per-queue values of an option by queue key; those of queues it does not have are left out."""
    found, _missing = _resolve(topic, spec, keys, what)
    return {found[ref]: value for ref, value in spec.items() if ref in found}


def _split(ranges: list[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """Kafka's KafkaOffsetRangeCalculator: with fewer ranges than minPartitions, each range gets a share of the
    partitions proportional to its size (at least one), cut into near-equal offset ranges."""
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)

    def share(size: int, of: int, parts: int) -> int:
        return max(int(size / of * parts + 0.5), 1)  # Scala's math.round: halves up

    unsplit = [r for r in ranges if share(r.end - r.start, total, min_partitions) == 1]
    split_total = total - sum(r.end - r.start for r in unsplit)
    split_parts = max(min_partitions - len(unsplit), 1)
    out = []
    for r in ranges:
        size = r.end - r.start
        parts = 1 if share(size, total, min_partitions) == 1 else share(size, split_total, split_parts)
        begin, remaining = r.start, size
        for part in range(parts):
            this = remaining // (parts - part)  # the last part takes the rounding
            remaining -= this
            out.append(QueueRange(r.topic, r.broker_name, r.queue_id, begin, begin + this))
            begin += this
    return [r for r in out if r.end > r.start]


class _Reading:
    def __init__(self, options: SourceOptions):
        self.options = options
        self.namesrv = options.namesrv
        self.range_read = broker_io.RangeRead(options.tags, options.fail_on_data_loss, options.poll_timeout_s)

    def _topics(self) -> list[str]:
        o = self.options
        if o.pattern is not None:
            return [t for t in broker_io.user_topics(self.namesrv) if o.pattern.fullmatch(t)]
        return list(o.assign) if o.assign is not None else list(o.subscribe)

    def _bounds(self, first: bool) -> Bounds:
        """The selected queues' bounds now, on every broker. At a query's start a subscribed topic or assigned
        queue that does not exist is an error naming it (later, it is data loss)."""
        o = self.options
        select = None if o.assign is None else lambda topic, keys: self._assigned(topic, keys, first)
        bounds = broker_io.queue_bounds(self.namesrv, self._topics(), select)
        if first and o.pattern is None:
            for topic in o.assign or o.subscribe:
                if topic not in bounds:
                    option = "assign" if o.assign is not None else "subscribe"
                    raise OptionError(f"option '{option}': topic {topic!r} does not exist")
        return bounds

    def _assigned(self, topic: str, keys: list[str], first: bool) -> list[str]:
        found, missing = _resolve(topic, self.options.assign.get(topic, ()), keys, "option 'assign'")
        if first and missing:
            raise OptionError(f"option 'assign': topic {topic!r} has no queue [{', '.join(missing)}] "
                              f"(its queues: {', '.join(sorted(keys))})")
        return sorted(set(found.values()))

    def _positions(self, bound: Bound, bounds: Bounds, side: str) -> Offsets:
        """A Bound as the offset of every queue (times looked up on the brokers)."""
        option = "startingOffsets" if side == "start" else "endingOffsets"
        given: dict[str, dict[str, int]] = {}
        times: dict[str, dict[str, int]] = {}
        for topic, queues in bounds.items():
            if isinstance(bound.offsets, dict):
                given[topic] = _by_key(topic, bound.offsets.get(topic, {}), queues, f"option '{option}'")
            per_queue = _by_key(topic, (bound.timestamps or {}).get(topic, {}), queues,
                                f"option '{option}ByTimestamp'")
            for key in queues:
                ts = bound.timestamp if bound.timestamp is not None else per_queue.get(key)
                if ts is not None:
                    times.setdefault(topic, {})[key] = ts
        found = broker_io.offsets_for_times(self.namesrv, times) if times else {}
        out: Offsets = {}
        for topic, queues in bounds.items():
            out[topic] = {}
            for key, b in queues.items():
                if key in found.get(topic, {}):
                    value = min(max(found[topic][key], b.low), b.high)
                else:
                    value = self._offset(given.get(topic, bound.offsets), topic, key, b, side)
                out[topic][key] = value
        return out

    def _offset(self, spec: str | dict[str, int], topic: str, key: str, b: QueueBounds, side: str) -> int:
        if spec == "earliest":
            return b.low
        if spec == "latest":
            return b.high
        value = spec.get(key, b.low if side == "start" else b.high)
        if value == KAFKA_LATEST:
            return b.high
        if value == KAFKA_EARLIEST:
            return b.low
        if value < b.low:
            if self.options.fail_on_data_loss:
                raise DataLossError(f"{side} offset {value} of {queue_label(topic, key)} is no longer available "
                                    f"(the queue starts at {b.low}); set failOnDataLoss=false to skip ahead")
            return b.low
        return value

    def read(self, partition: QueueRange):
        if not isinstance(partition, QueueRange):  # Spark's placeholder when partitions() is empty
            return
        yield from broker_io.read_range(self.namesrv, partition.topic, partition.broker_name, partition.queue_id,
                                        partition.start, partition.end, self.range_read)


class HalfmqBatchReader(_Reading, DataSourceReader):
    def partitions(self):
        bounds = self._bounds(first=True)
        start = self._positions(self.options.starting, bounds, "start")
        end = self._positions(self.options.ending, bounds, "end")
        ranges = [QueueRange(topic, *parse_queue_key(key), start[topic][key], stop)
                  for topic, queues in end.items() for key, stop in queues.items() if stop > start[topic][key]]
        return _split(ranges, self.options.min_partitions)


class HalfmqStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are JSON {"topic": {"brokerName:queueId": next offset}}; those of a checkpoint written before the
    source read several brokers name a queue by its id alone, and are read as the queue of that id of the topic's
    one broker. Before every batch the queues are looked up again: new topics (subscribePattern) and queues (of a
    broker the topic spread to, too) start at their earliest offset, and lost data is reported.
    With trigger(availableNow=True) the query stops at the offsets that were the latest when it started."""

    def __init__(self, options: SourceOptions):
        super().__init__(options)
        self.target: Offsets | None = None
        #: The queues as last looked up (each batch's latestOffset), and their ends: the progress' latestOffset.
        self.bounds: Bounds = {}
        self.latest: Offsets | None = None
        #: When the last batch minOffsetsPerTrigger let through was planned (None: none yet, Kafka's first batch
        #: never waits).
        self.last_trigger: float | None = None

    def _look(self, first: bool = False) -> Bounds:
        self.bounds = self._bounds(first)
        self.latest = _highs(self.bounds)
        return self.bounds

    def initialOffset(self) -> dict:
        return self._positions(self.options.starting, self._look(first=True), "start")

    def getDefaultReadLimit(self):
        if self.options.max_per_trigger:
            return ReadMaxRows(self.options.max_per_trigger)
        if self.options.min_per_trigger:
            return ReadMinRows(self.options.min_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = _highs(self._look())

    def reportLatestOffset(self) -> dict | None:
        """The queues' ends at the last look: with the batch's end offset, the lag in the query progress."""
        return self.latest

    def _lost(self, what: str) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{what}; set failOnDataLoss=false to skip lost messages")
        log.warning("%s; skipped (failOnDataLoss=false)", what)

    def _keyed(self, offsets: dict) -> Offsets:
        """Spark's offsets with every queue named by its key, as last looked up (a queue named by its id alone,
        in a checkpoint written before the source read several brokers, is the queue of that id)."""
        out: Offsets = {}
        for topic, queues in offsets.items():
            bare = [ref for ref in queues if parse_queue_key(ref)[0] is None]
            found, _missing = _resolve(topic, bare, self.bounds.get(topic, {}),
                                       "the offsets of the query's checkpoint (written by a source that read one "
                                       "broker)") if bare else ({}, [])
            out[topic] = {found.get(ref, ref): offset for ref, offset in queues.items()}
        return out

    def _checked(self, start: dict) -> Offsets:
        """Every queue's position for the next batch, after checking ``start`` (the last batch's end) against the
        queues now: what is lost is reported, and under failOnDataLoss=false skipped."""
        positions: Offsets = {}
        start = self._keyed(start)
        for topic, queues in start.items():
            for key, pos in queues.items():
                b = self.bounds.get(topic, {}).get(key)
                label = queue_label(topic, key)
                if b is None:
                    self._lost(f"topic {topic!r} was deleted" if topic not in self.bounds
                               else f"queue {label} no longer exists")
                    continue
                if pos > b.high:
                    self._lost(f"offsets of {label} went backwards from {pos} to {b.high} (the queue was "
                               f"emptied or created again); it is read again from its start, {b.low}")
                    pos = b.low
                elif pos < b.low:
                    self._lost(f"messages {label} offsets {pos}..{b.low - 1} were deleted before they were read")
                    pos = b.low
                positions.setdefault(topic, {})[key] = pos
        for topic, queues in self.bounds.items():
            for key, b in queues.items():
                if key not in positions.get(topic, {}) and key not in start.get(topic, {}):
                    if b.low > 0:  # as Kafka's "added partition starts from X instead of 0"
                        self._lost(f"new queue {queue_label(topic, key)} starts at offset {b.low}: the messages "
                                   f"before were deleted before the query saw them")
                    positions.setdefault(topic, {})[key] = b.low
        return positions

    def latestOffset(self, start: dict, limit) -> dict:
        self._look()
        positions = self._checked(start)
        latest = {topic: {q: self.latest[topic][q] for q in queues} for topic, queues in positions.items()}
        if self.target is not None:  # availableNow: nothing past the ends seen at the start, no queue added since
            latest = {topic: {q: min(v, self.target[topic][q]) for q, v in queues.items()
                              if q in self.target.get(topic, {})} for topic, queues in latest.items()}
            positions = {topic: {q: min(v, latest[topic][q]) for q, v in queues.items() if q in latest[topic]}
                         for topic, queues in positions.items()}
            return self._capped(positions, latest, limit)
        if isinstance(limit, ReadAllAvailable):
            return latest
        if self._delayed(positions, latest):
            return start
        return self._capped(positions, latest, limit)

    def _delayed(self, positions: Offsets, latest: Offsets) -> bool:
        """Kafka's minOffsetsPerTrigger: no batch while fewer new messages wait, unless maxTriggerDelay passed
        since the last batch."""
        minimum = self.options.min_per_trigger
        now = time.monotonic()
        if minimum:
            waiting = sum(high - positions[t][q] for t, queues in latest.items() for q, high in queues.items())
            overdue = self.last_trigger is None or (now - self.last_trigger) * 1000 >= self.options.max_trigger_delay_ms
            if waiting < minimum and not overdue:
                return True
        self.last_trigger = now
        return False

    def _capped(self, positions: Offsets, latest: Offsets, limit) -> Offsets:
        """At most maxOffsetsPerTrigger past ``positions``, queues filled round robin so one busy queue cannot
        starve the others."""
        budget = (limit.max_rows if isinstance(limit, ReadMaxRows)
                  else self.options.max_per_trigger if not isinstance(limit, ReadAllAvailable) else None)
        if not budget:
            return latest
        capped = {topic: dict(queues) for topic, queues in positions.items()}
        pending = [(t, q, positions[t][q], high) for t, queues in latest.items() for q, high in queues.items()]
        while budget > 0 and pending:
            share = max(1, budget // len(pending))
            still = []
            for topic, queue, pos, high in pending:
                take = min(share, high - pos, budget)
                if take > 0:
                    pos += take
                    budget -= take
                capped[topic][queue] = pos
                if pos < high:
                    still.append((topic, queue, pos, high))
            pending = still
        return capped

    def partitions(self, start: dict, end: dict):
        # After a restart Spark may plan the batch it was running from its checkpoint before asking for offsets.
        if any(key not in self.bounds.get(t, {}) for t, keys in end.items() for key in keys):
            self._look()
        start, end = self._keyed(start), self._keyed(end)
        ranges = []
        for topic, queues in end.items():
            for key, stop in queues.items():
                b = self.bounds.get(topic, {}).get(key)
                if b is None:
                    continue  # gone since it was planned: the task would find nothing, latestOffset reports it
                begin = start.get(topic, {}).get(key, b.low)  # a new queue starts at its earliest
                if begin > stop:  # offsets went backwards (reported by latestOffset): read from the start again
                    begin = b.low
                if stop > begin:
                    ranges.append(QueueRange(topic, *parse_queue_key(key), begin, stop))
        return _split(ranges, self.options.min_partitions)

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in Spark's checkpoint."""


__all__ = ["SCHEMA", "DataLossError", "HalfmqDataSource", "OptionError"]
