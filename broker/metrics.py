"""Prometheus metrics on the broker's own registry (RocketMQ 5 names where one exists, halfmq_* otherwise).

Counters are bumped on the hot path; values that can be read off the broker's state (connections, lag, store
size) are computed by a custom collector at scrape time instead of being kept up to date. The two series bumped
for every message (messages and bytes in, request latency) are plain integers on the loop thread, exported by
the collector, and so are the per-decision transaction series: prometheus-client's lock per update cost as
much as a tenth of a send.

Label values that clients choose (topics, groups) are capped: the first ``metricsMaxLabelValues`` distinct topics
and groups get series of their own, later ones are summed under ``(other)`` (a name no topic or group can have).
3,000 made-up group names once made 12,000 series, and a scrape's cost grew with them.
"""
from __future__ import annotations

import logging
from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from halfmq.protocol.codes import RequestCode
from halfmq.store import HalfStatus

log = logging.getLogger(__name__)
_MS_BUCKETS = (1, 5, 10, 50, 100, 500, 1000, 3000, 10000, 30000)
_S_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300)


def _observe(table: dict, key, bounds: tuple, value: float) -> None:
    """Count ``value`` into the plain histogram ``table[key]``: one count per bucket, then +Inf, then the sum."""
    counts = table.get(key)
    if counts is None:
        counts = table[key] = [0] * (len(bounds) + 1) + [0.0]
    counts[bisect_left(bounds, value)] += 1
    counts[-1] += value


def _histogram(name: str, doc: str, labels: list[str], bounds: tuple, table: dict,
               label_values) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for key, counts in list(table.items()):
        counts = list(counts)
        cumulative, buckets = 0, []
        for bound, count in zip((*bounds, "+Inf"), counts):
            cumulative += count
            buckets.append((str(bound), cumulative))
        family.add_metric(label_values(key), buckets, sum_value=counts[-1])
    return family


def _topic_counters(table: dict[str, list[int]], *families: tuple[str, str]):
    """One counter family per (name, help), labelled by topic: family i takes ``table[topic][i]``."""
    out = [CounterMetricFamily(name, doc, labels=["topic"]) for name, doc in families]
    for topic, values in list(table.items()):
        for family, value in zip(out, values):
            family.add_metric([topic], value)
    return out


OTHER = "(other)"


class LabelCap:
    """Maps client-chosen label values to themselves while fewer than ``limit`` are known, later ones to OTHER.

    A value keeps its mapping for the broker's life, so a counter never moves between series."""

    def __init__(self, limit: int):
        self.limit = limit
        self.known: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.known:
            return value
        if len(self.known) < self.limit:
            self.known.add(value)
            return value
        return OTHER


def _code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)


