"""Send latency while retention deletes a million messages (issue 13).

    scripts/bench.py retention --fill 1000000 --size 1024 --inflight 64 --duration 10

A broker process (SYNC_FLUSH, as deployed) over a temporary store is filled with ``--fill`` small messages, which
then age past the retention (fileReservedTime=0.0001 h). Three phases of ``--inflight`` concurrent sends of
``--size`` bytes follow: without a sweep, during one retention pass (started with DELETE_EXPIRED_COMMITLOG, what
mqadmin's deleteExpiredCommitLog sends) until it has deleted everything, and without a sweep again. The figures
give p99 of each phase and the ratio of the sweep's p99 to the quiet phases' (the goal: under 2).
"""
from __future__ import annotations

import asyncio
import os
import time

from halfmq.client import Message, MessageQueue, Producer
from halfmq.client.admin import Admin
from halfmq.protocol.codes import RequestCode

from .harness import run_main, start_broker, stop
from .load import Progress, Stats, percentile, timed_loop
from .results import Results

FILL_TOPIC, SEND_TOPIC = "RetentionFill", "RetentionBench"
BATCH = 256
RETENTION_S = 0.36  # fileReservedTime=0.0001 h


async def fill(namesrv: str, count: int, size: int) -> None:
    body = os.urandom(size)
    sent = 0
    async with Producer("BENCH_FILL", namesrv) as producer, Progress("fill", lambda: sent, count):
        first = (await producer.send(Message(FILL_TOPIC, body))).queue  # creates the topic
        queues = [MessageQueue(FILL_TOPIC, first.broker_name, q) for q in range(4)]
        sent = 1

        async def worker(index: int):
            nonlocal sent
            while sent < count:
                n = min(BATCH, count - sent)
                sent += n
                await producer.send_batch([Message(FILL_TOPIC, body) for _ in range(n)], queues[index % len(queues)])

        await asyncio.gather(*(worker(i) for i in range(4)))


async def phase(name: str, producer: Producer, args, until: asyncio.Future | None = None) -> Stats:
    body = os.urandom(args.size)
    stats = Stats(name)
    if until is None:
        await timed_loop(args.inflight, args.duration, lambda: producer.send(Message(SEND_TOPIC, body)), stats)
        return stats

    async def loop_until_done():
        while not until.done():
            await timed_loop(args.inflight, 1.0, lambda: producer.send(Message(SEND_TOPIC, body)), stats)

    await loop_until_done()
    return stats


async def main_async(args, results: Results) -> None:
    proc, ready = await start_broker("--logLevel=WARNING", "--fileReservedTime=0.0001",
                                     "--cleanResourceInterval=3600000", "--metricsPromExporterPort=-1",
                                     f"--maxMapSize={64 << 30}")
    namesrv = ready.group(2).decode()
    try:
        await fill(namesrv, args.fill, args.fill_size)
        await asyncio.sleep(RETENTION_S)  # the fill must be older than the retention: age is what it reads
        async with Producer("BENCH_PG", namesrv) as producer, Admin(namesrv, timeout=3600) as admin:
            await producer.send(Message(SEND_TOPIC, b"create"))
            before = await phase("quiet-before", producer, args)
            before.summary(results, size=args.size, inflight=args.inflight)
            started = time.perf_counter()
            sweep = asyncio.ensure_future(admin.json_call(await admin.broker_addr(),
                                                          RequestCode.DELETE_EXPIRED_COMMITLOG))
            during = await phase("during-sweep", producer, args, until=sweep)
            result = sweep.result()
            swept = time.perf_counter() - started
            during.summary(results, size=args.size, inflight=args.inflight)
            after = await phase("quiet-after", producer, args)
            after.summary(results, size=args.size, inflight=args.inflight)
        quiet = percentile(before.latencies + after.latencies, 99)
        loud = percentile(during.latencies, 99)
        results.add_all({"deleted": (result["deleted"], "msg"), "sweep_s": (swept, "s"),
                         "deleted_per_s": (result["deleted"] / swept, "msg/s"), "p99_quiet_ms": (quiet * 1000, "ms"),
                         "p99_sweep_ms": (loud * 1000, "ms"), "sweep_quiet_p99_ratio": (loud / quiet, "goal < 2")},
                        mode="retention", size=args.size, inflight=args.inflight)
    finally:
        await stop([proc])


def add_arguments(parser) -> None:
    parser.add_argument("--fill", type=int, default=1_000_000, help="messages to fill and then delete (%(default)s)")
    parser.add_argument("--fill-size", type=int, default=100, help="bytes per filled message (%(default)s)")
    parser.add_argument("--size", type=int, default=1024, help="bytes per measured send (%(default)s)")
    parser.add_argument("--inflight", type=int, default=64, help="concurrent sends (%(default)s)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of each quiet phase (%(default)s)")


def run(args, results: Results) -> None:
    run_main(main_async(args, results))
