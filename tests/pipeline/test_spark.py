"""The "halfmq" Spark source and sink against a real broker: batch, streaming, limits, transactions, audit."""
from __future__ import annotations

import asyncio
import json

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from halfmq.client import (BlockingProducer, LocalTransactionState, Message, MessageQueue, PullConsumer,
                           TransactionProducer)

S = LocalTransactionState


def fill(broker, topic: str, count: int, start: int = 0) -> None:
    with BlockingProducer("PG_SPARK", broker.namesrv_addr) as producer:
        for i in range(start, start + count):
            producer.send(Message(topic, f"m{i}".encode(), tags="even" if i % 2 == 0 else "odd", keys=f"k{i}",
                                  properties={"i": str(i)}))


def read(spark, broker, **options):
    reader = spark.read.format("halfmq").option("namesrv", broker.namesrv_addr)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_all_fields_offsets_and_tags(spark, live_broker):
    fill(live_broker, "SparkT", 20)
    rows = read(spark, live_broker, subscribe="SparkT").collect()
    assert sorted(r.body for r in rows) == sorted(f"m{i}".encode() for i in range(20))
    row = next(r for r in rows if r.body == b"m3")
    assert (row.topic, row.tags, row.keys, row.properties["i"]) == ("SparkT", "odd", "k3", "3")
    assert row.msg_id and row.store_timestamp is not None and row.born_timestamp is not None
    assert len({(r.queue_id, r.queue_offset) for r in rows}) == 20
    assert sorted(r.body for r in read(spark, live_broker, subscribe="SparkT", tags="even").collect()) == sorted(
        f"m{i}".encode() for i in range(0, 20, 2))
    ending = json.dumps({"SparkT": {"0": 1, "1": 1, "2": 1, "3": 1}})
    assert read(spark, live_broker, subscribe="SparkT", endingOffsets=ending).count() == 4
    starting = json.dumps({"SparkT": {"0": 1, "1": 1, "2": 1, "3": 1}})
    assert read(spark, live_broker, subscribe="SparkT", startingOffsets=starting).count() == 16


def test_missing_options_are_named(spark, live_broker):
    with pytest.raises(PySparkException, match="subscribe"):
        spark.read.format("halfmq").option("namesrv", live_broker.namesrv_addr).load().collect()


def stream_to_parquet(spark, broker, out, checkpoint, **options):
    reader = (spark.readStream.format("halfmq").option("namesrv", broker.namesrv_addr)
              .option("startingOffsets", "earliest"))
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(120)
    return query


def test_stream_available_now_restarts_from_checkpoint(spark, live_broker, tmp_path):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    fill(live_broker, "StreamT", 12)
    stream_to_parquet(spark, live_broker, out, checkpoint, subscribe="StreamT")
    assert spark.read.parquet(str(out)).count() == 12
    fill(live_broker, "StreamT", 8, start=12)
    stream_to_parquet(spark, live_broker, out, checkpoint, subscribe="StreamT")
    bodies = [r.body for r in spark.read.parquet(str(out)).select("body").collect()]
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(20))  # no loss, no duplicates


def test_stream_read_limit(spark, live_broker, tmp_path):
    fill(live_broker, "LimitT", 20)
    query = stream_to_parquet(spark, live_broker, tmp_path / "o", tmp_path / "c", subscribe="LimitT",
                              maxOffsetsPerTrigger="6")
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(batches) == 20 and max(batches) <= 6 and len(batches) >= 4


class Plan:
    def __init__(self, local):
        self.local = local

    async def execute_local_transaction(self, msg, arg):
        return self.local[msg.keys]

    async def check_local_transaction(self, msg):
        return S.UNKNOW


