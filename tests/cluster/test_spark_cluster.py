"""The Spark source, sink and audit job over a cluster (real processes on loopback: 2 name servers, 3 brokers):
topics have queues on every broker, the source reads each once with offsets keyed by broker and queue, the sink
publishes once across brokers, through crashes too, and the audit reports every broker."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
from types import SimpleNamespace

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from halfmq.client import Message, MessageQueue, Producer, PullConsumer, TransactionProducer
from halfmq.client.admin import Admin
from halfmq.client.errors import TopicNotExistError
from halfmq.pipeline import sink_io
from halfmq.pipeline.jobs.transaction_audit import audit
from halfmq.pipeline.sink_io import HalfTag, owner_group, sink_producer

from tests.pipeline.test_sink_crash import GROUP, Driver, owners
from tests.support.cluster import LocalCluster, until
from tests.support.local_spark import spark_fixture

pytestmark = pytest.mark.spark
BROKERS = ("broker-0", "broker-1", "broker-2")
#: 2 queues per topic on each broker; check-backs every second, never given up, however many are unread.
FLAGS = ("--defaultTopicQueueNums=2", "--transactionCheckInterval=1000", "--transactionTimeOut=1000",
         "--transactionCheckMax=100000", "--transactionCheckMaxUnreadBytes=67108864")


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """A local Spark as tests/pipeline's (the same session when those tests made it first)."""
    yield from spark_fixture("halfmq-cluster-tests", tmp_path_factory)


@pytest.fixture
async def cluster(tmp_path):
    cluster = await LocalCluster(tmp_path, namesrvs=2, brokers=3, broker_flags=FLAGS).start()
    yield cluster
    # The owner process a sink write starts lives as long as its driver's JVM, here this session's: it goes with
    # the cluster it holds connections to.
    for pid in owners(cluster.namesrv_addr):
        with contextlib.suppress(ProcessLookupError):  # it may have ended since it was listed
            os.kill(pid, signal.SIGTERM)

    async def owners_gone():
        return not owners(cluster.namesrv_addr)
    await until(owners_gone, 30, "the sink's owner processes to end")
    await cluster.stop()


async def create_everywhere(namesrv: str, *topics: str) -> None:
    """The topics with 2 queues on every broker, once the name servers route all of them."""
    async with Admin(namesrv) as admin:
        for topic in topics:
            await admin.update_topic(topic, 2, 2)

            async def routed(topic=topic):
                route = await admin.topic_route(topic)
                return sorted(q["brokerName"] for q in route["queueDatas"]) == list(BROKERS)
            await until(routed, 10, f"the route of {topic} lists every broker")


async def spread(namesrv: str, topic: str, count: int) -> None:
    """``count`` messages "0", "1", ... of ``topic`` created on every broker, in batches of 500 round robin over
    its queues."""
    await create_everywhere(namesrv, topic)
    async with Producer("PG_SPREAD", namesrv) as producer:
        queues = sorted(MessageQueue(topic, b, q) for b in BROKERS for q in range(2))
        for n, start in enumerate(range(0, count, 500)):
            await producer.send_batch([Message(topic, b"%d" % i) for i in range(start, min(start + 500, count))],
                                      queues[n % len(queues)])


async def stored(namesrv: str, topic: str) -> list[tuple[str, int, bytes]]:
    """(broker name, queue id, body) of every message of ``topic`` on every broker."""
    out = []
    async with PullConsumer("PG_CHECK", namesrv) as consumer:
        try:
            queues = await consumer.fetch_subscribe_queues(topic)
        except TopicNotExistError:
            return []
        for queue in queues:
            offset, high = 0, await consumer.max_offset(queue)
            while offset < high:
                result = await consumer.pull(queue, offset, 1000)
                out += [(queue.broker_name, queue.queue_id, m.body) for m in result.messages]
                offset = result.next_begin_offset
    return out


async def ends(namesrv: str, topic: str) -> dict[str, int]:
    """{"brokerName:queueId": max offset} of ``topic``'s queues."""
    async with Admin(namesrv) as admin:
        try:
            return {f"{r['brokerName']}:{r['queueId']}": r["maxOffset"] for r in await admin.topic_status(topic)}
        except TopicNotExistError:
            return {}


async def pending(namesrv: str) -> dict[str, dict[str, int]]:
    """Per broker, the sink group's pending halves: offsetMsgId → how many times they were checked back."""
    out = {}
    async with Admin(namesrv) as admin:
        for broker in await admin.brokers():
            out[broker.name] = {half["offsetMsgId"]: half["checks"]
                                async for half in admin.pending_halves(addr=broker.addr)
                                if half["producerGroup"] == GROUP}
    return out


