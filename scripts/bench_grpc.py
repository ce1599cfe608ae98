"""gRPC sends/s beside remoting sends/s against one broker, in the same run (issue 15).

    python scripts/bench_grpc.py --size 1024 --inflight 64 --duration 10

Starts a broker subprocess (SYNC_FLUSH, free ports, a temporary store), then measures in turn: remoting sends with
halfmq's asyncio Producer, and gRPC SendMessage calls (what the RocketMQ 5 clients send) on one grpc.aio channel,
each with ``--inflight`` requests in flight. The gRPC requests are serialized before the clock starts (distinct
message ids), so the figure is the broker's, not the load generator's protobuf encoding. Prints both SUMMARY lines
and the ratio.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402

from bench import Stats, run_main, run_producer, start_broker, timed_loop  # noqa: E402
from halfmq.broker.grpc.schema import SERVICE, Code, MessageType, pb  # noqa: E402


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


async def run_grpc(args, endpoint: str) -> float:
    requests = send_requests(args.topic + "Grpc", args.size, 4096)
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
        stats = Stats("grpc-producer")
        await timed_loop(args.inflight, args.duration, one, stats)
        return stats.summary(size=args.size, inflight=args.inflight)


async def main_async(args) -> None:
    proc, ready = await start_broker("--metricsPromExporterPort=-1", "--grpcListenPort=0", "--logLevel=WARNING")
    line = ready.string.decode()
    endpoint = line.split(" grpc ")[1].split()[0]
    try:
        started = time.perf_counter()
        remoting = await run_producer(args, ready.group(2).decode(), args.topic)
        grpc_tps = await run_grpc(args, endpoint)
        print(f"RESULT remoting_tps={remoting:,.0f} grpc_tps={grpc_tps:,.0f} grpc/remoting={grpc_tps / remoting:.0%} "
              f"size={args.size} inflight={args.inflight} ({time.perf_counter() - started:.0f} s)", flush=True)
    finally:
        proc.terminate()
        await proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topic", default="BenchTopic")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0)
    run_main(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
