"""Data lifecycle against a real broker (issue 13): retention by age and by space, consumers behind the minimum,
topic deletion that deletes, pending halves kept, a full disk refused and recovered from."""
from __future__ import annotations

import asyncio
import os
import subprocess
import time
import urllib.request

import pytest

from halfmq.client import (LocalTransactionState, Message, MessageQueue, Producer, PullConsumer, PullStatus,
                           TransactionProducer)
from halfmq.client.admin import Admin
from halfmq.client.errors import BrokerError
from halfmq.protocol.codes import RequestCode, ResponseCode

#: the smallest fileReservedTime: 0.0001 h = 360 ms
RESERVED_S = 0.36
SHORT = {"fileReservedTime": 0.0001, "cleanResourceInterval": 3_600_000}  # passes run when a test runs them


async def outlive_retention(since: float) -> None:
    """Wait until messages stored by ``since`` (time.time()) are older than the retention. This waits on the clock
    itself: age is what retention reads."""
    await asyncio.sleep(max(0.0, since + RESERVED_S + 0.05 - time.time()))


async def send_all(producer, topic: str, bodies, queue_id: int = 0) -> None:
    queue = MessageQueue(topic, "broker-a", queue_id)
    for body in bodies:
        await producer.send(Message(topic, body), queue)


async def test_consumers_behind_the_minimum_are_moved_to_it(broker_factory):
    broker = await broker_factory(metricsPromExporterPort=0, **SHORT)
    queue = MessageQueue("Aging", "broker-a", 0)
    async with Producer("P", broker.namesrv_addr) as producer, PullConsumer("C", broker.namesrv_addr) as consumer:
        await send_all(producer, "Aging", [b"old-%d" % i for i in range(20)])
        await outlive_retention(time.time())
        await send_all(producer, "Aging", [b"new-%d" % i for i in range(5)])
        async with Admin(broker.namesrv_addr) as admin:  # mqadmin's deleteExpiredCommitLog: a pass now
            result = await admin.json_call(await admin.broker_addr(), RequestCode.DELETE_EXPIRED_COMMITLOG)
        assert result["deleted"] == 20 and broker.ctx.retention.deleted_total == 20
        assert await consumer.min_offset(queue) == 20 and await consumer.max_offset(queue) == 25
        behind = await consumer.pull(queue, 3)  # the reference: OFFSET_TOO_SMALL → PULL_OFFSET_MOVED, next = min
        assert behind.status is PullStatus.OFFSET_ILLEGAL and behind.next_begin_offset == 20
        moved = await consumer.pull(queue, behind.next_begin_offset)
        assert [m.body for m in moved.messages] == [b"new-%d" % i for i in range(5)]
        await consumer.update_offset(queue, 3)  # a group left behind: deleted messages are not its lag
        metrics = urllib.request.urlopen(f"http://{broker.metrics_addr}/metrics", timeout=5).read().decode()
        assert 'rocketmq_consumer_lag_messages{consumer_group="C",topic="Aging"} 5.0' in metrics


async def test_writing_ten_times_the_store_keeps_succeeding(broker_factory):
    limit = 4 << 20
    broker = await broker_factory(mapSize=1 << 20, maxMapSize=limit, diskMaxUsedSpaceRatio=50,
                                  cleanResourceInterval=3_600_000)
    body = os.urandom(3000)  # a record on one 4 KiB page
    async with Producer("P", broker.namesrv_addr) as producer:
        for round_ in range(80):  # 80 × 128 records (512 KiB of pages), each followed by the pass the timer runs
            queue = MessageQueue("Big", "broker-a", round_ % 4)
            for _ in range(4):
                await producer.send_batch([Message("Big", body) for _ in range(32)], queue)
            await broker.ctx.retention.run_pass()
            assert broker.store.usage().ratio < 0.9
    assert broker.ctx.retention.deleted_total > 70 * 128
    data = os.path.join(broker.config.storePathRootDir, "lmdb", "data.mdb")
    assert os.path.getsize(data) <= limit  # freed pages were reused: the file never outgrew the limit


async def test_a_deleted_topic_created_again_is_empty(broker_factory):
    broker = await broker_factory(cleanResourceInterval=3_600_000)
    async with Producer("P", broker.namesrv_addr) as producer, Admin(broker.namesrv_addr) as admin:
        await admin.update_topic("Payroll", 2, 2)
        await producer.send(Message("Payroll", b"salary-of-alice", keys="alice"))
        async with PullConsumer("HR", broker.namesrv_addr) as consumer:
            await consumer.update_offset(MessageQueue("Payroll", "broker-a", 0), 1)
        await admin.delete_topic("Payroll")
        await broker.ctx.retention.run_pass()  # the purge (it also runs in the background right after the delete)
        await admin.update_topic("Payroll", 2, 2)
        async with PullConsumer("New", broker.namesrv_addr) as consumer:
            for queue_id in (0, 1):
                queue = MessageQueue("Payroll", "broker-a", queue_id)
                assert (await consumer.max_offset(queue), await consumer.min_offset(queue)) == (0, 0)
                assert (await consumer.pull(queue, 0)).messages == []
        async with PullConsumer("HR", broker.namesrv_addr) as consumer:
            assert await consumer.query_offset(MessageQueue("Payroll", "broker-a", 0)) in (None, 0)
    assert broker.store.messages_by_key("Payroll", "alice", 10) == []
    assert broker.store.stats()["entries"]["commitlog"] == 0


