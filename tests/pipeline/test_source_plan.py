"""The source's planning without Spark or a broker (issue 12): option parsing, minPartitions splits, and the
data-loss rules applied to queue bounds before every stream batch."""
from __future__ import annotations

import pytest

from halfmq.pipeline.broker_io import DataLossError, QueueBounds
from halfmq.pipeline.options import OptionError
from halfmq.pipeline.source import HalfmqStreamReader, QueueRange, _split
from halfmq.pipeline.source_options import duration_ms, source_options

BASE = {"namesrv": "127.0.0.1:1"}


def opts(streaming=False, **given):
    return source_options({**BASE, **{k.lower(): v for k, v in given.items()}}, streaming)


def test_exactly_one_of_subscribe_subscribe_pattern_assign():
    with pytest.raises(OptionError, match="subscribe.*subscribePattern.*assign.*none"):
        opts()
    with pytest.raises(OptionError, match="'subscribe', 'assign'"):
        opts(subscribe="T", assign='{"T": [0]}')
    assert opts(subscribePattern="Orders.*").pattern.fullmatch("Orders-eu")
    assert opts(assign='{"T": [2, 0, 2]}').assign == {"T": ("0", "2")}
    assert opts(assign='{"T": ["b:1", 0, "a:01"]}').assign == {"T": ("0", "a:1", "b:1")}


@pytest.mark.parametrize("name, value, message", [
    ("subscribePattern", "(", "subscribePattern"),
    ("assign", '{"T": "0"}', "assign"),
    ("assign", '{"T": [-1]}', "assign"),
    ("assign", '{"T": ["b:x"]}', "assign"),
    ("startingOffsets", '{"T": {":0": 1}}', "startingOffsets"),
    ("assign", '{"T": []}', "assign"),
    ("startingOffsetsByTimestamp", '{"T": {"0": "x"}}', "startingOffsetsByTimestamp"),
    ("startingOffsetsByTimestamp", '{"T": {"0": -5}}', "startingOffsetsByTimestamp"),
    ("startingTimestamp", "yesterday", "startingTimestamp"),
    ("endingOffsets", "earliest", "endingOffsets"),
    ("endingOffsets", '{"T": {"0": -2}}', "endingOffsets"),
    ("startingOffsets", '{"T": {"0": -3}}', "startingOffsets"),
    ("minPartitions", "0", "minPartitions"),
    ("failOnDataLoss", "maybe", "failOnDataLoss"),
    ("kafkaConsumer.pollTimeoutMs", "-1", "kafkaConsumer.pollTimeoutMs"),
])
def test_a_malformed_value_is_refused_naming_its_option(name, value, message):
    with pytest.raises(OptionError, match=message):
        opts(subscribe="T", **{name: value})


def test_ending_options_are_for_batch_reads_only():
    for name in ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"):
        with pytest.raises(OptionError, match=f"{name}.*batch reads only"):
            opts(True, subscribe="T", **{name: "latest" if name == "endingOffsets" else "5"})
    with pytest.raises(OptionError, match="maxTriggerDelay.*minOffsetsPerTrigger"):
        opts(True, subscribe="T", maxTriggerDelay="5s")
    with pytest.raises(OptionError, match="maxTriggerDelay"):
        opts(True, subscribe="T", minOffsetsPerTrigger="5", maxTriggerDelay="soon")


def test_durations_as_spark_reads_them():
    assert [duration_ms(t, "x") for t in ("15m", "30s", "500ms", "500", "2h", "1d", "3min")] == [
        900_000, 30_000, 500, 500, 7_200_000, 86_400_000, 180_000]
    assert opts(True, subscribe="T", minOffsetsPerTrigger="5").max_trigger_delay_ms == 900_000  # Kafka's default
    assert opts(subscribe="T", **{"kafkaConsumer.pollTimeoutMs": "2500"}).poll_timeout_s == 2.5


def covered(ranges):
    return sorted((r.queue_id, o) for r in ranges for o in range(r.start, r.end))


def test_min_partitions_splits_queues_as_kafka_splits_partitions():
    ranges = [QueueRange("T", "b", q, 0, 100) for q in range(4)]
    assert _split(ranges, None) == ranges and _split(ranges, 4) == ranges and _split(ranges, 3) == ranges
    eight = _split(ranges, 8)
    assert len(eight) == 8 and {r.end - r.start for r in eight} == {50} and covered(eight) == covered(ranges)
    # Kafka: a small range stays whole; the others share the remaining partitions by size
    uneven = [QueueRange("T", "b", 0, 0, 1000), QueueRange("T", "b", 1, 10, 12)]
    parts = _split(uneven, 5)
    assert [(r.queue_id, r.end - r.start) for r in parts] == [(0, 250), (0, 250), (0, 250), (0, 250), (1, 2)]
    assert covered(parts) == covered(uneven)
    assert [(r.start, r.end) for r in _split([QueueRange("T", "b", 0, 5, 8)], 10)] == [(5, 6), (6, 7), (7, 8)]


