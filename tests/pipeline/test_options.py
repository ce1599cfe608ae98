"""Source and sink options as spark-sql-kafka users expect them (issue 12): empty ranges, unknown options,
Kafka's -2/-1 JSON offsets, any broker name."""
from __future__ import annotations

import json

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from tests.pipeline.test_spark import fill, read, stream_to_parquet
from tests.support.broker_thread import BrokerThread


def test_empty_range_reads_no_rows(spark, live_broker):
    fill(live_broker, "EmptyT", 6)
    assert read(spark, live_broker, subscribe="EmptyT", startingOffsets="latest").count() == 0
    everything = json.dumps({"EmptyT": {str(q): 0 for q in range(4)}})
    assert read(spark, live_broker, subscribe="EmptyT", endingOffsets=everything).count() == 0
    assert read(spark, live_broker, subscribe="EmptyT").count() == 6


def test_unknown_source_option_is_refused_and_supported_ones_listed(spark, live_broker):
    fill(live_broker, "OptT", 2)
    with pytest.raises(PySparkException, match="includeheaders|includeHeaders") as err:
        read(spark, live_broker, subscribe="OptT", includeHeaders="true").collect()
    for name in ("namesrv", "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets",
                 "startingOffsetsByTimestamp", "endingOffsetsByTimestamp", "startingTimestamp", "endingTimestamp",
                 "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions",
                 "failOnDataLoss", "kafkaConsumer.pollTimeoutMs", "tags"):
        assert name in str(err.value)
    with pytest.raises(PySparkException, match="kafka.bootstrap.servers"):
        (spark.readStream.format("halfmq").option("namesrv", live_broker.namesrv_addr).option("subscribe", "OptT")
         .option("kafka.bootstrap.servers", "x:1").load().writeStream.format("noop").start().awaitTermination(60))
    # every option supported before is still accepted, in any case (a batch ignores the trigger options)
    assert read(spark, live_broker, subscribe="OptT", STARTINGOFFSETS="earliest", endingOffsets="latest",
                failOnDataLoss="true", tags="*", maxOffsetsPerTrigger="10").count() == 2


def test_unknown_sink_option_is_refused_and_supported_ones_listed(spark, live_broker):
    df = spark.range(0, 3).select(F.col("id").cast("string").cast("binary").alias("body"))
    def writer():  # a DataFrameWriter keeps the options set on it: a fresh one per write
        return df.write.format("halfmq").option("namesrv", live_broker.namesrv_addr).mode("append")

    with pytest.raises(PySparkException, match="subscribe") as err:  # a source option is not a sink option
        writer().option("topic", "SinkOptT").option("subscribe", "SinkOptT").save()
    for name in ("namesrv", "topic", "producerGroup", "sinkId", "checkImmunitySeconds"):
        assert name in str(err.value)
    with pytest.raises(PySparkException, match="kafka.bootstrap.servers"):
        writer().option("topic", "SinkOptT").option("kafka.bootstrap.servers", "x:1").save()
    writer().option("topic", "SinkOptT").option("producerGroup", "PG_OPT").option("sinkId", "s") \
        .option("checkImmunitySeconds", "60").save()
    assert read(spark, live_broker, subscribe="SinkOptT").count() == 3


def test_kafka_json_offsets_minus_two_earliest_minus_one_latest(spark, live_broker):
    fill(live_broker, "KOffT", 12)
    per_queue: dict[int, int] = {}
    for row in read(spark, live_broker, subscribe="KOffT").collect():
        per_queue[row.queue_id] = per_queue.get(row.queue_id, 0) + 1
    assert len(per_queue) >= 2 and sum(per_queue.values()) == 12
    queues = sorted(per_queue)
    starting = json.dumps({"KOffT": {str(q): (-2 if i % 2 == 0 else -1) for i, q in enumerate(queues)}})
    expected = sum(per_queue[q] for i, q in enumerate(queues) if i % 2 == 0)
    assert read(spark, live_broker, subscribe="KOffT", startingOffsets=starting).count() == expected
    ending = json.dumps({"KOffT": {str(q): -1 for q in queues}})
    assert read(spark, live_broker, subscribe="KOffT", endingOffsets=ending).count() == 12
    # Kafka: -2 (earliest) is not allowed as an ending offset
    with pytest.raises(PySparkException, match="endingOffsets"):
        read(spark, live_broker, subscribe="KOffT",
             endingOffsets=json.dumps({"KOffT": {str(queues[0]): -2}})).collect()


@pytest.fixture
def named_broker(tmp_path):
    bt = BrokerThread(tmp_path / "store", brokerName="broker-z")
    yield bt.broker
    bt.stop()


def test_any_broker_name(spark, named_broker, tmp_path):
    fill(named_broker, "NamedT", 10)
    assert sorted(r.body for r in read(spark, named_broker, subscribe="NamedT").collect()) == sorted(
        f"m{i}".encode() for i in range(10))
    out = tmp_path / "out"
    stream_to_parquet(spark, named_broker, out, tmp_path / "checkpoint", subscribe="NamedT")
    assert spark.read.parquet(str(out)).count() == 10
    df = spark.range(0, 5, numPartitions=2).select(F.col("id").cast("string").cast("binary").alias("body"))
    df.write.format("halfmq").option("namesrv", named_broker.namesrv_addr).option("topic", "NamedSink") \
        .mode("append").save()
    assert sorted(int(r.body) for r in read(spark, named_broker, subscribe="NamedSink").collect()) == list(range(5))
