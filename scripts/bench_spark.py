"""Rows/s from the broker into Spark, against the same run's parquet read of the same rows (with --sink: rows/s from
Spark into the broker through the halfmq sink, against the same run's parquet write of the same rows).

Source: a batch read of a pre-filled topic into the `noop` sink; reference: a parquet copy of those rows (written
once, in the same run) read into `noop`. Passes alternate between the two so both see the same machine noise; the
ratio of the medians is the figure to compare. The broker runs in its own process, as deployed; Spark is
`local[2]` on the same machine.

    python scripts/bench_spark.py --messages 300000 --size 1024

``--alternate OLD NEW`` runs this benchmark (one timed pass each) of checkout OLD, then NEW, ``--pairs`` times,
each with its own .venv and broker, and prints each checkout's median rows/s and NEW's rows/s over OLD's, pair by
pair and their median (the machine's speed drifts over minutes; a pair's runs are a minute apart).
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
from tests.support.local_spark import local_spark  # noqa: E402

READY = re.compile(r"halfmq ready: broker (\S+) namesrv (\S+)")


def start_broker(store: str) -> tuple[subprocess.Popen, str]:
    """The broker in its own process, started as `halfmq broker` is (its own GIL, uvloop), on free ports."""
    proc = subprocess.Popen([sys.executable, "-m", "halfmq.broker.cli", "broker", "--bindAddress=127.0.0.1",
                             "--listenPort=0", "--namesrvListenPort=0", "--metricsPromExporterPort=-1",
                             "--grpcListenPort=-1", "--dashboardPort=-1", f"--storePathRootDir={store}", "--logLevel=WARNING"],
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


def timed(write) -> float:
    started = time.perf_counter()
    write()
    return time.perf_counter() - started


def bench_source(spark, namesrv: str, total: int, args) -> None:
    """Source → noop against parquet → noop of the same rows, alternating, medians and their ratio."""
    reader = spark.read.format("halfmq").option("namesrv", namesrv).option("subscribe", "SparkBench")
    if args.min_partitions:
        reader = reader.option("minPartitions", str(args.min_partitions))
    source = reader.load()
    with tempfile.TemporaryDirectory(prefix="halfmq-bench-parquet-") as folder:
        source.write.mode("overwrite").parquet(folder)  # the same rows; also the warm-up (JVM, Python workers)
        parquet = spark.read.parquet(folder)
        parquet.write.format("noop").mode("overwrite").save()
        source_rates, parquet_rates = [], []
        for number in range(1, args.passes + 1):
            source_rates.append(total / timed(lambda: source.write.format("noop").mode("overwrite").save()))
            parquet_rates.append(total / timed(lambda: parquet.write.format("noop").mode("overwrite").save()))
            print(f"pass {number}: source {source_rates[-1]:,.0f} rows/s, parquet {parquet_rates[-1]:,.0f} rows/s",
                  flush=True)
    # Medians of the timed passes: the JVM keeps compiling through the first ones, and this machine is noisy.
    source_rate, parquet_rate = statistics.median(source_rates), statistics.median(parquet_rates)
    print(f"SUMMARY mode=source messages={total} size={args.size} passes={args.passes} "
          f"minPartitions={args.min_partitions or 'unset'} source_rows_per_s={source_rate:,.0f} "
          f"parquet_rows_per_s={parquet_rate:,.0f} ratio={source_rate / parquet_rate:.2f}", flush=True)


def bench_sink(spark, namesrv: str, args) -> None:
    """The halfmq sink against a parquet write of the same rows, alternating, medians and their ratio."""
    from pyspark.sql import functions as F

    rows = args.messages
    padding = "x" * max(0, args.size - 12)
    df = spark.range(0, rows, numPartitions=2).select(
        F.concat(F.col("id").cast("string"), F.lit(padding)).cast("binary").alias("body")).cache()
    df.count()  # the rows are made once: both writes read them from memory
    sink = df.write.format("halfmq").option("namesrv", namesrv).option("topic", "SinkBench").mode("append")
    with tempfile.TemporaryDirectory(prefix="halfmq-bench-parquet-") as folder:
        df.write.mode("overwrite").parquet(folder)  # warm-up (JVM, Python workers)
        sink.save()
        sink_rates, parquet_rates = [], []
        for number in range(1, args.passes + 1):
            sink_rates.append(rows / timed(sink.save))
            parquet_rates.append(rows / timed(lambda: df.write.mode("overwrite").parquet(folder)))
            print(f"pass {number}: sink {sink_rates[-1]:,.0f} rows/s, parquet write {parquet_rates[-1]:,.0f} rows/s",
                  flush=True)
    sink_rate, parquet_rate = statistics.median(sink_rates), statistics.median(parquet_rates)
    print(f"SUMMARY mode=sink rows={rows} size={args.size} passes={args.passes} sink_rows_per_s={sink_rate:,.0f} "
          f"parquet_write_rows_per_s={parquet_rate:,.0f} ratio={sink_rate / parquet_rate:.2f}", flush=True)


def run_sink(args, namesrv: str, scratch: str) -> None:
    spark = local_spark("halfmq-bench-sink", scratch)
    bench_sink(spark, namesrv, args)
    spark.stop()


PASS_LINE = re.compile(r"pass 1: (?:sink|source) ([\d,]+) rows/s, parquet(?: write)? ([\d,]+) rows/s")


def alternate(args) -> None:
    """One timed pass of each checkout's own benchmark in turn (its .venv, its broker), ``--pairs`` times."""
    old, new = (os.path.abspath(tree) for tree in args.alternate)
    if old == new:
        raise SystemExit("--alternate needs two different checkouts")
    rates: dict[str, list[tuple[float, float]]] = {old: [], new: []}
    for pair in range(1, args.pairs + 1):
        for tree in (old, new):
            python = os.path.join(tree, ".venv", "bin", "python")
            cmd = [python if os.path.exists(python) else sys.executable,
                   os.path.join(tree, "scripts", "bench_spark.py"), f"--messages={args.messages}", f"--size={args.size}", f"--queues={args.queues}", "--passes=1"]
            if args.sink:
                cmd.append("--sink")
            if args.min_partitions:
                cmd.append(f"--min-partitions={args.min_partitions}")
            out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
            match = PASS_LINE.search(out.stdout)
            if out.returncode or match is None:
                raise SystemExit(f"the run of {tree} failed (exit {out.returncode}):\n{out.stdout[-2000:]}"
                                 f"{out.stderr[-2000:]}")
            rows, parquet = (float(g.replace(",", "")) for g in match.groups())
            rates[tree].append((rows, parquet))
            print(f"[pair {pair}] {tree}: {rows:,.0f} rows/s, parquet {parquet:,.0f} rows/s", flush=True)
        print(f"[pair {pair}] ratio {rates[new][-1][0] / rates[old][-1][0]:.2f}", flush=True)
    paired = statistics.median(n[0] / o[0] for n, o in zip(rates[new], rates[old]))
    for tree in (old, new):
        median = statistics.median(r for r, _p in rates[tree])
        print(f"SUMMARY mode=alternate kind={'sink' if args.sink else 'source'} tree={tree} pairs={args.pairs} "
              f"median_rows_per_s={median:,.0f} "
              f"median_parquet_rows_per_s={statistics.median(p for _r, p in rates[tree]):,.0f} "
              f"ratio={median / statistics.median(r for r, _p in rates[old]):.2f} "
              f"paired_ratio={paired if tree == new else 1.0:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--passes", type=int, default=3, help="timed passes after the warm-up")
    parser.add_argument("--min-partitions", type=int, default=0, help="the source's minPartitions (0: unset)")
    parser.add_argument("--sink", action="store_true",
                        help="measure the sink instead: --messages rows written to halfmq and to parquet")
    parser.add_argument("--alternate", nargs=2, metavar=("OLD", "NEW"),
                        help="compare two checkouts: one timed pass of each in turn, --pairs times")
    parser.add_argument("--pairs", type=int, default=4, help="--alternate: how many pairs of runs")
    args = parser.parse_args()
    if args.alternate:
        return alternate(args)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="halfmq-bench-spark-") as store, \
            tempfile.TemporaryDirectory(prefix="halfmq-bench-spark-scratch-", ignore_cleanup_errors=True) as scratch:
        broker, namesrv = start_broker(store)
        try:
            run(args, namesrv, scratch)
        finally:
            broker.send_signal(signal.SIGTERM)
            broker.wait(30)


def run(args, namesrv: str, scratch: str) -> None:
    if args.sink:
        return run_sink(args, namesrv, scratch)
    started = time.perf_counter()
    total = asyncio.run(fill(namesrv, "SparkBench", args.messages, args.size, args.queues))
    print(f"filled {total:,} messages in {time.perf_counter() - started:.1f} s", flush=True)

    spark = local_spark("halfmq-bench-source", scratch)
    bench_source(spark, namesrv, total, args)
    spark.stop()


if __name__ == "__main__":
    main()
