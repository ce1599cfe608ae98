"""Read-only operator requests: message lookup by key, runtime info, connections, consume progress and the
transaction tables (what `halfmq admin` and the Spark audit job read)."""
from __future__ import annotations

import heapq
import json
import time

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import (
    ConnectionListRequestHeader,
    ConsumeStatsRequestHeader,
    GroupListRequestHeader,
    HalfStatusRequestHeader,
    QueryMessageRequestHeader,
    TopicRequestHeader,
    TopicStatsRequestHeader,
)
from halfmq.protocol.message import create_offset_msg_id, decode_record
from halfmq.transactions import HalfStatus

from ..context import now_ms
from ..errors import BrokerError, Failure
from ..names import DLQ_PREFIX, GRPC_GROUP_PREFIX, RETRY_PREFIX, check_group, check_message_key, check_topic
from ..topics import SYSTEM_TOPICS, TopicConfig
from .base import Processor, handles

#: Rows per page of the transaction tables: what one request can make the broker read and encode on its event loop
#: (a client wanting more asks for the next page). Decoding a half's state costs ~20 us here, so a page holds the
#: loop ~20 ms (5,000 rows held it 120-130 ms).
MAX_PAGE = 1_000
#: Rows a page of one state may pass over (halves of other states): passing over one costs ~0.4 us here (its first
#: bytes tell its state), so as long on the loop as a full page.
MAX_SCAN = 50_000
_STARTED = time.time()
#: Groups per page of HALFMQ_GET_CONSUMER_GROUPS and HALFMQ_GET_PRODUCER_GROUPS, and clients listed per producer
#: group: a page costs the same however many clients a group has.
MAX_GROUP_PAGE = 500
MAX_LISTED = 100
TOPIC_KINDS = ("NORMAL", "RETRY", "DLQ", "SYSTEM")
#: Queue rows a page of HALFMQ_GET_TOPIC_STATS holds at most (a topic has up to 1,024 queues): ~30 ms on the loop
MAX_TOPIC_PAGE_QUEUES = 20_000


def _json(cmd: RemotingCommand, body) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())


