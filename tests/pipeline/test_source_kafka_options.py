"""spark-sql-kafka's source options against a real broker (issue 12): minPartitions, subscribePattern, assign,
timestamps, min/max offsets per trigger, failOnDataLoss on every batch, lag in the query progress."""
from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime

import pytest
from pyspark.errors import PySparkException

from halfmq.client import BlockingProducer, Message
from halfmq.client.admin import Admin
from tests.pipeline.test_spark import fill, read
from tests.support.broker_thread import BrokerThread


@pytest.fixture
def broker_thread(tmp_path):
    bt = BrokerThread(tmp_path / "store")
    yield bt
    bt.stop()


def source(spark, broker, **options):
    reader = spark.readStream.format("halfmq").option("namesrv", broker.namesrv_addr)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def stream(spark, broker, name, **options):
    """A stream into a memory table ``name``, every 50 ms; stopped by the caller."""
    return (source(spark, broker, **options).writeStream.format("memory").queryName(name)
            .trigger(processingTime="50 milliseconds").start())


def rows_read(query):
    """Rows the query's batches read (its recent progress: no Spark job)."""
    return sum(p["numInputRows"] for p in query.recentProgress)


def bodies(spark, table):
    return sorted(r.body.decode() for r in spark.table(table).select("body").collect())


def wait_until(condition, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # a poll of Spark's state, not a synchronisation: the condition decides


def send(broker, topic, texts):
    with BlockingProducer("PG_KOPT", broker.namesrv_addr) as producer:
        for text in texts:
            producer.send(Message(topic, text.encode()))


def test_min_partitions_splits_queues(spark, live_broker):
    fill(live_broker, "SplitT", 40)
    df = read(spark, live_broker, subscribe="SplitT", minPartitions="8")
    assert df.rdd.getNumPartitions() == 8  # 4 queues of 10 messages, each in 2 ranges
    assert sorted(r.body for r in df.collect()) == sorted(f"m{i}".encode() for i in range(40))
    assert read(spark, live_broker, subscribe="SplitT").rdd.getNumPartitions() == 4  # one per queue by default


def test_subscribe_pattern_reads_matching_topics_and_picks_up_new_ones(spark, live_broker):
    send(live_broker, "PatA1", ["a1"])
    send(live_broker, "PatA2", ["a2"])
    send(live_broker, "PatB", ["b"])
    assert sorted(r.body for r in read(spark, live_broker, subscribePattern="PatA.*").collect()) == [b"a1", b"a2"]
    query = stream(spark, live_broker, "pattern_stream", subscribePattern="PatA.*", startingOffsets="earliest")
    try:
        query.processAllAvailable()
        assert bodies(spark, "pattern_stream") == ["a1", "a2"]
        send(live_broker, "PatA3", ["a3"])  # a topic created after the query started
        send(live_broker, "PatB", ["b2"])
        wait_until(lambda: "a3" in bodies(spark, "pattern_stream"), what="the new topic's message")
        assert bodies(spark, "pattern_stream") == ["a1", "a2", "a3"]
    finally:
        query.stop()


def test_assign_reads_only_the_listed_queues(spark, live_broker):
    fill(live_broker, "AssignT", 16)
    rows = read(spark, live_broker, assign=json.dumps({"AssignT": [0, 2]})).collect()
    assert {r.queue_id for r in rows} == {0, 2} and len(rows) == 8
    with pytest.raises(PySparkException, match=r"assign.*no queue \[9\]"):
        read(spark, live_broker, assign=json.dumps({"AssignT": [0, 9]})).collect()


def test_timestamps_start_and_end_reads(spark, live_broker, tmp_path):
    send(live_broker, "TsT", [f"old{i}" for i in range(6)])
    stored = [r.store_timestamp for r in read(spark, live_broker, subscribe="TsT").collect()]
    split = int(max(stored).timestamp() * 1000) + 1
    wait_until(lambda: time.time() * 1000 > split + 1, what="the clock to pass the split")
    send(live_broker, "TsT", [f"new{i}" for i in range(4)])
    new = [f"new{i}" for i in range(4)]
    old = [f"old{i}" for i in range(6)]

    def texts(**options):
        return sorted(r.body.decode() for r in read(spark, live_broker, subscribe="TsT", **options).collect())

    assert texts(startingTimestamp=str(split)) == new
    assert texts(endingTimestamp=str(split)) == old
    every_queue = json.dumps({"TsT": {str(q): split for q in range(4)}})
    assert texts(startingOffsetsByTimestamp=every_queue) == new
    assert texts(endingOffsetsByTimestamp=every_queue) == old
    # a global timestamp wins over the offsets; a time after every message starts at the end
    assert texts(startingTimestamp=str(split), startingOffsets="earliest") == new
    assert texts(startingTimestamp=str(int(time.time() * 1000) + 3_600_000)) == []
    query = stream(spark, live_broker, "ts_stream", subscribe="TsT", startingTimestamp=str(split))
    try:
        query.processAllAvailable()
        assert bodies(spark, "ts_stream") == new
    finally:
        query.stop()


def test_min_offsets_per_trigger_waits_for_enough_messages_or_max_trigger_delay(spark, live_broker):
    # Idle triggers report their progress every second (not every 10 s), so the test sees the source waiting sooner.
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "1s")
    send(live_broker, "MinT", ["x0", "x1"])
    query = stream(spark, live_broker, "min_stream", subscribe="MinT", startingOffsets="earliest",
                   minOffsetsPerTrigger="5", maxTriggerDelay="1h")
    try:
        wait_until(lambda: rows_read(query) == 2, what="the first batch (Kafka: never delayed)")
        send(live_broker, "MinT", ["x2", "x3", "x4"])  # 3 < 5 waiting: no batch for an hour

        def seen_waiting():  # the source saw the 3 new messages (its latest offset) and planned no batch
            progress = query.lastProgress
            return progress and sum(v for q in json.loads(progress["sources"][0]["latestOffset"] or "{}")
                                    .values() for v in q.values()) == 5
        wait_until(seen_waiting, what="a trigger that saw the waiting messages")
        assert rows_read(query) == 2
        send(live_broker, "MinT", ["x5", "x6"])  # 5 waiting
        wait_until(lambda: rows_read(query) == 7, what="the batch of 5")
        assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [2, 5]
    finally:
        query.stop()
    send(live_broker, "MinDelayT", ["y0"])
    query = stream(spark, live_broker, "delay_stream", subscribe="MinDelayT", startingOffsets="earliest",
                   minOffsetsPerTrigger="100", maxTriggerDelay="3s")
    try:
        wait_until(lambda: rows_read(query) == 1, what="the first batch")
        send(live_broker, "MinDelayT", ["y1"])  # 1 < 100: it waits for maxTriggerDelay after the first, then goes
        wait_until(lambda: rows_read(query) == 2, what="the delayed batch")
        first, second = (datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00"))
                         for p in query.recentProgress if p["numInputRows"])
        assert (second - first).total_seconds() >= 2.9
    finally:
        query.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")


