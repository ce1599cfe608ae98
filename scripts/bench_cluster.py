"""Aggregate durable sends/s of a cluster of 1 broker against 2 (or any counts), on this machine, in one run.

    python scripts/bench_cluster.py                     # 1 and 2 brokers, 3 rounds of 5 s each, 2 client processes
    python scripts/bench_cluster.py --brokers 1 2 3 --rounds 5 --duration 10 --clients 3

Each run starts a name server and N brokers (SYNC_FLUSH: every send acknowledged once synced; each broker on a
temporary store), creates the topic on every broker, then starts ``--clients`` client processes that each send
1 KiB messages with ``--inflight`` sends in flight through the name server, spread over every broker's queues.
The clients warm up, wait, and send for ``--duration`` seconds from the same moment. Configurations alternate,
round after round, so a machine whose load changes meanwhile weighs on each alike.

Clients and brokers share this machine's cores, so beside sends/s each run prints the CPU microseconds per message
of the brokers with their writer processes, and of the clients (their own measure of the sending window), and how
many cores they kept busy together: where the machine is the limit, CPU per message says what another broker
costs or saves. It ends with each configuration's medians and their ratio to the first configuration.

Reuses scripts/bench.py's start_broker, Stats, timed_loop, run_main and CPU readers.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402 - scripts/bench.py, which also puts the repository on sys.path

from halfmq.broker.local_cluster import NAMESRV_READY, Member  # noqa: E402
from halfmq.client import Message, Producer  # noqa: E402
from halfmq.client.admin import Admin  # noqa: E402
from halfmq.client.errors import TopicNotExistError  # noqa: E402

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

        stats = bench.Stats("client")
        cpu = time.process_time()
        await bench.timed_loop(args.inflight, args.duration, send, stats)
        cpu = time.process_time() - cpu
    print("RESULT " + json.dumps({"count": stats.count, "errors": stats.errors, "cpu": cpu,
                                  "elapsed": stats.finished - stats.started, "per_broker": per_broker,
                                  "p50_ms": bench.percentile(stats.latencies, 50) * 1000,
                                  "p99_ms": bench.percentile(stats.latencies, 99) * 1000}), flush=True)


def server_cpu(brokers: list[asyncio.subprocess.Process]) -> float:
    """CPU seconds so far of the brokers and their helper processes (the store's writer)."""
    return sum(bench.cpu_seconds(b.pid) + sum(map(bench.cpu_seconds, bench.child_pids(b.pid))) for b in brokers)


async def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.perf_counter() + timeout
    while not await check():
        if time.perf_counter() > deadline:
            raise SystemExit(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.1)  # a benchmark waiting for its set-up, not test synchronisation


async def one_run(args, broker_count: int) -> dict:
    """A name server and ``broker_count`` brokers, loaded by the clients; the figures of the sending window."""
    folder = bench.temp_store("halfmq-bench-cluster-")  # removed with the brokers' stores at the end
    namesrv = Member("namesrv", [sys.executable, "-m", "halfmq.broker.cli", "namesrv", "--bindAddress=127.0.0.1",
                                 "--listenPort=0"], Path(folder) / "namesrv.log", NAMESRV_READY)
    brokers: list[asyncio.subprocess.Process] = []
    clients: list[asyncio.subprocess.Process] = []
    try:
        addr = (await namesrv.start(30)).group(1).decode()
        started = await asyncio.gather(*(bench.start_broker(
            f"--namesrvAddr={addr}", f"--brokerName=broker-{j}", "--brokerClusterName=BenchCluster",
            "--metricsPromExporterPort=-1", "--logLevel=WARNING") for j in range(broker_count)))
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
        command = [sys.executable, __file__, "client", f"--namesrv={addr}", f"--duration={args.duration}",
                   f"--inflight={args.inflight}", f"--size={args.size}"]
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
        for proc in brokers:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
        await namesrv.stop(30)
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


async def compare(args) -> None:
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
        print(f"SUMMARY brokers={n} clients={args.clients} inflight={args.inflight} size={args.size} "
              f"rounds={args.rounds} duration_s={args.duration:g} median_sends_per_s={median['sends_per_s']:,.0f} "
              f"ratio={median['sends_per_s'] / base:.2f} p50_ms={median['p50_ms']:.2f} p99_ms={median['p99_ms']:.2f} "
              f"cpu_us_per_msg_brokers_writers={median['server_us']:.0f} "
              f"cpu_us_per_msg_clients={median['client_us']:.0f} cores_busy={median['cores_busy']:.2f} "
              f"cores_here={os.cpu_count()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="compare", choices=["compare", "client"],
                        help="compare (the default) runs everything; client is one client process it starts")
    parser.add_argument("--brokers", type=int, nargs="+", default=[1, 2], help="broker counts to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of sending per run")
    parser.add_argument("--clients", type=int, default=2, help="client processes per run")
    parser.add_argument("--inflight", type=int, default=64, help="sends in flight per client")
    parser.add_argument("--size", type=int, default=1024, help="message body bytes")
    parser.add_argument("--namesrv", help="client mode: the name server")
    args = parser.parse_args()
    if min(args.brokers) < 1 or args.rounds < 1 or args.clients < 1 or args.duration <= 0:
        parser.error("--brokers, --rounds and --clients must be at least 1, --duration positive")
    if args.mode == "client":
        bench.run_main(client(args))
    else:
        bench.run_main(compare(args))


if __name__ == "__main__":
    main()
