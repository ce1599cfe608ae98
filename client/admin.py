"""``halfmq admin <command>``: operator commands over the protocol's admin request codes.

Readable tables by default, ``--json`` for scripts. Examples:

    halfmq admin clusterList
    halfmq admin updateTopic -t Orders -r 8 -w 8
    halfmq admin consumerProgress -g orders-consumer
    halfmq admin halfStatus
    halfmq admin resumeHalf -i 7F00000100002A9F0000000000001234
"""
from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
from typing import Any

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.headers import (ConnectionListRequestHeader, ConsumeStatsRequestHeader, CreateTopicRequestHeader,
                                     HalfStatusRequestHeader, QueryMessageRequestHeader, QueueRequestHeader,
                                     ResumeCheckHalfMessageRequestHeader, TopicRequestHeader, ViewMessageRequestHeader)
from halfmq.protocol.message import decode_offset_msg_id, decode_records

from .errors import ClientError, ConnectionClosedError, error_for
from .remoting import ConnectionPool, Credentials


class Admin:
    def __init__(self, namesrv: str, broker: str | None = None, credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None, timeout: float = 5.0):
        self.namesrv = namesrv
        self.broker = broker
        self.timeout = timeout
        self.pool = ConnectionPool(credentials=credentials, tls=tls)

    async def close(self) -> None:
        await self.pool.close()

    async def call(self, addr: str, code: int, ext: dict | None = None, body: bytes = b""):
        try:
            conn = await self.pool.get(addr)
        except ConnectionClosedError as exc:
            if addr != self.namesrv:
                raise
            # The first thing most commands do: say which option points there.
            raise ConnectionClosedError(f"cannot reach the name server (-n/--namesrv): {exc}") from None
        resp = await conn.request(code, {k: str(v) for k, v in (ext or {}).items()}, body, self.timeout)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)
        return resp

    async def json_call(self, addr: str, code: int, ext: dict | None = None) -> Any:
        return json.loads((await self.call(addr, code, ext)).body or b"{}")

    async def broker_addr(self) -> str:
        if self.broker:
            return self.broker
        info = await self.json_call(self.namesrv, RequestCode.GET_BROKER_CLUSTER_INFO)
        for data in info.get("brokerAddrTable", {}).values():
            addr = data.get("brokerAddrs", {}).get("0")
            if addr:
                self.broker = addr
                return addr
        raise ClientError("the name server knows no broker")

    # --- commands: each returns rows (list of dicts) or a dict ---
    async def cluster_list(self, args):
        info = await self.json_call(self.namesrv, RequestCode.GET_BROKER_CLUSTER_INFO)
        return [{"cluster": cluster, "brokerName": name, "brokerId": bid, "addr": addr}
                for cluster, names in info.get("clusterAddrTable", {}).items() for name in names
                for bid, addr in info["brokerAddrTable"][name]["brokerAddrs"].items()]

    async def topic_list(self, args):
        data = await self.json_call(self.namesrv, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        return [{"topic": t} for t in data.get("topicList", [])]

    async def topic_route(self, args):
        return await self.json_call(self.namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                     TopicRequestHeader(topic=args.topic).to_ext())

    async def topic_status(self, args):
        route = await self.topic_route(args)
        addr = await self.broker_addr()
        rows = []
        for q in range(max((d["readQueueNums"] for d in route["queueDatas"]), default=0)):
            ext = QueueRequestHeader(topic=args.topic, queueId=q).to_ext()
            low = (await self.call(addr, RequestCode.GET_MIN_OFFSET, ext)).ext_fields["offset"]
            high = (await self.call(addr, RequestCode.GET_MAX_OFFSET, ext)).ext_fields["offset"]
            rows.append({"queueId": q, "minOffset": int(low), "maxOffset": int(high)})
        return rows

    async def update_topic(self, args):
        header = CreateTopicRequestHeader(topic=args.topic, readQueueNums=args.read_queues,
                                          writeQueueNums=args.write_queues, perm=args.perm)
        await self.call(await self.broker_addr(), RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
        return {"updated": args.topic}

    async def delete_topic(self, args):
        await self.call(await self.broker_addr(), RequestCode.DELETE_TOPIC_IN_BROKER,
                        TopicRequestHeader(topic=args.topic).to_ext())
        return {"deleted": args.topic}

    async def consumer_progress(self, args):
        ext = ConsumeStatsRequestHeader(consumerGroup=args.group, topic=args.topic or None).to_ext()
        data = await self.json_call(await self.broker_addr(), RequestCode.GET_CONSUME_STATS, ext)
        return data["offsetTable"]

    async def producer_connection(self, args):
        data = await self.json_call(await self.broker_addr(), RequestCode.GET_PRODUCER_CONNECTION_LIST,
                                    ConnectionListRequestHeader(producerGroup=args.group).to_ext())
        return data["connectionSet"]

    async def consumer_connection(self, args):
        data = await self.json_call(await self.broker_addr(), RequestCode.GET_CONSUMER_CONNECTION_LIST,
                                    ConnectionListRequestHeader(consumerGroup=args.group).to_ext())
        return data["connectionSet"]

    @staticmethod
    def _messages(body: bytes):
        return [{"msgId": m.msg_id, "offsetMsgId": m.offset_msg_id, "topic": m.topic, "queueId": m.queue_id,
                 "queueOffset": m.queue_offset, "tags": m.tags, "keys": m.keys, "storeTimestamp": m.store_timestamp,
                 "bodySize": len(m.body), "body": m.body.decode("utf-8", "replace")[:200]}
                for m in decode_records(body)]

    async def query_msg_by_id(self, args):
        _host, offset = decode_offset_msg_id(args.id)
        resp = await self.call(await self.broker_addr(), RequestCode.VIEW_MESSAGE_BY_ID,
                               ViewMessageRequestHeader(offset=offset).to_ext())
        return self._messages(resp.body)

    async def query_msg_by_key(self, args):
        header = QueryMessageRequestHeader(topic=args.topic, key=args.key, maxNum=64, beginTimestamp=0,
                                           endTimestamp=2 ** 62)
        resp = await self.call(await self.broker_addr(), RequestCode.QUERY_MESSAGE, header.to_ext())
        return self._messages(resp.body)

    async def broker_status(self, args):
        return (await self.json_call(await self.broker_addr(), RequestCode.GET_BROKER_RUNTIME_INFO))["table"]

    async def half_status(self, args):
        data = await self.json_call(await self.broker_addr(), RequestCode.HALFMQ_GET_HALF_STATUS,
                                    HalfStatusRequestHeader(limit=args.limit).to_ext())
        return data["halves"]

    async def resume_half(self, args):
        await self.call(await self.broker_addr(), RequestCode.RESUME_CHECK_HALF_MESSAGE,
                        ResumeCheckHalfMessageRequestHeader(msgId=args.id).to_ext())
        return {"resumed": args.id}


def render_table(rows) -> str:
    if isinstance(rows, dict):
        width = max((len(k) for k in rows), default=0)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows.items())
    if not rows:
        return "(none)"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


COMMANDS = {
    "clusterList": ("cluster_list", []), "topicList": ("topic_list", []), "topicRoute": ("topic_route", ["topic"]),
    "topicStatus": ("topic_status", ["topic"]), "updateTopic": ("update_topic", ["topic", "queues"]),
    "deleteTopic": ("delete_topic", ["topic"]), "consumerProgress": ("consumer_progress", ["group", "topic?"]),
    "producerConnection": ("producer_connection", ["group"]), "consumerConnection": ("consumer_connection", ["group"]),
    "queryMsgById": ("query_msg_by_id", ["id"]), "queryMsgByKey": ("query_msg_by_key", ["topic", "key"]),
    "brokerStatus": ("broker_status", []), "halfStatus": ("half_status", ["limit"]), "resumeHalf": ("resume_half", ["id"]),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="halfmq admin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--namesrv", default="127.0.0.1:9876")
    p.add_argument("-b", "--broker", help="broker address (default: the first one the name server knows)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--access-key")
    p.add_argument("--secret-key")
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--cafile", help="CA certificate to verify the broker with")
    sub = p.add_subparsers(dest="command", required=True)
    for name, (_method, params) in COMMANDS.items():
        c = sub.add_parser(name)
        if "topic" in params:
            c.add_argument("-t", "--topic", required=True)
        if "topic?" in params:
            c.add_argument("-t", "--topic")
        if "group" in params:
            c.add_argument("-g", "--group", required=True)
        if "id" in params:
            c.add_argument("-i", "--id", required=True, help="offsetMsgId")
        if "key" in params:
            c.add_argument("-k", "--key", required=True)
        if "limit" in params:
            c.add_argument("--limit", type=int, default=1000)
        if "queues" in params:
            c.add_argument("-r", "--read-queues", type=int, default=8)
            c.add_argument("-w", "--write-queues", type=int, default=8)
            c.add_argument("-p", "--perm", type=int, default=6)
    return p


async def run(args) -> Any:
    credentials = Credentials(args.access_key, args.secret_key) if args.access_key else None
    tls = ssl.create_default_context(cafile=args.cafile) if args.tls else None
    admin = Admin(args.namesrv, args.broker, credentials, tls)
    try:
        return await getattr(admin, COMMANDS[args.command][0])(args)
    finally:
        await admin.close()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        result = asyncio.run(run(args))
    except ClientError as exc:
        print(f"halfmq admin: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else render_table(result))
    return 0
