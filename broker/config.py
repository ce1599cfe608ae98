"""Broker configuration: RocketMQ key names, a Java-properties file, ``HALFMQ_<KEY>`` variables and flags.

Precedence: defaults < file < environment < command-line flags. An unknown key or a value that does not parse
is a start-up error naming the key — never silently ignored.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

#: bindAddress values meaning every interface.
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class ConfigError(ValueError):
    """A configuration key is unknown or its value is malformed; the message names the key."""


def _doc(text: str, **kw):
    return field(metadata={"doc": text, **kw.pop("meta", {})}, **kw)


@dataclass(frozen=True)
class BrokerConfig:
    """Every supported key, with RocketMQ's names. See conf/broker.conf for the annotated file."""

    brokerClusterName: str = _doc("cluster name put in routes and the CLUSTER property", default="DefaultCluster")
    brokerName: str = _doc("broker name put in routes", default="broker-a")
    brokerId: int = _doc("a broker group's member: 0 leads, another id follows the leader (replication, "
                         "docs/replication.md); routes show the leader as 0", default=0, meta={"min": 0, "max": 1023})
    haListenPort: int = _doc("replication port of a broker group's member (0 = any free port, -1 = off); used by "
                             "a broker with namesrvAddr, haMasterAddress or a brokerId above 0 (a broker alone has "
                             "no replication)", default=10912, meta={"min": -1, "max": 65535})
    haMasterAddress: str = _doc("HOST:PORT of the leader's replication port, for a follower; empty = the address the "
                                "name servers give for its group's leader", default="")
    haAdvertisedAddress: str = _doc("HOST:PORT at which the group's other members reach this member's replication "
                                    "port (a NAT, a published container port, a proxy): published in etcd and to the "
                                    "name servers; empty = brokerIP1 and the port haListenPort bound", default="")
    minInSyncReplicas: int = _doc("members (the leader counted) that must have a write durable before it is "
                                  "answered; with fewer in sync, writes are refused (code 14); 0 = 2 once the group "
                                  "has had a follower, else 1", default=0, meta={"min": 0, "max": 16})
    haEtcdEndpoints: str = _doc("etcd client addresses, HOST:PORT,HOST:PORT: the broker group elects its leader there "
                                "(automatic failover, docs/replication.md); brokerId then only names the member; "
                                "empty = roles by brokerId", default="")
    haLeaseSeconds: float = _doc("the elected leader's etcd lease, s: a dead leader is replaced this long after its "
                                 "last renewal; it stops answering writes after two thirds of it without one",
                                 default=2.0, meta={"min": 1.0, "max": 60.0})
    haMaxLagMillis: int = _doc("a follower whose oldest unacknowledged record is older than this leaves the in-sync "
                               "set (writes stop waiting for it), ms; it joins again once caught up", default=5000,
                               meta={"min": 100})
    brokerIP1: str = _doc("address advertised in routes and message ids; empty = bindAddress, or 127.0.0.1 "
                          "when bound to all interfaces", default="")
    bindAddress: str = _doc("interface the broker and name-server ports (and metrics, unless "
                            "metricsPromExporterHost) listen on: 0.0.0.0 = every IPv4 interface, :: = every IPv4 "
                            "and IPv6 interface (dual stack)", default="0.0.0.0")
    listenPort: int = _doc("broker port (0 = any free port)", default=10911, meta={"min": 0, "max": 65535})
    namesrvListenPort: int = _doc("built-in name server port (0 = any free port, -1 = off); with namesrvAddr set the "
                                  "broker joins those name servers and serves none of its own", default=9876,
                                  meta={"min": -1, "max": 65535})
    namesrvAddr: str = _doc("name servers to register with, HOST:PORT;HOST:PORT (halfmq namesrv): the broker joins "
                            "brokerClusterName's cluster; empty = the built-in name server, this broker alone",
                            default="")
    registerNameServerPeriod: int = _doc("ms between the broker's registrations with each name server (it also "
                                         "registers at once when its topics change)", default=30_000,
                                         meta={"min": 100, "max": 60_000})
    brokerNotActiveTimeoutMillis: int = _doc("a name server drops this broker after this long without a "
                                             "registration, ms (sent with each registration)", default=120_000,
                                             meta={"min": 1000})
    namesrvAccessKey: str = _doc("account the broker signs its requests to name servers with (registrations, and the "
                                 "route lookups of its gRPC endpoint), for name servers with aclEnable (an admin "
                                 "account of theirs)", default="")
    namesrvSecretKey: str = _doc("secret key of namesrvAccessKey", default="")
    storePathRootDir: str = _doc("folder holding the LMDB store", default="./store_data")
    mapSize: int = _doc("LMDB map size in bytes to start with; the store grows it (doubling) up to maxMapSize "
                        "when it fills", default=1 << 30, meta={"min": 1 << 20})
    maxMapSize: int = _doc("the most the LMDB map grows to, bytes: with the free space of its disk, the store's "
                           "limit, of which the disk*Ratio keys are percentages", default=64 << 30,
                           meta={"min": 1 << 20})
    fileReservedTime: float = _doc("hours a message is kept; older ones are deleted, oldest first (fractions "
                                   "allowed: 0.01 = 36 s)", default=72.0, meta={"min": 0.0001})
    cleanResourceInterval: int = _doc("ms between retention passes (and deleted topics' purges)", default=10_000,
                                      meta={"min": 10})
    diskMaxUsedSpaceRatio: int = _doc("percent of the store's limit above which the oldest messages are deleted "
                                      "whatever their age", default=75, meta={"min": 10, "max": 95})
    timerMaxDelaySec: int = _doc("furthest ahead a timer message (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS, "
                                 "__STARTDELIVERTIME) may be delivered, s; later ones are refused (code 13)",
                                 default=259_200, meta={"min": 1})
    diskSpaceWarningLevelRatio: int = _doc("percent of the store's limit above which sends are refused (code 14) "
                                           "until retention brings it below; reads go on", default=90,
                                           meta={"min": 10, "max": 99})
    flushDiskType: str = _doc("SYNC_FLUSH: acknowledge after a synced commit; ASYNC_FLUSH: sync on an interval",
                              default="SYNC_FLUSH", meta={"choices": ("SYNC_FLUSH", "ASYNC_FLUSH")})
    flushIntervalCommitLog: int = _doc("ASYNC_FLUSH sync interval, ms", default=500, meta={"min": 1})
    autoCreateTopicEnable: bool = _doc("create unknown topics on first send (inheriting TBW102)", default=True)
    defaultTopicQueueNums: int = _doc("queues of TBW102, the template for auto-created topics", default=8,
                                      meta={"min": 1, "max": 1024})
    maxMessageSize: int = _doc("largest message body accepted, bytes", default=4 << 20, meta={"min": 1})
    messageDelayLevel: str = _doc("delay of each level 1..18, space separated", default=DEFAULT_DELAY_LEVELS)
    longPollingEnable: bool = _doc("hold pulls that find nothing until data arrives or they time out",
                                   default=True)
    maxTransferCountOnMessageInMemory: int = _doc("most messages one pull returns", default=1024,
                                                  meta={"min": 1})
    maxTransferBytesOnMessageInMemory: int = _doc("most bytes one pull returns", default=4 << 20,
                                                  meta={"min": 1})
    flushConsumerOffsetInterval: int = _doc("how often consumer offsets are persisted, ms", default=5000,
                                            meta={"min": 10})
    channelExpiredTimeout: int = _doc("drop a client's registrations after this long without heartbeat, ms",
                                      default=120_000, meta={"min": 1000})
    serverMaxFrameSize: int = _doc("largest frame accepted, bytes (checked before it is buffered)",
                                   default=16 << 20, meta={"min": 1024})
    refusedRequestBytesPerSecond: int = _doc(
        "how fast the bytes of requests refused for their size are read, bytes a second, on either protocol: a "
        "remoting send declaring a body over maxMessageSize is answered once its header arrived and the rest of its "
        "frame is read at this rate and discarded; a gRPC request refused unparsed for its size (grpc copies it "
        "whole first) is answered, and a telemetry stream read again, once its size has passed at this rate; a "
        "gRPC gzip body that inflates past maxMessageSize is refused, and the connection's next gzip "
        "body inflated, once maxMessageSize has passed at this rate", default=1 << 20, meta={"min": 1})
    serverMaxInflightPerConnection: int = _doc("requests one connection may have in progress before the broker "
                                               "stops reading from it", default=1024, meta={"min": 1})
    serverMaxConnections: int = _doc("most client connections at once", default=10_000, meta={"min": 1})
    serverChannelMaxIdleTimeSeconds: int = _doc("close connections idle this long, s (0 = never)", default=120,
                                                meta={"min": 0})
    # --- bounded memory per connection and in total, fair check-back (issue 11, items 3 and 5) ---
    serverMaxUnreadBytesPerConnection: int = _doc(
        "answers written to a connection but not yet taken by its reader, bytes: above this the broker stops "
        "turning the connection's further requests into answers (and stops reading it) until the reader catches up",
        default=4 << 20, meta={"min": 64 << 10})
    serverMaxInflightBytesPerConnection: int = _doc(
        "bodies of the requests one connection has in progress, bytes: above this the broker stops reading it "
        "(with serverMaxInflightPerConnection, which counts them); on the gRPC port, requests still arriving above "
        "this get no more flow-control window, but the oldest of them", default=16 << 20, meta={"min": 64 << 10})
    serverMaxBufferedFrameBytes: int = _doc(
        "bytes held in incomplete frames across all connections, authenticated or not, gRPC ones included (their "
        "incomplete requests) (each connection may always buffer 128 KiB, and one alone may finish a frame up to "
        "serverMaxFrameSize); a connection that needs more waits, unread (a gRPC one: given no more flow-control "
        "window), until others' frames complete",
        default=128 << 20, meta={"min": 1 << 20})
    serverBufferedFrameWaitSeconds: int = _doc(
        "how long a connection may wait for room under serverMaxBufferedFrameBytes before it is closed, s",
        default=10, meta={"min": 1})
    longPollingMaxHeldPerConnection: int = _doc(
        "held (long-polling) pulls one connection may have; more are answered SYSTEM_BUSY. Held pulls also count "
        "as requests in progress (serverMaxInflightPerConnection)", default=512, meta={"min": 1})
    longPollingMaxHeld: int = _doc("held pulls across all connections; more are answered SYSTEM_BUSY",
                                   default=50_000, meta={"min": 1})
    maxBatchMessageCount: int = _doc(
        "most messages in one batch send (the whole batch body is also bounded by maxMessageSize); at most "
        "400000, so the answer's message-id list always fits in a frame header", default=10_000,
        meta={"min": 1, "max": 400_000})
    transactionCheckMaxUnreadBytes: int = _doc(
        "a producer connection with more bytes than this written to it and not yet read (its write buffer, plus "
        "the check-backs sent since it last sent anything) gets no check-back; another producer of the group does",
        default=64 << 10, meta={"min": 1024})
    metricsPromExporterPort: int = _doc("Prometheus metrics HTTP port (0 = any free port, -1 = off)", default=5557,
                                        meta={"min": -1, "max": 65535})
    aclEnable: bool = _doc("check AccessKey/Signature of every request against aclConfigFile (RocketMQ 4.x "
                           "plain ACL); when off, admin requests are served to loopback clients only", default=False)
    aclConfigFile: str = _doc("accounts and permissions, RocketMQ's plain_acl.yml format", default="conf/plain_acl.yml")
    authorizationSkewSeconds: int = _doc(
        "with aclEnable, a signed request whose signed time is further than this from the broker's clock is refused "
        "(a replay, or a client clock to set right), s: a gRPC call's x-mq-date-time; of RocketMQ 4.x requests only "
        "a send signs a time (bornTimestamp), so a replayed pull, heartbeat or END_TRANSACTION cannot be told apart",
        default=900, meta={"min": 1})
    tlsEnable: bool = _doc("serve the broker port over TLS", default=False)
    tlsServerCertPath: str = _doc("PEM certificate chain for TLS", default="")
    tlsServerKeyPath: str = _doc("PEM private key for TLS", default="")
    transactionTimeOut: int = _doc("ms after storing before a half message is first checked", default=6000,
                                   meta={"min": 0})
    transactionCheckInterval: int = _doc("ms between check-backs of an undecided half message", default=30_000,
                                         meta={"min": 10})
    transactionCheckMax: int = _doc("check-backs before a half message is discarded", default=15,
                                    meta={"min": 1})
    rejectTransactionMessage: bool = _doc("refuse half messages with NO_PERMISSION", default=False)
    shutdownGraceSeconds: int = _doc("how long shutdown waits for in-progress requests, s", default=10,
                                     meta={"min": 0})
    logLevel: str = _doc("DEBUG, INFO, WARNING or ERROR", default="INFO",
                         meta={"choices": ("DEBUG", "INFO", "WARNING", "ERROR")})
    # --- quotas on what clients create, and where the metrics port listens (issue 11, items 4 and 6) ---
    autoCreateSubscriptionGroup: bool = _doc(
        "create a consumer group (its %RETRY% topic) on its first heartbeat or send-back; false: only groups an "
        "admin created (UPDATE_AND_CREATE_TOPIC of %RETRY%<group>)", default=True)
    maxAutoCreatedTopics: int = _doc(
        "auto-creation of topics stops once the broker holds this many user topics (admin-created ones count; an "
        "admin can still create more)", default=1000, meta={"min": 0})
    maxAutoCreatedSubscriptionGroups: int = _doc(
        "auto-creation of consumer groups stops once the broker holds this many (a heartbeat beyond it registers "
        "the consumer but creates nothing)", default=1000, meta={"min": 0})
    metricsMaxLabelValues: int = _doc(
        "distinct topics, and distinct groups, that get series of their own in the metrics; later ones are "
        "counted under the label value (other)", default=1000, meta={"min": 1})
    metricsPromExporterHost: str = _doc("interface the metrics port listens on; empty = bindAddress", default="")
    dashboardPort: int = _doc("the dashboard's HTTP port (pages and a JSON API over the cluster's brokers; 0 = any "
                              "free port, -1 = off)", default=8080, meta={"min": -1, "max": 65535})
    dashboardBindAddress: str = _doc("interface the dashboard listens on; empty = 127.0.0.1 (loopback only) unless "
                                     "aclEnable, then bindAddress (with ACL only admin accounts sign in)", default="")
    # --- the gRPC endpoint for RocketMQ 5 clients (issue 15; broker/grpc/) ---
    grpcListenPort: int = _doc("gRPC port for RocketMQ 5 clients (apache.rocketmq.v2.MessagingService, what the "
                               "reference proxy serves on 8081); 0 = any free port, -1 = off. It listens on "
                               "bindAddress, with TLS and ACL as the broker port", default=8081,
                               meta={"min": -1, "max": 65535})
    grpcMaxDeliveryAttempts: int = _doc("deliveries of a message to a gRPC consumer group before it goes to the "
                                        "group's %DLQ% topic (the reference's retryMaxTimes 16 + 1)", default=17,
                                        meta={"min": 1, "max": 1000})
    grpcMaxReceiptsPerQueue: int = _doc("received and not yet acknowledged messages one gRPC consumer group may "
                                        "hold per queue; a receive beyond it gets only redeliveries",
                                        default=2000, meta={"min": 1, "max": 100_000})
    grpcRequestHeadroomBytes: int = _doc(
        "how much larger than maxMessageSize a gRPC request may be (its envelope: topics, properties, ids; a batch "
        "SendMessage's bodies together); a larger request is refused RESOURCE_EXHAUSTED from its length prefix, "
        "before it is buffered", default=1 << 20, meta={"min": 64 << 10, "max": 64 << 20})
    grpcMaxStreamsPerConnection: int = _doc(
        "RPCs one gRPC connection may have open at once (HTTP/2's max concurrent streams): more wait in the client "
        "until one ends (one a client opens anyway is refused REFUSED_STREAM); each open receive can hold an answer waiting for the client's window, so this bounds what "
        "a connection that never reads costs", default=256, meta={"min": 1, "max": 65_536})
    grpcMaxAckEntries: int = _doc("most entries in one AckMessage (a receive hands out at most 1024 messages); more "
                                  "are refused BAD_REQUEST", default=1024, meta={"min": 1, "max": 100_000})
    # --- gRPC sessions and telemetry, bounded as the remoting door bounds connections and their answers ---
    grpcMaxClientIds: int = _doc("RocketMQ 5 client ids (x-mq-client-id: the broker's session of a client) known at "
                                 "once; a call naming a new one beyond it is answered TOO_MANY_REQUESTS until "
                                 "others terminate or expire (channelExpiredTimeout)", default=10_000,
                                 meta={"min": 1})
    grpcMaxClientIdsPerOwner: int = _doc("client ids one owner may have at once: an account with ACL on, a client "
                                         "address with ACL off; beyond it, TOO_MANY_REQUESTS", default=1000,
                                         meta={"min": 1})
    grpcTelemetryMaxSettingsBytes: int = _doc("largest Settings message a client may send on its telemetry "
                                              "stream, bytes; a larger one is answered PAYLOAD_TOO_LARGE and "
                                              "kept nowhere", default=1 << 20, meta={"min": 4096, "max": 64 << 20})
    grpcTelemetryMaxSettingsTopics: int = _doc("most topics one Settings message may name (a producer's topics, "
                                               "a consumer's subscriptions); more are answered PAYLOAD_TOO_LARGE",
                                               default=1000, meta={"min": 1, "max": 100_000})
    grpcTelemetryMaxUnreadBytes: int = _doc(
        "answers and commands queued on a telemetry stream and not yet taken by its reader, bytes: above this the "
        "broker reads no more of the stream's commands, and queues no transaction check to it (the check is sent "
        "again later, to it or another producer)", default=4 << 20, meta={"min": 64 << 10})
    grpcTelemetryMaxUnreadBytesTotal: int = _doc(
        "answers and commands queued on every telemetry stream together and not yet taken by their readers, bytes: "
        "above this no stream with answers of its own still untaken is read further or queued a transaction check, "
        "until readers catch up (without it, grpcMaxClientIds sessions could each hold grpcTelemetryMaxUnreadBytes)",
        default=64 << 20, meta={"min": 64 << 10})

    @property
    def advertised_ip(self) -> str:
        """brokerIP1, else the bound address when it is one IPv4 address, else 127.0.0.1 (message ids carry an
        IPv4 store host; a wildcard or IPv6 bind cannot name an address that other hosts reach)."""
        if self.brokerIP1:
            return self.brokerIP1
        bind = self.bindAddress
        return "127.0.0.1" if bind in WILDCARDS or ":" in bind else bind

    @property
    def delay_levels_ms(self) -> list[int]:
        return parse_delay_levels(self.messageDelayLevel)

    def replace(self, **changes) -> "BrokerConfig":
        return build_config(changes, base=self)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