async def settle(namesrv: str, timeout: float = 300) -> None:
    """Run a producer of the sink group (the next job would) until no broker has a half of it pending."""
    producer, listener = sink_producer(namesrv, GROUP)
    async with producer:
        async def none_pending():
            return not any((await pending(namesrv)).values())
        await until(none_pending, timeout, "every broker's halves of the sink group to be resolved", 0.2)
    await listener.close()


def expect_each_once(rows: list[tuple[str, int, bytes]], count: int) -> None:
    bodies = sorted(int(body) for _b, _q, body in rows)
    assert bodies == list(range(count)), f"{len(bodies)} rows, {len(set(bodies))} distinct, for {count}"
    assert {broker for broker, _q, _b in rows} == set(BROKERS)


async def spark_job(spark, job, *args, **kwargs):
    """``job(*args, **kwargs)`` on a thread, so that this loop goes on draining the cluster's output while Spark blocks,
    with the session active there: Spark looks a Python data source's name up in the thread's active session when
    it writes, and a thread it did not start has none."""
    def run():
        spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)
        return job(*args, **kwargs)
    return await asyncio.to_thread(run)


@contextlib.asynccontextmanager
async def driver(*args):
    """A Spark driver process of test_sink_crash.py, killed at the end if it still runs."""
    process = Driver(*args)
    try:
        yield process
    finally:
        if process.proc.poll() is None:
            await asyncio.to_thread(process.kill)


