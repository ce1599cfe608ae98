"""Messages/s from the broker into Spark: a batch read of a pre-filled topic into the `noop` sink.

The broker runs in its own process, as deployed; Spark is `local[2]` on the same machine.

    python scripts/bench_spark.py --messages 300000 --size 1024
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from halfmq.client import Message, MessageQueue, Producer, PullConsumer  # noqa: E402

READY = re.compile(r"halfmq ready: broker (\S+) namesrv (\S+)")


def start_broker(store: str) -> tuple[subprocess.Popen, str]:
    """The broker in its own process, started as `halfmq broker` is (its own GIL, uvloop), on free ports."""
    proc = subprocess.Popen([sys.executable, "-m", "halfmq.broker.cli", "broker", "--bindAddress=127.0.0.1",
                             "--listenPort=0", "--namesrvListenPort=0", "--metricsPromExporterPort=-1",
                             f"--storePathRootDir={store}", "--logLevel=WARNING"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        match = READY.search(line)
        if match:
            # Keep reading its output, so a chatty broker never blocks on a full pipe.
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, match.group(2)
    raise SystemExit("the broker exited before it was ready")


async def fill(namesrv: str, topic: str, count: int, size: int, queues: int) -> int:
    body = os.urandom(size)
    per_batch = max(1, (1 << 20) // (size + 200))
    async with Producer("BENCH_SPARK", namesrv) as producer:
        async def one(queue_id: int, n: int):
            queue = MessageQueue(topic, "broker-a", queue_id)
            for start in range(0, n, per_batch):
                await producer.send_batch([Message(topic, body)] * min(per_batch, n - start), queue)
        await producer.send(Message(topic, body))
        await asyncio.gather(*(one(q, count // queues) for q in range(queues)))
    async with PullConsumer("BENCH_SPARK", namesrv) as consumer:
        return sum([await consumer.max_offset(q) for q in await consumer.fetch_subscribe_queues(topic)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--passes", type=int, default=3, help="timed passes after the warm-up")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    broker, namesrv = start_broker(tempfile.mkdtemp(prefix="halfmq-bench-spark-"))
    try:
        run(args, namesrv)
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(30)


def run(args, namesrv: str) -> None:
    started = time.perf_counter()
    total = asyncio.run(fill(namesrv, "SparkBench", args.messages, args.size, args.queues))
    print(f"filled {total:,} messages in {time.perf_counter() - started:.1f} s", flush=True)

    from pyspark.sql import SparkSession

    from halfmq.pipeline import register

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    register(spark)
    df = spark.read.format("halfmq").option("namesrv", namesrv).option("subscribe", "SparkBench").load()
    df.write.format("noop").mode("overwrite").save()  # warm-up: JVM, Python workers
    rates = []
    for _ in range(args.passes):
        started = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        rates.append(total / (time.perf_counter() - started))
        print(f"pass {len(rates)}: {rates[-1]:,.0f} msgs/s", flush=True)
    # The median of the timed passes: the JVM keeps compiling through the first ones, and this machine is noisy.
    print(f"SUMMARY mode=spark messages={total} size={args.size} passes={args.passes} "
          f"msgs_per_s={statistics.median(rates):,.0f} (first {rates[0]:,.0f}, best {max(rates):,.0f})", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
