"""Send latency while retention deletes a million messages (issue 13).

    python scripts/bench_retention.py --fill 1000000 --size 1024 --inflight 64 --duration 10

A broker process (SYNC_FLUSH, as deployed) over a temporary store is filled with ``--fill`` small messages, which
then age past the retention (fileReservedTime=0.0001 h). Three phases of ``--inflight`` concurrent sends of
``--size`` bytes follow: without a sweep, during one retention pass (started with DELETE_EXPIRED_COMMITLOG, what
mqadmin's deleteExpiredCommitLog sends) until it has deleted everything, and without a sweep again. The SUMMARY
gives p99 of each phase and the ratio of the sweep's p99 to the quiet phases' (the goal: under 2).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import Progress, Stats, percentile, run_main, start_broker, timed_loop  # noqa: E402

from halfmq.client import Message, MessageQueue, Producer  # noqa: E402
from halfmq.client.admin import Admin  # noqa: E402
from halfmq.protocol.codes import RequestCode  # noqa: E402

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


async def main_async(args) -> None:
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
            before.summary(size=args.size, inflight=args.inflight)
            started = time.perf_counter()
            sweep = asyncio.ensure_future(admin.json_call(await admin.broker_addr(),
                                                          RequestCode.DELETE_EXPIRED_COMMITLOG))
            during = await phase("during-sweep", producer, args, until=sweep)
            result = sweep.result()
            swept = time.perf_counter() - started
            during.summary(size=args.size, inflight=args.inflight)
            after = await phase("quiet-after", producer, args)
            after.summary(size=args.size, inflight=args.inflight)
        quiet = percentile(before.latencies + after.latencies, 99)
        loud = percentile(during.latencies, 99)
        print(f"SUMMARY mode=retention deleted={result['deleted']:,} sweep_s={swept:.1f} "
              f"deleted_per_s={result['deleted'] / swept:,.0f} p99_quiet_ms={quiet * 1000:.2f} "
              f"p99_sweep_ms={loud * 1000:.2f} ratio={loud / quiet:.2f} (goal < 2)", flush=True)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fill", type=int, default=1_000_000, help="messages to fill and then delete (%(default)s)")
    parser.add_argument("--fill-size", type=int, default=100, help="bytes per filled message (%(default)s)")
    parser.add_argument("--size", type=int, default=1024, help="bytes per measured send (%(default)s)")
    parser.add_argument("--inflight", type=int, default=64, help="concurrent sends (%(default)s)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of each quiet phase (%(default)s)")
    run_main(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
