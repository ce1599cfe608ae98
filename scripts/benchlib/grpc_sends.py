"""gRPC sends/s beside remoting sends/s against one broker, in the same run (issue 15).

    scripts/bench.py grpc --size 1024 --inflight 64 --duration 10 --rounds 3
    scripts/bench.py grpc --trees main . --rounds 3   # two checkouts' brokers (a folder or a revision), in turn

Starts a broker subprocess per checkout (SYNC_FLUSH, free ports, a temporary store), then, ``--rounds`` times and
for each broker in turn, measures remoting sends with halfmq's asyncio Producer and gRPC SendMessage calls (what
the RocketMQ 5 clients send) on one grpc.aio channel, each with ``--inflight`` requests in flight. The gRPC
requests are serialized before the clock starts (distinct message ids), so the figure is the broker's, not the load
generator's protobuf encoding. Each run also prints the CPU per send of the broker (its process and its helper
processes, the store's writer) and of this load generator, read from /proc before and after the run: on a busy
machine sends/s swing, CPU per send much less. Ends with each broker's medians and the gRPC/remoting ratios.

A checkout other than this one is imported from its own folders (PYTHONPATH pointing at a ``halfmq`` folder of
links to them) with this checkout's venv.
"""
from __future__ import annotations

import os
import statistics

import grpc

from halfmq.broker.grpc.schema import SERVICE, Code, MessageType, pb
from halfmq.client import Message, Producer

from .harness import (REPO, child_pids, cpu_seconds, grpc_endpoint, has, run_main, start_broker, stop, temp_store,
                      tree as checkout, tree_env)
from .load import Stats, timed_loop
from .results import Results, revision


def send_requests(topic: str, size: int, count: int) -> list[bytes]:
    body = os.urandom(size)
    out = []
    for i in range(count):
        request = pb.SendMessageRequest()
        msg = request.messages.add()
        msg.topic.name = topic
        msg.body = body
        msg.system_properties.message_id = f"01BENCH{i:027X}"
        msg.system_properties.message_type = MessageType["NORMAL"]
        msg.system_properties.born_timestamp.GetCurrentTime()
        msg.system_properties.born_host = "127.0.0.1"
        msg.system_properties.body_encoding = 1  # IDENTITY
        out.append(request.SerializeToString())
    return out


def cpu_now(broker: int) -> tuple[float, float, float]:
    """CPU seconds so far of the broker process, of its helper processes (the store's writer), and of this load
    generator."""
    return cpu_seconds(broker), sum(map(cpu_seconds, child_pids(broker))), cpu_seconds(os.getpid())


class CpuStats(Stats):
    """Stats that remember the broker's CPU when the clock starts (timed_loop starts the load with the clock)."""

    def __init__(self, name: str, pid: int):
        super().__init__(name)
        self.cpu_at_start = cpu_now(pid)


async def run_remoting(args, pid: int, namesrv: str) -> CpuStats:
    body = os.urandom(args.size)
    async with Producer("BENCH_PG", namesrv) as producer:
        await producer.send(Message(args.topic, body))  # creates the topic
        stats = CpuStats("producer", pid)
        await timed_loop(args.inflight, args.duration, lambda: producer.send(Message(args.topic, body)), stats)
        return stats


