"""The sink's exactly-once promise under crashes (issue 12, item 7): the Spark driver runs in a process of its own
(this file run as a script), started and killed here with SIGKILL (the driver, its JVM and its Python workers);
each test then asserts the exact contents of the target topic: every row once, or none.

Broker: check-backs every second and no per-producer cap on unread checks, so undecided halves are resolved within
seconds of their immunity (the jobs set checkImmunitySeconds=10). After a crash the test runs a producer of the
sink group, as the next job would be.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from halfmq.client import Message, MessageQueue, Producer
from halfmq.protocol.message import decode_record

from tests.support.broker_thread import BrokerThread
from tests.support.local_spark import local_spark

pytestmark = pytest.mark.slow  # Spark drivers in processes of their own, killed

GROUP = "halfmq-spark-sink"
#: The jobs' checkImmunitySeconds: orphans are checked soon after a crash, and the halves of a running job are
#: not asked about every second while it writes (each check costs the broker about what a send does).
IMMUNITY = "10"
#: Rows per batch half: small, so a job stores and commits many halves and each kill lands in the middle of them.
ROWS_PER_HALF = "100"
ROOT = Path(__file__).resolve().parents[2]
SCRATCH = "HALFMQ_TEST_SPARK_SCRATCH"  #: the driver's Spark scratch folder, set by Driver


@pytest.fixture
def broker(tmp_path):
    bt = BrokerThread(tmp_path / "store", transactionCheckInterval=1000, transactionTimeOut=1000,
                      transactionCheckMax=100_000, transactionCheckMaxUnreadBytes=64 << 20)
    yield bt.broker
    bt.stop()


def wait_until(condition, timeout: float, what: str, interval: float = 0.01) -> None:
    """Poll a condition on the broker's store (written by another thread) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def stored(broker, topic: str) -> list[tuple[int, object]]:
    """(queue id, decoded record) of every message of ``topic`` in the broker's store."""
    store = broker.store
    found = []
    for queue_id in range(16):
        count = store.max_offset(topic, queue_id)
        if count:
            entries = store.get_queue_entries(topic, queue_id, 0, count)
            found += [(queue_id, decode_record(raw)) for raw in store.read_records([e.physical_offset
                                                                                    for e in entries])]
    return found


def committed(broker, topic: str) -> list[bytes]:
    return [record.body for _queue_id, record in stored(broker, topic)]


def published(broker, topic: str) -> int:
    return sum(broker.store.max_offset(topic, queue_id) for queue_id in range(16))


def pending(broker) -> int:
    """Rows in the sink group's pending halves."""
    return sum(state.batch or 1 for _offset, state in broker.store.iter_halves()
               if state.pending and state.group == GROUP)


def settle(broker, timeout: float = 300) -> None:
    """Run a producer of the sink group (the next job would) until no half of the group is pending."""
    from halfmq.pipeline.sink_io import sink_producer

    async def run():
        producer, listener = sink_producer(broker.namesrv_addr, GROUP)
        async with producer:
            await asyncio.to_thread(wait_until, lambda: pending(broker) == 0, timeout, "the halves to be resolved",
                                    0.05)
        await listener.close()
    asyncio.run(run())


class Driver:
    """This file as a Spark driver script, in a session of its own; its output lines are collected."""

    def __init__(self, tmp_path: Path, mode: str, namesrv: str, *args: str):
        self.namesrv = namesrv
        run = time.monotonic_ns()
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
               "PYTHONPATH": str(ROOT), SCRATCH: str(tmp_path / f"spark-{run}")}
        self.err_path = tmp_path / f"driver-{run}.err"
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, __file__, mode, namesrv, *args], stdout=subprocess.PIPE,
                                         stderr=err, start_new_session=True, env=env, text=True)
        self.lines: list[str] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.strip())
                self.changed.notify_all()
        with self.changed:
            self.lines.append("<eof>")
            self.changed.notify_all()

    def wait_line(self, text: str, timeout: float = 300) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: text in self.lines or "<eof>" in self.lines, timeout):
                raise AssertionError(f"no {text!r} from the driver within {timeout} s:\n{self.stderr()}")
        assert text in self.lines, f"the driver ended without {text!r}: {self.lines}\n{self.stderr()}"

    def finish(self, timeout: float = 300) -> list[str]:
        assert self.proc.wait(timeout) == 0, f"driver failed: {self.lines}\n{self.stderr()}"
        self._reap_tree()
        return self.lines

    def stderr(self) -> str:
        return "\n".join(self.err_path.read_text(errors="replace").splitlines()[-40:])

    def _tree(self) -> list[int]:
        """The driver and every live descendant (the JVM, pyspark's daemon and workers in their own groups)."""
        children: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
                except OSError:
                    continue
                children.setdefault(ppid, []).append(int(name))
        tree, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += children.get(pid, [])
        return tree

    def kill(self) -> None:
        """SIGKILL the driver and every process it started (the machine running the driver is gone)."""
        for pid in self._tree():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        self._reap_tree()

    def _reap_tree(self) -> None:
        # The sink's owner process left the driver's tree on purpose; it ends when it sees the JVM gone.
        wait_until(lambda: not owners(self.namesrv), 60, "the sink's owner process to end", 0.05)


