"""The sink's rules for rows and options (issue 12, item 4): the topic option beats the column, a queue_id column is
honoured, a source row's properties map can be written back, and bad values are refused by name."""
from __future__ import annotations

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from halfmq.client import BlockingProducer, Message
from halfmq.pipeline.sink_io import IDEMPOTENCY_KEY

from .test_sink_crash import stored


def write(df, broker, **options):
    writer = df.write.format("halfmq").option("namesrv", broker.namesrv_addr).mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def rows(spark, count: int, **columns):
    df = spark.range(0, count, numPartitions=2).withColumn("body", F.col("id").cast("string").cast("binary"))
    for name, column in columns.items():
        df = df.withColumn(name, column)
    return df.drop("id")


def test_the_topic_option_beats_the_topic_column(spark, live_broker):
    write(rows(spark, 10, topic=F.lit("ColumnT")), live_broker, topic="OptionT")
    assert sorted(int(r.body) for _q, r in stored(live_broker, "OptionT")) == list(range(10))
    assert stored(live_broker, "ColumnT") == []
    write(rows(spark, 4, topic=F.lit("ColumnT")), live_broker)  # no option: the column says where
    assert len(stored(live_broker, "ColumnT")) == 4


def test_an_empty_write_publishes_nothing_and_asks_for_no_column(spark, live_broker):
    """No rows, nothing to route: an empty write succeeds even without a topic (Spark may still hand the task an
    empty record batch, whose schema lacks the column)."""
    write(rows(spark, 0), live_broker)
    write(rows(spark, 10).filter("body IS NULL"), live_broker)  # partitions that had rows, none left
    write(rows(spark, 0), live_broker, topic="EmptyT")
    assert stored(live_broker, "EmptyT") == []


def test_a_queue_id_column_is_honoured(spark, live_broker):
    write(rows(spark, 20, queue_id=(F.col("id") % 2 + 1).cast("int")), live_broker, topic="QueueT")
    placed = stored(live_broker, "QueueT")
    assert sorted(int(r.body) for _q, r in placed) == list(range(20))
    assert all(queue_id == int(r.body) % 2 + 1 for queue_id, r in placed)
    with pytest.raises(PySparkException, match="column 'queue_id': topic QueueT has no writable queue 99"):
        write(rows(spark, 2, queue_id=F.lit(99)), live_broker, topic="QueueT")
    assert len(stored(live_broker, "QueueT")) == 20  # the failed job published nothing


def test_a_source_rows_properties_can_be_written_back(spark, live_broker):
    with BlockingProducer("PG_PROPS", live_broker.namesrv_addr) as producer:
        for i in range(6):
            producer.send(Message("PropsIn", f"{i}".encode(), tags="t", keys=f"k{i}", properties={"i": str(i)}))
    source = spark.read.format("halfmq").option("namesrv", live_broker.namesrv_addr).option("subscribe", "PropsIn")
    copied = source.load().select("body", "properties", "tags", "keys")
    assert any("UNIQ_KEY" in r.properties for r in copied.collect())  # the source hands reserved names over
    write(copied, live_broker, topic="PropsOut")
    out = [r for _q, r in stored(live_broker, "PropsOut")]
    assert sorted(int(r.body) for r in out) == list(range(6))
    for record in out:
        props = record.properties
        assert props["i"] == record.body.decode() and props["KEYS"] == f"k{props['i']}" and props["TAGS"] == "t"
        assert props[IDEMPOTENCY_KEY].endswith(tuple(f":{n}" for n in range(6)))


def test_bad_sink_options_are_refused_by_name(spark, live_broker):
    with pytest.raises(PySparkException, match="checkImmunitySeconds"):
        write(rows(spark, 1), live_broker, topic="T", checkImmunitySeconds="soon")
    with pytest.raises(PySparkException, match="sinkId"):
        write(rows(spark, 1), live_broker, topic="T", sinkId="has space")
    for bad in ("0", "10001", "many"):
        with pytest.raises(PySparkException, match="rowsPerHalf"):
            write(rows(spark, 1), live_broker, topic="T", rowsPerHalf=bad)


def test_rows_go_in_batch_halves_of_rows_per_half(spark, live_broker):
    write(rows(spark, 10), live_broker, topic="PerHalfT", rowsPerHalf="3")  # 2 partitions of 5 rows
    halves = [s for _o, s in live_broker.store.iter_halves() if s.topic == "PerHalfT"]
    assert sorted(s.batch for s in halves) == [2, 2, 3, 3] and all(s.status.value == "COMMITTED" for s in halves)
    assert sorted(int(r.body) for _q, r in stored(live_broker, "PerHalfT")) == list(range(10))


def test_halves_carry_the_check_immunity_option(spark, live_broker):
    write(rows(spark, 3), live_broker, topic="ImmunityT", checkImmunitySeconds="77")
    out = stored(live_broker, "ImmunityT")
    assert len(out) == 3 and all(r.properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] == "77" for _q, r in out)
    write(rows(spark, 1), live_broker, topic="ImmunityDefaultT")
    (_q, record), = stored(live_broker, "ImmunityDefaultT")
    assert record.properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] == "300"
