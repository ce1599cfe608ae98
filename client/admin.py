"""Admin: operator requests over the protocol's admin request codes (what ``halfmq admin`` runs, see admin_cli).

Each method returns plain data (rows as dicts, messages as MessageExt); the transaction tables are async iterators
that page through every row. In a cluster, changes go to every master broker (of ``cluster``, or ``broker`` alone)
and the tables that span brokers list each row's broker.

    async with Admin("127.0.0.1:9876;127.0.0.1:9877") as admin:
        print(await admin.topic_list())
        await admin.update_topic("Orders", 8, 8)      # on every master of the cluster
        async for half in admin.pending_halves():     # one broker's
            print(half["transactionId"], half["ageMillis"])
"""
from __future__ import annotations

import asyncio
import copy
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

from halfmq.protocol.codes import PullSysFlag, RequestCode, ResponseCode, language_name, version_name
from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.headers import (ConnectionListRequestHeader, ConsumeStatsRequestHeader, CreateTopicRequestHeader,
                                     DeleteSubscriptionGroupRequestHeader, DeleteTopicFromNamesrvRequestHeader,
                                     GroupListRequestHeader, HalfStatusRequestHeader, PullMessageRequestHeader,
                                     QueryMessageRequestHeader, QueueRequestHeader, ResumeCheckHalfMessageRequestHeader,
                                     SearchOffsetRequestHeader, TopicRequestHeader, TopicStatsRequestHeader,
                                     UpdateConsumerOffsetRequestHeader, ViewMessageRequestHeader)
from halfmq.protocol.message import decode_offset_msg_id, decode_records
from halfmq.protocol.rules import RETRY_PREFIX

from .errors import AddressError, BrokerError, ClientError, ConnectionClosedError, RequestTimeoutError, error_for
from .message import MessageExt
from .remoting import ConnectionPool, Credentials, parse_address

T = TypeVar("T")
#: the group an admin's reads of a queue pull as (RocketMQ's tools use it too); they commit no offset
BROWSE_GROUP = "TOOLS_CONSUMER"


class Broker(NamedTuple):
    """A master broker as the name servers list it."""

    name: str
    addr: str
    cluster: str


