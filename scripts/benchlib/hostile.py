"""The "hostile neighbour" benchmark (issue 11): two good clients — one remoting (sends and pulls), one RocketMQ 5
gRPC (sends, receives and acknowledgements) — each keep 64 requests in flight while each attack runs in turn against
the same broker; per attack it reports each good client's errors and latency and the broker's peak RSS. The good
clients run at once (``--good-clients together``), or take turns beside the attack (``in-turn``, each for
``--duration``: what the attack does to one good client, without the other's load).

    scripts/bench.py hostile --spawn-broker                # every attack, 10 s each
    scripts/bench.py hostile --spawn-broker --attacks pipelined_pulls,grpc_gzip_bomb --duration 5
    scripts/bench.py hostile --namesrv H:P --broker H:P --grpc-endpoint H:P --pid PID   # a running broker

Acceptance: 0 errors, p99 under 50 ms (each good client), broker RSS under 512 MiB during every attack. Remoting
attacks (the issue's):
``pipelined_pulls`` (3 connections pipeline pulls of 1 MiB answers and never read), ``held_pulls`` (one
connection parks 100k long-poll pulls), ``partial_frames`` (40 connections announce 16 MiB frames and trickle),
``huge_batch`` (a 15 MiB batch of ~680k tiny messages, again and again), ``max_batches`` (the largest batch
allowed, back to back: a heavy legitimate neighbour; not in the default list),
``many_groups`` (heartbeats naming thousands of client-chosen groups), ``many_consumers`` (2,000 consumers join
one group), ``many_topics`` (sends naming 20,000 new topics), ``none`` (a baseline). gRPC attacks:
``grpc_big_messages`` (8 half-sent 40 MiB messages on one connection), ``grpc_unread_receives`` (48 receive streams
on one connection whose 4 MiB answers are never read), ``grpc_telemetry_flood`` (telemetry settings with a 4 MiB user
agent, replies never read), ``grpc_huge_ack`` (AckMessage with 300,000 entries), ``grpc_held_receives`` (5,000
long-poll receives on one connection), ``grpc_gzip_bomb`` (a 191 KiB gzip body inflating to 192 MiB),
``grpc_many_topics_settings`` (150,000 topics in one producer settings message), ``grpc_many_client_ids`` (5,000
client ids of 7 KB, each with a heartbeat and an open telemetry stream). The attacks the two raw HTTP/2 ones need
(a half-sent message, answers never read) are made with RawH2, not grpcio.
"""
from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import socket
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from halfmq.broker.grpc.schema import SERVICE, ClientType, Code, Encoding, FilterType, MessageType, pb
from halfmq.client import Message, Producer, PullConsumer
from halfmq.protocol.codes import RequestCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.frame import FrameDecoder
from halfmq.protocol.message import BatchItem, encode_batch
from halfmq.protocol.properties import encode_properties

from .harness import drain, grpc_endpoint as endpoint_of, helper, rss_mib, run_main, start_broker, stop
from .load import Stats, percentile
from .results import Results

