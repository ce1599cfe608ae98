"""A lean load generator for bench.py (``--client raw``): plain sends and transactions over one connection, written
against the remoting wire format with struct and orjson only, nothing of halfmq.

The project's client spends about 19 us of CPU per send and shares the machine's two cores with the broker, so
with it the client's cost hides much of a change in the broker's. This one builds each request by patching two
fixed-width fields (opaque, UNIQ_KEY) into a frame encoded once, and reads only what it must from each answer: a
send costs it a few microseconds. It speaks what a stock Java producer speaks: SEND_MESSAGE_V2 with JSON headers,
and for a transaction a half (TRAN_MSG, PGROUP) followed, once the half is stored, by a oneway END_TRANSACTION
commit naming it, which is when a stock producer's ``sendMessageInTransaction`` returns.
"""
from __future__ import annotations

import asyncio
import struct
import time

import orjson

SEND_MESSAGE_V2, END_TRANSACTION = 310, 37
SUCCESS = 0
ONEWAY = 2  #: flag bit of a request that gets no answer
_PREFIX = struct.Struct(">II")  # frame length (after this word), serialize type << 24 | header length
_OPAQUE_BASE = 1_000_000_000   # opaques stay 10 digits wide, so a frame's length never changes
_KEY_DIGITS = 12


def _frame(header: dict, body: bytes) -> bytes:
    raw = orjson.dumps(header)
    return _PREFIX.pack(4 + len(raw) + len(body), len(raw)) + raw


class RawProducer(asyncio.Protocol):
    """``await send()`` stores one message (transactional: a half, then its commit); raises on a failed answer."""

    def __init__(self, topic: str, body: bytes, queues: int, transactional: bool, group: str):
        self.body = body
        self.queues = queues
        self.transactional = transactional
        self.group = group
        self.waiting: dict[int, asyncio.Future] = {}
        self.buffer = bytearray()
        self.pending: list = []  # request bytes to write at the end of this loop iteration
        self.transport: asyncio.Transport | None = None
        self.count = 0
        props = {"UNIQ_KEY": "0" * 20 + "X" * _KEY_DIGITS, "WAIT": "true"}
        if transactional:
            props.update(TRAN_MSG="true", PGROUP=group)
        self.heads = []  # one encoded head per queue id, with placeholders for opaque and UNIQ_KEY
        for queue in range(queues):
            ext = {"a": group, "b": topic, "c": "TBW102", "d": str(queues), "e": str(queue),
                   "f": "4" if transactional else "0", "g": str(int(time.time() * 1000)), "h": "0",
                   "i": "".join(f"{k}\x01{v}\x02" for k, v in props.items()), "j": "0", "k": "false", "m": "false"}
            head = _frame({"code": SEND_MESSAGE_V2, "language": "JAVA", "version": 401, "opaque": 9_999_999_999,
                           "flag": 0, "extFields": ext, "serializeTypeCurrentRPC": "JSON"}, body)
            self.heads.append(head)
        head = self.heads[0]
        self.opaque_at = head.index(b"9999999999")
        self.key_at = head.index(b"X" * _KEY_DIGITS)

    async def connect(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        await asyncio.get_running_loop().create_connection(lambda: self, host, int(port))

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(ConnectionError(f"the broker closed the connection ({exc})"))
        self.waiting.clear()

    def send(self) -> asyncio.Future:
        self.count += 1
        opaque = _OPAQUE_BASE + self.count % _OPAQUE_BASE
        head = bytearray(self.heads[self.count % self.queues])
        head[self.opaque_at:self.opaque_at + 10] = b"%010d" % opaque
        head[self.key_at:self.key_at + _KEY_DIGITS] = b"%012X" % self.count
        future = asyncio.get_running_loop().create_future()
        self.waiting[opaque] = future
        self._write(head, self.body)
        return future

    def _write(self, *parts) -> None:
        """Requests made in one loop iteration go out in one write, as a real client's pipelined requests do."""
        if not self.pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self.pending += parts

    def _flush(self) -> None:
        pending, self.pending = self.pending, []
        if not self.transport.is_closing():
            self.transport.writelines(pending)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        pos, end = 0, len(buffer)
        while end - pos >= 8:
            length, word = _PREFIX.unpack_from(buffer, pos)
            if end - pos - 4 < length:
                break
            header = orjson.loads(memoryview(buffer)[pos + 8:pos + 8 + (word & 0xFFFFFF)])
            pos += 4 + length
            future = self.waiting.pop(header.get("opaque"), None)
            if future is None or future.done():
                continue
            if header.get("code") != SUCCESS:
                future.set_exception(RuntimeError(f"answer {header.get('code')}: {header.get('remark')}"))
            elif self.transactional:
                self._commit(header.get("extFields") or {})
                future.set_result(None)
            else:
                future.set_result(None)
        del buffer[:pos]

    def _commit(self, ext: dict) -> None:
        """The oneway commit of the half just stored (as a stock producer's endTransactionOneway)."""
        msg_id = ext["msgId"]
        self.count += 1
        header = {"code": END_TRANSACTION, "language": "JAVA", "version": 401,
                  "opaque": _OPAQUE_BASE + self.count % _OPAQUE_BASE, "flag": ONEWAY,
                  "extFields": {"producerGroup": self.group, "tranStateTableOffset": ext["queueOffset"],
                                "commitLogOffset": str(int(msg_id[-16:], 16)), "commitOrRollback": "8",
                                "fromTransactionCheck": "false", "msgId": msg_id,
                                "transactionId": ext.get("transactionId", msg_id)},
                  "serializeTypeCurrentRPC": "JSON"}
        self._write(_frame(header, b""))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