async def run_grpc(args, pid: int, endpoint: str, requests: list[bytes]) -> CpuStats:
    metadata = (("x-mq-client-id", "bench@1"), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"))
    async with grpc.aio.insecure_channel(endpoint) as channel:
        send = channel.unary_unary(f"/{SERVICE}/SendMessage", request_serializer=None,
                                   response_deserializer=pb.SendMessageResponse.FromString)
        counter = iter(range(1 << 62))

        async def one() -> None:
            answer = await send(requests[next(counter) % len(requests)], metadata=metadata, timeout=10)
            if answer.status.code != Code["OK"]:
                raise RuntimeError(f"{answer.status.code} {answer.status.message}")

        await one()  # creates the topic
        stats = CpuStats("grpc-producer", pid)
        await timed_loop(args.inflight, args.duration, one, stats)
        return stats


async def measured(pid: int, run) -> tuple[float, float, float, float]:
    """(sends/s, CPU microseconds per send of the broker process, of its helper processes, of the load generator)
    of one run, whose setup (connecting, the first send) is not counted."""
    stats = await run
    per_send = [(now - then) * 1e6 / max(1, stats.count)
                for now, then in zip(cpu_now(pid), stats.cpu_at_start, strict=True)]
    return stats.count / (stats.finished - stats.started), *per_send


async def start_tree_broker(spec: str):
    """(tree, process, namesrv address, gRPC endpoint) of a broker running checkout ``spec``'s code."""
    tree = checkout(spec)
    proc, ready = await start_broker("--metricsPromExporterPort=-1", "--grpcListenPort=0", "--logLevel=WARNING",
                                     dashboard=has(tree, "dashboard"), env=tree_env(tree, temp_store()))
    return spec, proc, ready.group(2).decode(), grpc_endpoint(ready)


async def main_async(args, figures: Results) -> None:
    brokers = []
    try:
        for tree in args.trees:
            brokers.append(await start_tree_broker(tree))
        requests = send_requests(args.topic + "Grpc", args.size, 4096)
        results: dict[str, list[tuple[float, ...]]] = {tree: [] for tree in args.trees}
        for round_no in range(1, args.rounds + 1):
            for tree, proc, namesrv, endpoint in brokers:
                remoting = await measured(proc.pid, run_remoting(args, proc.pid, namesrv))
                grpc_side = await measured(proc.pid, run_grpc(args, proc.pid, endpoint, requests))
                results[tree].append(remoting + grpc_side)
                print(f"ROUND {round_no} tree={tree} remoting_tps={remoting[0]:,.0f} grpc_tps={grpc_side[0]:,.0f} "
                      f"grpc/remoting={grpc_side[0] / remoting[0]:.0%} cpu_us_per_send (broker+writer, client): "
                      f"remoting={remoting[1]:.0f}+{remoting[2]:.0f}, {remoting[3]:.0f} "
                      f"grpc={grpc_side[1]:.0f}+{grpc_side[2]:.0f}, {grpc_side[3]:.0f}", flush=True)
        for tree, rows in results.items():
            tps_r, main_r, helpers_r, client_r, tps_g, main_g, helpers_g, client_g = (
                statistics.median(column) for column in zip(*rows, strict=True))
            ratios = [row[4] / row[0] for row in rows]
            figures.add_all({
                "remoting_tps": (tps_r, "msg/s"), "grpc_tps": (tps_g, "msg/s"),
                "grpc_remoting_ratio": (statistics.median(ratios), " ".join(f"{r:.0%}" for r in ratios)),
                "remoting_broker_cpu_us": (main_r, "us/msg"), "remoting_writer_cpu_us": (helpers_r, "us/msg"),
                "remoting_client_cpu_us": (client_r, "us/msg"), "grpc_broker_cpu_us": (main_g, "us/msg"),
                "grpc_writer_cpu_us": (helpers_g, "us/msg"), "grpc_client_cpu_us": (client_g, "us/msg")},
                revision(checkout(tree)), tree=tree, rounds=args.rounds, size=args.size, inflight=args.inflight)
    finally:
        await stop([proc for _tree, proc, _namesrv, _endpoint in brokers])


def add_arguments(parser) -> None:
    parser.add_argument("--topic", default="BenchTopic")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of each run")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side, alternated")
    parser.add_argument("--trees", nargs="+", default=[str(REPO)],
                        help="checkouts whose brokers are measured in turn, each a folder or a git revision "
                             "(default: this one)")


def run(args, results: Results) -> None:
    run_main(main_async(args, results))
