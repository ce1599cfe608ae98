"""Sends, pulls and transactions against one broker or a broker group, modelled on RocketMQ's benchmarks.

    scripts/bench.py send         --spawn-broker --size 1024 --inflight 64 --duration 10
    scripts/bench.py consume      --spawn-broker --messages 300000
    scripts/bench.py transactions --spawn-broker --unknown 0.1 --rollback 0.1 --check-timeout 1000
    scripts/bench.py compare      --spawn-broker   # plain against transactional sends, same run

Prints TPS and RT p50/p99/max every few seconds, then the run's figures. With --spawn-broker a broker (of
``--broker-tree``; ``--replicas N``: a group of N) is started for the run (SYNC_FLUSH unless --async-flush). Filling
and draining phases print their progress every second. ``--client raw`` puts the load on with rawload.py (a lean
generator over one connection) instead of the project's client.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
import urllib.request

from halfmq.client import (LocalTransactionState, Message, MessageQueue, Producer, PullConsumer,
                           TransactionProducer)
from halfmq.client.route import DEFAULT_QUEUE_NUMS

from .harness import run_main, start_group, stop
from .load import Progress, Stats, percentile, timed_loop
from .rawload import RawProducer
from .results import Results, revision

S = LocalTransactionState
#: subcommand → the mode of its run
MODES = {"send": "producer", "consume": "consumer", "transactions": "transaction", "compare": "compare"}


async def run_raw(args, results: Results, namesrv: str, topic: str, transactional: bool, name: str,
                  metrics_addr: str | None = None) -> float:
    """``--client raw``: the load of scripts/rawload.py (a lean generator) over one connection to the broker."""
    if not args.broker:
        raise SystemExit("--client raw needs --spawn-broker or --broker")
    body = os.urandom(args.size)
    async with Producer("BENCH_PG", namesrv) as producer:
        await producer.send(Message(topic, body))  # creates the topic, with the client's DEFAULT_QUEUE_NUMS queues
    raw = RawProducer(topic, body, DEFAULT_QUEUE_NUMS, transactional, "BENCH_TX_PG" if transactional else "BENCH_PG")
    await raw.connect(args.broker)
    try:
        stats = Stats(name)
        await timed_loop(args.inflight, args.duration, raw.send, stats)
        # Halves still pending once the load stops would be decisions the broker never applied.
        extra = {"pending_halves": (await settled_pending(metrics_addr), "")} if transactional else {}
        return stats.summary(results, extra, size=args.size, inflight=args.inflight, client="raw")
    finally:
        raw.close()


async def run_producer(args, results: Results, namesrv: str, topic: str | None = None) -> float:
    if args.client == "raw":
        return await run_raw(args, results, namesrv, topic or args.topic, False, "producer")
    body = os.urandom(args.size)
    async with Producer("BENCH_PG", namesrv) as producer:
        await producer.send(Message(topic or args.topic, body))  # creates the topic
        stats = Stats("producer")
        await timed_loop(args.inflight, args.duration, lambda: producer.send(Message(topic or args.topic, body)), stats)
        return stats.summary(results, size=args.size, inflight=args.inflight)


async def run_consumer(args, results: Results, namesrv: str) -> float:
    body = os.urandom(args.size)
    topic = f"{args.topic}Drain"
    async with Producer("BENCH_PG", namesrv) as producer:
        # The first send creates the topic; its queues are then read from the name server (the sends before
        # used the template route, which has fewer queues). Every message sent is counted, this one too.
        await producer.send(Message(topic, body))
        sent = 1
        queues = (await producer.instance.routes.fetch(topic)).write_queues
        t0 = time.perf_counter()
        per_batch = max(1, min(256, (1 << 20) // (args.size + 200)))

        async def fill(queue: MessageQueue, count: int):
            nonlocal sent
            for start in range(0, count, per_batch):
                n = min(per_batch, count - start)
                await producer.send_batch([Message(topic, body)] * n, queue)
                sent += n

        remaining = max(0, args.messages - sent)
        shares = [remaining // len(queues) + (i < remaining % len(queues)) for i in range(len(queues))]
        async with Progress("fill", lambda: sent, args.messages):
            await asyncio.gather(*(fill(q, n) for q, n in zip(queues, shares, strict=True)))
        print(f"filled {sent:,} messages in {time.perf_counter() - t0:.1f} s", flush=True)
    async with PullConsumer("BENCH_CG", namesrv) as consumer:
        queues = await consumer.fetch_subscribe_queues(topic)
        stats = Stats("consumer")
        stats.started = time.perf_counter()

        async def drain(queue: MessageQueue):
            offset = 0
            end = await consumer.max_offset(queue)
            while offset < end:
                t0 = time.perf_counter()
                result = await consumer.pull(queue, offset, max_nums=args.pull_batch)
                stats.latencies.append(time.perf_counter() - t0)
                stats.count += len(result.messages)
                offset = result.next_begin_offset

        async with Progress("drain", lambda: stats.count, sent):
            await asyncio.gather(*(drain(q) for q in queues))
        if stats.count != sent:
            print(f"WARNING: drained {stats.count:,} messages but filled {sent:,}", flush=True)
        return stats.summary(results, {"filled": (sent, "msg")}, size=args.size, pull_batch=args.pull_batch)


class BenchListener:
    """Local decisions and check answers drawn at the configured rates; counts checks by kind."""

    def __init__(self, args):
        self.args = args
        self.local: dict[str, S] = {}
        self.unknown_at: dict[str, float] = {}
        self.decided_by_check: set[str] = set()
        self.checks = 0
        self.unexpected = 0
        self.duplicated = 0
        self.resolve_times: list[float] = []

    async def execute_local_transaction(self, msg, arg):
        r = random.random()
        state = (S.ROLLBACK_MESSAGE if r < self.args.rollback else
                 S.UNKNOW if r < self.args.rollback + self.args.unknown else S.COMMIT_MESSAGE)
        self.local[msg.keys] = state
        if state is S.UNKNOW:
            self.unknown_at[msg.keys] = time.perf_counter()
        return state

    async def check_local_transaction(self, msg):
        key = msg.keys
        self.checks += 1
        if self.local.get(key, S.UNKNOW) is not S.UNKNOW:
            self.unexpected += 1  # the broker asked about a message the producer already decided
        if key in self.decided_by_check:
            self.duplicated += 1  # asked again after a check already decided it
        r = random.random()
        answer = (S.UNKNOW if r < self.args.check_unknown else
                  S.ROLLBACK_MESSAGE if r < self.args.check_unknown + self.args.check_rollback else S.COMMIT_MESSAGE)
        if answer is not S.UNKNOW:
            self.decided_by_check.add(key)
            if key in self.unknown_at:
                self.resolve_times.append(time.perf_counter() - self.unknown_at[key])
        return answer


def scrape_pending(metrics_addr: str) -> int:
    text = urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=5).read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("rocketmq_half_messages{")))


async def settled_pending(metrics_addr: str | None) -> int | str:
    """Pending halves once the last oneway END_TRANSACTIONs of the run reached the broker (at most 3 s)."""
    if not metrics_addr:
        return "?"
    pending, deadline = scrape_pending(metrics_addr), time.perf_counter() + 3
    while pending and time.perf_counter() < deadline:
        await asyncio.sleep(0.1)  # a benchmark waiting out its tail, not test synchronisation
        pending = scrape_pending(metrics_addr)
    return pending


async def run_transaction(args, results: Results, namesrv: str, metrics_addr: str | None,
                          name: str = "transaction") -> float:
    if args.client == "raw":
        return await run_raw(args, results, namesrv, args.topic + "Tx", True, name, metrics_addr)
    body = os.urandom(args.size)
    listener = BenchListener(args)
    counter = iter(range(1 << 62))
    async with TransactionProducer("BENCH_TX_PG", listener, namesrv) as producer:
        await producer.send(Message(args.topic + "Tx", body))
        stats = Stats(name)
        await timed_loop(args.inflight, args.duration,
                         lambda: producer.send_message_in_transaction(
                             Message(args.topic + "Tx", body, keys=f"k{next(counter)}")), stats)
        unknown = len(listener.unknown_at)
        if unknown:  # let the outstanding checks arrive: they are part of the measurement
            deadline = time.perf_counter() + args.check_timeout / 1000 + 5
            while len(listener.resolve_times) < unknown * (1 - args.check_unknown) * 0.99 \
                    and time.perf_counter() < deadline:
                await asyncio.sleep(0.1)  # a benchmark waiting out its tail, not test synchronisation
        times = listener.resolve_times
        pending = await settled_pending(metrics_addr)
        return stats.summary(results, {
            "checks": (listener.checks, ""), "unexpected_checks": (listener.unexpected, ""),
            "duplicated_checks": (listener.duplicated, ""), "unknown": (unknown, ""), "resolved": (len(times), ""),
            "unknown_to_decision_p50_ms": (percentile(times, 50) * 1000, "ms"),
            "unknown_to_decision_p99_ms": (percentile(times, 99) * 1000, "ms"), "pending_halves": (pending, "")},
            size=args.size, inflight=args.inflight)


async def main_async(args, results: Results) -> None:
    procs = []
    metrics_addr = None
    namesrv = args.namesrv
    if args.spawn_broker:
        flags = ["--metricsPromExporterPort=0",
                 f"--flushDiskType={'ASYNC_FLUSH' if args.async_flush else 'SYNC_FLUSH'}", "--logLevel=WARNING",
                 f"--transactionTimeOut={args.check_timeout}", f"--transactionCheckInterval={args.check_interval}"]
        procs, args.broker, namesrv, metrics_addr = await start_group(args.broker_tree, args.replicas, flags)
        if args.broker_tree:  # the figures are of that checkout's broker
            results.revision = revision(args.broker_tree)
    try:
        mode = MODES[args.benchmark]
        if mode == "producer":
            await run_producer(args, results, namesrv)
        elif mode == "consumer":
            await run_consumer(args, results, namesrv)
        elif mode == "transaction":
            await run_transaction(args, results, namesrv, metrics_addr)
        else:
            plain = await run_producer(args, results, namesrv, args.topic + "Plain")
            args.unknown = args.rollback = 0.0
            tx = await run_transaction(args, results, namesrv, metrics_addr, "transaction-commit")
            results.add("tx_plain_ratio", tx / plain, "", size=args.size, inflight=args.inflight)
    finally:
        await stop(procs)


def add_arguments(parser) -> None:
    add_load_arguments(parser)
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--broker", default="", help="--client raw without --spawn-broker: the broker's address")
    parser.add_argument("--spawn-broker", action="store_true")
    parser.add_argument("--broker-tree", default="",
                        help="--spawn-broker: the checkout whose broker is spawned (with its .venv when it has one)")
    parser.add_argument("--async-flush", action="store_true")
    parser.add_argument("--replicas", type=int, default=1,
                        help="--spawn-broker: a broker group of this many members (a name server, a leader taking "
                             "the load and followers)")
    parser.add_argument("--topic", default="BenchTopic")
    parser.add_argument("--messages", type=int, default=300_000, help="consume: messages to drain")
    parser.add_argument("--pull-batch", type=int, default=1000)
    parser.add_argument("--rollback", type=float, default=0.0, help="share of local ROLLBACK")
    parser.add_argument("--unknown", type=float, default=0.1, help="share of local UNKNOW")
    parser.add_argument("--check-rollback", type=float, default=0.5, help="share of check answers ROLLBACK")
    parser.add_argument("--check-unknown", type=float, default=0.0, help="share of check answers UNKNOW")
    parser.add_argument("--check-timeout", type=int, default=1000, help="broker transactionTimeOut, ms")
    parser.add_argument("--check-interval", type=int, default=30_000, help="broker transactionCheckInterval, ms")


def add_load_arguments(parser) -> None:
    """The load of a run, which ``alternate`` passes on to each of its runs."""
    parser.add_argument("--client", choices=["halfmq", "raw"], default="halfmq",
                        help="the project's client, or the lean load generator of rawload.py (one connection; "
                             "needs --spawn-broker or --broker)")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0)


def run(args, results: Results) -> None:
    run_main(main_async(args, results))
