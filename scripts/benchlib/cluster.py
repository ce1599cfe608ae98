"""Aggregate durable sends/s of a cluster of 1 broker against 2 (or any counts), on this machine, in one run.

    scripts/bench.py cluster                     # 1 and 2 brokers, 3 rounds of 5 s each, 2 client processes
    scripts/bench.py cluster --brokers 1 2 3 --rounds 5 --duration 10 --clients 3

Each run starts a name server and N brokers (SYNC_FLUSH: every send acknowledged once synced; each broker on a
temporary store), creates the topic on every broker, then starts ``--clients`` client processes that each send
1 KiB messages with ``--inflight`` sends in flight through the name server, spread over every broker's queues.
The clients warm up, wait, and send for ``--duration`` seconds from the same moment. Configurations alternate,
round after round, so a machine whose load changes meanwhile weighs on each alike.

Clients and brokers share this machine's cores, so beside sends/s each run prints the CPU microseconds per message
of the brokers with their writer processes, and of the clients (their own measure of the sending window), and how
many cores they kept busy together: where the machine is the limit, CPU per message says what another broker
costs or saves. It ends with each configuration's medians and their ratio to the first configuration.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import time

from halfmq.client import Message, Producer
from halfmq.client.admin import Admin
from halfmq.client.errors import TopicNotExistError

from .harness import child_pids, cpu_seconds, helper, run_main, start_broker, start_namesrv, stop
from .load import Stats, percentile, timed_loop
from .results import Results

TOPIC = "BenchClusterTopic"
GROUP = "BENCH_CLUSTER_PG"
WARMUP_SENDS = 300  #: per client, before the measured window: connections, route, the interpreter's caches


async def client(args) -> None:
    """One client process: warm up, say so, wait for the go line on stdin, send for --duration seconds, print a
    RESULT line (JSON: messages, errors, latencies, messages per broker, the process's CPU seconds meanwhile)."""
    body = os.urandom(args.size)
    per_broker: collections.Counter[str] = collections.Counter()
    async with Producer(GROUP, args.namesrv) as producer:
        for _ in range(WARMUP_SENDS):
            await producer.send(Message(TOPIC, body))
        print("WARM", flush=True)
        if not await asyncio.to_thread(sys.stdin.readline):
            return  # the benchmark that started this client is gone

        async def send() -> None:
            per_broker[(await producer.send(Message(TOPIC, body))).queue.broker_name] += 1

        stats = Stats("client")
        cpu = time.process_time()
        await timed_loop(args.inflight, args.duration, send, stats)
        cpu = time.process_time() - cpu
    print("RESULT " + json.dumps({"count": stats.count, "errors": stats.errors, "cpu": cpu,
                                  "elapsed": stats.finished - stats.started, "per_broker": per_broker,
                                  "p50_ms": percentile(stats.latencies, 50) * 1000,
                                  "p99_ms": percentile(stats.latencies, 99) * 1000}), flush=True)


def server_cpu(brokers: list[asyncio.subprocess.Process]) -> float:
    """CPU seconds so far of the brokers and their helper processes (the store's writer)."""
    return sum(cpu_seconds(b.pid) + sum(map(cpu_seconds, child_pids(b.pid))) for b in brokers)


async def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.perf_counter() + timeout
    while not await check():
        if time.perf_counter() > deadline:
            raise SystemExit(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.1)  # a benchmark waiting for its set-up, not test synchronisation


async def one_run(args, broker_count: int) -> dict:
    """A name server and ``broker_count`` brokers, loaded by the clients; the figures of the sending window."""
    namesrv = None
    brokers: list[asyncio.subprocess.Process] = []
    clients: list[asyncio.subprocess.Process] = []
    try:
        namesrv, addr = await start_namesrv()
        started = await asyncio.gather(*(start_broker(
            f"--namesrvAddr={addr}", f"--brokerName=broker-{j}", "--brokerClusterName=BenchCluster",
            "--metricsPromExporterPort=-1", "--logLevel=WARNING", "--haListenPort=0") for j in range(broker_count)))
        brokers = [proc for proc, _ in started]
        async with Admin(addr) as admin:
            async def registered() -> bool:
                return len(await admin.cluster_list()) == broker_count
            await wait_for(registered, 30, f"{broker_count} brokers registered")
            await admin.update_topic(TOPIC)

            async def routed() -> bool:
                try:
                    route = await admin.topic_route(TOPIC)
                except TopicNotExistError:  # until the first broker has registered it
                    return False
                return len({q["brokerName"] for q in route["queueDatas"]}) == broker_count
            await wait_for(routed, 30, f"the route of {TOPIC} lists every broker")
        command = helper("cluster", "--helper-client", f"--namesrv={addr}", f"--duration={args.duration}",
                         f"--inflight={args.inflight}", f"--size={args.size}")
        clients = [await asyncio.create_subprocess_exec(*command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                   for _ in range(args.clients)]
        for proc in clients:
            while (line := await proc.stdout.readline()) != b"WARM\n":
                if not line:
                    raise SystemExit("a client exited before it warmed up")
        cpu_before, wall = server_cpu(brokers), time.perf_counter()
        for proc in clients:
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        results = []
        for proc in clients:
            async for line in proc.stdout:
                if line.startswith(b"RESULT "):
                    results.append(json.loads(line[7:]))
        server, wall = server_cpu(brokers) - cpu_before, time.perf_counter() - wall
        if len(results) != len(clients):
            raise SystemExit("a client ended without its RESULT line")
    finally:
        for proc in clients:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        await stop(([namesrv] if namesrv else []) + brokers)
    count = sum(r["count"] for r in results)
    clients_cpu = sum(r["cpu"] for r in results)
    spread = collections.Counter()
    for r in results:
        spread.update(r["per_broker"])
    return {"brokers": broker_count, "sends_per_s": sum(r["count"] / r["elapsed"] for r in results),
            "errors": sum(r["errors"] for r in results),
            "p50_ms": statistics.median(r["p50_ms"] for r in results), "p99_ms": max(r["p99_ms"] for r in results),
            "server_us": server / count * 1e6, "client_us": clients_cpu / count * 1e6,
            "cores_busy": (server + clients_cpu) / wall,
            "spread": " ".join(f"{name}:{n / count:.0%}" for name, n in sorted(spread.items()))}


async def compare(args, results: Results) -> None:
    runs: dict[int, list[dict]] = {n: [] for n in args.brokers}
    for round_no in range(1, args.rounds + 1):
        # Every other round in reverse: neither configuration always runs first after a quiet spell.
        for n in (args.brokers if round_no % 2 else args.brokers[::-1]):
            run = await one_run(args, n)
            runs[n].append(run)
            print(f"[round {round_no}] brokers={n} sends/s={run['sends_per_s']:,.0f} errors={run['errors']} "
                  f"p50_ms={run['p50_ms']:.2f} p99_ms={run['p99_ms']:.2f} cpu_us_per_msg "
                  f"brokers+writers={run['server_us']:.0f} clients={run['client_us']:.0f} "
                  f"cores_busy={run['cores_busy']:.2f} spread={run['spread']}", flush=True)
    base = statistics.median(r["sends_per_s"] for r in runs[args.brokers[0]])
    for n, rs in runs.items():
        median = {k: statistics.median(r[k] for r in rs)
                  for k in ("sends_per_s", "p50_ms", "p99_ms", "server_us", "client_us", "cores_busy")}
        results.add_all({"median_sends_per_s": (median["sends_per_s"], "msg/s"),
                         "ratio": (median["sends_per_s"] / base, ""), "p50_ms": (median["p50_ms"], "ms"),
                         "p99_ms": (median["p99_ms"], "ms"),
                         "cpu_us_per_msg_brokers_writers": (median["server_us"], "us/msg"),
                         "cpu_us_per_msg_clients": (median["client_us"], "us/msg"),
                         "cores_busy": (median["cores_busy"], f"of {os.cpu_count()}")},
                        brokers=n, clients=args.clients, inflight=args.inflight, size=args.size, rounds=args.rounds,
                        duration_s=args.duration)


def add_arguments(parser) -> None:
    parser.add_argument("--brokers", type=int, nargs="+", default=[1, 2], help="broker counts to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of sending per run")
    parser.add_argument("--clients", type=int, default=2, help="client processes per run")
    parser.add_argument("--inflight", type=int, default=64, help="sends in flight per client")
    parser.add_argument("--size", type=int, default=1024, help="message body bytes")
    parser.add_argument("--namesrv", help=argparse.SUPPRESS)
    parser.add_argument("--helper-client", action="store_true", help=argparse.SUPPRESS)


def run(args, results: Results) -> None:
    if min(args.brokers) < 1 or args.rounds < 1 or args.clients < 1 or args.duration <= 0:
        raise SystemExit("--brokers, --rounds and --clients must be at least 1, --duration positive")
    if args.helper_client:  # one client process the benchmark starts
        run_main(client(args))
    else:
        run_main(compare(args, results))