async def test_the_source_reads_every_brokers_queues_once_in_batches_and_streams(cluster, spark, tmp_path):
    namesrv = cluster.namesrv_addr
    await spread(namesrv, "Spread", 3000)

    def read(**options):
        reader = spark.read.format("halfmq").option("namesrv", namesrv).option("subscribe", "Spread")
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load().collect()

    rows = await spark_job(spark, read)
    expect_each_once([(r.broker_name, r.queue_id, r.body) for r in rows], 3000)
    assert len({(r.broker_name, r.queue_id, r.queue_offset) for r in rows}) == 3000
    # Offsets name a queue by broker and id: queue 0 of broker-1 starts at 400, the other queue 0s at theirs.
    later = await spark_job(spark, read, startingOffsets=json.dumps({"Spread": {"broker-1:0": 400}}))
    skipped = [r for r in rows if (r.broker_name, r.queue_id) == ("broker-1", 0) and r.queue_offset < 400]
    assert len(skipped) == 400 and len(later) == 3000 - 400
    with pytest.raises(PySparkException, match="queue 0 of topic 'Spread' is on several brokers"):
        await spark_job(spark, read, startingOffsets=json.dumps({"Spread": {"0": 1}}))

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def stream() -> dict:
        query = (spark.readStream.format("halfmq").option("namesrv", namesrv).option("subscribe", "Spread")
                 .option("startingOffsets", "earliest").load().writeStream.format("parquet")
                 .option("path", str(out)).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        return json.loads(query.lastProgress["sources"][0]["endOffset"])

    assert await spark_job(spark, stream) == {"Spread": await ends(namesrv, "Spread")}
    await spread(namesrv, "Spread", 3500)  # 3,000 again and 500 more
    assert await spark_job(spark, stream) == {"Spread": await ends(namesrv, "Spread")}  # from the checkpoint
    bodies = await spark_job(spark, lambda: [int(r.body) for r in spark.read.parquet(str(out)).collect()])
    assert sorted(bodies) == sorted(list(range(3000)) + list(range(3500)))


async def test_the_sink_publishes_once_on_every_broker_or_nothing_and_the_audit_reports_each(cluster, spark):
    namesrv = cluster.namesrv_addr
    # A row placed by broker_name and queue_id needs the topic to have that queue: a topic a send creates appears
    # on each broker only as sends reach it.
    await create_everywhere(namesrv, "SinkOut", "SinkCopy", "SinkFail")

    def write(df, topic: str) -> None:
        (df.write.format("halfmq").option("namesrv", namesrv).option("topic", topic).option("rowsPerHalf", "10")
         .mode("append").save())

    rows = spark.range(0, 300, numPartitions=3).select(F.col("id").cast("string").cast("binary").alias("body"))
    await spark_job(spark, write, rows, "SinkOut")
    written = await stored(namesrv, "SinkOut")
    expect_each_once(written, 300)
    # A source row written back goes to the queue its broker_name and queue_id name.
    copied = (spark.read.format("halfmq").option("namesrv", namesrv).option("subscribe", "SinkOut").load()
              .select("broker_name", "queue_id", "body"))
    await spark_job(spark, write, copied, "SinkCopy")
    assert sorted(await stored(namesrv, "SinkCopy")) == sorted(written)

    @F.udf("binary")
    def explode_on_299(value):
        if value == 299:
            raise ValueError("task failure")
        return str(value).encode()

    failing = spark.range(0, 300, numPartitions=3).select(explode_on_299(F.col("id")).alias("body"))
    with pytest.raises(PySparkException, match="task failure"):
        await spark_job(spark, write, failing, "SinkFail")
    assert await stored(namesrv, "SinkFail") == []

    report = await spark_job(spark, lambda: audit(spark, namesrv).filter(f"producerGroup = '{GROUP}'").collect())
    by_broker = collections.defaultdict(dict)
    for row in report:
        by_broker[row.topic][row.brokerName] = row
    assert set(by_broker["SinkOut"]) == set(by_broker["SinkFail"]) == set(BROKERS)
    assert sum(r.committed_messages for r in by_broker["SinkOut"].values()) == 300
    # The failed job's halves on every broker were rolled back (by its failed task or by the abort).
    assert all(r.rolled_back and not r.committed and not r.pending for r in by_broker["SinkFail"].values())


async def test_a_driver_killed_mid_commit_publishes_every_row_once_though_the_log_broker_was_down(cluster, tmp_path):
    namesrv = cluster.namesrv_addr
    async with driver(tmp_path, "batch", namesrv, "CrashBatch", "30000") as first, Admin(namesrv) as admin:
        async def decided():  # the commit record is written: the halves are committed next
            try:
                return any(row["maxOffset"] for row in await admin.topic_status(sink_io.SINK_COMMITS_TOPIC))
            except TopicNotExistError:
                return False
        await until(decided, 600, "the batch's commit record", 0.005)
        await asyncio.to_thread(first.kill)
    left = await pending(namesrv)
    print(f"halves pending after the kill: { {broker: len(halves) for broker, halves in left.items()} }")
    assert left["broker-1"] or left["broker-2"], "the commit was over before the kill: nothing left to check back"
    # broker-0, first by name, holds the decision log, which says COMMIT. While it is down, the other brokers
    # ask the sink group about their halves (a producer of it runs, as the next job would): not knowing, it must
    # not roll them back.
    await cluster.brokers[0].stop()
    before = await pending(namesrv)
    producer, listener = sink_producer(namesrv, GROUP)
    async with producer:
        async def asked_again():
            return all(checks > before[broker].get(half, 0)
                       for broker, halves in (await pending(namesrv)).items() for half, checks in halves.items())
        await until(asked_again, 60, "broker-1 and broker-2 to check back their halves")
    await listener.close()
    cluster.brokers[0] = cluster.broker_process(0)
    await cluster.brokers[0].start()
    await settle(namesrv)
    expect_each_once(await stored(namesrv, "CrashBatch"), 30_000)


async def test_a_streaming_driver_killed_then_restarted_publishes_every_row_once(cluster, tmp_path):
    namesrv = cluster.namesrv_addr
    await spread(namesrv, "StreamIn", 6_000)
    args = (tmp_path, "stream", namesrv, "StreamIn", "StreamOut", str(tmp_path / "checkpoint"))
    async with driver(*args) as first:
        async def second_batch_committing():  # the last of two batches of 3,000
            return sum((await ends(namesrv, "StreamOut")).values()) >= 4_000
        await until(second_batch_committing, 300, "the second batch's commit", 0.01)
        await asyncio.to_thread(first.kill)
    async with driver(*args) as restarted:
        assert "done" in await asyncio.to_thread(restarted.finish)
    await settle(namesrv)
    expect_each_once(await stored(namesrv, "StreamOut"), 6_000)


async def test_a_live_driver_counts_on_every_broker(cluster):
    """A check answer finds the driver's owner alive while any broker lists it: one restarted since the owner
    registered does not."""
    namesrv = cluster.namesrv_addr
    producer, listener = sink_producer(namesrv, "PG_LIVE")
    undecided = HalfTag("live", 0, "A", "0.0", "DRIVER", "broker-0")

    async def answer():
        # What a check-back hands the listener: the half's record (its properties are what is read).
        checked = SimpleNamespace(msg_id="checked", properties=undecided.half_properties())
        return await listener.check_local_transaction(checked)

    async with producer:
        async with TransactionProducer(owner_group("DRIVER"), listener, namesrv):
            await cluster.brokers[0].stop()
            cluster.brokers[0] = cluster.broker_process(0)
            await cluster.brokers[0].start()
            assert await answer() is sink_io.UNKNOWN
        assert await answer() is sink_io.ROLLBACK  # the owner gone: rolled back
    await listener.close()