FIELDS = _fields(BrokerConfig)


def same_key(name: str, **overrides):
    """A field of another configuration (the standalone name server's) that means exactly what BrokerConfig's key
    ``name`` means: its documentation, default and bounds are defined once, here."""
    f = FIELDS[name]
    meta = dict(f.metadata)
    text = overrides.pop("doc", meta.pop("doc"))
    meta.pop("doc", None)
    return _doc(text, default=overrides.pop("default", f.default), meta=meta)


def parse_delay_levels(text: str) -> list[int]:
    levels = []
    for item in text.split():
        match = re.fullmatch(r"(\d+)(ms|[smhd])", item)
        if not match:
            raise ConfigError(f"messageDelayLevel: {item!r} is not a duration like 500ms, 10s, 5m, 2h")
        levels.append(int(match.group(1)) * _UNIT_MS[match.group(2)])
    if not levels:
        raise ConfigError("messageDelayLevel: at least one level is required")
    return levels


def _convert(name: str, raw: Any, fields: Mapping[str, dataclasses.Field]) -> Any:
    f = fields[name]
    kind = f.type if isinstance(f.type, type) else {"str": str, "int": int, "bool": bool, "float": float}[f.type]
    meta = f.metadata
    if kind is bool:
        if isinstance(raw, bool):
            value = raw
        elif str(raw).strip().lower() in ("true", "false"):
            value = str(raw).strip().lower() == "true"
        else:
            raise ConfigError(f"{name}: {raw!r} is not true or false")
    elif kind in (int, float):
        try:
            value = kind(str(raw).strip())
        except ValueError:
            raise ConfigError(f"{name}: {raw!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{name}: {raw!r} is not a finite number")
        if "min" in meta and value < meta["min"] or "max" in meta and value > meta["max"]:
            raise ConfigError(f"{name}: {value} is outside {meta.get('min')}..{meta.get('max')}")
    else:
        value = str(raw).strip()
        if "choices" in meta and value not in meta["choices"]:
            raise ConfigError(f"{name}: {value!r} is not one of {', '.join(meta['choices'])}")
    if name == "messageDelayLevel":
        parse_delay_levels(value)
    return value


