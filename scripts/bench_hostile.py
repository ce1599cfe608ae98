"""The "hostile neighbour" benchmark (issue 11): a good client keeps sending and pulling at 64 in flight while each
attack runs in turn against the same broker; per attack it reports the good client's errors and latency and the
broker's peak RSS.

    python scripts/bench_hostile.py --spawn-broker                # every attack, 10 s each
    python scripts/bench_hostile.py --spawn-broker --attacks pipelined_pulls,partial_frames --duration 5

Acceptance: 0 errors, p99 under 50 ms, broker RSS under 512 MiB during every attack. Attacks (the issue's):
``pipelined_pulls`` (3 connections pipeline pulls of 1 MiB answers and never read), ``held_pulls`` (one
connection parks 100k long-poll pulls), ``partial_frames`` (40 connections announce 16 MiB frames and trickle),
``huge_batch`` (a 15 MiB batch of ~680k tiny messages, again and again), ``max_batches`` (the largest batch
allowed, back to back: a heavy legitimate neighbour; not in the default list),
``many_groups`` (heartbeats naming thousands of client-chosen groups), ``many_consumers`` (2,000 consumers join
one group), ``many_topics`` (sends naming 20,000 new topics), ``none`` (a baseline).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import Stats, percentile, run_main, start_broker  # noqa: E402
from halfmq.client import Message, Producer, PullConsumer  # noqa: E402
from halfmq.protocol.codes import RequestCode  # noqa: E402
from halfmq.protocol.command import RemotingCommand  # noqa: E402
from halfmq.protocol.frame import FrameDecoder  # noqa: E402
from halfmq.protocol.message import BatchItem, encode_batch  # noqa: E402
from halfmq.protocol.properties import encode_properties  # noqa: E402

ATTACKS = ["none", "pipelined_pulls", "held_pulls", "partial_frames", "huge_batch", "many_groups", "many_consumers",
           "many_topics"]  # the issue's
OPTIONAL = ["max_batches"]


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def spawn_broker() -> tuple[asyncio.subprocess.Process, str, str]:
    proc, ready = await start_broker("--metricsPromExporterPort=-1", "--logLevel=ERROR",
                                     "--serverChannelMaxIdleTimeSeconds=0")
    asyncio.get_running_loop().create_task(_drain(proc))
    return proc, ready.group(1).decode(), ready.group(2).decode()


async def _drain(proc) -> None:
    while await proc.stdout.readline():
        pass


def pull_frame(opaque: int, topic: str, offset: int = 0, suspend_ms: int = 0, max_nums: int = 32) -> bytes:
    ext = {"consumerGroup": "ATTACK_CG", "topic": topic, "queueId": "0", "queueOffset": str(offset),
           "maxMsgNums": str(max_nums), "sysFlag": str(4 | (2 if suspend_ms else 0)), "commitOffset": "0",
           "suspendTimeoutMillis": str(suspend_ms), "subVersion": "0", "subscription": "*", "expressionType": "TAG"}
    return RemotingCommand(RequestCode.PULL_MESSAGE, opaque, ext_fields=ext).encode()


def send_frame(opaque: int, code: int, topic: str, body: bytes) -> bytes:
    ext = {"a": "ATTACK_PG", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0",
           "i": encode_properties({"UNIQ_KEY": f"{opaque:032X}"}), "j": "0", "k": "false", "m": "true"}
    return RemotingCommand(code, opaque, ext_fields=ext, body=body).encode()


class Attack:
    """Runs in the benchmark's loop; plain sockets (they must not read) are driven from threads."""

    def __init__(self, addr: str, stop: asyncio.Event):
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self.stop = stop
        self.socks: list[socket.socket] = []

    def connect(self, rcvbuf: int | None = None) -> socket.socket:
        sock = socket.socket()
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.connect((self.host, self.port))
        self.socks.append(sock)
        return sock

    def close(self) -> None:
        for sock in self.socks:
            try:
                sock.close()
            except OSError:
                pass

    @staticmethod
    async def in_threads(fn, *args_each) -> None:
        """``fn(args)`` for each, each on its own thread (asyncio.to_thread's pool has only a few)."""
        with ThreadPoolExecutor(max_workers=max(1, len(args_each))) as pool:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(pool, fn, *args) for args in args_each))

    @staticmethod
    def send_all(sock: socket.socket, data: bytes, stop: asyncio.Event) -> None:
        sock.settimeout(0.5)
        view = memoryview(data)
        while view and not stop.is_set():
            try:
                sent = sock.send(view[:1 << 20])
            except TimeoutError:
                continue  # the broker stopped reading: exactly what it should do
            except OSError:
                return
            view = view[sent:]

    async def pipelined_pulls(self) -> None:
        frames = b"".join(pull_frame(i, "HostileBulk") for i in range(20_000))
        socks = [self.connect(rcvbuf=4096) for _ in range(3)]
        await self.in_threads(self.send_all, *((s, frames, self.stop) for s in socks))
        await self.stop.wait()

    async def held_pulls(self) -> None:
        sock = self.connect(rcvbuf=1 << 20)
        frames = b"".join(pull_frame(i, "HostileEmpty", offset=0, suspend_ms=60_000) for i in range(100_000))
        await asyncio.to_thread(self.send_all, sock, frames, self.stop)
        await self.stop.wait()

    async def partial_frames(self) -> None:
        socks = [self.connect() for _ in range(40)]
        head = struct.pack(">II", 16 << 20, 40)
        chunk = b"\0" * (1 << 20)

        def trickle(sock):
            self.send_all(sock, head + chunk * 15, self.stop)  # 15 of the announced 16 MiB, then a byte a second
            while not self.stop.is_set():
                try:
                    sock.send(b"\0")
                except OSError:
                    return
                self.stop_wait(1.0)

        await self.in_threads(trickle, *((s,) for s in socks))

    def stop_wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.stop.is_set():
            time.sleep(0.05)

    async def huge_batch(self) -> None:
        """The issue's 15 MiB batch of ~680k tiny messages, again and again (each waits for its answer)."""
        props = encode_properties({"UNIQ_KEY": "0A000001000000000000000000"})
        huge = encode_batch([BatchItem(b"", props)] * (15 * (1 << 20) // (22 + len(props))))
        await asyncio.to_thread(self._hammer, huge)

    async def max_batches(self) -> None:
        """The largest batch allowed (maxBatchMessageCount tiny messages), one in flight at a time, back to back:
        not an attack, a heavy but legitimate neighbour."""
        props = encode_properties({"UNIQ_KEY": "0A000001000000000000000000"})
        await asyncio.to_thread(self._hammer, encode_batch([BatchItem(b"x" * 16, props)] * self.batch_count))

    batch_count = 10_000

    def _hammer(self, body: bytes) -> None:
        """Send one batch, wait for its answer, again until stopped."""
        sock = self.connect()
        sock.settimeout(0.5)
        decoder = FrameDecoder(64 << 20)
        frame = send_frame(1, RequestCode.SEND_BATCH_MESSAGE, "HostileBatch", body)  # built once: CPU is shared
        while not self.stop.is_set():
            self.send_all(sock, frame, self.stop)
            answered = False
            while not answered and not self.stop.is_set():
                try:
                    data = sock.recv(1 << 20)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                answered = bool(decoder.feed(data))

    def _read_all(self, sock) -> None:
        sock.settimeout(0.5)
        while not self.stop.is_set():
            try:
                if not sock.recv(1 << 20):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    async def many_groups(self) -> None:
        sock = self.connect()
        reader = asyncio.ensure_future(asyncio.to_thread(self._read_all, sock))
        n = 0
        while not self.stop.is_set():
            body = json.dumps({"clientID": f"attacker-{n}", "producerDataSet": [],
                               "consumerDataSet": [{"groupName": f"G{n}-{i}", "consumeType": "CONSUME_PASSIVELY",
                                                    "messageModel": "CLUSTERING",
                                                    "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                                                    "subscriptionDataSet": [{"topic": f"T{n}-{i}", "subString": "*"}]}
                                                   for i in range(100)]}).encode()
            await asyncio.to_thread(self.send_all, sock, RemotingCommand(RequestCode.HEART_BEAT, n, body=body).encode(),
                                    self.stop)
            n += 1
            if n >= 30:
                await self.stop.wait()
        reader.cancel()

    async def many_consumers(self) -> None:
        """2,000 consumers join one group (each joining notifies the members already there)."""
        def join(first: int, count: int) -> None:
            for n in range(first, first + count):
                if self.stop.is_set():
                    return
                sock = self.connect()
                body = json.dumps({"clientID": f"joiner-{n}", "producerDataSet": [], "consumerDataSet": [{
                    "groupName": "CROWD", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                    "subscriptionDataSet": [{"topic": "HostileGood", "subString": "*"}]}]}).encode()
                sock.sendall(RemotingCommand(RequestCode.HEART_BEAT, n, body=body).encode())

        await self.in_threads(join, *((i * 500, 500) for i in range(4)))
        await self.stop.wait()

    async def many_topics(self) -> None:
        """Sends that name 20,000 new topics (auto-creation), pipelined on one connection."""
        sock = self.connect()
        reader = asyncio.ensure_future(asyncio.to_thread(self._read_all, sock))
        frames = b"".join(send_frame(i, RequestCode.SEND_MESSAGE_V2, f"Spam{i}", b"x") for i in range(20_000))
        await asyncio.to_thread(self.send_all, sock, frames, self.stop)
        await self.stop.wait()
        reader.cancel()

    async def none(self) -> None:
        await self.stop.wait()


async def good_client(namesrv: str, duration: float, inflight: int) -> tuple[Stats, Stats]:
    """Half the in-flight requests send 1 KiB messages, half pull them back."""
    sends, pulls = Stats("send"), Stats("pull")
    body = os.urandom(1024)
    deadline = time.perf_counter() + duration
    async with Producer("GOOD_PG", namesrv, retry_times=0) as producer, \
            PullConsumer("GOOD_CG", namesrv) as consumer:
        await producer.send(Message("HostileGood", body))
        queues = await consumer.fetch_subscribe_queues("HostileGood")

        async def sender():
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    await asyncio.wait_for(producer.send(Message("HostileGood", body)), 10)
                    sends.record(time.perf_counter() - t0)
                except Exception as exc:  # noqa: BLE001 - counted
                    sends.errors += 1
                    if sends.errors < 4:
                        print(f"  send error: {exc!r}", flush=True)

        async def puller(index: int):
            queue = queues[index % len(queues)]
            offset = 0
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    result = await asyncio.wait_for(consumer.pull(queue, offset, 32), 10)
                    pulls.record(time.perf_counter() - t0)
                    offset = result.next_begin_offset
                except Exception as exc:  # noqa: BLE001 - counted
                    pulls.errors += 1
                    if pulls.errors < 4:
                        print(f"  pull error: {exc!r}", flush=True)

        await asyncio.gather(*(sender() for _ in range(inflight // 2)),
                             *(puller(i) for i in range(inflight - inflight // 2)))
    return sends, pulls


async def prepare(addr_namesrv: str) -> None:
    async with Producer("PREP_PG", addr_namesrv) as producer:
        for _ in range(32):  # 1 MiB answers for the pipelined pulls
            await producer.send(Message("HostileBulk", os.urandom(32 << 10)), )
        await producer.send(Message("HostileEmpty", b"x"))
        await producer.send(Message("HostileGood", b"x"))  # before any attack: a topic quota may fill up


async def run_attack_process(name: str, broker: str, duration: float) -> None:
    """The attacker's side, in its own process (its sockets and threads must not slow the good client down)."""
    stop = asyncio.Event()
    attack = Attack(broker, stop)
    asyncio.get_running_loop().call_later(duration, stop.set)
    try:
        await getattr(attack, name)()
    finally:
        attack.close()


async def one_round(name: str, args) -> tuple[str, int, float, float]:
    proc = None
    if args.spawn_broker:
        proc, broker, namesrv = await spawn_broker()
        pid = proc.pid
    else:
        broker, namesrv, pid = args.broker, args.namesrv, args.pid
    try:
        await prepare(namesrv)
        attacker = await asyncio.create_subprocess_exec(sys.executable, __file__, "--attack-only", name,
                                                        "--broker", broker, "--duration", str(args.duration + 2),
                                                        "--batch-count", str(args.batch_count))
        stop = asyncio.Event()
        peak = [rss_mib(pid)]

        async def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], rss_mib(pid))
                try:
                    await asyncio.wait_for(stop.wait(), 0.2)
                except asyncio.TimeoutError:
                    pass

        sampler = asyncio.ensure_future(sample())
        try:
            await asyncio.sleep(1.0)  # the attack gets going before the good client starts measuring
            sends, pulls = await good_client(namesrv, args.duration, args.inflight)
        finally:
            stop.set()
            await sampler
            try:
                await asyncio.wait_for(attacker.wait(), 20)
            except asyncio.TimeoutError:
                attacker.kill()
                await attacker.wait()
    finally:
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
    lat = sends.latencies + pulls.latencies
    errors = sends.errors + pulls.errors
    print(f"ATTACK {name:16s} errors={errors} sends={sends.count} pulls={pulls.count} "
          f"p50_ms={percentile(lat, 50) * 1000:.2f} p99_ms={percentile(lat, 99) * 1000:.2f} "
          f"max_ms={max(lat, default=0) * 1000:.2f} broker_rss_peak_mib={peak[0]:.0f}", flush=True)
    return name, errors, percentile(lat, 99), peak[0]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spawn-broker", action="store_true", help="a fresh broker for each attack")
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--broker", default="127.0.0.1:10911", help="broker address (without --spawn-broker)")
    parser.add_argument("--pid", type=int, default=0, help="broker pid for RSS (without --spawn-broker)")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--batch-count", type=int, default=10_000, help="messages in a max_batches batch")
    parser.add_argument("--attack-only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack_only:
        Attack.batch_count = args.batch_count
        await run_attack_process(args.attack_only, args.broker, args.duration)
        return
    results = [await one_round(name, args) for name in args.attacks.split(",")]
    ok = all(e == 0 and p99 < 0.050 and rss < 512 for _n, e, p99, rss in results)
    print(f"SUMMARY hostile ok={ok} " + " ".join(f"{n}=e{e}/p99:{p * 1000:.1f}ms/rss:{r:.0f}MiB"
                                                  for n, e, p, r in results), flush=True)


if __name__ == "__main__":
    run_main(main())  # the brokers' temporary stores are removed at the end, also after an error or Ctrl-C
