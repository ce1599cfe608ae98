"""Admin: operator requests over the protocol's admin request codes (what ``halfmq admin`` runs, see admin_cli).

Each method returns plain data (rows as dicts, messages as MessageExt); the transaction tables are async iterators
that page through every row.

    async with Admin("127.0.0.1:9876") as admin:
        print(await admin.topic_list())
        async for half in admin.pending_halves():
            print(half["transactionId"], half["ageMillis"])
"""
from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

from halfmq.protocol.codes import RequestCode, ResponseCode, language_name, version_name
from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.headers import (ConnectionListRequestHeader, ConsumeStatsRequestHeader, CreateTopicRequestHeader,
                                     DeleteSubscriptionGroupRequestHeader, HalfStatusRequestHeader, QueryMessageRequestHeader, QueueRequestHeader,
                                     ResumeCheckHalfMessageRequestHeader, TopicRequestHeader, ViewMessageRequestHeader)
from halfmq.protocol.message import decode_offset_msg_id, decode_records

from .errors import ClientError, ConnectionClosedError, error_for
from .message import MessageExt
from .remoting import ConnectionPool, Credentials


class Admin:
    """Admin requests to the brokers a name server knows.

    Args:
        namesrv: name server address.
        broker: broker address to send broker requests to (default: the first master the name server knows).
    """

    def __init__(self, namesrv: str, broker: str | None = None, credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None, timeout: float = 5.0):
        self.namesrv = namesrv
        self.broker = broker
        self.credentials = credentials
        self.tls = tls
        self.timeout = timeout
        self.pool = ConnectionPool(credentials=credentials, tls=tls)

    async def close(self) -> None:
        await self.pool.close()

    async def __aenter__(self) -> "Admin":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def call(self, addr: str, code: int, ext: dict | None = None, body: bytes = b"",
                   timeout: float | None = None):
        """One request (``timeout``: the Admin's unless given); raises the BrokerError of any answer but SUCCESS."""
        try:
            conn = await self.pool.get(addr)
        except ConnectionClosedError as exc:
            if addr != self.namesrv:
                raise
            # The first thing most commands do: say which option points there.
            raise ConnectionClosedError(f"cannot reach the name server (-n/--namesrv): {exc}") from None
        resp = await conn.request(code, {k: str(v) for k, v in (ext or {}).items()}, body, timeout or self.timeout)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)
        return resp

    async def json_call(self, addr: str, code: int, ext: dict | None = None, body: bytes = b"") -> Any:
        return json.loads((await self.call(addr, code, ext, body)).body or b"{}")

    # --- where requests go ---
    async def cluster_info(self) -> dict:
        return await self.json_call(self.namesrv, RequestCode.GET_BROKER_CLUSTER_INFO)

    async def broker_addrs(self) -> dict[str, str]:
        """Broker name → master address, as the name server has them."""
        info = await self.cluster_info()
        return {name: data["brokerAddrs"]["0"] for name, data in info.get("brokerAddrTable", {}).items()
                if "0" in data.get("brokerAddrs", {})}

    async def broker_addr(self) -> str:
        if self.broker:
            return self.broker
        for addr in (await self.broker_addrs()).values():
            self.broker = addr
            return addr
        raise ClientError("the name server knows no broker")

    # --- cluster and topics ---
    async def cluster_list(self) -> list[dict]:
        info = await self.cluster_info()
        return [{"cluster": cluster, "brokerName": name, "brokerId": bid, "addr": addr}
                for cluster, names in info.get("clusterAddrTable", {}).items() for name in names
                for bid, addr in info["brokerAddrTable"][name]["brokerAddrs"].items()]

    async def topic_list(self) -> list[str]:
        data = await self.json_call(self.namesrv, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        return list(data.get("topicList", []))

    async def topic_route(self, topic: str) -> dict:
        """The name server's route: ``brokerDatas`` (name → addresses) and ``queueDatas`` (queues per broker)."""
        return await self.json_call(self.namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                    TopicRequestHeader(topic=topic).to_ext())

    async def topic_status(self, topic: str) -> list[dict]:
        route = await self.topic_route(topic)
        addrs = {b["brokerName"]: b["brokerAddrs"]["0"] for b in route["brokerDatas"] if "0" in b["brokerAddrs"]}
        rows = []
        for data in route["queueDatas"]:
            addr = addrs.get(data["brokerName"])
            if addr is None:
                continue
            for q in range(data["readQueueNums"]):
                ext = QueueRequestHeader(topic=topic, queueId=q).to_ext()
                low = (await self.call(addr, RequestCode.GET_MIN_OFFSET, ext)).ext_fields["offset"]
                high = (await self.call(addr, RequestCode.GET_MAX_OFFSET, ext)).ext_fields["offset"]
                rows.append({"brokerName": data["brokerName"], "queueId": q, "minOffset": int(low),
                             "maxOffset": int(high)})
        return rows

    async def update_topic(self, topic: str, read_queues: int = 8, write_queues: int = 8, perm: int = 6,
                           attributes: str | None = None) -> None:
        """Create or change a topic; ``attributes`` as mqadmin's -a, e.g. "+message.type=FIFO"."""
        header = CreateTopicRequestHeader(topic=topic, readQueueNums=read_queues, writeQueueNums=write_queues,
                                          perm=perm, attributes=attributes)
        await self.call(await self.broker_addr(), RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())

    async def delete_topic(self, topic: str) -> None:
        await self.call(await self.broker_addr(), RequestCode.DELETE_TOPIC_IN_BROKER,
                        TopicRequestHeader(topic=topic).to_ext())

    # --- groups and clients ---
    async def consumer_progress(self, group: str, topic: str | None = None) -> list[dict]:
        """Per queue: broker offset, the group's offset and the difference."""
        ext = ConsumeStatsRequestHeader(consumerGroup=group, topic=topic or None).to_ext()
        return (await self.json_call(await self.broker_addr(), RequestCode.GET_CONSUME_STATS, ext))["offsetTable"]

    @staticmethod
    def _named(connections: list[dict]) -> list[dict]:
        """Language and version by RocketMQ's names (PYTHON, V4_9_8), as mqadmin shows them."""
        return [{**c, "language": language_name(c["language"]), "version": version_name(int(c["version"]))}
                for c in connections]

    async def producer_connections(self, group: str) -> list[dict]:
        data = await self.json_call(await self.broker_addr(), RequestCode.GET_PRODUCER_CONNECTION_LIST,
                                    ConnectionListRequestHeader(producerGroup=group).to_ext())
        return self._named(data["connectionSet"])

    async def consumer_connections(self, group: str) -> dict:
        """``connectionSet`` (clients) and ``subscriptionTable`` (topic → expression) and the group's settings."""
        data = await self.json_call(await self.broker_addr(), RequestCode.GET_CONSUMER_CONNECTION_LIST,
                                    ConnectionListRequestHeader(consumerGroup=group).to_ext())
        return {**data, "connectionSet": self._named(data["connectionSet"])}

    async def update_sub_group(self, group: str) -> None:
        """Create a subscription group (halfmq keeps no settings per group: RocketMQ's defaults apply)."""
        await self.call(await self.broker_addr(), RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                        body=json.dumps({"groupName": group}).encode())

    async def delete_sub_group(self, group: str) -> None:
        await self.call(await self.broker_addr(), RequestCode.DELETE_SUBSCRIPTIONGROUP,
                        DeleteSubscriptionGroupRequestHeader(groupName=group).to_ext())

    # --- messages ---
    async def view_message(self, offset_msg_id: str) -> MessageExt:
        """The message an offsetMsgId names (VIEW_MESSAGE_BY_ID on the broker the id names).

        Raises:
            MessageFormatError: not an offsetMsgId.
        """
        host, offset = decode_offset_msg_id(offset_msg_id)
        addr = host if host in (await self.broker_addrs()).values() else await self.broker_addr()
        resp = await self.call(addr, RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(offset=offset).to_ext())
        return decode_records(resp.body)[0]

    async def query_msg_by_key(self, topic: str, key: str, max_num: int = 64) -> list[MessageExt]:
        header = QueryMessageRequestHeader(topic=topic, key=key, maxNum=max_num, beginTimestamp=0,
                                           endTimestamp=2 ** 62)
        resp = await self.call(await self.broker_addr(), RequestCode.QUERY_MESSAGE, header.to_ext())
        return decode_records(resp.body)

    async def is_offset_msg_id(self, msg_id: str) -> bool:
        """Does ``msg_id`` name a stored record of a broker the name server knows (the offsetMsgId form)?"""
        try:
            host, _offset = decode_offset_msg_id(msg_id)
        except MessageFormatError:
            return False
        return host in set((await self.broker_addrs()).values()) | {await self.broker_addr()}

    # --- brokers ---
    async def broker_status(self) -> dict:
        return (await self.json_call(await self.broker_addr(), RequestCode.GET_BROKER_RUNTIME_INFO))["table"]

    async def delete_expired_commit_log(self, timeout: float = 600.0) -> dict:
        """Run a retention pass now (DELETE_EXPIRED_COMMITLOG): what it deleted and freed. A pass over millions of
        messages takes a while: ``timeout`` is long."""
        addr = await self.broker_addr()
        return json.loads((await self.call(addr, RequestCode.DELETE_EXPIRED_COMMITLOG, timeout=timeout)).body)

    async def broker_config(self) -> dict[str, str]:
        """The broker's configuration in effect, key → value as text."""
        text = (await self.call(await self.broker_addr(), RequestCode.GET_BROKER_CONFIG)).body.decode()
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    # --- transactions ---
    async def _pages(self, code: int, key: str, page_size: int | None) -> AsyncIterator[list[dict]]:
        addr = await self.broker_addr()
        after = None
        while True:
            data = await self.json_call(addr, code, HalfStatusRequestHeader(limit=page_size, after=after).to_ext())
            yield data[key]
            after = data.get("next")
            if not after:
                return

    async def pending_halves(self, page_size: int | None = None) -> AsyncIterator[dict]:
        """Every pending half message, oldest check due first, a page of ``page_size`` per request (default and
        most: the broker's page). A half checked while the pages are read can come twice (its next check moved
        past the pages still to read): each offsetMsgId is given once."""
        seen = set()
        async for page in self._pages(RequestCode.HALFMQ_GET_HALF_STATUS, "halves", page_size):
            for row in page:
                if row["offsetMsgId"] not in seen:
                    seen.add(row["offsetMsgId"])
                    yield row

    def transaction_record_pages(self, page_size: int | None = None) -> AsyncIterator[list[dict]]:
        """Every transaction record the broker keeps, in store order, as the pages the broker answers
        (``page_size`` rows a request; default and most: the broker's page)."""
        return self._pages(RequestCode.HALFMQ_GET_TRANSACTION_RECORDS, "records", page_size)

    async def resume_half(self, offset_msg_id: str) -> None:
        await self.call(await self.broker_addr(), RequestCode.RESUME_CHECK_HALF_MESSAGE,
                        ResumeCheckHalfMessageRequestHeader(msgId=offset_msg_id).to_ext())
