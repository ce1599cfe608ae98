"""The Spark sink's exactly-once promise across a failover of the broker group holding its decision log (issue 41):
a group of three real broker processes elects its leader on a real 3-member etcd; a sink job writes to it, and the
leader, which holds the decision log (``HALFMQ_SINK_COMMITS``) and every half, is SIGKILLed in the middle of a
commit: once the commit record is in the log, before the halves are committed. The new leader holds the record
and the halves (each was acknowledged by the in-sync members), so the commit carries on there (the driver waits
for the group to elect it) and the job ends as if nothing happened: every row published once, none missing, and
the audit job reports it. (Before, the commit failed at once: its decisions went to the dead leader.) A driver
killed mid-commit and restarted from its checkpoint is tests/pipeline/test_sink_crash.py's; with a failover it takes
a minute more of the one worker every Spark test shares, and the log it reads is the same.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest
from pyspark.sql import functions as F

from halfmq.client import Message, MessageQueue, Producer
from halfmq.client.admin import Admin
from halfmq.client.errors import TopicNotExistError
from halfmq.pipeline import sink_io
from halfmq.pipeline.jobs.transaction_audit import audit

from tests.cluster.test_spark_cluster import pending, settle, spark_job, stored
from tests.pipeline.test_sink_crash import GROUP, owners
from tests.replication.test_failover import ElectedGroup, elected
from tests.support.cluster import until
from tests.support.local_spark import spark_fixture

pytestmark = [pytest.mark.slow, pytest.mark.spark]
#: Check-backs every second, never given up, however many are unread: a half the commit could not decide is
#: settled within seconds, as in the other sink crash tests.
FLAGS = ("--transactionCheckInterval=1000", "--transactionTimeOut=1000", "--transactionCheckMax=100000",
         "--transactionCheckMaxUnreadBytes=67108864")
ROWS = 6_000
#: Small halves: a commit decides hundreds of them, so the kill lands before it is over.
ROWS_PER_HALF = "20"


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """A local Spark as tests/pipeline's (the same session when those tests made it first)."""
    yield from spark_fixture("halfmq-failover-tests", tmp_path_factory)


@pytest.fixture
async def group(tmp_path, etcd):
    group = await ElectedGroup(tmp_path, etcd, flags=FLAGS).start()
    yield group
    # The owner process a sink write starts lives as long as this session's JVM: it goes with the group it holds
    # connections to.
    for pid in owners(group.namesrv_addr):
        with contextlib.suppress(ProcessLookupError):  # it may have ended since it was listed
            os.kill(pid, signal.SIGTERM)

    async def owners_gone():
        return not owners(group.namesrv_addr)
    await until(owners_gone, 30, "the sink's owner processes to end")
    await group.stop()


async def kill_leader_once_decided(group, leader: int, topic: str, records: int = 1) -> int:
    """SIGKILL the leader as soon as its decision log holds ``records`` records (the commit record of the batch to
    kill in was just written); return how many rows of ``topic`` it showed published just before."""
    async with Admin(group.namesrv_addr) as admin:
        async def total(name: str) -> int:
            try:
                return sum(row["maxOffset"] for row in await admin.topic_status(name))
            except TopicNotExistError:
                return 0

        async def decided():
            return await total(sink_io.SINK_COMMITS_TOPIC) >= records and (await total(topic),)
        (published,) = await until(decided, 300, f"decision record {records}", 0.005)
    await group.members[leader].kill_group()
    return published


async def fill(namesrv: str, topic: str) -> None:
    """Messages "0" to ROWS - 1 in ``topic``'s 4 queues of the group, in batches of 500."""
    async with Producer("PG_FAILOVER_IN", namesrv) as producer:
        for start in range(0, ROWS, 500):
            await producer.send_batch([Message(topic, b"%d" % i) for i in range(start, start + 500)],
                                      MessageQueue(topic, "g", start // 500 % 4))


def sink(writer, namesrv: str, topic: str):
    return (writer.format("halfmq").option("namesrv", namesrv).option("topic", topic)
            .option("checkImmunitySeconds", "10").option("rowsPerHalf", ROWS_PER_HALF))


async def test_a_batch_write_publishes_every_row_once_though_the_leader_holding_its_log_dies_mid_commit(group, spark):
    namesrv = group.namesrv_addr
    leader = await elected(group)
    async with Admin(namesrv) as admin:
        await admin.update_topic("FailoverSink", 4, 4)

    def write() -> None:
        rows = spark.range(0, ROWS, numPartitions=2).select(F.col("id").cast("string").cast("binary").alias("body"))
        sink(rows.write, namesrv, "FailoverSink").mode("append").save()

    job = asyncio.ensure_future(spark_job(spark, write))
    published_at_kill = await kill_leader_once_decided(group, leader, "FailoverSink")
    await elected(group, exclude=leader)
    await job  # the commit carried on at the new leader: the job succeeded
    print(f"rows published when the leader was killed: {published_at_kill}")
    assert published_at_kill < ROWS, "the commit was over before the kill: no failover within it"

    await settle(namesrv)
    bodies = sorted(int(body) for _broker, _queue, body in await stored(namesrv, "FailoverSink"))
    assert bodies == list(range(ROWS)), f"{len(bodies)} rows, {len(set(bodies))} distinct, for {ROWS}"
    report = await spark_job(spark, lambda: audit(spark, namesrv).filter(
        f"producerGroup = '{GROUP}' and topic = 'FailoverSink'").collect())
    assert sum(row.committed_messages for row in report) == ROWS
    assert not any(row.rolled_back or row.pending or row.discarded for row in report), report
    assert not any((await pending(namesrv)).values())


async def test_a_stream_publishes_every_row_once_though_the_leader_holding_its_log_dies_mid_commit(group, spark,
                                                                                                   tmp_path):
    namesrv = group.namesrv_addr
    leader = await elected(group)
    async with Admin(namesrv) as admin:
        await admin.update_topic("FailoverIn", 4, 4)
        await admin.update_topic("FailoverOut", 4, 4)
    await fill(namesrv, "FailoverIn")

    def stream() -> None:
        query = sink(spark.readStream.format("halfmq").option("namesrv", namesrv).option("subscribe", "FailoverIn")
                     .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(ROWS // 2)).load()
                     .select("body").writeStream, namesrv, "FailoverOut")
        query = query.option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start()
        query.awaitTermination()

    job = asyncio.ensure_future(spark_job(spark, stream))
    # In the commit of the second of its two micro-batches: the first was published by the leader now killed.
    published_at_kill = await kill_leader_once_decided(group, leader, "FailoverOut", records=2)
    await elected(group, exclude=leader)
    await job
    print(f"rows published when the leader was killed: {published_at_kill}")
    assert published_at_kill < ROWS, "the commit was over before the kill: no failover within it"

    await settle(namesrv)
    bodies = sorted(int(body) for _broker, _queue, body in await stored(namesrv, "FailoverOut"))
    assert bodies == list(range(ROWS)), f"{len(bodies)} rows, {len(set(bodies))} distinct, for {ROWS}"