async def test_a_pending_half_older_than_the_retention_is_checked_and_commits(broker_factory):
    broker = await broker_factory(transactionTimeOut=100, transactionCheckInterval=100, **SHORT)
    checked = asyncio.Event()

    class Listener:
        def execute_local_transaction(self, msg, arg):
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, msg):
            if broker.ctx.retention.last_pass is None:
                return LocalTransactionState.UNKNOW  # not decided before retention has run
            checked.set()
            return LocalTransactionState.COMMIT_MESSAGE

    arrived = asyncio.Event()
    broker.store.add_arrival_listener(lambda topic, _q, _m: arrived.set() if topic == "Orders" else None)
    async with TransactionProducer("TX", Listener(), broker.namesrv_addr) as producer:
        await producer.send_message_in_transaction(Message("Orders", b"order-1"))
        await outlive_retention(time.time())
        await broker.ctx.retention.run_pass()
        await asyncio.wait_for(checked.wait(), 10)
        await asyncio.wait_for(arrived.wait(), 10)
    async with PullConsumer("C", broker.namesrv_addr) as consumer:
        found = [m.body for queue in await consumer.fetch_subscribe_queues("Orders")
                 for m in (await consumer.pull(queue, 0)).messages]
    assert found == [b"order-1"]


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs of the test's own, unmounted at the end."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


async def test_a_full_disk_refuses_sends_keeps_reads_and_recovers(broker_factory, small_disk):
    ballast = small_disk / "ballast"
    broker = await broker_factory(store_dir=small_disk / "store", mapSize=1 << 20, maxMapSize=1 << 30,
                                  cleanResourceInterval=3_600_000)
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    with open(ballast, "wb") as f:
        f.write(b"\0" * (free - (3 << 20)))  # leave 3 MiB
    body = os.urandom(64 << 10)
    queue = MessageQueue("Disk", "broker-a", 0)
    async with Producer("P", broker.namesrv_addr, retry_times=0) as producer:
        sent = 0
        with pytest.raises(BrokerError) as refused:
            for _ in range(200):
                await producer.send(Message("Disk", body), queue)
                sent += 1
        assert refused.value.code == ResponseCode.SERVICE_NOT_AVAILABLE and "no space left" in refused.value.remark
        assert sent > 0
        async with PullConsumer("C", broker.namesrv_addr) as consumer:
            assert len((await consumer.pull(queue, 0, max_nums=sent)).messages) == sent  # reads go on
        ballast.unlink()
        await producer.send(Message("Disk", body), queue)  # space is back: so are sends


async def test_above_the_warning_level_sends_are_refused_reads_go_on_and_status_shows_it(broker_factory):
    broker = await broker_factory(mapSize=1 << 20, maxMapSize=4 << 20, diskSpaceWarningLevelRatio=10,
                                  diskMaxUsedSpaceRatio=95, cleanResourceInterval=3_600_000,
                                  metricsPromExporterPort=0)
    queue = MessageQueue("Full", "broker-a", 0)
    body = os.urandom(3000)
    async with Producer("P", broker.namesrv_addr, retry_times=0) as producer, \
            Admin(broker.namesrv_addr) as admin:
        for _ in range(8):  # 256 pages: a quarter of the store's 4 MiB limit
            await producer.send_batch([Message("Full", body) for _ in range(32)], queue)
        await broker.ctx.retention.run_pass()
        with pytest.raises(BrokerError) as refused:
            await producer.send(Message("Full", b"one more"), queue)
        assert refused.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "diskSpaceWarningLevelRatio=10%" in refused.value.remark
        async with PullConsumer("C", broker.namesrv_addr) as consumer:
            assert len((await consumer.pull(queue, 0, max_nums=32)).messages) == 32  # reads go on
        status = await admin.broker_status()
        assert status["storeRefusingWrites"] == "true" and float(status["storeUseRatio"]) > 0.1
        assert int(status["storeLimitBytes"]) == 4 << 20 and float(status["oldestMessageAgeSeconds"]) >= 0
        metrics = urllib.request.urlopen(f"http://{broker.metrics_addr}/metrics", timeout=5).read().decode()
        assert "halfmq_store_refusing_writes 1.0" in metrics and "halfmq_store_use_ratio" in metrics
        await admin.delete_topic("Full")
        await broker.ctx.retention.run_pass()  # purges the topic: the store is below the level again
        assert (await admin.broker_status())["storeRefusingWrites"] == "false"
        assert int((await admin.broker_status())["deletedTopicsPurgedMessages"]) == 256
        await producer.send(Message("Other", b"accepted again"))