GOOD_GRPC_GROUP = "GOOD_GRPC_CG"
GOOD_GRPC_METADATA = (("x-mq-client-id", "good-grpc@1"), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"))
ATTACKS = ["none", "pipelined_pulls", "held_pulls", "partial_frames", "huge_batch", "many_groups", "many_consumers",
           "many_topics",  # the issue's
           "grpc_big_messages", "grpc_unread_receives", "grpc_telemetry_flood", "grpc_huge_ack", "grpc_held_receives",
           "grpc_gzip_bomb", "grpc_many_topics_settings", "grpc_many_client_ids"]
OPTIONAL = ["max_batches"]
#: the broker accepts 64 MiB messages; the attackers' requests and the good client's answers stay below
GRPC_OPTIONS = [("grpc.max_receive_message_length", 128 << 20), ("grpc.max_send_message_length", 128 << 20)]


async def spawn_broker() -> tuple[asyncio.subprocess.Process, str, str, str]:
    """(process, broker address, name server address, gRPC endpoint) of a fresh broker."""
    proc, ready = await start_broker("--metricsPromExporterPort=-1", "--logLevel=ERROR",
                                     "--serverChannelMaxIdleTimeSeconds=0", "--grpcListenPort=0")
    asyncio.get_running_loop().create_task(drain(proc))
    return proc, ready.group(1).decode(), ready.group(2).decode(), endpoint_of(ready)


def pull_frame(opaque: int, topic: str, offset: int = 0, suspend_ms: int = 0, max_nums: int = 32) -> bytes:
    ext = {"consumerGroup": "ATTACK_CG", "topic": topic, "queueId": "0", "queueOffset": str(offset),
           "maxMsgNums": str(max_nums), "sysFlag": str(4 | (2 if suspend_ms else 0)), "commitOffset": "0",
           "suspendTimeoutMillis": str(suspend_ms), "subVersion": "0", "subscription": "*", "expressionType": "TAG"}
    return RemotingCommand(RequestCode.PULL_MESSAGE, opaque, ext_fields=ext).encode()


def send_frame(opaque: int, code: int, topic: str, body: bytes) -> bytes:
    ext = {"a": "ATTACK_PG", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0",
           "i": encode_properties({"UNIQ_KEY": f"{opaque:032X}"}), "j": "0", "k": "false", "m": "true"}
    return RemotingCommand(code, opaque, ext_fields=ext, body=body).encode()


class RawH2:
    """A minimal HTTP/2 client on a plain socket, for the gRPC attacks grpcio cannot make: a message announced and
    half sent, and streams whose answers are never read (``window`` 0: the broker may never send it DATA). It
    answers the broker's SETTINGS and PINGs (a peer that does not is dropped, which is not the attack) and honours
    the broker's flow-control windows when sending (what the broker grants is what it chose to buffer)."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    DATA, HEADERS, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 4, 6, 7, 8

    def __init__(self, sock: socket.socket, authority: str, stop: asyncio.Event, window: int = 65535):
        self.sock, self.authority, self.stop = sock, authority, stop
        self.write_lock = threading.Lock()
        self.windows = threading.Condition()
        self.conn_window = 65535
        self.initial_window = 65535
        self.stream_windows: dict[int, int] = {}
        self.next_stream = 1
        self.closed = False
        self.frame(self.SETTINGS, 0, 0, struct.pack(">HIHI", 0x2, 0, 0x4, window), preface=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def frame(self, kind: int, flags: int, stream: int, payload: bytes, preface: bool = False) -> None:
        data = (self.PREFACE if preface else b"") + struct.pack(">I", len(payload))[1:] + \
            struct.pack(">BBI", kind, flags, stream) + payload
        with self.write_lock:
            self.sock.sendall(data)

    def _read(self) -> None:
        buffer = b""
        self.sock.settimeout(0.5)
        while not self.stop.is_set():
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                break
            buffer += data
            while len(buffer) >= 9:
                length = int.from_bytes(buffer[:3], "big")
                if len(buffer) < 9 + length:
                    break
                kind, flags, stream = struct.unpack(">BBI", buffer[3:9])
                payload, buffer = buffer[9:9 + length], buffer[9 + length:]
                self._frame_in(kind, flags, stream & 0x7FFFFFFF, payload)
        with self.windows:
            self.closed = True
            self.windows.notify_all()

    def _frame_in(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == self.SETTINGS and not flags & 1:
            with self.windows:
                for i in range(0, len(payload), 6):
                    key, value = struct.unpack(">HI", payload[i:i + 6])
                    if key == 0x4:
                        for sid in self.stream_windows:
                            self.stream_windows[sid] += value - self.initial_window
                        self.initial_window = value
                self.windows.notify_all()
            self.frame(self.SETTINGS, 1, 0, b"")
        elif kind == self.PING and not flags & 1:
            self.frame(self.PING, 1, 0, payload)
        elif kind == self.WINDOW_UPDATE:
            with self.windows:
                grant = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                if stream == 0:
                    self.conn_window += grant
                elif stream in self.stream_windows:
                    self.stream_windows[stream] += grant
                self.windows.notify_all()
        elif kind == self.GOAWAY:
            with self.windows:
                self.closed = True
                self.windows.notify_all()

    @staticmethod
    def _literal(name: str, value: str) -> bytes:
        """An HPACK literal header field without indexing, no Huffman coding."""
        out = b"\x00"
        for text in (name.encode(), value.encode()):
            n = len(text)
            if n < 127:
                out += bytes([n])
            else:
                out += b"\x7f"
                n -= 127
                while n >= 128:
                    out += bytes([n & 0x7F | 0x80])
                    n >>= 7
                out += bytes([n])
            out += text
        return out

    def open(self, method: str, client_id: str) -> int:
        """A new stream calling ``method`` of MessagingService; its id."""
        stream = self.next_stream
        self.next_stream += 2
        headers = [(":method", "POST"), (":scheme", "http"), (":path", f"/{SERVICE}/{method}"),
                   (":authority", self.authority), ("content-type", "application/grpc"), ("te", "trailers"),
                   ("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2")]
        with self.windows:
            self.stream_windows[stream] = self.initial_window
        self.frame(self.HEADERS, 0x4, stream, b"".join(self._literal(k, v) for k, v in headers))
        return stream

    def send(self, stream: int, data: bytes) -> bool:
        """Send ``data`` on the stream as the broker's windows allow; False when stopped or closed first."""
        view = memoryview(data)
        while view:
            with self.windows:
                while not self.closed and not self.stop.is_set() and \
                        min(self.conn_window, self.stream_windows[stream]) <= 0:
                    self.windows.wait(0.5)
                if self.closed or self.stop.is_set():
                    return False
                size = min(16384, len(view), self.conn_window, self.stream_windows[stream])
                self.conn_window -= size
                self.stream_windows[stream] -= size
            try:
                self.frame(self.DATA, 0, stream, bytes(view[:size]))
            except OSError:
                return False
            view = view[size:]
        return True

    @staticmethod
    def message(payload: bytes) -> bytes:
        """A gRPC length-prefixed message (uncompressed)."""
        return b"\x00" + struct.pack(">I", len(payload)) + payload


class Attack:
    """Runs in the benchmark's loop; plain sockets (they must not read) are driven from threads."""

    def __init__(self, addr: str, grpc_endpoint: str, stop: asyncio.Event):
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self.grpc_endpoint = grpc_endpoint
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

    # --- gRPC attacks (the endpoint of RocketMQ 5 clients) ---
    def grpc_sock(self) -> tuple[socket.socket, str]:
        host, port = self.grpc_endpoint.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        self.socks.append(sock)
        return sock, self.grpc_endpoint

    async def grpc_big_messages(self) -> None:
        """8 SendMessage streams on one connection, each announcing a 40 MiB message and sending half of it."""
        h2 = RawH2(*self.grpc_sock(), self.stop)
        half = b"\0" * (20 << 20)

        def half_send(stream: int) -> None:
            h2.send(stream, b"\x00" + struct.pack(">I", 40 << 20) + half)

        streams = [h2.open("SendMessage", f"attacker-big-{i}") for i in range(8)]
        await self.in_threads(half_send, *((s,) for s in streams))
        await self.stop.wait()

    async def grpc_unread_receives(self) -> None:
        """48 ReceiveMessage streams on one connection (each its own group: each gets a full 4 MiB answer of
        HostileBulkGrpc) whose answers are never read: the connection's window for the broker's data is 0."""
        h2 = RawH2(*self.grpc_sock(), self.stop, window=0)
        for i in range(48):
            request = pb.ReceiveMessageRequest(group=pb.Resource(name=f"ATTACK_CG_{i}"), message_queue=pb.MessageQueue(
                topic=pb.Resource(name="HostileBulkGrpc"), id=0), batch_size=32,
                filter_expression=pb.FilterExpression(type=FilterType["TAG"], expression="*"))
            request.invisible_duration.FromSeconds(60)
            stream = h2.open("ReceiveMessage", "attacker-unread@1")
            await asyncio.to_thread(h2.send, stream, h2.message(request.SerializeToString()))
            h2.frame(h2.DATA, 0x1, stream, b"")  # end of the request: the broker answers (into a window of 0)
        await self.stop.wait()

    async def grpc_telemetry_flood(self) -> None:
        """Telemetry settings with a 4 MiB user agent, again and again on one stream; the replies (each a copy of
        the settings) are never read."""
        h2 = RawH2(*self.grpc_sock(), self.stop, window=0)
        settings = pb.Settings(client_type=ClientType["PRODUCER"], publishing=pb.Publishing())
        settings.user_agent.platform = "p" * (4 << 20)
        frame = h2.message(pb.TelemetryCommand(settings=settings).SerializeToString())
        stream = h2.open("Telemetry", "attacker-flood@1")

        def flood() -> None:
            while h2.send(stream, frame):
                pass

        await asyncio.to_thread(flood)
        await self.stop.wait()

    def grpc_calls(self, name: str, request: bytes, deserialize) -> None:
        """The same serialized request, again and again, each waiting for its answer (grpcio, in this thread)."""
        with grpc.insecure_channel(self.grpc_endpoint, options=GRPC_OPTIONS) as channel:
            call = channel.unary_unary(f"/{SERVICE}/{name}", request_serializer=None,
                                       response_deserializer=deserialize)
            while not self.stop.is_set():
                try:
                    call(request, metadata=(("x-mq-client-id", "attacker@1"),), timeout=30)
                except grpc.RpcError:
                    pass

    async def grpc_huge_ack(self) -> None:
        """AckMessage with 300,000 entries, one after the other."""
        request = pb.AckMessageRequest(group=pb.Resource(name="ATTACK_CG"), topic=pb.Resource(name="HostileGood"),
                                       entries=[pb.AckMessageEntry(message_id="x", receipt_handle=f"0:{i:x}:1")
                                                for i in range(300_000)])
        await asyncio.to_thread(self.grpc_calls, "AckMessage", request.SerializeToString(), None)

    async def grpc_gzip_bomb(self) -> None:
        """SendMessage of a 191 KiB gzip body inflating to 192 MiB, one after the other."""
        bomb = await asyncio.to_thread(gzip.compress, b"\0" * (192 << 20), 9)
        msg = pb.Message(topic=pb.Resource(name="HostileGood"), body=bomb)
        msg.system_properties.message_id = "0A0000010000000000000000BB"
        msg.system_properties.message_type = MessageType["NORMAL"]
        msg.system_properties.body_encoding = Encoding["GZIP"]
        request = pb.SendMessageRequest(messages=[msg]).SerializeToString()
        print(f"  gzip bomb: {len(bomb) >> 10} KiB inflating to 192 MiB", flush=True)
        await asyncio.to_thread(self.grpc_calls, "SendMessage", request, None)

    async def grpc_held_receives(self) -> None:
        """5,000 long-poll receives (60 s) on one connection, on a topic that gets nothing."""
        request = pb.ReceiveMessageRequest(group=pb.Resource(name="ATTACK_CG"), message_queue=pb.MessageQueue(
            topic=pb.Resource(name="HostileEmpty"), id=0), batch_size=32,
            filter_expression=pb.FilterExpression(type=FilterType["TAG"], expression="*"))
        request.invisible_duration.FromSeconds(60)
        request.long_polling_timeout.FromSeconds(60)
        async with grpc.aio.insecure_channel(self.grpc_endpoint, options=GRPC_OPTIONS) as channel:
            receive = channel.unary_stream(f"/{SERVICE}/ReceiveMessage",
                                           request_serializer=pb.ReceiveMessageRequest.SerializeToString,
                                           response_deserializer=pb.ReceiveMessageResponse.FromString)

            async def held() -> None:
                try:
                    async for _answer in receive(request, metadata=(("x-mq-client-id", "attacker-held@1"),)):
                        pass
                except grpc.RpcError:
                    pass

            tasks = [asyncio.ensure_future(held()) for _ in range(5_000)]
            await self.stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def grpc_many_topics_settings(self) -> None:
        """Producer settings naming 150,000 new topics, again (new names) each time the reply comes."""
        async with grpc.aio.insecure_channel(self.grpc_endpoint, options=GRPC_OPTIONS) as channel:
            telemetry = channel.stream_stream(f"/{SERVICE}/Telemetry",
                                              request_serializer=pb.TelemetryCommand.SerializeToString,
                                              response_deserializer=pb.TelemetryCommand.FromString)
            call = telemetry(metadata=(("x-mq-client-id", "attacker-topics@1"),))
            n = 0
            while not self.stop.is_set():
                settings = pb.Settings(client_type=ClientType["PRODUCER"], publishing=pb.Publishing(
                    topics=[pb.Resource(name=f"S{n}-{i}") for i in range(150_000)]))
                try:
                    await call.write(pb.TelemetryCommand(settings=settings))
                    reply = await call.read()
                except grpc.RpcError:
                    break
                if reply is grpc.aio.EOF:
                    break
                n += 1
            call.cancel()
            await self.stop.wait()

    async def grpc_many_client_ids(self) -> None:
        """5,000 client ids of 7 KB: each sends a heartbeat and keeps a producer telemetry stream open."""
        async with grpc.aio.insecure_channel(self.grpc_endpoint, options=GRPC_OPTIONS) as channel:
            heartbeat = channel.unary_unary(f"/{SERVICE}/Heartbeat",
                                            request_serializer=pb.HeartbeatRequest.SerializeToString,
                                            response_deserializer=pb.HeartbeatResponse.FromString)
            telemetry = channel.stream_stream(f"/{SERVICE}/Telemetry",
                                              request_serializer=pb.TelemetryCommand.SerializeToString,
                                              response_deserializer=pb.TelemetryCommand.FromString)
            streams = []

            async def join(first: int) -> None:
                for n in range(first, 5_000, 16):
                    if self.stop.is_set():
                        return
                    meta = (("x-mq-client-id", f"{n:05d}" + "c" * 6_995),)
                    try:
                        await heartbeat(pb.HeartbeatRequest(client_type=ClientType["PRODUCER"]), metadata=meta,
                                        timeout=30)
                        call = telemetry(metadata=meta)
                        streams.append(call)
                        await call.write(pb.TelemetryCommand(settings=pb.Settings(
                            client_type=ClientType["PRODUCER"], publishing=pb.Publishing())))
                    except grpc.RpcError:
                        pass

            await asyncio.gather(*(join(i) for i in range(16)))
            await self.stop.wait()
            for call in streams:
                call.cancel()


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


async def good_grpc_client(endpoint: str, duration: float, inflight: int) -> tuple[Stats, Stats, Stats]:
    """The RocketMQ 5 neighbour on one grpc.aio channel: half the in-flight calls send 1 KiB messages, half receive
    them (no long poll, as the remoting good client's pulls) and acknowledge what they got."""
    sends, receives, acks = Stats("grpc-send"), Stats("grpc-receive"), Stats("grpc-ack")
    body = os.urandom(1024)
    meta = GOOD_GRPC_METADATA
    deadline = time.perf_counter() + duration
    request = pb.ReceiveMessageRequest(group=pb.Resource(name=GOOD_GRPC_GROUP), message_queue=pb.MessageQueue(
        topic=pb.Resource(name="HostileGoodGrpc"), id=-1), batch_size=32,
        filter_expression=pb.FilterExpression(type=FilterType["TAG"], expression="*"))
    request.invisible_duration.FromSeconds(30)
    async with grpc.aio.insecure_channel(endpoint, options=GRPC_OPTIONS) as channel:
        send = channel.unary_unary(f"/{SERVICE}/SendMessage", request_serializer=None,
                                   response_deserializer=pb.SendMessageResponse.FromString)
        receive = channel.unary_stream(f"/{SERVICE}/ReceiveMessage",
                                       request_serializer=pb.ReceiveMessageRequest.SerializeToString,
                                       response_deserializer=pb.ReceiveMessageResponse.FromString)
        ack = channel.unary_unary(f"/{SERVICE}/AckMessage", request_serializer=pb.AckMessageRequest.SerializeToString,
                                  response_deserializer=pb.AckMessageResponse.FromString)

        def failed(stats: Stats, what) -> None:
            stats.errors += 1
            if stats.errors < 4:
                print(f"  {stats.name} error: {what}", flush=True)

        async def timed(call, request, stats: Stats) -> None:
            """One unary call, its latency recorded when it answers OK, an error otherwise."""
            t0 = time.perf_counter()
            try:
                answer = await call(request, metadata=meta, timeout=10)
            except grpc.RpcError as exc:
                failed(stats, repr(exc))
                return
            if answer.status.code != Code["OK"]:
                failed(stats, answer.status)
            else:
                stats.record(time.perf_counter() - t0)

        async def sender():
            n = 0
            while time.perf_counter() < deadline:
                n += 1
                msg = pb.Message(topic=pb.Resource(name="HostileGoodGrpc"), body=body)
                msg.system_properties.message_id = f"{id(msg):016X}{n:010X}"
                msg.system_properties.message_type = MessageType["NORMAL"]
                msg.system_properties.body_encoding = Encoding["IDENTITY"]
                data = pb.SendMessageRequest(messages=[msg]).SerializeToString()
                await timed(send, data, sends)

        async def receiver():
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    answers = [a async for a in receive(request, metadata=meta, timeout=10)]
                except grpc.RpcError as exc:
                    failed(receives, repr(exc))
                    continue
                status = next((a.status for a in answers if a.HasField("status")), None)
                if status is None or status.code not in (Code["OK"], Code["MESSAGE_NOT_FOUND"]):
                    failed(receives, status)
                    continue
                receives.record(time.perf_counter() - t0)
                handles = [pb.AckMessageEntry(message_id=a.message.system_properties.message_id,
                                              receipt_handle=a.message.system_properties.receipt_handle)
                           for a in answers if a.HasField("message")]
                if not handles:
                    continue
                await timed(ack, pb.AckMessageRequest(group=request.group, topic=request.message_queue.topic,
                                                      entries=handles), acks)

        await asyncio.gather(*(sender() for _ in range(inflight // 2)),
                             *(receiver() for _ in range(inflight - inflight // 2)))
    return sends, receives, acks


async def prepare(addr_namesrv: str, grpc_endpoint: str) -> None:
    async with Producer("PREP_PG", addr_namesrv) as producer:
        for _ in range(32):  # 1 MiB answers for the pipelined pulls
            await producer.send(Message("HostileBulk", os.urandom(32 << 10)), )
        for _ in range(32):  # 4 MiB answers for the unread gRPC receives
            await producer.send(Message("HostileBulkGrpc", os.urandom(128 << 10)))
        await producer.send(Message("HostileEmpty", b"x"))
        await producer.send(Message("HostileGood", b"x"))  # before any attack: a topic quota may fill up
        await producer.send(Message("HostileGoodGrpc", b"x"))
    # The good gRPC client's group exists before any attack, as its topic does: a flood of client-chosen groups
    # fills the group quota, and a group first seen after it is refused (CONSUMER_GROUP_NOT_FOUND), not harmed.
    async with grpc.aio.insecure_channel(grpc_endpoint, options=GRPC_OPTIONS) as channel:
        receive = channel.unary_stream(f"/{SERVICE}/ReceiveMessage",
                                       request_serializer=pb.ReceiveMessageRequest.SerializeToString,
                                       response_deserializer=pb.ReceiveMessageResponse.FromString)
        request = pb.ReceiveMessageRequest(group=pb.Resource(name=GOOD_GRPC_GROUP), message_queue=pb.MessageQueue(
            topic=pb.Resource(name="HostileGoodGrpc"), id=-1), batch_size=1,
            filter_expression=pb.FilterExpression(type=FilterType["TAG"], expression="*"))
        request.invisible_duration.FromSeconds(1)
        answers = [a async for a in receive(request, metadata=GOOD_GRPC_METADATA, timeout=10)]
        status = next((a.status for a in answers if a.HasField("status")), None)
        if status is None or status.code not in (Code["OK"], Code["MESSAGE_NOT_FOUND"]):
            raise RuntimeError(f"the good gRPC client's group could not be prepared: {status}")


async def run_attack_process(name: str, broker: str, grpc_endpoint: str, duration: float) -> None:
    """The attacker's side, in its own process (its sockets and threads must not slow the good clients down)."""
    stop = asyncio.Event()
    attack = Attack(broker, grpc_endpoint, stop)
    asyncio.get_running_loop().call_later(duration, stop.set)
    try:
        await getattr(attack, name)()
    finally:
        attack.close()


def stats_from(output: bytes) -> list[Stats]:
    """The good gRPC client process's Stats, from the last line it printed (errors it printed are passed on)."""
    lines = output.decode().splitlines()
    for line in lines[:-1]:
        print(line, flush=True)
    stats = []
    for item in json.loads(lines[-1]) if lines else []:
        stats.append(Stats(item["name"], latencies=item["latencies"], count=item["count"], errors=item["errors"]))
    return stats or [Stats("grpc", errors=1)]


async def run_good_grpc_process(endpoint: str, duration: float, inflight: int) -> None:
    """The good gRPC client, in its own process (sharing an event loop with the remoting one would measure that
    loop too): its Stats as a JSON line."""
    stats = await good_grpc_client(endpoint, duration, inflight)
    print(json.dumps([{"name": s.name, "count": s.count, "errors": s.errors, "latencies": s.latencies}
                      for s in stats]), flush=True)


class Result:
    """One attack's figures: each good client's errors and latencies, the broker's peak RSS."""

    def __init__(self, name: str, remoting: list[Stats], grpc_stats: list[Stats], rss: float):
        self.name, self.rss = name, rss
        self.clients = {"remoting": remoting, "grpc": grpc_stats}

    def errors(self, client: str) -> int:
        return sum(s.errors for s in self.clients[client])

    def p99(self, client: str) -> float:
        return percentile([x for s in self.clients[client] for x in s.latencies], 99)

    @property
    def ok(self) -> bool:
        return self.rss < 512 and all(self.errors(c) == 0 and self.p99(c) < 0.050 for c in self.clients)

    def line(self) -> str:
        parts = [f"ATTACK {self.name:26s}"]
        for client, stats in self.clients.items():
            lat = [x for s in stats for x in s.latencies]
            counts = " ".join(f"{s.name}={s.count}(p99 {percentile(s.latencies, 99) * 1000:.0f}ms)" for s in stats)
            parts.append(f"{client}: errors={self.errors(client)} {counts} p50_ms={percentile(lat, 50) * 1000:.2f} "
                         f"p99_ms={percentile(lat, 99) * 1000:.2f} max_ms={max(lat, default=0) * 1000:.2f}")
        return " | ".join(parts) + f" | broker_rss_peak_mib={self.rss:.0f}"


async def start_good_grpc(grpc_endpoint: str, args) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *helper("hostile", "--helper-good-grpc", "--grpc-endpoint", grpc_endpoint, "--duration", str(args.duration),
                "--inflight", str(args.inflight)), stdout=asyncio.subprocess.PIPE)


async def one_round(name: str, args) -> Result:
    proc = None
    if args.spawn_broker:
        proc, broker, namesrv, grpc_endpoint = await spawn_broker()
        pid = proc.pid
    else:
        broker, namesrv, grpc_endpoint, pid = args.broker, args.namesrv, args.grpc_endpoint, args.pid
    try:
        await prepare(namesrv, grpc_endpoint)
        together = args.good_clients == "together"
        measured = args.duration if together else 2 * args.duration
        attacker = await asyncio.create_subprocess_exec(*helper("hostile", "--helper-attack", name,
                                                                "--broker", broker, "--grpc-endpoint", grpc_endpoint,
                                                                "--duration", str(measured + 2),
                                                                "--batch-count", str(args.batch_count)),
                                                        stdout=sys.stderr)  # its notes; stdout is for figures
        sampled = asyncio.Event()
        peak = [rss_mib(pid)]

        async def sample():
            while not sampled.is_set():
                peak[0] = max(peak[0], rss_mib(pid))
                try:
                    await asyncio.wait_for(sampled.wait(), 0.2)
                except asyncio.TimeoutError:
                    pass

        sampler = asyncio.ensure_future(sample())
        try:
            await asyncio.sleep(1.0)  # the attack gets going before the good clients start measuring
            if together:
                grpc_client = await start_good_grpc(grpc_endpoint, args)
                remoting, grpc_output = await asyncio.gather(good_client(namesrv, args.duration, args.inflight),
                                                             grpc_client.communicate())
            else:  # each good client alone beside the attack, one after the other
                remoting = await good_client(namesrv, args.duration, args.inflight)
                grpc_output = await (await start_good_grpc(grpc_endpoint, args)).communicate()
            grpc_stats = stats_from(grpc_output[0])
        finally:
            sampled.set()
            await sampler
            try:
                await asyncio.wait_for(attacker.wait(), 20)
            except asyncio.TimeoutError:
                attacker.kill()
                await attacker.wait()
    finally:
        if proc is not None:
            try:
                await asyncio.wait_for(stop([proc]), 20)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
    result = Result(name, list(remoting), list(grpc_stats), peak[0])
    print(result.line(), flush=True)
    return result


def add_arguments(parser) -> None:
    parser.add_argument("--spawn-broker", action="store_true", help="a fresh broker for each attack")
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--broker", default="127.0.0.1:10911", help="broker address (without --spawn-broker)")
    parser.add_argument("--grpc-endpoint", default="127.0.0.1:8081", help="broker gRPC endpoint (without "
                                                                           "--spawn-broker)")
    parser.add_argument("--pid", type=int, default=0, help="broker pid for RSS (without --spawn-broker)")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--inflight", type=int, default=64, help="requests in flight of each good client")
    parser.add_argument("--batch-count", type=int, default=10_000, help="messages in a max_batches batch")
    parser.add_argument("--good-clients", choices=("together", "in-turn"), default="together",
                        help="both good clients at once while the attack runs, or one after the other (each for "
                             "--duration): together they are twice the load, and on 2 cores the gRPC client's "
                             "latency is then mostly its share of the broker's one event loop, not the attack's doing")
    parser.add_argument("--helper-attack", help=argparse.SUPPRESS)
    parser.add_argument("--helper-good-grpc", action="store_true", help=argparse.SUPPRESS)


async def main_async(args, results: Results) -> None:
    if args.helper_attack:
        Attack.batch_count = args.batch_count
        await run_attack_process(args.helper_attack, args.broker, args.grpc_endpoint, args.duration)
        return
    if args.helper_good_grpc:
        await run_good_grpc_process(args.grpc_endpoint, args.duration, args.inflight)
        return
    rounds = [await one_round(name, args) for name in args.attacks.split(",")]
    for r in rounds:
        for client in r.clients:
            results.add_all({"errors": (r.errors(client), ""), "p99_ms": (r.p99(client) * 1000, "ms")},
                            attack=r.name, client=client, good_clients=args.good_clients)
        results.add("broker_rss_peak", r.rss, "MiB", attack=r.name, good_clients=args.good_clients)
    results.add("ok", all(r.ok for r in rounds), "0 errors, p99 < 50 ms, RSS < 512 MiB", attacks=args.attacks)


def run(args, results: Results) -> None:
    run_main(main_async(args, results))  # the brokers' temporary stores are removed at the end, also on Ctrl-C
