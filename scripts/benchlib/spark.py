"""Rows/s from the broker into Spark, against the same run's parquet read of the same rows (with --sink: rows/s from
Spark into the broker through the halfmq sink, against the same run's parquet write of the same rows).

Source: a batch read of a pre-filled topic into the `noop` sink; reference: a parquet copy of those rows (written
once, in the same run) read into `noop`. Passes alternate between the two so both see the same machine noise; the
ratio of the medians is the figure to compare. The broker runs in its own process, as deployed; Spark is
`local[2]` on the same machine.

    scripts/bench.py spark --messages 300000 --size 1024
    scripts/bench.py spark --sink --alternate main HEAD --pairs 4

``--alternate OLD NEW`` runs this benchmark (one timed pass each) with the code of checkout OLD, then NEW (each a
folder, run with its .venv when it has one, or a revision), ``--pairs`` times, each with its own broker, and gives
each checkout's median rows/s and NEW's rows/s over OLD's, pair by pair and their median (the machine's speed
drifts over minutes; a pair's runs are a minute apart).
"""
from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from halfmq.client import Message, MessageQueue, Producer, PullConsumer
from tests.support.local_spark import local_spark

from .harness import (ENTRY, drain, remove_temp_stores, run_main, start_broker, stop, temp_store, tree as checkout,
                      tree_command)
from .results import Results, revision

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


def bench_source(spark, namesrv: str, total: int, args, results: Results) -> None:
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
    results.add_all({"source_rows_per_s": (source_rate, "rows/s"), "parquet_rows_per_s": (parquet_rate, "rows/s"),
                     "ratio": (source_rate / parquet_rate, "")}, mode="source", messages=total, size=args.size,
                    passes=args.passes, minPartitions=args.min_partitions or "unset")


def bench_sink(spark, namesrv: str, args, results: Results) -> None:
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
    results.add_all({"sink_rows_per_s": (sink_rate, "rows/s"), "parquet_write_rows_per_s": (parquet_rate, "rows/s"),
                     "ratio": (sink_rate / parquet_rate, "")}, mode="sink", rows=rows, size=args.size,
                    passes=args.passes)


def run_sink(args, results: Results, namesrv: str, scratch: str) -> None:
    spark = local_spark("halfmq-bench-sink", scratch)
    bench_sink(spark, namesrv, args, results)
    spark.stop()


PASS_LINE = re.compile(r"pass 1: (?:sink|source) ([\d,]+) rows/s, parquet(?: write)? ([\d,]+) rows/s")


def alternate(args, results: Results) -> None:
    """One timed pass of this benchmark with each checkout's code in turn (its .venv, its broker), ``--pairs``
    times."""
    old, new = args.alternate
    if old == new:
        raise SystemExit("--alternate needs two different checkouts")
    folders = {spec: checkout(spec) for spec in (old, new)}
    rates: dict[str, list[tuple[float, float]]] = {old: [], new: []}
    for pair in range(1, args.pairs + 1):
        for spec in (old, new):
            python, env = tree_command(folders[spec])
            cmd = [python, str(ENTRY), "spark", f"--messages={args.messages}", f"--size={args.size}",
                   f"--queues={args.queues}", "--passes=1"]
            if args.sink:
                cmd.append("--sink")
            if args.min_partitions:
                cmd.append(f"--min-partitions={args.min_partitions}")
            out = subprocess.run(cmd, cwd=folders[spec], capture_output=True, text=True,
                                 env={**os.environ, **env} if env else None)
            match = PASS_LINE.search(out.stderr)  # a pass's progress line
            if out.returncode or match is None:
                raise SystemExit(f"the run of {spec} failed (exit {out.returncode}):\n{out.stdout[-2000:]}"
                                 f"{out.stderr[-2000:]}")
            rows, parquet = (float(g.replace(",", "")) for g in match.groups())
            rates[spec].append((rows, parquet))
            print(f"[pair {pair}] {spec}: {rows:,.0f} rows/s, parquet {parquet:,.0f} rows/s", flush=True)
        print(f"[pair {pair}] ratio {rates[new][-1][0] / rates[old][-1][0]:.2f}", flush=True)
    paired = statistics.median(n[0] / o[0] for n, o in zip(rates[new], rates[old]))
    for tree in (old, new):
        median = statistics.median(r for r, _p in rates[tree])
        results.add_all({"median_rows_per_s": (median, "rows/s"),
                         "median_parquet_rows_per_s": (statistics.median(p for _r, p in rates[tree]), "rows/s"),
                         "ratio": (median / statistics.median(r for r, _p in rates[old]), ""),
                         "paired_ratio": (paired if tree == new else 1.0, "")},
                        revision(folders[tree]), mode="alternate", kind="sink" if args.sink else "source", tree=tree,
                        pairs=args.pairs)


def add_arguments(parser) -> None:
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


def run(args, results: Results) -> None:
    if args.alternate:
        try:
            return alternate(args, results)
        finally:
            remove_temp_stores()  # the checkouts of revisions
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    run_main(main_async(args, results))


async def main_async(args, results: Results) -> None:
    """The broker in its own process, as deployed (its own GIL, uvloop); Spark in a thread of this one, so that the
    broker's output is read meanwhile (a full pipe would block it)."""
    proc, ready = await start_broker("--metricsPromExporterPort=-1", "--logLevel=WARNING")
    reading = asyncio.get_running_loop().create_task(drain(proc))
    namesrv, scratch = ready.group(2).decode(), temp_store("halfmq-bench-spark-scratch-")
    try:
        if args.sink:
            return await asyncio.to_thread(run_sink, args, results, namesrv, scratch)
        started = time.perf_counter()
        total = await fill(namesrv, "SparkBench", args.messages, args.size, args.queues)
        print(f"filled {total:,} messages in {time.perf_counter() - started:.1f} s", flush=True)
        await asyncio.to_thread(run_source, args, results, namesrv, total, scratch)
    finally:
        reading.cancel()
        await stop([proc])


def run_source(args, results: Results, namesrv: str, total: int, scratch: str) -> None:
    spark = local_spark("halfmq-bench-source", scratch)
    bench_source(spark, namesrv, total, args, results)
    spark.stop()