async def test_the_admin_cli_runs_a_retention_pass_and_declares_topic_types(broker_factory):
    from tests.client.test_admin_cli import admin_json

    broker = await broker_factory(**SHORT)
    async with Producer("P", broker.namesrv_addr) as producer:
        await send_all(producer, "Cli", [b"old"] * 3)
    await outlive_retention(time.time())
    assert (await admin_json(broker, "deleteExpiredCommitLog"))["deleted"] == 3
    await admin_json(broker, "updateTopic", "-t", "Fifo", "-a", "+message.type=FIFO")
    assert broker.ctx.topics.get("Fifo").message_type == "FIFO"


async def test_halves_no_producer_answers_never_keep_the_store_refusing_sends(broker_factory):
    """Issue 23: halves of a group with no producer were never discarded and never deleted, so a store they filled
    refused every client's sends (14) for good. Now they are discarded at the retention age and deleted after it,
    and sends are accepted again."""
    from tests.broker.test_transactions import send_half
    from tests.support.raw import RawClient
    broker = await broker_factory(mapSize=1 << 20, maxMapSize=4 << 20, diskSpaceWarningLevelRatio=10,
                                  diskMaxUsedSpaceRatio=95, transactionTimeOut=20, transactionCheckInterval=100,
                                  **SHORT)
    orphan = await RawClient.connect(broker.addr)
    body = os.urandom(3000)
    refused = None
    for _ in range(1000):  # until the store is at its warning level: the halves fill it
        answer = await orphan.send("Orphans", body, group="PG_GONE",
                                   props={"TRAN_MSG": "true", "PGROUP": "PG_GONE"}, sys_flag=4)
        if answer.code != ResponseCode.SUCCESS:
            refused = answer.code
            break
        await broker.ctx.retention.run_pass()
    orphan.close()
    assert refused == ResponseCode.SERVICE_NOT_AVAILABLE
    client = await RawClient.connect(broker.addr)
    try:
        deadline = time.monotonic() + 20
        while (await client.send("Other", b"a plain send")).code != ResponseCode.SUCCESS:
            assert time.monotonic() < deadline, "sends are still refused: the orphaned halves pin the store"
            await outlive_retention(time.time())  # the halves age out, then their discarded copies
            await broker.ctx.retention.run_pass()
    finally:
        client.close()


@pytest.mark.slow  # it waits out the halves' retention age twice (7.2 s each)
async def test_a_store_filled_with_big_halves_nobody_answers_frees_itself(broker_factory):
    """Issue 43: a client fills a 32 MiB store with 256 KiB halves of its own group until the store refuses (14),
    then leaves. Discarding a half (its checks used up, or no producer for fileReservedTime) wrote its copy to
    TRANS_CHECK_MAX_TIME_TOPIC: the copies filled the room the refusing store had left (LMDB then frees nothing
    without a page to write), and every other client's 256 KiB send was refused for good, the halves pending.
    Now a refusing store's discards write no copy (the half stays resumable from its own record), the discarded
    halves age out, and the store frees itself as one of plain messages does."""
    from tests.support.raw import RawClient
    # Halves age out after 7.2 s: the fill must end before (CI, on a machine running nine times its cores' work,
    # took more than 3.6 s to fill, the first halves aged out meanwhile, and the store never refused).
    age_s = 7.2
    broker = await broker_factory(mapSize=1 << 20, maxMapSize=32 << 20, fileReservedTime=age_s / 3600,
                                  cleanResourceInterval=3_600_000, transactionTimeOut=20,
                                  transactionCheckInterval=500, transactionCheckMax=2)
    orphan = await RawClient.connect(broker.addr)
    body = os.urandom(256 << 10)
    refused = None
    for _ in range(200):
        answer = await orphan.send("BigOrphans", body, group="PG_BIG",
                                   props={"TRAN_MSG": "true", "PGROUP": "PG_BIG"}, sys_flag=4)
        if answer.code != ResponseCode.SUCCESS:
            refused = answer.code
            break
        await broker.ctx.retention.run_pass()  # the store refuses at diskSpaceWarningLevelRatio, not a full map
    orphan.close()
    assert refused == ResponseCode.SERVICE_NOT_AVAILABLE
    filled = time.time()
    client = await RawClient.connect(broker.addr)
    try:
        await outlive_retention(filled + age_s - RESERVED_S)  # every half is older than fileReservedTime
        deadline = time.monotonic() + 3 * age_s
        while (answer := await client.send("Other", body)).code != ResponseCode.SUCCESS:
            assert time.monotonic() < deadline, f"sends are still refused ({answer.code}): the halves pin the store"
            await outlive_retention(time.time() + age_s - RESERVED_S)  # the discarded halves age out too
            await broker.ctx.retention.run_pass()
        assert broker.store.pending_halves_count() == 0
    finally:
        client.close()