class BrokerMetrics:
    def __init__(self, ctx):
        self.ctx = ctx
        self.registry = r = CollectorRegistry(auto_describe=True)
        limit = ctx.config.metricsMaxLabelValues
        self.topic_label, self.group_label = LabelCap(limit), LabelCap(limit)
        self.messages_in: dict[str, list[int]] = {}  # topic → [messages, body bytes]
        #: (Completion, topic, body bytes) of each message submitted and not counted yet (ProducerService): counted
        #: in by ``count_stored`` once its write is durable, without a completion callback per message
        self.uncounted: list[tuple] = []
        ctx.store.publish_hooks.append(self.count_stored)
        self.rpc_latency: dict[tuple[int, int], list] = {}  # (code, response code) → bucket counts + [sum]
        self.messages_out = Counter("rocketmq_messages_out", "Messages delivered by pulls",
                                    ["topic", "consumer_group"], registry=r)
        self.throughput_out = Counter("rocketmq_throughput_out", "Bytes delivered by pulls",
                                      ["topic", "consumer_group"], registry=r)
        self.decided: dict[str, list[int]] = {}  # topic → [committed, rolled back]
        self.finish_latency: dict[str, list] = {}  # topic → seconds from half to decision, plain histogram
        self.checks_sent = Counter("halfmq_check_backs_sent", "CHECK_TRANSACTION_STATE written to a producer",
                                   registry=r)
        self.checks_undeliverable = Counter("halfmq_check_backs_undeliverable",
                                            "Checks due with no live producer of the group", registry=r)
        self.checks_taken_back = Counter("halfmq_check_backs_taken_back",
                                         "Checks not counted: their producer had not read them when the half was "
                                         "due again", registry=r)
        self.discarded = Counter("halfmq_half_messages_discarded",
                                 "Half messages moved to TRANS_CHECK_MAX_TIME_TOPIC", registry=r)
        self.unexpected = Counter("halfmq_check_backs_unexpected",
                                  "Check answers for an already decided half message", registry=r)
        self.conflicts = Counter("halfmq_decision_conflicts", "Conflicting END_TRANSACTION decisions refused",
                                 ["producer_group"], registry=r)
        self.grpc_receives_refused = Counter(
            "halfmq_grpc_receives_refused", "gRPC receives answered TOO_MANY_REQUESTS because their connection's "
            "answers were not being read (serverMaxUnreadBytesPerConnection)", registry=r)
        self.grpc_undeliverable_messages = Counter(
            "halfmq_grpc_undeliverable_messages", "Messages a gRPC receive could not turn into an answer (a "
            "compressed body that does not inflate within maxMessageSize), moved to the group's DLQ", ["topic"],
            registry=r)
        self.check_pass = Histogram("halfmq_check_pass_seconds", "Duration of one check-back scheduler pass",
                                    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5), registry=r)
        self.half_open: dict[str, int] = {}
        self._out: dict = {}
        #: every topic's, for the runtime info (the dashboard's sends/s and pulls/s)
        self.messages_in_total = self.messages_out_total = 0
        r.register(_StateCollector(self))
        self._http = None

    # --- hooks called by processors and services (hot: labelled children are cached) ---
    def message_in(self, topic: str, nbytes: int, count: int = 1) -> None:
        self.messages_in_total += count
        totals = self.messages_in.get(topic)
        if totals is None:  # a topic not counted yet, or one over the label cap: its series is the capped name's
            label = self.topic_label(topic)
            totals = self.messages_in.get(label)
            if totals is None:
                totals = self.messages_in[label] = [0, 0]
        totals[0] += count
        totals[1] += nbytes

    def count_stored(self) -> None:
        """The messages of ``uncounted`` whose writes are durable, counted in; those whose writes failed, dropped.

        A store publish hook: it runs once the store resolved a group's Completions, before the loop goes on (so
        before a client could read the count after its answer). Groups are published in the order they were
        submitted, so the resolved messages come first; a write refused at once is resolved early and waits
        behind them, and what is still pending stays for a later group."""
        uncounted = self.uncounted
        if not uncounted:
            return
        messages_in, resolved, count = self.messages_in, 0, 0
        for completion, topic, nbytes in uncounted:
            if completion.succeeded:
                totals = messages_in.get(topic)
                if totals is None:
                    self.message_in(topic, nbytes)
                else:
                    totals[0] += 1
                    totals[1] += nbytes
                    count += 1
            elif not completion.done():
                break
            resolved += 1
        self.messages_in_total += count
        del uncounted[:resolved]

    def message_out(self, topic: str, group: str, count: int, nbytes: int) -> None:
        self.messages_out_total += count
        key = (topic, group)
        children = self._out.get(key)
        if children is None:
            labels = (self.topic_label(topic), self.group_label(group))
            children = (self.messages_out.labels(*labels), self.throughput_out.labels(*labels))
            if labels == key:  # cache only the capped pairs: made-up names must not grow this dict either
                self._out[key] = children
        children[0].inc(count)
        children[1].inc(nbytes)

    def request_done(self, code: int, response_code: int, seconds: float) -> None:
        _observe(self.rpc_latency, (code, response_code), _MS_BUCKETS, seconds * 1000)

    def grpc_receive_refused(self) -> None:
        self.grpc_receives_refused.inc()

    def grpc_undeliverable(self, topic: str) -> None:
        self.grpc_undeliverable_messages.labels(self.topic_label(topic)).inc()

    def half_prepared(self, topic: str) -> None:
        topic = self.topic_label(topic)
        self.half_open[topic] = self.half_open.get(topic, 0) + 1

    def half_decided(self, state, was_open: bool = True) -> None:
        """A half reached ``state``: a HalfState, or a txops.Decision (which names the same fields: topic, status,
        store_ts, decided_ts); ``was_open``: it was pending until now."""
        topic = self.topic_label(state.topic)
        if was_open:
            self.half_open[topic] = max(0, self.half_open.get(topic, 0) - 1)
        decided = self.decided.get(topic)
        if decided is None:
            decided = self.decided[topic] = [0, 0]  # committed, rolled back
        if state.status is HalfStatus.COMMITTED:
            decided[0] += 1
        elif state.status is HalfStatus.ROLLED_BACK:
            decided[1] += 1
        elif state.status is HalfStatus.DISCARDED:
            self.discarded.inc()
        if state.decided_ts is not None and was_open:
            _observe(self.finish_latency, topic, _S_BUCKETS, max(0, state.decided_ts - state.store_ts) / 1000)

    def half_reopened(self, topic: str) -> None:
        """A discarded half was resumed: it is open again."""
        self.half_prepared(topic)

    def repeated_decision(self, from_check: bool) -> None:
        if from_check:
            self.unexpected.inc()

    def decision_conflict(self, group: str) -> None:
        self.conflicts.labels(self.group_label(group)).inc()

    def check_pass_done(self, sent: int, undeliverable: int, taken_back: int, seconds: float) -> None:
        self.checks_sent.inc(sent)
        self.checks_undeliverable.inc(undeliverable)
        self.checks_taken_back.inc(taken_back)
        self.check_pass.observe(seconds)

    # --- lifecycle ---
    def load_pending(self) -> None:
        """Rebuild the open-half gauge from the pending halves (cost: pending only)."""
        store = self.ctx.store
        for _due, offset in store.due_halves(2 ** 62, 2 ** 31):
            state = store.get_half(offset)
            if state is not None and state.pending:
                self.half_prepared(state.topic)

    def serve(self, addr: str, port: int) -> tuple:
        """Start the HTTP exporter; returns the bound socket address (host, port, ...)."""
        self._http, _thread = start_http_server(port, addr, registry=self.registry)
        return self._http.server_address

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