class Planned(HalfmqStreamReader):
    """The stream reader's planning with the brokers' answer given (as queue_bounds would return it)."""

    def __init__(self, bounds, **given):
        super().__init__(opts(True, subscribe="T,U", **given))
        self.given = bounds

    def _bounds(self, first):
        return self.given


B = QueueBounds


def test_every_batch_fails_on_data_lost_since_the_last_one():
    reader = Planned({"T": {"b:0": B(0, 10)}, "U": {"b:0": B(0, 5)}})
    assert reader.latestOffset({"T": {"b:0": 4}, "U": {"b:0": 0}}, None) == {"T": {"b:0": 10}, "U": {"b:0": 5}}
    reader.given = {"T": {"b:0": B(6, 12)}, "U": {"b:0": B(0, 5)}}
    with pytest.raises(DataLossError, match=r"T/b:0 offsets 4\.\.5 were deleted"):
        reader.latestOffset({"T": {"b:0": 4}, "U": {"b:0": 0}}, None)
    reader.given = {"T": {"b:0": B(0, 3)}, "U": {"b:0": B(0, 5)}}
    with pytest.raises(DataLossError, match="T/b:0 went backwards from 10 to 3"):
        reader.latestOffset({"T": {"b:0": 10}, "U": {"b:0": 0}}, None)
    reader.given = {"T": {"b:0": B(0, 12)}}
    with pytest.raises(DataLossError, match="topic 'U' was deleted"):
        reader.latestOffset({"T": {"b:0": 10}, "U": {"b:0": 0}}, None)
    reader.given = {"T": {"b:0": B(0, 12), "b:1": B(3, 4)}, "U": {"b:0": B(0, 5)}}
    with pytest.raises(DataLossError, match="new queue T/b:1 starts at offset 3"):
        reader.latestOffset({"T": {"b:0": 10}, "U": {"b:0": 0}}, None)


def test_without_fail_on_data_loss_lost_data_is_skipped_and_the_query_goes_on():
    reader = Planned({"T": {"b:0": B(6, 12), "b:1": B(2, 4)}}, failOnDataLoss="false")
    start = {"T": {"b:0": 4}, "U": {"b:0": 3}}
    end = reader.latestOffset(start, None)
    assert end == {"T": {"b:0": 12, "b:1": 4}}  # U (deleted) dropped, the new queue T/b:1 read from its start
    assert sorted((r.queue_id, r.start, r.end) for r in reader.partitions(start, end)) == [(0, 4, 12), (1, 2, 4)]
    reader.given = {"T": {"b:0": B(0, 3), "b:1": B(2, 4)}}  # T/b:0 emptied and refilled
    start = end
    end = reader.latestOffset(start, None)
    assert end == {"T": {"b:0": 3, "b:1": 4}}
    assert [(r.queue_id, r.start, r.end) for r in reader.partitions(start, end)] == [(0, 0, 3)]


def test_queues_of_several_brokers_are_told_apart_by_broker():
    reader = Planned({"T": {"a:0": B(0, 10), "b:0": B(0, 7)}}, maxOffsetsPerTrigger="9")
    end = reader.latestOffset({"T": {"a:0": 2, "b:0": 0}}, None)
    assert end == {"T": {"a:0": 7, "b:0": 4}}  # queue 0 of each broker gets its share
    assert sorted((r.broker_name, r.queue_id, r.start, r.end) for r in reader.partitions({"T": {"a:0": 2}}, end)) \
        == [("a", 0, 2, 7), ("b", 0, 0, 4)]


def test_a_checkpoint_written_when_the_source_read_one_broker_goes_on():
    """Offsets of a checkpoint from before the source read several brokers name queues by id alone: on a topic of
    one broker they are its queues; where a topic has the id on several brokers they cannot be told apart."""
    reader = Planned({"T": {"b:0": B(0, 10), "b:1": B(0, 4)}})
    old = {"T": {"0": 6, "1": 4}}
    end = reader.latestOffset(old, None)
    assert end == {"T": {"b:0": 10, "b:1": 4}}
    assert [(r.broker_name, r.queue_id, r.start, r.end) for r in reader.partitions(old, end)] == [("b", 0, 6, 10)]
    # Spark may plan the batch it was running from the checkpoint, its end in the old form too.
    assert [(r.queue_id, r.start, r.end) for r in reader.partitions(old, {"T": {"0": 8, "1": 4}})] == [(0, 6, 8)]
    reader.given = {"T": {"a:0": B(0, 3), "b:0": B(0, 10), "b:1": B(0, 4)}}
    with pytest.raises(OptionError, match=r"checkpoint.*queue 0 of topic 'T' is on several brokers \(a:0, b:0\)"):
        reader.latestOffset(old, None)