class Admin:
    """Admin requests to the name servers and the brokers they know.

    Args:
        namesrv: name server address HOST:PORT, or several separated by ';' (a request the first cannot answer
            goes to the next).
        broker: the one broker, by address or name, that broker requests go to (default: see ``brokers``).
        cluster: broker requests go to this cluster's masters (default: see ``brokers``).

    Raises:
        AddressError: a name server address that is not HOST:PORT.
    """

    def __init__(self, namesrv: str, broker: str | None = None, credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None, timeout: float = 5.0, cluster: str | None = None):
        self.namesrv = namesrv
        self.namesrvs = [a.strip() for a in namesrv.split(";") if a.strip()]
        if not self.namesrvs:
            raise AddressError(f"no name server address in {namesrv!r}: write HOST:PORT, several separated by ';'")
        for addr in self.namesrvs:
            parse_address(addr)  # a typo is reported as one, not as a name server that is down
        self.broker = broker
        self.cluster = cluster
        self.credentials = credentials
        self.tls = tls
        self.timeout = timeout
        self.pool = ConnectionPool(credentials=credentials, tls=tls)
        self._answering = self.namesrvs[0]  #: the name server that answered last: asked first
        self._one: str | None = None  #: broker_addr's broker, looked up once

    async def close(self) -> None:
        await self.pool.close()

    def scoped(self, broker: str | None = None, cluster: str | None = None) -> "Admin":
        """This client with its broker requests aimed at ``broker`` (name or address) or ``cluster`` instead (see
        ``brokers``), sharing its connections and credentials: close this one, not the copy."""
        other = copy.copy(self)
        other.broker, other.cluster, other._one = broker, cluster, None
        return other

    async def __aenter__(self) -> "Admin":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def call(self, addr: str, code: int, ext: dict | None = None, body: bytes = b"",
                   timeout: float | None = None):
        """One request (``timeout``: the Admin's unless given); raises the BrokerError of any answer but SUCCESS."""
        conn = await self.pool.get(addr)
        resp = await conn.request(code, {k: str(v) for k, v in (ext or {}).items()}, body, timeout or self.timeout)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)
        return resp

    async def json_call(self, addr: str, code: int, ext: dict | None = None, body: bytes = b"",
                        timeout: float | None = None) -> Any:
        return json.loads((await self.call(addr, code, ext, body, timeout)).body or b"{}")

    async def namesrv_call(self, code: int, ext: dict | None = None, body: bytes = b""):
        """A request to the name servers: to the one that answered last, and while one is down or silent, to the
        next (each knows every broker, as every broker registers with all of them).

        Raises:
            ConnectionClosedError: none of them answered.
        """
        first = self.namesrvs.index(self._answering)
        unreachable = []
        for addr in self.namesrvs[first:] + self.namesrvs[:first]:
            try:
                resp = await self.call(addr, code, ext, body)
            except (ConnectionClosedError, RequestTimeoutError) as exc:
                unreachable.append(str(exc))
                continue
            self._answering = addr
            return resp
        if len(unreachable) == 1:  # the first thing most commands do: say which option points there
            raise ConnectionClosedError(f"cannot reach the name server (-n/--namesrv): {unreachable[0]}")
        raise ConnectionClosedError(f"cannot reach any name server (-n/--namesrv): {'; '.join(unreachable)}")

    async def namesrv_json(self, code: int, ext: dict | None = None) -> Any:
        return json.loads((await self.namesrv_call(code, ext)).body or b"{}")

    # --- where requests go ---
    async def cluster_info(self) -> dict:
        return await self.namesrv_json(RequestCode.GET_BROKER_CLUSTER_INFO)

    async def masters(self) -> list[Broker]:
        """Every master broker the name servers know, by name."""
        info = await self.cluster_info()
        cluster_of = {name: cluster for cluster, names in info.get("clusterAddrTable", {}).items() for name in names}
        return [Broker(name, data["brokerAddrs"]["0"], data.get("cluster") or cluster_of.get(name, ""))
                for name, data in sorted(info.get("brokerAddrTable", {}).items())
                if "0" in data.get("brokerAddrs", {})]

    async def broker_addrs(self) -> dict[str, str]:
        """Broker name → master address, as the name servers have them."""
        return {b.name: b.addr for b in await self.masters()}

    async def brokers(self, one_cluster: bool = False) -> list[Broker]:
        """The brokers broker requests go to: ``broker`` alone; else every master of ``cluster``; else every master
        the name servers know. ``one_cluster`` (for changes): without ``broker`` or ``cluster`` the name servers must
        know one cluster only, so a change never reaches another cluster unasked.

        Raises:
            ClientError: no broker known, an unknown cluster or broker, several clusters with ``one_cluster``.
        """
        masters = await self.masters()
        if not masters:
            raise ClientError("the name servers know no broker")
        clusters = sorted({b.cluster for b in masters})
        chosen = masters
        if self.cluster is not None:
            chosen = [b for b in masters if b.cluster == self.cluster]
            if not chosen:
                raise ClientError(f"unknown cluster {self.cluster!r} (-c/--cluster): the name servers know "
                                  f"{', '.join(clusters)}")
        if self.broker is not None:
            named = [b for b in chosen if self.broker in (b.name, b.addr)]
            if not named:
                where = f" in cluster {self.cluster}" if self.cluster is not None else ""
                raise ClientError(f"unknown broker {self.broker!r} (-b/--broker){where}: the name servers know "
                                  + ", ".join(f"{b.name} ({b.addr})" for b in chosen))
            return named[:1]
        if one_cluster and self.cluster is None and len(clusters) > 1:
            raise ClientError(f"the name servers know {len(clusters)} clusters ({', '.join(clusters)}): name one "
                              f"with -c/--cluster, or a broker with -b/--broker")
        return chosen

    async def broker_addr(self) -> str:
        """The broker of the requests that go to one: ``broker``, else the first master (of ``cluster``)."""
        if self._one is None:
            self._one = (await self.brokers())[0].addr
        return self._one

    async def on_each(self, brokers: list[Broker], request: Callable[[Broker], Awaitable[T]],
                      absent: int | None = None) -> list[tuple[Broker, T]]:
        """``request(broker)`` on every broker at once: (broker, result) in the brokers' order. A broker that answers
        ``absent`` (it holds no such topic, group or message) is left out; when every broker does, that is raised.

        Raises:
            ClientError: a broker failed: its own error when it is the only one asked, else one error naming
                every broker that failed (and where the request succeeded: a change was made there).
        """
        done, failed, absences = await self._outcomes(brokers, request, absent)
        if failed and len(brokers) == 1:
            raise failed[0][1]
        if failed:
            reasons = "; ".join(f"{b.name} ({b.addr}): {exc}" for b, exc in failed)
            if not done:
                raise ClientError(f"no broker answered: {reasons}", failed[0][1].code)
            raise ClientError(f"{reasons} (succeeded on {', '.join(b.name for b, _ in done)})", failed[0][1].code)
        if not done and absences:
            raise absences[0]
        return done

    async def on_each_answering(self, brokers: list[Broker], request: Callable[[Broker], Awaitable[T]],
                                absent: int | None = None
                                ) -> tuple[list[tuple[Broker, T]], list[tuple[Broker, ClientError]]]:
        """As ``on_each``, for reads that can show what the other brokers answered: the brokers that failed are
        returned with their errors ((answers, failures)) instead of failing the whole."""
        done, failed, _absences = await self._outcomes(brokers, request, absent)
        return done, failed

    @staticmethod
    async def _outcomes(brokers: list[Broker], request: Callable[[Broker], Awaitable[T]], absent: int | None
                        ) -> tuple[list[tuple[Broker, T]], list[tuple[Broker, ClientError]], list[BrokerError]]:
        """``request(broker)`` on every broker at once, sorted in the brokers' order: (answers, failures, the
        errors of brokers that answered ``absent``); an exception that is no ClientError is raised."""
        outcomes = await asyncio.gather(*(request(b) for b in brokers), return_exceptions=True)
        done, failed, absences = [], [], []
        for broker, outcome in zip(brokers, outcomes, strict=True):
            if isinstance(outcome, BrokerError) and absent is not None and outcome.code == absent:
                absences.append(outcome)
            elif isinstance(outcome, ClientError):
                failed.append((broker, outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                done.append((broker, outcome))
        return done, failed, absences

    # --- cluster and topics ---
    async def cluster_list(self) -> list[dict]:
        info = await self.cluster_info()
        return [{"cluster": cluster, "brokerName": name, "brokerId": bid, "addr": addr}
                for cluster, names in info.get("clusterAddrTable", {}).items() for name in names
                for bid, addr in info["brokerAddrTable"][name]["brokerAddrs"].items()]

    async def topic_list(self) -> list[str]:
        data = await self.namesrv_json(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        return list(data.get("topicList", []))

    async def topic_route(self, topic: str) -> dict:
        """The name server's route: ``brokerDatas`` (name → addresses) and ``queueDatas`` (queues per broker)."""
        return await self.namesrv_json(RequestCode.GET_ROUTEINFO_BY_TOPIC, TopicRequestHeader(topic=topic).to_ext())

    @staticmethod
    def _route_brokers(route: dict) -> list[Broker]:
        return [Broker(b["brokerName"], b["brokerAddrs"]["0"], b.get("cluster") or "")
                for b in route["brokerDatas"] if "0" in b["brokerAddrs"]]

    async def topic_status(self, topic: str) -> list[dict]:
        """Per queue of every broker of the route (of ``cluster``, or ``broker`` alone): min and max offset."""
        route = await self.topic_route(topic)
        holders = self._route_brokers(route)
        if self.broker is not None or self.cluster is not None:
            chosen = {b.name for b in await self.brokers()}
            holders = [b for b in holders if b.name in chosen]
        queues = {data["brokerName"]: data["readQueueNums"] for data in route["queueDatas"]}

        async def offsets(broker: Broker) -> list[dict]:
            rows = []
            for q in range(queues.get(broker.name, 0)):
                ext = QueueRequestHeader(topic=topic, queueId=q).to_ext()
                low = (await self.call(broker.addr, RequestCode.GET_MIN_OFFSET, ext)).ext_fields["offset"]
                high = (await self.call(broker.addr, RequestCode.GET_MAX_OFFSET, ext)).ext_fields["offset"]
                rows.append({"brokerName": broker.name, "queueId": q, "minOffset": int(low), "maxOffset": int(high)})
            return rows
        return [row for _broker, rows in await self.on_each(holders, offsets) for row in rows]

    async def topic_stats_page(self, limit: int, after: str | None = None, contains: str | None = None,
                               kinds: str | None = None) -> dict:
        """One page of the topics of every broker ``brokers`` names, in name order (HALFMQ_GET_TOPIC_STATS):
        ``topics`` (each ``topic``, ``kind`` and ``brokers``: every holder's row, its ``brokerName`` added),
        ``totals`` (broker name → its topics matching), ``errors`` (broker name → why it did not answer) and
        ``next`` (the ``after`` of the next page; None after the last).

        Each broker answers its first names after ``after`` (``limit`` of them, or fewer with ``next`` set): the
        union's names up to the first ``next`` a broker gave are all in the answers, each with every holder's row,
        so a page never misses a name nor a broker's share of one."""
        ext = TopicStatsRequestHeader(limit=limit, after=after, contains=contains or None, kinds=kinds).to_ext()
        done, failed = await self.on_each_answering(
            await self.brokers(), lambda b: self.json_call(b.addr, RequestCode.HALFMQ_GET_TOPIC_STATS, ext))
        if failed and not done:
            raise failed[0][1]
        rows: dict[str, list[dict]] = {}
        for broker, data in done:
            for row in data["topics"]:
                rows.setdefault(row["topic"], []).append({**row, "brokerName": broker.name})
        cut = min((data["next"] for _b, data in done if data["next"] is not None), default=None)
        names = sorted(n for n in rows if cut is None or n <= cut)
        more = cut is not None or len(names) > limit
        names = names[:limit]
        return {"topics": [{"topic": n, "kind": rows[n][0]["kind"], "brokers": rows[n]} for n in names],
                "totals": {b.name: data["total"] for b, data in done},
                "errors": {b.name: str(exc) for b, exc in failed}, "next": names[-1] if more and names else None}

    async def topic_stats(self, topic: str) -> tuple[list[dict], dict[str, str]]:
        """The topic on every broker ``brokers`` names that holds it: (its row there, with ``brokerName``,
        ``brokerAddr`` and each queue's last store time; broker name → why it did not answer).

        Raises:
            TopicNotExistError: every broker answered, and none holds it.
        """
        ext = TopicStatsRequestHeader(topic=topic).to_ext()
        done, failed = await self.on_each_answering(
            await self.brokers(), lambda b: self.json_call(b.addr, RequestCode.HALFMQ_GET_TOPIC_STATS, ext),
            absent=ResponseCode.TOPIC_NOT_EXIST)
        if not done and not failed:
            raise error_for(ResponseCode.TOPIC_NOT_EXIST, f"no broker holds topic {topic}")
        if failed and not done:
            raise failed[0][1]
        return ([{**data["topics"][0], "brokerName": b.name, "brokerAddr": b.addr} for b, data in done],
                {b.name: str(exc) for b, exc in failed})

    async def topic_consumers(self, topic: str, addr: str | None = None) -> list[str]:
        """The groups one broker (``addr``, else ``broker_addr``) knows consume ``topic``: a consumer offset in it
        or a consumer online subscribed to it (QUERY_TOPIC_CONSUME_BY_WHO)."""
        data = await self.json_call(addr or await self.broker_addr(), RequestCode.QUERY_TOPIC_CONSUME_BY_WHO,
                                    TopicRequestHeader(topic=topic).to_ext())
        return list(data["groupList"])

    async def update_topic(self, topic: str, read_queues: int = 8, write_queues: int = 8, perm: int = 6,
                           attributes: str | None = None) -> None:
        """Create or change a topic on every broker ``brokers(one_cluster=True)`` names (mqadmin's -c, or -b);
        ``attributes`` as mqadmin's -a, e.g. "+message.type=FIFO". Each broker registers again at once, so the
        routes list its queues a moment later."""
        header = CreateTopicRequestHeader(topic=topic, readQueueNums=read_queues, writeQueueNums=write_queues,
                                          perm=perm, attributes=attributes).to_ext()
        await self.on_each(await self.brokers(one_cluster=True),
                           lambda b: self.call(b.addr, RequestCode.UPDATE_AND_CREATE_TOPIC, header))

    async def delete_topic(self, topic: str) -> None:
        """Delete a topic on every broker of its route (of ``cluster``'s masters; of ``broker`` alone), then, unless
        one broker was named, in every name server (of ``cluster``), so no route lists it from now on, not only
        once each broker has registered again.

        Raises:
            TopicNotExistError: no broker holds the topic.
        """
        if self.broker is None and self.cluster is None:
            holders = self._route_brokers(await self.topic_route(topic))
        else:
            holders = await self.brokers()
        ext = TopicRequestHeader(topic=topic).to_ext()
        await self.on_each(holders, lambda b: self.call(b.addr, RequestCode.DELETE_TOPIC_IN_BROKER, ext),
                           absent=ResponseCode.TOPIC_NOT_EXIST)
        if self.broker is None:  # one broker's topic: the others of the cluster keep theirs in the routes
            await asyncio.gather(*(self._forget_topic(addr, topic) for addr in self.namesrvs))

    async def _forget_topic(self, namesrv: str, topic: str) -> None:
        ext = DeleteTopicFromNamesrvRequestHeader(topic=topic, clusterName=self.cluster).to_ext()
        try:
            await self.call(namesrv, RequestCode.DELETE_TOPIC_IN_NAMESRV, ext)
        except (ConnectionClosedError, RequestTimeoutError):
            pass  # down: it learns from the brokers' next registrations, which no longer list the topic
        except BrokerError as exc:
            # A lone broker's built-in name server serves no deletions: it reads the broker's own topics live.
            if exc.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                raise

    # --- groups and clients ---
    async def consumer_progress(self, group: str, topic: str | None = None) -> list[dict]:
        """Per queue of every broker ``brokers`` names: broker offset, the group's offset and the difference."""
        ext = ConsumeStatsRequestHeader(consumerGroup=group, topic=topic or None).to_ext()

        async def stats(broker: Broker) -> list[dict]:
            return (await self.json_call(broker.addr, RequestCode.GET_CONSUME_STATS, ext))["offsetTable"]
        return [row for _broker, rows in await self.on_each(await self.brokers(), stats) for row in rows]

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

    async def _group_page(self, code: int, limit: int, after: str | None, contains: str | None
                          ) -> tuple[dict[str, list[tuple[Broker, dict]]], dict[str, int], dict[str, str], str | None]:
        """One page of the groups of every broker ``brokers`` names (HALFMQ_GET_CONSUMER_GROUPS or
        HALFMQ_GET_PRODUCER_GROUPS), in name order: (group → each holder's row, broker name → its groups
        matching, broker name → why it did not answer, the ``after`` of the next page or None after the last).

        Each broker answers its first names after ``after``: the first ``limit`` names of their union, up to the
        last name of any broker that has more, are among those, each with every holder's row."""
        ext = GroupListRequestHeader(limit=limit, after=after, contains=contains or None).to_ext()
        done, failed = await self.on_each_answering(await self.brokers(),
                                                    lambda b: self.json_call(b.addr, code, ext))
        if failed and not done:
            raise failed[0][1]
        rows: dict[str, list[tuple[Broker, dict]]] = {}
        for broker, data in done:
            for row in data["groups"]:
                rows.setdefault(row["group"], []).append((broker, row))
        bound = min((data["next"] for _b, data in done if data["next"] is not None), default=None)
        names = sorted(n for n in rows if bound is None or n <= bound)[:limit]
        more = bound is not None or len(rows) > len(names)
        return ({n: rows[n] for n in names}, {b.name: data["total"] for b, data in done},
                {b.name: str(exc) for b, exc in failed}, names[-1] if more and names else None)

    async def consumer_groups_page(self, limit: int, after: str | None = None, contains: str | None = None
                                   ) -> dict:
        """One page of the consumer groups of every broker ``brokers`` names, in name order: ``groups`` (each
        ``group``; ``online``, the most remoting consumers online at one broker, as each consumer joins every broker
        of its topics; ``lag``, every broker's summed; ``topics`` it reads; ``retryTopic`` and ``dlqTopic``, held
        by some broker; ``brokers``, those that know it), ``totals``, ``errors`` and ``next`` (see _group_page)."""
        rows, totals, errors, after = await self._group_page(RequestCode.HALFMQ_GET_CONSUMER_GROUPS, limit, after,
                                                             contains)
        groups = [{"group": name, "online": max(r["online"] for _b, r in held),
                   "lag": sum(r["lag"] for _b, r in held),
                   "topics": sorted({t for _b, r in held for t in r["topics"]}),
                   "messageModel": next((r["messageModel"] for _b, r in held if r["messageModel"]), None),
                   "retryTopic": any(r["retryTopic"] for _b, r in held),
                   "dlqTopic": any(r["dlqTopic"] for _b, r in held), "brokers": [b.name for b, _r in held]}
                  for name, held in rows.items()]
        return {"groups": groups, "totals": totals, "errors": errors, "next": after}

    async def producer_groups_page(self, limit: int, after: str | None = None, contains: str | None = None
                                   ) -> dict:
        """One page of the live producer groups of every broker ``brokers`` names, in name order: ``groups`` (each
        ``group``, ``protocol`` (remoting or grpc; a gRPC group is its ``topic``'s, 5.x producers have none),
        ``clients`` (by client id, with ``brokers``: where it is registered; language and version by name),
        ``clientCount`` (the most at one broker, or the clients listed if more) and ``brokers``), ``totals``,
        ``errors`` and ``next`` (see _group_page)."""
        rows, totals, errors, after = await self._group_page(RequestCode.HALFMQ_GET_PRODUCER_GROUPS, limit, after,
                                                             contains)
        groups = []
        for name, held in rows.items():
            clients: dict[str, dict] = {}
            for broker, row in held:
                for client in row["clients"]:
                    clients.setdefault(client["clientId"], {**self._client_named(client), "brokers": []})[
                        "brokers"].append(broker.name)
            groups.append({"group": name, "protocol": held[0][1]["protocol"], "topic": held[0][1]["topic"],
                           "clients": [clients[c] for c in sorted(clients)],
                           "clientCount": max(len(clients), *(r["clientCount"] for _b, r in held)),
                           "brokers": [b.name for b, _r in held]})
        return {"groups": groups, "totals": totals, "errors": errors, "next": after}

    @staticmethod
    def _client_named(client: dict) -> dict:
        """A remoting client's language and version ordinal by RocketMQ's names; a gRPC client's version is its
        user agent's already."""
        named = {**client, "language": language_name(client["language"])}
        if client.get("protocol") != "grpc":
            named["version"] = version_name(int(client["version"]))
        return named

    async def consumer_group(self, group: str) -> tuple[list[dict], dict[str, str]]:
        """The group on every broker ``brokers`` names that knows it: (per broker ``brokerName``, ``brokerAddr``,
        ``summary`` (its HALFMQ_GET_CONSUMER_GROUPS row), ``queues`` (GET_CONSUME_STATS rows), ``members`` and
        ``subscriptions`` (GET_CONSUMER_CONNECTION_LIST: none when no consumer is online there); broker name → why
        it did not answer).

        Raises:
            BrokerError: SUBSCRIPTION_GROUP_NOT_EXIST when every broker answered and none knows the group.
        """
        one = GroupListRequestHeader(group=group).to_ext()
        stats = ConsumeStatsRequestHeader(consumerGroup=group).to_ext()
        connections = ConnectionListRequestHeader(consumerGroup=group).to_ext()

        async def on(broker: Broker) -> dict:
            summary = (await self.json_call(broker.addr, RequestCode.HALFMQ_GET_CONSUMER_GROUPS, one))["groups"][0]
            queues = (await self.json_call(broker.addr, RequestCode.GET_CONSUME_STATS, stats))["offsetTable"]
            try:
                online = await self.json_call(broker.addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, connections)
            except BrokerError as exc:
                if exc.code != ResponseCode.CONSUMER_NOT_ONLINE:
                    raise
                online = {"connectionSet": [], "subscriptionTable": {}}
            return {"brokerName": broker.name, "brokerAddr": broker.addr, "summary": summary, "queues": queues,
                    "members": self._named(online["connectionSet"]),
                    "subscriptions": {t: s["subString"] for t, s in online["subscriptionTable"].items()}}
        done, failed = await self.on_each_answering(await self.brokers(), on,
                                                    absent=ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST)
        if not done and not failed:
            raise error_for(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"no broker knows consumer group {group}")
        if failed and not done:
            raise failed[0][1]
        return [data for _b, data in done], {b.name: str(exc) for b, exc in failed}

    async def reset_offset_by_time(self, group: str, timestamp_ms: int, topic: str | None = None) -> list[dict]:
        """mqadmin resetOffsetByTime as RocketMQ does it for a group with no consumer online (resetOffsetByTimeOld,
        forced): on every broker ``brokers`` names, each queue of ``topic``, else of every topic GET_CONSUME_STATS
        lists for the group but its ``%RETRY%`` topic, gets the group's offset of the first message stored at or
        after ``timestamp_ms`` (the queue's end when there is none), committed durably (two-way
        UPDATE_CONSUMER_OFFSET). Returns a row per queue: ``brokerName``, ``topic``, ``queueId``, ``previousOffset``
        (-1: none), ``offset``.

        A consumer online keeps its own position and commits it with its next pull, over the reset (RocketMQ
        tells its Java consumers to reset themselves, RESET_CONSUMER_CLIENT_OFFSET; halfmq's clients have no such
        command): stop the group's consumers first; they start again from the reset offsets."""
        stats = ConsumeStatsRequestHeader(consumerGroup=group, topic=topic or None).to_ext()

        async def reset(broker: Broker) -> list[dict]:
            rows = []
            for row in (await self.json_call(broker.addr, RequestCode.GET_CONSUME_STATS, stats))["offsetTable"]:
                name, queue_id = row["topic"], row["queueId"]
                if topic is None and name.startswith(RETRY_PREFIX):
                    continue
                queue = QueueRequestHeader(topic=name, queueId=queue_id).to_ext()
                offset = await self.search_offset(broker.addr, name, queue_id, timestamp_ms)
                low = int((await self.call(broker.addr, RequestCode.GET_MIN_OFFSET, queue)).ext_fields["offset"])
                if offset < low:  # the store answers 0 for a queue holding no message: its end is where to read
                    offset = int((await self.call(broker.addr, RequestCode.GET_MAX_OFFSET, queue)
                                  ).ext_fields["offset"])
                await self.call(broker.addr, RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader(
                    consumerGroup=group, topic=name, queueId=queue_id, commitOffset=offset).to_ext())
                rows.append({"brokerName": broker.name, "topic": name, "queueId": queue_id,
                             "previousOffset": row["consumerOffset"], "offset": offset})
            return rows
        return [row for _b, rows in await self.on_each(await self.brokers(), reset) for row in rows]

    async def update_sub_group(self, group: str) -> None:
        """Create a subscription group on every broker ``brokers(one_cluster=True)`` names (halfmq keeps no
        settings per group: RocketMQ's defaults apply)."""
        body = json.dumps({"groupName": group}).encode()
        await self.on_each(await self.brokers(one_cluster=True),
                           lambda b: self.call(b.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body))

    async def delete_sub_group(self, group: str) -> None:
        """Delete a subscription group on every broker ``brokers(one_cluster=True)`` names that has it."""
        ext = DeleteSubscriptionGroupRequestHeader(groupName=group).to_ext()
        await self.on_each(await self.brokers(one_cluster=True),
                           lambda b: self.call(b.addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, ext),
                           absent=ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST)

    # --- messages ---
    async def _holder(self, offset_msg_id: str) -> str:
        """The broker an offsetMsgId names, if the name servers know it, else ``broker_addr``.

        Raises:
            MessageFormatError: not an offsetMsgId.
        """
        host, _offset = decode_offset_msg_id(offset_msg_id)
        return host if host in (await self.broker_addrs()).values() else await self.broker_addr()

    async def view_message(self, offset_msg_id: str) -> MessageExt:
        """The message an offsetMsgId names (VIEW_MESSAGE_BY_ID on the broker the id names).

        Raises:
            MessageFormatError: not an offsetMsgId.
        """
        _host, offset = decode_offset_msg_id(offset_msg_id)
        resp = await self.call(await self._holder(offset_msg_id), RequestCode.VIEW_MESSAGE_BY_ID,
                               ViewMessageRequestHeader(offset=offset).to_ext())
        return decode_records(resp.body)[0]

    async def query_msg_by_key(self, topic: str, key: str, max_num: int = 64, addr: str | None = None
                               ) -> list[MessageExt]:
        """Messages of ``topic`` with ``key`` on one broker: ``addr``, else ``broker_addr``."""
        header = QueryMessageRequestHeader(topic=topic, key=key, maxNum=max_num, beginTimestamp=0,
                                           endTimestamp=2 ** 62)
        resp = await self.call(addr or await self.broker_addr(), RequestCode.QUERY_MESSAGE, header.to_ext())
        return decode_records(resp.body)

    async def read_queue(self, addr: str, topic: str, queue_id: int, offset: int, count: int
                         ) -> tuple[list[MessageExt], int, int]:
        """Up to ``count`` messages of one queue of the broker at ``addr``, from ``offset`` on (from the queue's
        first kept message when ``offset`` is below it), and the queue's min and max offset: pulls as BROWSE_GROUP
        that commit no offset and are never held."""
        messages: list[MessageExt] = []
        low = high = 0
        conn = await self.pool.get(addr)
        for _attempt in range(count):  # a pull answers at least one message or moves the offset: bounded
            ext = PullMessageRequestHeader(
                consumerGroup=BROWSE_GROUP, topic=topic, queueId=queue_id, queueOffset=offset,
                maxMsgNums=count - len(messages), sysFlag=PullSysFlag.SUBSCRIPTION, commitOffset=0,
                suspendTimeoutMillis=0, subVersion=0, subscription="*", expressionType="TAG").to_ext()
            resp = await conn.request(RequestCode.PULL_MESSAGE, ext, b"", self.timeout)
            if resp.code not in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
                                 ResponseCode.PULL_OFFSET_MOVED):
                raise error_for(resp.code, resp.remark)
            low, high = int(resp.ext_fields["minOffset"]), int(resp.ext_fields["maxOffset"])
            next_offset = int(resp.ext_fields["nextBeginOffset"])
            if resp.code == ResponseCode.SUCCESS:
                messages.extend(decode_records(resp.body))
            elif resp.code == ResponseCode.PULL_NOT_FOUND or next_offset == offset or offset > high:
                break  # at the end (an offset past it is moved to the end: nothing to read there either)
            offset = next_offset
            if len(messages) >= count or offset >= high:
                break
        return messages, low, high

    async def search_offset(self, addr: str, topic: str, queue_id: int, timestamp_ms: int,
                            boundary: str = "lower") -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP on the broker at ``addr``: ``lower``, the first offset stored at or after
        ``timestamp_ms`` (the max offset if none); ``upper``, the last stored at or before it."""
        ext = SearchOffsetRequestHeader(topic=topic, queueId=queue_id, timestamp=timestamp_ms,
                                        boundaryType=boundary).to_ext()
        return int((await self.call(addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, ext)).ext_fields["offset"])

    async def is_offset_msg_id(self, msg_id: str) -> bool:
        """Does ``msg_id`` name a stored record of a broker the name server knows (the offsetMsgId form)?"""
        try:
            host, _offset = decode_offset_msg_id(msg_id)
        except MessageFormatError:
            return False
        return host in set((await self.broker_addrs()).values()) | {await self.broker_addr()}

    # --- one broker's: ``addr``, else broker_addr ---
    async def replication(self) -> list[dict]:
        """Every member of every broker group (of -c's cluster, or -b's group) as it reports itself
        (HALFMQ_GET_REPLICATION): its role, epoch, last record and committed record; a leader's in-sync set, and each
        follower's acknowledged record and lag as its leader sees them. A member that does not answer is listed
        with the error."""
        info = await self.cluster_info()
        members = [(name, int(broker_id), addr) for name, data in sorted(info.get("brokerAddrTable", {}).items())
                   for broker_id, addr in sorted(data.get("brokerAddrs", {}).items(), key=lambda kv: int(kv[0]))
                   if self.broker in (None, name, addr)
                   and (self.cluster is None or data.get("cluster") == self.cluster)]
        if not members:
            raise ClientError("the name servers know no such broker group")

        async def ask(member):
            name, broker_id, addr = member
            try:
                status = await self.json_call(addr, RequestCode.HALFMQ_GET_REPLICATION)
            except ClientError as exc:
                return {"brokerName": name, "brokerId": broker_id, "brokerAddr": addr, "error": str(exc)}
            return {"brokerName": name, "brokerAddr": addr, **status}
        rows = await asyncio.gather(*(ask(m) for m in members))
        lag = {(row["brokerName"], f["brokerId"]): f for row in rows if row.get("role") == "leader"
               for f in row.get("followers", ())}
        for row in rows:
            seen = lag.get((row["brokerName"], row.get("brokerId")))
            if seen is not None:
                row.update(inSync=seen["inSync"], lagMillis=seen["lagMillis"], behind=seen["behind"])
            row.pop("followers", None)
        return rows

    async def switch_leader(self, broker_name: str, to: int, timeout: float = 60.0) -> dict:
        """Hand broker group ``broker_name``'s leadership to its member ``to`` (HALFMQ_SWITCH_LEADER, sent to the
        leader): once the member holds every record, it leads at a higher epoch and the old leader follows it."""
        info = await self.cluster_info()
        data = info.get("brokerAddrTable", {}).get(broker_name)
        if data is None or "0" not in data.get("brokerAddrs", {}):
            raise ClientError(f"the name servers know no leader of broker group {broker_name!r}")
        return await self.json_call(data["brokerAddrs"]["0"], RequestCode.HALFMQ_SWITCH_LEADER, {"brokerId": to},
                                    timeout=timeout)

    async def broker_status(self, addr: str | None = None) -> dict:
        return (await self.json_call(addr or await self.broker_addr(), RequestCode.GET_BROKER_RUNTIME_INFO))["table"]

    async def delete_expired_commit_log(self, timeout: float = 600.0, addr: str | None = None) -> dict:
        """Run a retention pass now (DELETE_EXPIRED_COMMITLOG): what it deleted and freed. A pass over millions of
        messages takes a while: ``timeout`` is long."""
        resp = await self.call(addr or await self.broker_addr(), RequestCode.DELETE_EXPIRED_COMMITLOG, timeout=timeout)
        return json.loads(resp.body)

    async def broker_config(self, addr: str | None = None) -> dict[str, str]:
        """The broker's configuration in effect, key → value as text."""
        text = (await self.call(addr or await self.broker_addr(), RequestCode.GET_BROKER_CONFIG)).body.decode()
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    # --- transactions (one broker's: ``addr``, else broker_addr) ---
    async def _pages(self, code: int, key: str, page_size: int | None, addr: str | None
                     ) -> AsyncIterator[list[dict]]:
        addr = addr or await self.broker_addr()
        after = None
        while True:
            data = await self.json_call(addr, code, HalfStatusRequestHeader(limit=page_size, after=after).to_ext())
            yield data[key]
            after = data.get("next")
            if not after:
                return

    async def pending_halves(self, page_size: int | None = None, addr: str | None = None) -> AsyncIterator[dict]:
        """Every pending half message, oldest check due first, a page of ``page_size`` per request (default and
        most: the broker's page). A half checked while the pages are read can come twice (its next check moved
        past the pages still to read): each offsetMsgId is given once."""
        seen = set()
        async for page in self._pages(RequestCode.HALFMQ_GET_HALF_STATUS, "halves", page_size, addr):
            for row in page:
                if row["offsetMsgId"] not in seen:
                    seen.add(row["offsetMsgId"])
                    yield row

    def transaction_record_pages(self, page_size: int | None = None, addr: str | None = None
                                 ) -> AsyncIterator[list[dict]]:
        """Every transaction record the broker keeps, in store order, as the pages the broker answers
        (``page_size`` rows a request; default and most: the broker's page)."""
        return self._pages(RequestCode.HALFMQ_GET_TRANSACTION_RECORDS, "records", page_size, addr)

    async def half_status_page(self, addr: str, order: str | None = None, after: str | None = None,
                               limit: int | None = None) -> dict:
        """One page of one broker's pending halves (HALFMQ_GET_HALF_STATUS): ``halves`` (rows), ``pending`` (how
        many the broker holds), ``next`` (the ``after`` of the next page, None after the last). ``order``: "due"
        (the default: next check soonest first), "store" (oldest first), "-due" or "-store" (reversed)."""
        header = HalfStatusRequestHeader(limit=limit, after=after, order=order)
        return await self.json_call(addr, RequestCode.HALFMQ_GET_HALF_STATUS, header.to_ext())

    async def transaction_records_page(self, addr: str, state: str | None = None, order: str | None = None,
                                       after: str | None = None, limit: int | None = None) -> dict:
        """One page of one broker's transaction records (HALFMQ_GET_TRANSACTION_RECORDS), of ``state`` alone if
        given: ``records`` and ``next``. ``order``: "store" (the default: oldest first) or "-store". A page of one
        state can hold fewer rows than asked for and still have a ``next``: the broker passes over a bounded
        number of other rows per request."""
        header = HalfStatusRequestHeader(limit=limit, after=after, order=order, state=state)
        return await self.json_call(addr, RequestCode.HALFMQ_GET_TRANSACTION_RECORDS, header.to_ext())

    async def half_record(self, offset_msg_id: str) -> tuple[str, dict] | None:
        """(broker address, transaction record) of the half an offsetMsgId names, on the broker it names; None
        when that broker keeps no half at that offset.

        Raises:
            MessageFormatError: not an offsetMsgId.
        """
        _host, offset = decode_offset_msg_id(offset_msg_id)
        addr = await self._holder(offset_msg_id)
        if offset < 0:
            return None
        page = await self.transaction_records_page(addr, after=str(offset - 1) if offset else None, limit=1)
        rows = [row for row in page["records"] if row["offset"] == offset]
        return (addr, rows[0]) if rows else None

    async def resume_half(self, offset_msg_id: str) -> None:
        """Check a discarded half again, on the broker its offsetMsgId names.

        Raises:
            MessageFormatError: not an offsetMsgId.
        """
        await self.call(await self._holder(offset_msg_id), RequestCode.RESUME_CHECK_HALF_MESSAGE,
                        ResumeCheckHalfMessageRequestHeader(msgId=offset_msg_id).to_ext())