def build_config(values: Mapping[str, Any], base=None, source: str = "", cls: type = BrokerConfig):
    """Apply ``values`` (key → raw value) over ``base`` (default: a ``cls`` of defaults).

    Raises:
        ConfigError: a key is unknown or a value is malformed.
    """
    cls = type(base) if base is not None else cls
    fields = _fields(cls)
    lower = {name.lower(): name for name in fields}
    where = f" (in {source})" if source else ""
    changes = {}
    for key, raw in values.items():
        if key not in fields:
            hint = lower.get(key.lower())
            extra = f"; did you mean {hint!r}?" if hint else ""
            raise ConfigError(f"unknown configuration key {key!r}{where}{extra}")
        try:
            changes[key] = _convert(key, raw, fields)
        except ConfigError as exc:
            raise ConfigError(f"{exc}{where}") from None
    return dataclasses.replace(base if base is not None else cls(), **changes)


def parse_properties(text: str, source: str = "config file") -> dict[str, str]:
    """Parse Java-properties text: ``key=value``, ``key: value`` or ``key value``; ``#``/``!`` comments;
    a trailing backslash continues the line.

    Raises:
        ConfigError: a line has no key, or a key appears twice.
    """
    result: dict[str, str] = {}
    logical: list[tuple[int, str]] = []
    pending = ""
    start_line = 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip() if not pending else line.lstrip()
        if not pending and (not stripped or stripped[0] in "#!"):
            continue
        if not pending:
            start_line = number
        if stripped.endswith("\\") and not stripped.endswith("\\\\"):
            pending += stripped[:-1]
            continue
        logical.append((start_line, pending + stripped))
        pending = ""
    if pending:
        logical.append((start_line, pending))
    for number, entry in logical:
        match = re.match(r"([^=:\s]+)\s*(?:[=:]\s*|\s+|$)(.*)$", entry)
        if not match:
            raise ConfigError(f"{source} line {number}: cannot parse {entry!r}")
        key, value = match.group(1), match.group(2).strip()
        if key in result:
            raise ConfigError(f"{source} line {number}: key {key!r} is set twice")
        result[key] = value
    return result