class InspectProcessor(Processor):
    @handles(RequestCode.QUERY_MESSAGE)
    def query_message(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = QueryMessageRequestHeader.from_ext(cmd.ext_fields)
        # Both form the key index's lookup prefix, which LMDB refuses beyond its key size.
        check_topic(h.topic, "topic")
        check_message_key(h.key, "key", Failure.BAD_REQUEST)
        self.ctx.acl.check_record(channel, cmd, h.topic)
        # Only records that are the topic's own: the access check above was for that topic, nothing else.
        records = [raw for raw in self.ctx.store.messages_by_key(h.topic, h.key, max(1, min(h.maxNum, 64)))
                   if decode_record(raw).topic == h.topic]
        if not records:
            raise BrokerError(Failure.KEY_NOT_FOUND, f"no message of topic {h.topic} with key {h.key}")
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"indexLastUpdateTimestamp": str(now_ms()),
                                                              "indexLastUpdatePhyoffset": "0"},
                            body=b"".join(records))

    @handles(RequestCode.GET_BROKER_RUNTIME_INFO)
    def runtime_info(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        ctx = self.ctx
        stats = ctx.store.stats()
        check = ctx.check_back
        table = {"brokerVersionDesc": "halfmq 0.1.0 (RocketMQ 4.9.8 protocol)", "bootTimestamp": str(int(_STARTED * 1000)),
                 "runtime": f"{int(time.time() - _STARTED)} s", "storeUsedBytes": str(stats["used_bytes"]),
                 "storeMapSize": str(stats["map_size"]), "storeGroupCommits": str(stats["total_groups"]),
                 "storeWrites": str(stats["total_ops"]), "pendingHalfMessages": str(ctx.store.pending_halves_count()),
                 "checkBacksSent": str(check.checks_sent), "checkBacksUndeliverable": str(check.checks_undeliverable),
                 "checkBacksTakenBack": str(check.checks_taken_back),
                 "halfMessagesDiscarded": str(check.discarded),
                 "lastCheckPassMillis": f"{check.last_pass_seconds * 1000:.2f}", "heldPulls": str(ctx.long_poll.count()),
                 "topics": str(len(ctx.topics.topics)), "flushDiskType": ctx.config.flushDiskType,
                 "messagesPutTotal": str(ctx.metrics.messages_in_total if ctx.metrics else 0),
                 "messagesGotTotal": str(ctx.metrics.messages_out_total if ctx.metrics else 0)}
        lifecycle = ctx.retention.status()
        table.update({"storeDataBytes": str(lifecycle.used_bytes), "storeFileBytes": str(lifecycle.file_bytes),
                      "storeLimitBytes": str(lifecycle.limit_bytes), "storeUseRatio": f"{lifecycle.use_ratio:.4f}",
                      "oldestMessageAgeSeconds": f"{lifecycle.oldest_age_seconds:.1f}",
                      "retentionDeletedMessages": str(lifecycle.deleted_total),
                      "deletedTopicsPurgedMessages": str(lifecycle.purged_total),
                      "storeRefusingWrites": str(lifecycle.refusing).lower()})
        return _json(cmd, {"table": table})

    @staticmethod
    def _connection(info) -> dict:
        return {"clientId": info.client_id, "clientAddr": info.channel.remote, "language": info.language,
                "version": info.version}

    @handles(RequestCode.GET_PRODUCER_CONNECTION_LIST)
    def producer_connections(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        group = check_group(ConnectionListRequestHeader.from_ext(cmd.ext_fields).producerGroup, "producerGroup")
        infos = self.ctx.producers.groups.get(group, {}).values()
        if not infos:
            raise BrokerError(Failure.NOT_ONLINE, f"the producer group[{group}] not online")
        return _json(cmd, {"connectionSet": [self._connection(i) for i in infos]})

    @handles(RequestCode.GET_CONSUMER_CONNECTION_LIST)
    def consumer_connections(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        group = check_group(ConnectionListRequestHeader.from_ext(cmd.ext_fields).consumerGroup, "consumerGroup")
        entry = self.ctx.consumers.groups.get(group)
        if entry is None:
            raise BrokerError(Failure.CONSUMERS_OFFLINE, f"the consumer group[{group}] not online")
        return _json(cmd, {"connectionSet": [self._connection(i) for i in entry.channels.values()],
                           "subscriptionTable": {t: {"topic": t, "subString": s.expression}
                                                 for t, s in entry.subscriptions.items()},
                           "consumeType": entry.consume_type, "messageModel": entry.message_model,
                           "consumeFromWhere": entry.consume_from_where})

    @handles(RequestCode.GET_CONSUME_STATS)
    def consume_stats(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = ConsumeStatsRequestHeader.from_ext(cmd.ext_fields)
        check_group(h.consumerGroup, "consumerGroup")
        if h.topic:
            check_topic(h.topic, "topic")
        ctx = self.ctx
        topics = {h.topic} if h.topic else {t for (g, t, _q) in ctx.offsets.table if g == h.consumerGroup}
        entry = ctx.consumers.groups.get(h.consumerGroup)
        if entry is not None and not h.topic:
            topics |= set(entry.subscriptions)
        return _json(cmd, {"offsetTable": self._progress(h.consumerGroup, topics), "consumeTps": 0.0})

    def _progress(self, group: str, topics) -> list[dict]:
        """Each queue of ``topics``: the broker's max offset, the group's committed offset (-1: none) and the
        difference."""
        ctx = self.ctx
        rows = []
        for topic in sorted(topics):
            config = ctx.topics.get(topic)
            queues = range(config.read_queue_nums) if config else ctx.store.queue_ids(topic)
            for queue_id in queues:
                broker_offset = ctx.store.max_offset(topic, queue_id)
                consumer_offset = ctx.offsets.get(group, topic, queue_id)
                rows.append({"topic": topic, "brokerName": ctx.config.brokerName, "queueId": queue_id,
                             "brokerOffset": broker_offset,
                             "consumerOffset": -1 if consumer_offset is None else consumer_offset,
                             "diff": broker_offset - (consumer_offset or 0)})
        return rows

    @handles(RequestCode.HALFMQ_GET_CONSUMER_GROUPS)
    def consumer_groups(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        """One page of the consumer groups (each ``%RETRY%`` topic's, and any with consumers online), in name order,
        each with its remoting consumers online, the topics it reads (subscribed, or with a committed offset), its
        lag (the sum over the queues GET_CONSUME_STATS lists of the broker's max offset less the group's offset, at
        least 0) and whether its retry and dead-letter topics exist; ``total`` counts every page's; ``next``
        continues after the page's last name (None after the last page). With ``group``: that group alone,
        SUBSCRIPTION_GROUP_NOT_EXIST when the broker knows nothing of it."""
        h = GroupListRequestHeader.from_ext(cmd.ext_fields)
        ctx = self.ctx
        online = ctx.consumers.groups
        names = {t[len(RETRY_PREFIX):] for t in ctx.topics.topics if t.startswith(RETRY_PREFIX)}
        names.update(online)
        page, total, after = _group_page(names, h)
        if h.group is not None and not page:
            raise BrokerError(Failure.GROUP_NOT_FOUND, f"subscription group[{h.group}] not exist")
        wanted = set(page)
        offset_topics: dict[str, set[str]] = {}
        for group, topic, _queue in ctx.offsets.table:  # one pass for the page, not one per group
            if group in wanted:
                offset_topics.setdefault(group, set()).add(topic)
        rows = []
        for group in page:
            entry = online.get(group)
            topics = offset_topics.get(group, set()) | (set(entry.subscriptions) if entry is not None else set())
            progress = self._progress(group, topics)
            rows.append({"group": group, "online": len(entry.client_ids()) if entry is not None else 0,
                         "topics": sorted(topics)[:MAX_LISTED], "lag": sum(max(0, r["diff"]) for r in progress),
                         "messageModel": entry.message_model if entry is not None else None,
                         "retryTopic": RETRY_PREFIX + group in ctx.topics.topics,
                         "dlqTopic": DLQ_PREFIX + group in ctx.topics.topics})
        return _json(cmd, {"groups": rows, "total": total, "next": after})

    @handles(RequestCode.HALFMQ_GET_PRODUCER_GROUPS)
    def producer_groups(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        """One page of the live producer groups, in name order, each with its clients by client id (at most
        MAX_LISTED; ``clientCount`` counts them all): id, address, language, version and protocol; ``total`` and
        ``next`` as consumer_groups'. gRPC producers (5.x clients have no group) are registered under each topic's
        transaction group ``%GRPC%<topic>`` (grpc/sessions.py): such a group is protocol "grpc" with its ``topic``,
        and its clients' version is what their user agent says (a remoting client's is its version ordinal)."""
        h = GroupListRequestHeader.from_ext(cmd.ext_fields)
        groups = self.ctx.producers.groups
        page, total, after = _group_page(groups, h)
        if h.group is not None and not page:
            raise BrokerError(Failure.NOT_ONLINE, f"the producer group[{h.group}] not online")
        rows = []
        for group in page:
            grpc = group.startswith(GRPC_GROUP_PREFIX)
            infos = sorted(groups[group].values(), key=lambda i: i.client_id)
            clients = []
            for info in infos[:MAX_LISTED]:
                client = {**self._connection(info), "protocol": "grpc" if grpc else "remoting"}
                if grpc:
                    client["version"] = _user_agent_version(info.channel)
                clients.append(client)
            rows.append({"group": group, "protocol": "grpc" if grpc else "remoting",
                         "topic": group[len(GRPC_GROUP_PREFIX):] if grpc else None, "clientCount": len(infos),
                         "clients": clients})
        return _json(cmd, {"groups": rows, "total": total, "next": after})

    @handles(RequestCode.HALFMQ_GET_HALF_STATUS)
    def half_status(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        """One page of the pending halves: age, checks so far, next check, waiting for a producer, group, topic,
        offsetMsgId, how many messages it holds (a batch half more than one). ``order`` "due" (the default): next
        check soonest first, from the due index; "store": oldest first, from the halves' own table (a page there
        passes over the decided halves between pending ones, MAX_SCAN rows at most); "-" before either for the
        reverse. ``next`` continues after the page's last row (None after the last page)."""
        h = HalfStatusRequestHeader.from_ext(cmd.ext_fields)
        order = _order(h.order, "due", ("due", "store"))
        limit = _page_limit(h.limit)
        store, now = self.ctx.store, now_ms()
        reverse = order.startswith("-")
        if order.endswith("due"):
            page = store.due_page(_cursor(h.after, 2), limit, reverse)
            # a half decided between the two reads is left out
            halves = [(offset, state) for _due, offset in page
                      if (state := store.get_half(offset)) is not None and state.pending]
            after = _next_cursor(page[-1] if page else None, len(page), limit)
        else:
            start = _cursor(h.after, 1)
            halves, last = store.halves_scan(HalfStatus.PREPARED, start[0] if start else None, limit, MAX_SCAN,
                                             reverse)
            after = None if last is None else str(last)
        rows = [{"offsetMsgId": create_offset_msg_id(self.ctx.store_host, offset),
                 "transactionId": state.uniq, "producerGroup": state.group, "topic": state.topic,
                 "ageMillis": now - state.store_ts, "checks": state.checks,
                 "nextCheckInMillis": state.due - now, "waitingForProducer": state.waiting,
                 "messages": state.batch or 1} for offset, state in halves]
        return _json(cmd, {"pending": store.pending_halves_count(), "halves": rows, "next": after})

    @handles(RequestCode.HALFMQ_GET_TRANSACTION_RECORDS)
    def transaction_records(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        """One page of the transactions' records (for audits): state, group, topic, times, check count, and the
        half's offsetMsgId (what a resume names); in store order (``order`` "-store": newest first), of one
        ``state`` only if given (a page then passes over MAX_SCAN rows at most). ``next`` continues after the last
        row looked at (None after the last page)."""
        h = HalfStatusRequestHeader.from_ext(cmd.ext_fields)
        order = _order(h.order, "store", ("store",))
        limit = _page_limit(h.limit)
        start = _cursor(h.after, 1)
        status = _status(h.state)
        page, last = self.ctx.store.halves_scan(status, start[0] if start else None, limit, MAX_SCAN,
                                                order.startswith("-"))
        rows = []
        for offset, state in page:
            rows.append({"offset": offset, "offsetMsgId": create_offset_msg_id(self.ctx.store_host, offset),
                         "transactionId": state.uniq, "producerGroup": state.group,
                         "topic": state.topic, "state": state.status.value, "storeTimestamp": state.store_ts,
                         "decidedTimestamp": state.decided_ts, "decidedBy": state.decided_by,
                         "checks": state.checks, "messages": state.batch or 1,
                         "nextCheckTimestamp": state.due if state.pending else None,
                         "waitingForProducer": state.waiting})
        return _json(cmd, {"records": rows, "next": None if last is None else str(last)})

    @handles(RequestCode.HALFMQ_GET_TOPIC_STATS)
    def topic_stats(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        """One page of the topics, in name order, each with its settings, messages sent to it since the broker
        started (None: beyond metricsMaxLabelValues, counted with others) and each queue's min and max offset;
        ``total`` counts every page's; ``next`` continues after the page's last name (None after the last page;
        a page stops short of ``limit`` topics at MAX_TOPIC_PAGE_QUEUES queues). With ``topic``: that topic alone,
        each queue with the store time of its last message as well."""
        h = TopicStatsRequestHeader.from_ext(cmd.ext_fields)
        topics = self.ctx.topics.topics
        if h.topic is not None:
            config = topics.get(h.topic)
            if config is None:
                raise BrokerError(Failure.TOPIC_NOT_FOUND, f"topic[{h.topic}] not exist")
            return _json(cmd, {"topics": [self._topic_row(config, last_store=True)], "total": 1, "next": None})
        kinds = set(TOPIC_KINDS) if not h.kinds else {k.strip().upper() for k in h.kinds.split(",")}
        if not kinds <= set(TOPIC_KINDS):
            raise BrokerError(Failure.BAD_REQUEST, f"kinds {h.kinds!r} are not among {', '.join(TOPIC_KINDS)}")
        limit = _page_limit(h.limit)
        contains = h.contains or ""
        matching = [name for name in topics if contains in name and topic_kind(name) in kinds]
        # The page's names without sorting every topic: a broker may hold many thousands.
        page = heapq.nsmallest(limit + 1, (n for n in matching if h.after is None or n > h.after))
        rows, queues = [], 0
        for name in page[:limit]:
            if rows and queues + topics[name].queue_nums > MAX_TOPIC_PAGE_QUEUES:
                break  # topics of many queues each: a shorter page, the next one goes on from here
            rows.append(self._topic_row(topics[name]))
            queues += topics[name].queue_nums
        return _json(cmd, {"topics": rows, "total": len(matching),
                           "next": rows[-1]["topic"] if len(rows) < len(page) else None})

    def _topic_row(self, config: TopicConfig, last_store: bool = False) -> dict:
        store, metrics = self.ctx.store, self.ctx.metrics
        queues = []
        for queue_id in range(config.queue_nums):
            row = {"queueId": queue_id, "minOffset": store.min_offset(config.name, queue_id),
                   "maxOffset": store.max_offset(config.name, queue_id)}
            if last_store:
                last = store.get_queue_entries(config.name, queue_id, row["maxOffset"] - 1, 1)
                row["lastStoreTimestamp"] = last[0].store_timestamp if last else 0
            queues.append(row)
        counted = metrics is not None and config.name in metrics.topic_label.known
        return {"topic": config.name, "kind": topic_kind(config.name), "readQueueNums": config.read_queue_nums,
                "writeQueueNums": config.write_queue_nums, "perm": config.perm, "messageType": config.message_type,
                "messagesIn": metrics.messages_in.get(config.name, [0])[0] if counted else None, "queues": queues}

    @handles(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO)
    def topic_consumers(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        """QUERY_TOPIC_CONSUME_BY_WHO: the groups with a consumer offset in the topic or a consumer online
        subscribed to it, by name."""
        topic = check_topic(TopicRequestHeader.from_ext(cmd.ext_fields).topic, "topic")
        groups = self.ctx.offsets.groups_of_topic(topic)
        groups |= {g for g, entry in self.ctx.consumers.groups.items() if topic in entry.subscriptions}
        return _json(cmd, {"groupList": sorted(groups)})


def topic_kind(name: str) -> str:
    if name in SYSTEM_TOPICS:
        return "SYSTEM"
    if name.startswith(RETRY_PREFIX):
        return "RETRY"
    if name.startswith(DLQ_PREFIX):
        return "DLQ"
    return "NORMAL"


def _order(text: str | None, default: str, keys: tuple[str, ...]) -> str:
    order = text or default
    if order.lstrip("-") not in keys or order.startswith("--"):
        raise BrokerError(Failure.BAD_REQUEST, f"order {order!r} is not one of "
                          + ", ".join(f"{k}, -{k}" for k in keys))
    return order


def _status(text: str | None) -> HalfStatus | None:
    if not text:
        return None
    try:
        return HalfStatus(text)
    except ValueError:
        raise BrokerError(Failure.BAD_REQUEST, f"state {text!r} is not one of "
                          + ", ".join(s.value for s in HalfStatus)) from None


def _group_page(names, h: GroupListRequestHeader) -> tuple[list[str], int, str | None]:
    """The page of ``names`` the request asks for, how many names match it, and the name the next page starts
    after (None: no page follows)."""
    if h.group is not None:
        return ([h.group] if h.group in names else []), int(h.group in names), None
    limit = min(_page_limit(h.limit), MAX_GROUP_PAGE)
    needle = (h.contains or "").lower()
    matching = [name for name in names if needle in name.lower()]
    # The page's names without sorting every group: a broker may hold many thousands.
    page = heapq.nsmallest(limit + 1, (n for n in matching if h.after is None or n > h.after))
    return page[:limit], len(matching), page[limit - 1] if len(page) > limit else None


def _user_agent_version(session) -> str:
    """A gRPC client's version from the user agent of its settings (its ClientInfo has no version ordinal)."""
    return getattr(session, "version", "")


def _page_limit(limit: int | None) -> int:
    if limit is None or limit == 0:
        return MAX_PAGE
    if limit < 0:
        raise BrokerError(Failure.BAD_REQUEST, f"limit {limit} is negative")
    return min(limit, MAX_PAGE)


def _cursor(text: str | None, parts: int) -> tuple[int, ...] | None:
    """A page's ``after`` (the previous answer's ``next``): ``parts`` unsigned integers joined by ':'."""
    if not text:
        return None
    fields = text.split(":")
    if len(fields) != parts or not all(f.isdecimal() and len(f) <= 20 for f in fields) \
            or not all(int(f) < 2 ** 64 for f in fields):
        raise BrokerError(Failure.BAD_REQUEST, f"after {text!r} is not a cursor this request gave")
    return tuple(int(f) for f in fields)


def _next_cursor(last: tuple[int, ...] | None, count: int, limit: int) -> str | None:
    """Where the next page starts: after this page's last key; None when the page was the last (it had fewer rows
    than asked for)."""
    return ":".join(map(str, last)) if count == limit else None
