"""Slow-disk benchmark: does a busy broker still answer another client's pulls quickly when every fsync is slow?

    scripts/bench.py slow-disk [--fsync-ms 20] [--duration 10] [--inflight 64] [--size 1024]

Mounts powerfs (tests/support/powerfs.py) over a temp folder with each fsync taking ``--fsync-ms`` (a network
disk), starts a broker on it (a subprocess, SYNC_FLUSH), and runs two clients at once:

- the load: one producer with ``--inflight`` sends in flight of ``--size`` bytes each (as ``bench.py send``);
- the probe, in a process of its own (so the load's event loop does not delay it): every ``--probe-every-ms`` a
  PULL of the load topic's first messages, then a GET_MAX_OFFSET, each timed.

Prints sends/s and the probe's p50/p99/max latencies, and whether the pulls meet the store's acceptance bound
(a pull from another client answered within 50 ms). Needs FUSE (``scripts/install_fuse.sh``, as root) and
``pip install -e .[test]``. The mount and the temp folder are removed at the end, also on Ctrl-C or an error.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from halfmq.client import Message, MessageQueue, Producer, PullConsumer
from tests.support.powermount import PowerDisk

from .harness import drain, helper, run_main, start_broker, stop
from .load import Stats, percentile, timed_loop
from .results import Results

TOPIC = "SlowDiskBench"
PULL_BOUND_MS = 50.0


def summary(name: str, seconds: list[float]) -> dict:
    return {"name": name, "count": len(seconds), "p50_ms": percentile(seconds, 50) * 1000,
            "p99_ms": percentile(seconds, 99) * 1000, "max_ms": max(seconds, default=0.0) * 1000,
            "over_bound": sum(s * 1000 > PULL_BOUND_MS for s in seconds)}


async def probe(namesrv: str, broker_name: str, duration: float, every_s: float) -> list[dict]:
    """The other client: a pull and a GET_MAX_OFFSET every ``every_s`` seconds for ``duration`` seconds."""
    pulls, max_offsets = [], []
    queue = MessageQueue(TOPIC, broker_name, 0)
    async with PullConsumer("BENCH_PROBE", namesrv) as consumer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration
        tick = loop.time()
        while loop.time() < deadline:
            t0 = time.perf_counter()
            await consumer.pull(queue, 0, max_nums=32)
            t1 = time.perf_counter()
            await consumer.max_offset(queue)
            t2 = time.perf_counter()
            pulls.append(t1 - t0)
            max_offsets.append(t2 - t1)
            tick += every_s  # a fixed pace, not back to back: the probe is a light, steady client
            await asyncio.sleep(max(0.0, tick - loop.time()))
    return [summary("pull", pulls), summary("get_max_offset", max_offsets)]


async def main_async(args, results: Results) -> None:
    with PowerDisk(fsync_delay_ms=args.fsync_ms, prefix="halfmq-slowdisk-") as disk:
        proc = None
        try:
            proc, ready = await start_broker("--mapSize=4294967296", "--logLevel=WARNING", store=disk.power_on())
            asyncio.get_running_loop().create_task(drain(proc))
            namesrv = ready.group(2).decode()
            body = os.urandom(args.size)
            async with Producer("BENCH_SLOW_PG", namesrv) as producer:
                first = await producer.send(Message(TOPIC, body))  # creates the topic; the probe pulls it
                prober = await asyncio.create_subprocess_exec(
                    *helper("slow-disk", "--helper-probe", namesrv, first.queue.broker_name),
                    f"--duration={args.duration}", f"--probe-every-ms={args.probe_every_ms}",
                    stdout=asyncio.subprocess.PIPE)
                stats = Stats("producer")
                await timed_loop(args.inflight, args.duration, lambda: producer.send(Message(TOPIC, body)), stats)
                out, _ = await prober.communicate()
            sends_per_s = stats.summary(results, size=args.size, inflight=args.inflight, fsync_ms=args.fsync_ms)
            for line in json.loads(out):
                results.add_all({"count": (line["count"], ""), "p50_ms": (line["p50_ms"], "ms"),
                                 "p99_ms": (line["p99_ms"], "ms"), "max_ms": (line["max_ms"], "ms"),
                                 f"over_{PULL_BOUND_MS:.0f}ms": (line["over_bound"], "")},
                                mode="probe", op=line["name"], fsync_ms=args.fsync_ms)
            pull = json.loads(out)[0]
            verdict = "met" if pull["max_ms"] <= PULL_BOUND_MS else "NOT met"
            print(f"ACCEPTANCE pull answered within {PULL_BOUND_MS:.0f} ms while {sends_per_s:,.0f} sends/s run "
                  f"on a {args.fsync_ms:g} ms-fsync disk: {verdict} (max {pull['max_ms']:.1f} ms, "
                  f"p99 {pull['p99_ms']:.1f} ms)", flush=True)
        finally:
            await stop([proc] if proc else [])
            disk.power_off()


def add_arguments(parser) -> None:
    parser.add_argument("--fsync-ms", type=float, default=20.0, help="how long each fsync takes on the disk")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--probe-every-ms", type=float, default=5.0)
    parser.add_argument("--helper-probe", nargs=2, metavar=("NAMESRV", "BROKER_NAME"), help=argparse.SUPPRESS)


def run(args, results: Results) -> None:
    if args.helper_probe:  # the probe process: results as one JSON line on stdout
        print(json.dumps(asyncio.run(probe(*args.helper_probe, args.duration, args.probe_every_ms / 1000))))
        return
    run_main(main_async(args, results))