def env_overrides(environ: Mapping[str, str], cls: type = BrokerConfig, prefix: str = "HALFMQ_") -> dict[str, str]:
    """``HALFMQ_<KEY>`` variables (the key in RocketMQ spelling, or all upper case as environment variables
    usually are). Any other spelling is refused as the same flag is: ``HALFMQ_transactionTimeout`` is neither
    ``transactionTimeOut`` nor ``TRANSACTIONTIMEOUT``.

    Raises:
        ConfigError: a HALFMQ_ variable names no known key, or names one in another case.
    """
    fields = _fields(cls)
    lower = {name.lower(): name for name in fields}
    out = {}
    for var, value in environ.items():
        if not var.startswith(prefix) or prefix == "HALFMQ_" and var.startswith("HALFMQ_NAMESRV_"):
            continue  # HALFMQ_NAMESRV_<KEY> belongs to the standalone name server (broker/namesrv/config.py)
        key = var[len(prefix):]
        hint = lower.get(key.lower())
        if key in fields:
            name = key
        elif hint is not None and key == key.upper():
            name = hint
        elif hint is not None:
            raise ConfigError(f"unknown configuration key {key!r} (in environment variable {var}); "
                              f"did you mean {hint!r}? ({prefix}{hint} or {prefix}{hint.upper()})")
        else:
            raise ConfigError(f"environment variable {var} names no configuration key")
        out[name] = value
    return out


def parse_flags(args: Iterable[str]) -> dict[str, str]:
    """``--KEY=VALUE`` flags.

    Raises:
        ConfigError: a flag is not of that form.
    """
    out = {}
    for arg in args:
        match = re.fullmatch(r"--([A-Za-z0-9_]+)=(.*)", arg, re.S)
        if not match:
            raise ConfigError(f"argument {arg!r} is not of the form --KEY=VALUE")
        out[match.group(1)] = match.group(2)
    return out


def load_config(path: str | None, flags: Iterable[str] = (), environ: Mapping[str, str] | None = None,
                cls: type = BrokerConfig, env_prefix: str = "HALFMQ_"):
    """Defaults < file < environment < flags, for a ``cls`` configuration (the broker's unless told).

    Raises:
        ConfigError: as build_config, parse_properties, env_overrides and parse_flags; or the file is unreadable.
    """
    config = cls()
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        config = build_config(parse_properties(text, path), config, path)
    config = build_config(env_overrides(os.environ if environ is None else environ, cls, env_prefix), config,
                          "environment")
    return build_config(parse_flags(flags), config, "command line")