def _sum_by(pairs) -> dict[str, int]:
    out: dict[str, int] = {}
    for label, value in pairs:
        out[label] = out.get(label, 0) + value
    return out


class _StateCollector:
    """Values read off the broker at scrape time."""

    def __init__(self, metrics: BrokerMetrics):
        self.metrics = metrics

    def describe(self):
        return []

    def _hot_series(self):
        yield from _topic_counters(self.metrics.messages_in, ("rocketmq_messages_in", "Messages stored"),
                                   ("rocketmq_throughput_in", "Body bytes stored"))
        latency = _histogram("rocketmq_rpc_latency", "Request processing time, ms", ["request_code", "response_code"],
                             _MS_BUCKETS, self.metrics.rpc_latency, lambda key: [_code_name(key[0]), str(key[1])])
        yield latency
        yield from _topic_counters(self.metrics.decided, ("rocketmq_commit_messages", "Half messages committed"),
                                   ("rocketmq_rollback_messages", "Half messages rolled back"))
        yield _histogram("rocketmq_finish_message_latency", "Seconds from storing a half message to its decision",
                         ["topic"], _S_BUCKETS, self.metrics.finish_latency, lambda key: [key])

    @staticmethod
    def _replication(ctx):
        """A broker group member's role, records and, on the leader, each follower's (docs/replication.md)."""
        member = ctx.member
        if member is None or not member.enabled:
            return
        status = member.status()
        yield GaugeMetricFamily("halfmq_replication_leader", "1 while this broker leads its broker group",
                                value=int(status["role"] == "leader"))
        yield GaugeMetricFamily("halfmq_replication_epoch", "Epoch of the last replication record held",
                                value=status.get("epoch", 0))
        yield GaugeMetricFamily("halfmq_replication_sequence", "Sequence of the last replication record held",
                                value=status.get("seq", 0))
        yield GaugeMetricFamily("halfmq_replication_committed_sequence", "Last record every in-sync member has "
                                "durable (what is answered, and shown to readers)", value=status.get("committed", 0))
        if status["role"] != "leader":
            return
        yield GaugeMetricFamily("halfmq_replication_in_sync_members", "Members in the in-sync set (the leader "
                                "counted)", value=len(status["inSync"]))
        yield GaugeMetricFamily("halfmq_replication_min_in_sync", "minInSyncReplicas in force",
                                value=status["minInSyncReplicas"])
        acked = GaugeMetricFamily("halfmq_replication_follower_acked_sequence", "Last record a follower has durable",
                                  labels=["broker_id"])
        lag = GaugeMetricFamily("halfmq_replication_follower_lag_seconds", "How long the oldest record a follower "
                                "has not acknowledged has been durable on the leader", labels=["broker_id"])
        in_sync = GaugeMetricFamily("halfmq_replication_follower_in_sync", "1 while a follower is in the in-sync set",
                                    labels=["broker_id"])
        for follower in status["followers"]:
            label = [str(follower["brokerId"])]
            acked.add_metric(label, follower["acked"])
            lag.add_metric(label, follower["lagMillis"] / 1000)
            in_sync.add_metric(label, int(follower["inSync"]))
        yield acked
        yield lag
        yield in_sync

    def collect(self):
        ctx = self.metrics.ctx
        yield from self._hot_series()
        metrics = self.metrics
        group_label, topic_label = metrics.group_label, metrics.topic_label
        producers = GaugeMetricFamily("rocketmq_producer_connections", "Producer channels by group",
                                      labels=["producer_group"])
        for label, value in _sum_by((group_label(g), len(channels))
                                    for g, channels in list(ctx.producers.groups.items())).items():
            producers.add_metric([label], value)
        yield producers
        consumers = GaugeMetricFamily("rocketmq_consumer_connections", "Consumer channels by group",
                                      labels=["consumer_group"])
        for label, value in _sum_by((group_label(g), len(entry.channels))
                                    for g, entry in list(ctx.consumers.groups.items())).items():
            consumers.add_metric([label], value)
        yield consumers
        lag = GaugeMetricFamily("rocketmq_consumer_lag_messages", "Messages not yet consumed by a group",
                                labels=["topic", "consumer_group"])
        totals: dict[tuple[str, str], int] = {}
        for (group, topic, queue_id), offset in list(ctx.offsets.table.items()):
            # Messages retention deleted can no longer be consumed: they are not lag.
            behind = max(0, ctx.store.max_offset(topic, queue_id) - max(offset, ctx.store.min_offset(topic, queue_id)))
            key = (topic_label(topic), group_label(group))
            totals[key] = totals.get(key, 0) + behind
        for (topic, group), value in totals.items():
            lag.add_metric([topic, group], value)
        yield lag
        if ctx.check_back is not None:
            yield CounterMetricFamily("halfmq_check_backs_poisoned", "Half messages discarded alone because no "
                                      "check could be made of them (an undecodable record, say)",
                                      value=ctx.check_back.poisoned)
        yield from self._replication(ctx)
        half = GaugeMetricFamily("rocketmq_half_messages", "Half messages not yet decided", labels=["topic"])
        for topic, value in list(self.metrics.half_open.items()):
            half.add_metric([topic], value)
        yield half
        stats = ctx.store.stats()
        yield GaugeMetricFamily("halfmq_store_size_bytes", "Bytes used in the LMDB map",
                                value=stats.get("used_bytes", 0))
        yield GaugeMetricFamily("halfmq_store_map_size_bytes", "The most the LMDB map grows to (maxMapSize)",
                                value=stats.get("map_size", 0))
        yield GaugeMetricFamily("halfmq_store_last_commit_seconds", "Duration of the last group commit",
                                value=stats.get("last_commit_seconds", 0.0))
        yield GaugeMetricFamily("halfmq_store_last_sync_seconds", "Duration of the last sync to disk",
                                value=stats.get("last_sync_seconds", 0.0))
        yield GaugeMetricFamily("halfmq_store_last_group_size", "Writes in the last group commit",
                                value=stats.get("last_group_size", 0))
        yield CounterMetricFamily("halfmq_store_groups", "Group commits", value=stats.get("total_groups", 0))
        yield CounterMetricFamily("halfmq_store_ops", "Writes committed", value=stats.get("total_ops", 0))
        yield CounterMetricFamily("halfmq_store_corrupt_records", "Stored messages that failed their CRC check when "
                                  "read (never served)", value=stats.get("corrupt_records", 0))
        if ctx.retention is not None:
            lifecycle = ctx.retention.status()
            yield GaugeMetricFamily("halfmq_store_data_bytes", "Bytes of LMDB pages holding data (free pages "
                                    "excluded)", value=lifecycle.used_bytes)
            yield GaugeMetricFamily("halfmq_store_limit_bytes", "The most the store can hold: maxMapSize or, when "
                                    "smaller, its data file plus its disk's free space", value=lifecycle.limit_bytes)
            yield GaugeMetricFamily("halfmq_store_use_ratio", "store_data_bytes / store_limit_bytes (retention acts "
                                    "above diskMaxUsedSpaceRatio, sends are refused above "
                                    "diskSpaceWarningLevelRatio)", value=lifecycle.use_ratio)
            yield GaugeMetricFamily("halfmq_store_oldest_message_age_seconds", "Age of the oldest message held",
                                    value=lifecycle.oldest_age_seconds)
            yield CounterMetricFamily("halfmq_retention_deleted_messages", "Messages deleted by retention (age or "
                                      "space)", value=lifecycle.deleted_total)
            yield CounterMetricFamily("halfmq_deleted_topics_purged_messages", "Messages of deleted topics removed",
                                      value=lifecycle.purged_total)
            yield GaugeMetricFamily("halfmq_store_refusing_writes", "1 while new messages are refused (the store is "
                                    "above diskSpaceWarningLevelRatio)", value=int(lifecycle.refusing))
