"""A minimal remoting peer built on halfmq.protocol only, so broker tests do not depend on halfmq.client."""
from __future__ import annotations

import asyncio
import itertools
import json

from halfmq.protocol.codes import FLAG_ONEWAY, LanguageCode, RequestCode
from halfmq.protocol.command import RemotingCommand, decode_command
from halfmq.protocol.frame import FrameDecoder
from halfmq.protocol.headers import SendMessageRequestHeaderV2
from halfmq.protocol.message import UniqKeyGenerator
from halfmq.protocol.properties import encode_properties

_uniq = UniqKeyGenerator()


class RawClient(asyncio.Protocol):
    def __init__(self):
        self.decoder = FrameDecoder()
        self.pending: dict[int, asyncio.Future] = {}
        self.incoming: asyncio.Queue[RemotingCommand] = asyncio.Queue()
        self.closed = asyncio.Event()
        self.transport = None
        self._opaque = itertools.count(1)

    @classmethod
    async def connect(cls, addr: str) -> "RawClient":
        host, port = addr.rsplit(":", 1)
        _t, proto = await asyncio.get_running_loop().create_connection(cls, host, int(port))
        return proto

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        for frame in self.decoder.feed(data):
            cmd = decode_command(frame)
            if cmd.is_response:
                fut = self.pending.pop(cmd.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(cmd)
            else:
                self.incoming.put_nowait(cmd)

    def connection_lost(self, exc):
        self.closed.set()
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError("connection closed"))

    async def request(self, code: int, ext: dict | None = None, body: bytes = b"", timeout: float = 5.0,
                      **kw) -> RemotingCommand:
        cmd = RemotingCommand(code, next(self._opaque), ext_fields={k: str(v) for k, v in (ext or {}).items()},
                              body=body, language=LanguageCode.PYTHON, **kw)
        fut = asyncio.get_running_loop().create_future()
        self.pending[cmd.opaque] = fut
        self.transport.write(cmd.encode())
        return await asyncio.wait_for(fut, timeout)

    def oneway(self, code: int, ext: dict | None = None, body: bytes = b"") -> None:
        cmd = RemotingCommand(code, next(self._opaque), FLAG_ONEWAY,
                              ext_fields={k: str(v) for k, v in (ext or {}).items()}, body=body)
        self.transport.write(cmd.encode())

    def close(self):
        self.transport.close()

    # --- conveniences ---
    async def send(self, topic: str, body: bytes, tags: str | None = None, keys: str | None = None,
                   queue_id: int = 0, group: str = "PG", props: dict | None = None, sys_flag: int = 0,
                   code: int = RequestCode.SEND_MESSAGE_V2, **kw) -> RemotingCommand:
        properties = {"UNIQ_KEY": _uniq.next(), "WAIT": "true"}
        if tags:
            properties["TAGS"] = tags
        if keys:
            properties["KEYS"] = keys
        properties.update(props or {})
        header = SendMessageRequestHeaderV2(producerGroup=group, topic=topic, defaultTopic="TBW102",
                                            defaultTopicQueueNums=4, queueId=queue_id, sysFlag=sys_flag,
                                            bornTimestamp=1, flag=0, properties=encode_properties(properties))
        return await self.request(code, header.to_ext(), body, **kw)

    async def pull(self, topic: str, queue_id: int, offset: int, group: str = "CG", max_nums: int = 32,
                   expression: str = "*", suspend_ms: int = 0, sys_flag: int = 4, timeout: float = 5.0
                   ) -> RemotingCommand:
        if suspend_ms:
            sys_flag |= 2
        ext = {"consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
               "maxMsgNums": max_nums, "sysFlag": sys_flag, "commitOffset": 0,
               "suspendTimeoutMillis": suspend_ms, "subVersion": 0, "subscription": expression,
               "expressionType": "TAG"}
        return await self.request(RequestCode.PULL_MESSAGE, ext, timeout=timeout)

    async def heartbeat(self, client_id: str, producer_groups=(), consumer_groups: dict | None = None):
        body = {"clientID": client_id,
                "producerDataSet": [{"groupName": g} for g in producer_groups],
                "consumerDataSet": [
                    {"groupName": g, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                     "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
                     "subscriptionDataSet": [{"topic": t, "subString": e, "subVersion": 1, "expressionType": "TAG"}
                                             for t, e in subs.items()]}
                    for g, subs in (consumer_groups or {}).items()]}
        return await self.request(RequestCode.HEART_BEAT, body=json.dumps(body).encode())