def test_query_progress_shows_the_latest_offsets_so_the_lag(spark, live_broker, tmp_path):
    fill(live_broker, "LagT", 20)
    query = (spark.readStream.format("halfmq").option("namesrv", live_broker.namesrv_addr)
             .option("subscribe", "LagT").option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "8")
             .load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    first = next(p for p in query.recentProgress if p["numInputRows"])["sources"][0]

    def total(offsets):
        return sum(v for queues in json.loads(offsets).values() for v in queues.values())
    assert total(first["latestOffset"]) == 20 and total(first["endOffset"]) == 8  # 12 behind after batch 1


def test_poll_timeout_is_accepted(spark, live_broker):
    fill(live_broker, "PollT", 4)
    assert read(spark, live_broker, subscribe="PollT", **{"kafkaConsumer.pollTimeoutMs": "5000"}).count() == 4


def delete_topic(broker, topic):
    async def run():
        async with Admin(broker.namesrv_addr) as admin:
            await admin.delete_topic(topic)
    asyncio.run(run())


def delete_below(bt, topic, offsets):
    """What retention does once it deleted a queue's first messages: the queue now starts later."""
    async def run():
        bt.broker.store.advance_minimums({(topic, q): o for q, o in offsets.items()})
    bt.call(run())


def per_queue_max(broker, topic):
    return {q: broker.store.max_offset(topic, q) for q in range(4)}


@pytest.mark.parametrize("fail", [True, False])
def test_data_deleted_below_a_streams_position_is_checked_on_every_batch(spark, broker_thread, tmp_path, fail):
    broker = broker_thread.broker
    send(broker, "LossT", [f"a{i}" for i in range(8)])
    out = tmp_path / "out"

    def start():  # to parquet, which a restarted query goes on writing (the memory sink cannot restart)
        return (source(spark, broker, subscribe="LossT", startingOffsets="earliest", failOnDataLoss=str(fail).lower())
                .writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="50 milliseconds")
                .start())

    def written():
        return sorted(r.body.decode() for r in spark.read.parquet(str(out)).collect())

    query = start()
    query.processAllAvailable()
    query.stop()  # so the b messages cannot be read before they are deleted
    assert len(written()) == 8
    send(broker, "LossT", [f"b{i}" for i in range(8)])
    before = per_queue_max(broker, "LossT")
    send(broker, "LossT", [f"c{i}" for i in range(8)])
    delete_below(broker_thread, "LossT", before)  # every b message is deleted before the next batch
    query = start()  # from the checkpoint: its next batch starts at the b messages
    try:
        if fail:
            with pytest.raises(Exception, match=r"LossT/broker-a:\d offsets \d+\.\.\d+ were deleted before they were "
                                                r"read"):
                query.processAllAvailable()
        else:
            query.processAllAvailable()
            assert written() == sorted([f"a{i}" for i in range(8)] + [f"c{i}" for i in range(8)])
            assert query.exception() is None
    finally:
        query.stop()


@pytest.mark.parametrize("fail", [True, False])
def test_a_deleted_topic(spark, live_broker, fail):
    send(live_broker, "GoneT", ["g0"])
    send(live_broker, "StayT", ["s0"])
    name = f"gone_{fail}"
    query = stream(spark, live_broker, name, subscribe="GoneT,StayT", startingOffsets="earliest",
                   failOnDataLoss=str(fail).lower())
    try:
        query.processAllAvailable()
        assert bodies(spark, name) == ["g0", "s0"]
        delete_topic(live_broker, "GoneT")
        send(live_broker, "StayT", ["s1"])
        if fail:
            with pytest.raises(Exception, match="GoneT"):
                query.processAllAvailable()
        else:  # the query goes on with the topics left
            query.processAllAvailable()
            assert bodies(spark, name) == ["g0", "s0", "s1"] and query.isActive
    finally:
        query.stop()


def test_a_batch_starting_below_the_queues_start(spark, broker_thread):
    broker = broker_thread.broker
    fill(broker, "TaskLossT", 8)
    delete_below(broker_thread, "TaskLossT", {q: 1 for q in range(4)})
    start = json.dumps({"TaskLossT": {str(q): 0 for q in range(4)}})
    with pytest.raises(PySparkException, match="no longer available"):
        read(spark, broker, subscribe="TaskLossT", startingOffsets=start).collect()
    assert read(spark, broker, subscribe="TaskLossT", startingOffsets=start, failOnDataLoss="false").count() == 4
