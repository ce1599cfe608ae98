"""The streaming sink's names (issue 12, item 1): with no option, a stream's sink id is its query id, which a
restart from the checkpoint keeps, so a replayed batch is recognised; each row's key names its batch."""
from __future__ import annotations

from halfmq.client import BlockingProducer, Message
from halfmq.pipeline.sink_io import IDEMPOTENCY_KEY, SINK_ATTEMPT, SINK_BATCH, SINK_ID, SINK_OWNER

from .test_sink_crash import stored


def run_stream(spark, broker, checkpoint):
    query = (spark.readStream.format("halfmq").option("namesrv", broker.namesrv_addr).option("subscribe", "SIn")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "4").load().select("body")
             .writeStream.format("halfmq").option("namesrv", broker.namesrv_addr).option("topic", "SOut")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(120)
    return query.id


def test_a_streams_rows_are_named_by_query_batch_partition_and_row(spark, live_broker, tmp_path):
    with BlockingProducer("PG_S", live_broker.namesrv_addr) as producer:
        for i in range(10):
            producer.send(Message("SIn", f"{i}".encode()))
    query_id = run_stream(spark, live_broker, tmp_path / "checkpoint")
    with BlockingProducer("PG_S", live_broker.namesrv_addr) as producer:
        for i in range(10, 14):
            producer.send(Message("SIn", f"{i}".encode()))
    assert run_stream(spark, live_broker, tmp_path / "checkpoint") == query_id  # a restart: the same query
    out = [r.properties for _q, r in stored(live_broker, "SOut")]
    assert len(out) == 14
    assert {p[SINK_ID] for p in out} == {query_id}
    assert len({p[IDEMPOTENCY_KEY] for p in out}) == 14
    assert all(p[IDEMPOTENCY_KEY].startswith(f"{query_id}:{p[SINK_BATCH]}:") for p in out)
    batches = {p[SINK_BATCH] for p in out}
    assert len(batches) >= 4
    # Spark makes a writer per micro-batch run: an attempt each, all owned by the driver's one owner process.
    assert len({p[SINK_ATTEMPT] for p in out}) == len(batches) and len({p[SINK_OWNER] for p in out}) == 1