def owners(namesrv: str) -> list[int]:
    """The sink owner processes of this test's broker (another test run may have its own)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if b"halfmq.pipeline.sink_lease" in args and namesrv.encode() in args:
                found.append(int(name))
    return found


def fill(broker, topic: str, count: int) -> None:
    async def run():
        async with Producer("PG_CRASH", broker.namesrv_addr) as producer:
            for start in range(0, count, 500):
                await producer.send_batch([Message(topic, f"{i}".encode()) for i in range(start, start + 500)],
                                          MessageQueue(topic, broker.config.brokerName, (start // 500) % 4))
    asyncio.run(run())


def expect_each_once(bodies: list[bytes], count: int) -> None:
    assert len(bodies) == count and sorted(int(b) for b in bodies) == list(range(count)), \
        f"{len(bodies)} rows, {len(set(bodies))} distinct, for {count}"


def test_driver_killed_during_a_batch_commit_publishes_every_row_once(broker, tmp_path):
    driver = Driver(tmp_path, "batch", broker.namesrv_addr, "CrashBatch", "30000")
    # Killed once the commit has published its first rows, long before its last.
    wait_until(lambda: published(broker, "CrashBatch") > 0, 600, "the commit to start")
    driver.kill()
    published_at_kill = published(broker, "CrashBatch")
    settle(broker)
    print(f"published at the kill: {published_at_kill}")
    expect_each_once(committed(broker, "CrashBatch"), 30_000)


def test_driver_killed_before_a_batch_commit_publishes_nothing(broker, tmp_path):
    driver = Driver(tmp_path, "batch", broker.namesrv_addr, "CrashEarly", "30000")
    wait_until(lambda: pending(broker) >= 10_000, 600, "10,000 rows stored in halves")
    driver.kill()
    settle(broker)
    assert committed(broker, "CrashEarly") == []


def test_driver_killed_during_a_streaming_batch_then_restarted_publishes_every_row_once(broker, tmp_path):
    fill(broker, "StreamIn", 12_000)
    args = ("stream", broker.namesrv_addr, "StreamIn", "StreamOut", str(tmp_path / "checkpoint"))
    first = Driver(tmp_path, *args)
    # Batches of 3,000: killed while the second batch is being published.
    wait_until(lambda: published(broker, "StreamOut") >= 4_000, 300, "the second batch's commit")
    first.kill()
    published_at_kill = published(broker, "StreamOut")
    assert "done" in Driver(tmp_path, *args).finish()
    settle(broker)
    print(f"published at the kill: {published_at_kill}")
    expect_each_once(committed(broker, "StreamOut"), 12_000)


def test_a_task_failing_once_and_a_job_failing_publish_once_and_nothing(broker, tmp_path):
    lines = Driver(tmp_path, "failures", broker.namesrv_addr, "RetriedT", "FailedT").finish()
    assert "job failed" in lines
    settle(broker)
    expect_each_once(committed(broker, "RetriedT"), 3_000)
    assert committed(broker, "FailedT") == []


# --- the driver ---
def _session(master: str = "local[2]"):
    # Its scratch folder is under the test's tmp_path: a killed driver leaves it there, not in /tmp.
    return local_spark("halfmq-sink-crash", os.environ[SCRATCH], master, **{"spark.sql.shuffle.partitions": "2"})


def _write(df, namesrv: str, topic: str) -> None:
    (df.write.format("halfmq").option("namesrv", namesrv).option("topic", topic)
     .option("checkImmunitySeconds", IMMUNITY).option("rowsPerHalf", ROWS_PER_HALF).mode("append").save())


def _rows(spark, count: int, partitions: int = 4):
    from pyspark.sql import functions as F

    return spark.range(0, count, numPartitions=partitions).select(F.col("id").cast("string").cast("binary")
                                                                   .alias("body"))


def _drive(mode: str, namesrv: str, *args: str) -> None:
    from pyspark.sql import functions as F

    if mode == "batch":
        topic, count = args
        spark = _session()
        _write(_rows(spark, int(count)), namesrv, topic)
    elif mode == "stream":
        source, target, checkpoint = args
        spark = _session()
        query = (spark.readStream.format("halfmq").option("namesrv", namesrv).option("subscribe", source)
                 .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "3000").load()
                 .select("body").writeStream.format("halfmq").option("namesrv", namesrv).option("topic", target)
                 .option("checkImmunitySeconds", IMMUNITY).option("rowsPerHalf", ROWS_PER_HALF)
                 .option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    elif mode == "failures":
        retried, failed = args
        spark = _session("local[2,4]")  # up to 4 attempts per task

        @F.udf("binary")
        def fail_first_attempt(value):
            from pyspark import TaskContext

            ctx = TaskContext.get()
            if ctx.partitionId() == 1 and ctx.attemptNumber() == 0 and value % 1000 == 900:
                raise RuntimeError("the first attempt fails after storing 900 rows in halves")
            return str(value).encode()

        _write(spark.range(0, 3000, numPartitions=3).select(fail_first_attempt("id").alias("body")), namesrv,
               retried)

        @F.udf("binary")
        def fail_always(value):
            if value == 2500:
                raise RuntimeError("this task always fails")
            return str(value).encode()

        try:
            _write(spark.range(0, 3000, numPartitions=3).select(fail_always("id").alias("body")), namesrv, failed)
        except Exception:
            print("job failed", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    _drive(*sys.argv[1:])
