"""The "halfmq" Spark data source (PySpark's Python Data Source API).

Options follow Spark's Kafka source where the meaning matches: ``namesrv``, ``subscribe`` (comma-separated
topics), ``startingOffsets`` / ``endingOffsets`` (``earliest``, ``latest`` or JSON ``{"topic": {"0": 42}}``
where, as in Kafka, -2 means earliest and -1 latest; -2 is not allowed in ``endingOffsets``),
``maxOffsetsPerTrigger``, ``failOnDataLoss``, plus ``tags`` (a tag expression). Sink options: ``topic`` (when the
rows have no topic column), ``producerGroup``, ``sinkId`` (idempotency: a batch already committed under the
same sinkId and batch id is never published again). Option keys arrive lower-cased. An option a side does not
support is refused (OptionError naming it and listing the supported ones), never silently ignored.

Only committed messages are ever read: half messages live in the broker's half topic until committed.
"""
from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from . import broker_io
from .options import SINK_OPTIONS, SOURCE_OPTIONS, OptionError, namesrv_option, parse_options
from .sink import HalfmqStreamWriter, HalfmqWriter

SCHEMA = ("topic string, queue_id int, queue_offset long, msg_id string, keys string, tags string, body binary, "
          "properties map<string,string>, born_timestamp timestamp, store_timestamp timestamp")


def _topics(options: dict[str, str]) -> list[str]:
    topics = [t.strip() for t in options.get("subscribe", "").split(",") if t.strip()]
    if not topics:
        raise OptionError("option 'subscribe' (comma-separated topics) is required to read")
    return topics


@dataclass
class QueueRange(InputPartition):
    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int


#: Kafka's special offsets in the JSON form of startingOffsets / endingOffsets.
KAFKA_EARLIEST, KAFKA_LATEST = -2, -1


def _resolve(spec, bounds: dict[str, dict[int, broker_io.QueueBounds]], which: str, fail_on_data_loss: bool
             ) -> dict[str, dict[str, int]]:
    """Offsets JSON (string queue keys) for every queue, from earliest/latest/explicit JSON."""
    out: dict[str, dict[str, int]] = {}
    for topic, queues in bounds.items():
        out[topic] = {}
        for queue_id, (low, high, _broker) in queues.items():
            if spec == "earliest":
                value = low
            elif spec == "latest":
                value = high
            else:
                value = spec.get(topic, {}).get(queue_id, low if which == "start" else high)
                option = "startingOffsets" if which == "start" else "endingOffsets"
                if value == KAFKA_LATEST:
                    value = high
                elif value == KAFKA_EARLIEST:
                    if which != "start":
                        raise OptionError(f"option '{option}': -2 (earliest) is not allowed as an ending offset "
                                          f"({topic}/{queue_id}), as in Kafka")
                    value = low
                elif value < 0:
                    raise OptionError(f"option '{option}': offset {value} of {topic}/{queue_id} is negative "
                                      f"(only -2 = earliest and -1 = latest are, as in Kafka)")
                elif value < low:
                    if fail_on_data_loss:
                        raise OptionError(f"{which} offset {value} of {topic}/{queue_id} is no longer available "
                                          f"(the queue starts at {low}); set failOnDataLoss=false to skip ahead")
                    value = low
            out[topic][str(queue_id)] = value
    return out


def _brokers(bounds: dict[str, dict[int, broker_io.QueueBounds]]) -> dict[tuple[str, str], str]:
    """{(topic, queue id as in offsets JSON): the name of the broker holding the queue}."""
    return {(topic, str(q)): b.broker_name for topic, queues in bounds.items() for q, b in queues.items()}


def _partitions(start: dict, end: dict, brokers: dict[tuple[str, str], str]) -> list[QueueRange]:
    parts = []
    for topic, queues in end.items():
        for queue_id, stop in queues.items():
            begin = start.get(topic, {}).get(queue_id, 0)
            if stop > begin:
                parts.append(QueueRange(topic, brokers[(topic, str(queue_id))], int(queue_id), begin, stop))
    return parts


class HalfmqDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "halfmq"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> "HalfmqBatchReader":
        return HalfmqBatchReader(parse_options(self.options, SOURCE_OPTIONS, 'source'))

    def streamReader(self, schema) -> "HalfmqStreamReader":
        return HalfmqStreamReader(parse_options(self.options, SOURCE_OPTIONS, 'source'))

    def writer(self, schema, overwrite: bool) -> HalfmqWriter:
        return HalfmqWriter(parse_options(self.options, SINK_OPTIONS, 'sink'))

    def streamWriter(self, schema, overwrite: bool) -> HalfmqStreamWriter:
        return HalfmqStreamWriter(parse_options(self.options, SINK_OPTIONS, 'sink'))


class _Reading:
    def __init__(self, options: dict[str, str]):
        self.options = options
        self.namesrv = namesrv_option(options)
        self.topics = _topics(options)
        self.tags = options.get("tags", "*") or "*"
        self.fail_on_data_loss = options.get("failondataloss", "true").lower() != "false"

    def read(self, partition: QueueRange):
        if not isinstance(partition, QueueRange):  # Spark's placeholder when partitions() is empty
            return
        yield from broker_io.read_range(self.namesrv, partition.topic, partition.broker_name, partition.queue_id,
                                        partition.start, partition.end, self.tags)


class HalfmqBatchReader(_Reading, DataSourceReader):
    def partitions(self):
        bounds = broker_io.queue_bounds(self.namesrv, self.topics)
        start = _resolve(broker_io.parse_offsets(self.options.get("startingoffsets"), "earliest"), bounds, "start",
                         self.fail_on_data_loss)
        end = _resolve(broker_io.parse_offsets(self.options.get("endingoffsets"), "latest"), bounds, "end", False)
        return _partitions(start, end, _brokers(bounds))


class HalfmqStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are JSON {"topic": {"queueId": next offset}}; one partition per queue with new data.
    With trigger(availableNow=True) the query stops at the offsets that were the latest when it started."""

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        self.target: dict | None = None
        self.brokers: dict[tuple[str, str], str] = {}
        text = options.get("maxoffsetspertrigger")
        try:
            self.max_per_trigger = int(text) if text else None
        except ValueError:
            raise OptionError(f"option 'maxOffsetsPerTrigger' is not an integer: {text!r}") from None

    def _bounds(self):
        bounds = broker_io.queue_bounds(self.namesrv, self.topics)
        self.brokers.update(_brokers(bounds))
        return bounds

    def initialOffset(self) -> dict:
        return _resolve(broker_io.parse_offsets(self.options.get("startingoffsets"), "latest"), self._bounds(),
                        "start", self.fail_on_data_loss)

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = _resolve("latest", self._bounds(), "end", False)

    def latestOffset(self, start: dict, limit) -> dict:
        latest = self.target if self.target is not None else _resolve("latest", self._bounds(), "end", False)
        if not isinstance(limit, ReadMaxRows):
            return latest
        budget = limit.max_rows
        capped: dict[str, dict[str, int]] = {t: dict(q) for t, q in start.items()}
        # Fill queues round robin so one busy queue cannot starve the others.
        pending = [(t, q, start.get(t, {}).get(q, 0), hi) for t, qs in latest.items() for q, hi in qs.items()]
        while budget > 0 and pending:
            share = max(1, budget // len(pending))
            still = []
            for topic, queue, pos, high in pending:
                take = min(share, high - pos, budget)
                if take > 0:
                    pos += take
                    budget -= take
                capped.setdefault(topic, {})[queue] = pos
                if pos < high:
                    still.append((topic, queue, pos, high))
            pending = still
        for topic, queues in latest.items():  # new queues appear at their start
            for queue in queues:
                capped.setdefault(topic, {}).setdefault(queue, start.get(topic, {}).get(queue, 0))
        return capped

    def partitions(self, start: dict, end: dict):
        # After a restart Spark may plan the batch it was running from its checkpoint before asking for offsets.
        if any((t, str(q)) not in self.brokers for t, qs in end.items() for q in qs):
            self._bounds()
        return _partitions(start, end, self.brokers)

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in Spark's checkpoint."""


__all__ = ["HalfmqDataSource", "SCHEMA", "OptionError"]
