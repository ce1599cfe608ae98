"""The "halfmq" Spark data source (PySpark's Python Data Source API), with spark-sql-kafka's options.

What to read, exactly one of: ``subscribe`` (comma-separated topics), ``subscribePattern`` (a regular expression
matched against the whole name of every user topic, looked up again before every batch of a stream so new topics
are picked up), ``assign`` (JSON ``{"topic": [queue ids]}``). Where to start and stop: ``startingOffsets`` /
``endingOffsets`` (``earliest``, ``latest`` or JSON ``{"topic": {"0": 42}}`` where, as in Kafka, -2 means earliest
and -1 latest), ``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp`` (JSON ``{"topic": {"0": ms}}``) and
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
from .broker_io import DataLossError, QueueBounds
from .options import SINK_OPTIONS, SOURCE_OPTIONS, OptionError, parse_options
from .sink import HalfmqStreamWriter, HalfmqWriter
from .source_options import KAFKA_EARLIEST, KAFKA_LATEST, Bound, SourceOptions, source_options

log = logging.getLogger(__name__)

SCHEMA = ("topic string, queue_id int, queue_offset long, msg_id string, keys string, tags string, body binary, "
          "properties map<string,string>, born_timestamp timestamp, store_timestamp timestamp")

Bounds = dict[str, dict[int, QueueBounds]]
#: Offsets as Spark keeps them (JSON: string queue keys): {"topic": {"queueId": offset}}.
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
    return {topic: {str(q): b.high for q, b in queues.items()} for topic, queues in bounds.items()}


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
        """The selected queues' bounds now. At a query's start a subscribed topic or assigned queue that does not
        exist is an error naming it (later, it is data loss)."""
        o = self.options
        bounds = broker_io.queue_bounds(self.namesrv, self._topics(), o.assign)
        if first and o.pattern is None:
            for topic in o.assign or o.subscribe:
                if topic not in bounds:
                    option = "assign" if o.assign is not None else "subscribe"
                    raise OptionError(f"option '{option}': topic {topic!r} does not exist")
            for topic, queues in (o.assign or {}).items():
                missing = sorted(set(queues) - set(bounds[topic]))
                if missing:
                    raise OptionError(f"option 'assign': topic {topic!r} has no queue {missing} "
                                      f"(its queues: {sorted(bounds[topic])})")
        return bounds

    def _positions(self, bound: Bound, bounds: Bounds, side: str) -> Offsets:
        """A Bound as the offset of every queue (times looked up on the broker)."""
        times: dict[str, dict[int, int]] = {}
        for topic, queues in bounds.items():
            for q in queues:
                ts = bound.timestamp if bound.timestamp is not None else (bound.timestamps or {}).get(topic, {}).get(q)
                if ts is not None:
                    times.setdefault(topic, {})[q] = ts
        found = broker_io.offsets_for_times(self.namesrv, times, bounds) if times else {}
        out: Offsets = {}
        for topic, queues in bounds.items():
            out[topic] = {}
            for q, b in queues.items():
                if q in found.get(topic, {}):
                    value = min(max(found[topic][q], b.low), b.high)
                else:
                    value = self._offset(bound.offsets, topic, q, b, side)
                out[topic][str(q)] = value
        return out

    def _offset(self, spec, topic: str, q: int, b: QueueBounds, side: str) -> int:
        if spec == "earliest":
            return b.low
        if spec == "latest":
            return b.high
        value = spec.get(topic, {}).get(q, b.low if side == "start" else b.high)
        if value == KAFKA_LATEST:
            return b.high
        if value == KAFKA_EARLIEST:
            return b.low
        if value < b.low:
            if self.options.fail_on_data_loss:
                raise DataLossError(f"{side} offset {value} of {topic}/{q} is no longer available (the queue "
                                    f"starts at {b.low}); set failOnDataLoss=false to skip ahead")
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
        ranges = [QueueRange(topic, bounds[topic][int(q)].broker_name, int(q), start[topic][q], stop)
                  for topic, queues in end.items() for q, stop in queues.items() if stop > start[topic][q]]
        return _split(ranges, self.options.min_partitions)


class HalfmqStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are JSON {"topic": {"queueId": next offset}}. Before every batch the queues are looked up again:
    new topics (subscribePattern) and queues start at their earliest offset, and lost data is reported.
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

    def _checked(self, start: dict) -> Offsets:
        """Every queue's position for the next batch, after checking ``start`` (the last batch's end) against the
        queues now: what is lost is reported, and under failOnDataLoss=false skipped."""
        positions: Offsets = {}
        for topic, queues in start.items():
            for queue, pos in queues.items():
                b = self.bounds.get(topic, {}).get(int(queue))
                if b is None:
                    self._lost(f"topic {topic!r} was deleted" if topic not in self.bounds
                               else f"queue {topic}/{queue} no longer exists")
                    continue
                if pos > b.high:
                    self._lost(f"offsets of {topic}/{queue} went backwards from {pos} to {b.high} (the queue was "
                               f"emptied or created again); it is read again from its start, {b.low}")
                    pos = b.low
                elif pos < b.low:
                    self._lost(f"messages {topic}/{queue} offsets {pos}..{b.low - 1} were deleted before they "
                               f"were read")
                    pos = b.low
                positions.setdefault(topic, {})[queue] = pos
        for topic, queues in self.bounds.items():
            for q, b in queues.items():
                if str(q) not in positions.get(topic, {}) and str(q) not in start.get(topic, {}):
                    if b.low > 0:  # as Kafka's "added partition starts from X instead of 0"
                        self._lost(f"new queue {topic}/{q} starts at offset {b.low}: the messages before were "
                                   f"deleted before the query saw them")
                    positions.setdefault(topic, {})[str(q)] = b.low
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
        if any(int(q) not in self.bounds.get(t, {}) for t, qs in end.items() for q in qs):
            self._look()
        ranges = []
        for topic, queues in end.items():
            for queue, stop in queues.items():
                b = self.bounds.get(topic, {}).get(int(queue))
                if b is None:
                    continue  # gone since it was planned: the task would find nothing, latestOffset reports it
                begin = start.get(topic, {}).get(queue, b.low)  # a new queue starts at its earliest
                if begin > stop:  # offsets went backwards (reported by latestOffset): read from the start again
                    begin = b.low
                if stop > begin:
                    ranges.append(QueueRange(topic, b.broker_name, int(queue), begin, stop))
        return _split(ranges, self.options.min_partitions)

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in Spark's checkpoint."""


__all__ = ["SCHEMA", "DataLossError", "HalfmqDataSource", "OptionError"]