def test_stream_never_outputs_rolled_back_or_pending_halves(spark, live_broker, tmp_path):
    async def send():
        plan = Plan({"c": S.COMMIT_MESSAGE, "r": S.ROLLBACK_MESSAGE, "p": S.UNKNOW})
        async with TransactionProducer("TX_SPARK", plan, live_broker.namesrv_addr) as producer:
            for key in "crp":
                await producer.send_message_in_transaction(Message("TxStream", key.encode(), keys=key))
            # a barrier: the oneway decisions above are durable once this two-way write is answered
            async with PullConsumer("BARRIER", live_broker.namesrv_addr) as c:
                await c.update_offset(MessageQueue("TxStream", "broker-a", 0), 0)

    asyncio.run(send())
    fill(live_broker, "TxStream", 3)
    out = tmp_path / "o"
    stream_to_parquet(spark, live_broker, out, tmp_path / "c", subscribe="TxStream")
    bodies = sorted(r.body for r in spark.read.parquet(str(out)).collect())
    assert bodies == sorted([b"c", b"m0", b"m1", b"m2"])


def test_sink_commits_everything_or_nothing(spark, live_broker):
    df = spark.range(0, 30, numPartitions=3).select(
        F.lit("SinkT").alias("topic"), F.col("id").cast("string").cast("binary").alias("body"),
        F.concat(F.lit("k"), F.col("id")).alias("keys"), F.lit("t").alias("tags"))
    df.write.format("halfmq").option("namesrv", live_broker.namesrv_addr).mode("append").save()
    rows = read(spark, live_broker, subscribe="SinkT").collect()
    assert sorted(int(r.body) for r in rows) == list(range(30))
    # The idempotency key names a row: one per row, and a second job's rows get keys of their own.
    df.write.format("halfmq").option("namesrv", live_broker.namesrv_addr).mode("append").save()
    rows = read(spark, live_broker, subscribe="SinkT").collect()
    assert len(rows) == 60 and len({r.properties["HALFMQ_IDEMPOTENCY_KEY"] for r in rows}) == 60

    @F.udf("binary")
    def explode_on_29(value):
        if value == 29:
            raise ValueError("task failure")
        return str(value).encode()

    failing = spark.range(0, 30, numPartitions=3).select(F.lit("SinkFail").alias("topic"),
                                                         explode_on_29(F.col("id")).alias("body"))
    with pytest.raises(PySparkException, match="task failure"):
        failing.write.format("halfmq").option("namesrv", live_broker.namesrv_addr).mode("append").save()
    halves = [s for _o, s in live_broker.store.iter_halves() if s.topic == "SinkFail"]
    assert halves and all(s.status.value != "COMMITTED" for s in halves)  # the failed job published nothing
    assert sum(live_broker.store.max_offset("SinkFail", q) for q in range(8)) == 0


def test_transaction_audit_job(spark, live_broker, tmp_path):
    from halfmq.pipeline.jobs.transaction_audit import audit

    async def send():
        plan = Plan({"c1": S.COMMIT_MESSAGE, "c2": S.COMMIT_MESSAGE, "r": S.ROLLBACK_MESSAGE, "p": S.UNKNOW})
        async with TransactionProducer("TX_AUDIT", plan, live_broker.namesrv_addr) as producer:
            for key in ("c1", "c2", "r", "p"):
                await producer.send_message_in_transaction(Message("AuditT", key.encode(), keys=key))
            half = await producer.send_half_batch([Message("AuditT", b"b%d" % i) for i in range(3)])
            await producer.decide(half.queue, half.queue_offset, half.offset_msg_id, half.msg_id, S.COMMIT_MESSAGE)
            async with PullConsumer("BARRIER", live_broker.namesrv_addr) as c:
                await c.update_offset(MessageQueue("AuditT", "broker-a", 0), 0)

    asyncio.run(send())
    report = audit(spark, live_broker.namesrv_addr)
    report.write.mode("overwrite").parquet(str(tmp_path / "audit"))
    (row,) = spark.read.parquet(str(tmp_path / "audit")).filter("producerGroup = 'TX_AUDIT'").collect()
    assert (row.topic, row.committed, row.rolled_back, row.discarded, row.pending) == ("AuditT", 3, 1, 0, 1)
    assert row.committed_messages == 5  # the batch half's 3 messages and 2 single ones
    assert row.decision_p50_ms is not None and row.check_backs == 0
