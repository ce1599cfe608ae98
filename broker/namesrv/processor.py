"""The name-server requests (reference §3.13) over a RouteTable: a remoting adapter, decode → table → encode.

Both name servers use it: the standalone one (``halfmq namesrv``) registers every code; the broker's built-in one
serves the read requests only (its one broker is in the table from the start, and nothing else may join)."""
from __future__ import annotations

import json
import logging
import re
import time
import zlib

from halfmq.protocol.codes import Perm, RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import (DeleteTopicFromNamesrvRequestHeader, GetTopicsByClusterRequestHeader,
                                     RegisterBrokerRequestHeader, RegisterBrokerResponseHeader, TopicRequestHeader,
                                     UnregisterBrokerRequestHeader)

from ..errors import BrokerError, Failure
from ..names import check_broker_name, check_topic
from .pacing import RegistrationPace
from .routes import BrokerEntry, QueueData, RouteTable

log = logging.getLogger(__name__)
MAX_BROKER_ID = 1023  #: a broker group's members: 0 leads, 1..MAX_BROKER_ID follow (broker config brokerId)
_ALL_PERMS = Perm.PRIORITY | Perm.READ | Perm.WRITE | Perm.INHERIT
#: An address every client, tool and page shows and connects to: nothing in it may read as markup or a separator.
_ADDR = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]{1,253}):[0-9]{1,5}")


class NameServerProcessor:
    def __init__(self, table: RouteTable, max_topics_per_broker: int = 100_000):
        self.table = table
        self.max_topics_per_broker = max_topics_per_broker
        self.pace = RegistrationPace()

    def register(self, dispatcher, registrations: bool = True) -> None:
        """Serves the read requests; with ``registrations``, brokers may also join, leave and delete topics."""
        dispatcher.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.route)
        dispatcher.register(RequestCode.GET_BROKER_CLUSTER_INFO, self.cluster_info)
        dispatcher.register(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.topic_list)
        dispatcher.register(RequestCode.GET_TOPICS_BY_CLUSTER, self.topics_by_cluster)
        if registrations:
            dispatcher.register(RequestCode.REGISTER_BROKER, self.register_broker)
            dispatcher.register(RequestCode.UNREGISTER_BROKER, self.unregister_broker)
            dispatcher.register(RequestCode.DELETE_TOPIC_IN_NAMESRV, self.delete_topic)
            dispatcher.on_channel_closed(self.channel_closed)

    @staticmethod
    def _json(cmd: RemotingCommand, body) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    def route(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        topic = TopicRequestHeader.from_ext(cmd.ext_fields).topic
        body = self.table.route(topic)
        if body is None:
            raise BrokerError(Failure.TOPIC_NOT_FOUND,
                              f"No topic route info in name server for the topic: {topic}")
        return self._json(cmd, body)

    def cluster_info(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        return self._json(cmd, self.table.cluster_info())

    def topic_list(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        return self._json(cmd, {"topicList": self.table.topics()})

    def topics_by_cluster(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        cluster = GetTopicsByClusterRequestHeader.from_ext(cmd.ext_fields).cluster
        return self._json(cmd, {"topicList": self.table.topics(cluster)})

    def register_broker(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        if not self.pace.allow(channel):  # before the body is parsed: that is the cost being bounded
            raise BrokerError(Failure.BUSY, f"REGISTER_BROKER: more than {self.pace.rate:g} registrations a second "
                                            f"on this connection; retry later")
        header = RegisterBrokerRequestHeader.from_ext(cmd.ext_fields)
        check_broker_name(header.brokerName, "REGISTER_BROKER: brokerName")
        check_broker_name(header.clusterName, "REGISTER_BROKER: clusterName")
        for field, value in (("brokerAddr", header.brokerAddr), ("grpcAddr", header.grpcAddr or "127.0.0.1:1"),
                             ("haServerAddr", header.haServerAddr or "127.0.0.1:1")):
            if not _ADDR.fullmatch(value) or not 0 < int(value.rpartition(":")[2]) < 65536:
                raise BrokerError(Failure.BAD_REQUEST, f"REGISTER_BROKER: {field} {value[:64]!r} is not "
                                                       f"HOST:PORT")
        if not 0 <= header.brokerId <= MAX_BROKER_ID:
            raise BrokerError(Failure.BAD_REQUEST, f"REGISTER_BROKER: brokerId {header.brokerId} is not 0 (a "
                                                   f"group's leader) to {MAX_BROKER_ID} (its followers)")
        epoch = header.epoch or 0
        current = self.table.leader(header.brokerName) if header.brokerId == 0 else None
        if current is not None and current.addr != header.brokerAddr and current.epoch > epoch:
            # A leader of an older epoch (one that was paused, or has not heard it was replaced) never takes the
            # route back from the group's newer leader.
            raise BrokerError(Failure.BAD_REQUEST, f"REGISTER_BROKER: broker group {header.brokerName} is led "
                                                   f"by {current.addr} at epoch {current.epoch}, above "
                                                   f"{epoch}")
        topics = self._topics_of(header, cmd.body or b"")
        timeout_ms = header.heartbeatTimeoutMillis or 120_000
        entry = BrokerEntry(header.clusterName, header.brokerName, header.brokerId, header.brokerAddr, topics,
                            grpc_addr=header.grpcAddr or "", ha_addr=header.haServerAddr or "", epoch=epoch,
                            heard_at=time.monotonic(),
                            timeout_s=max(1.0, timeout_ms / 1000), channel=channel)
        known = self.table.brokers.get((header.brokerName, header.brokerId))
        refused = self.table.register(entry)
        if refused:
            raise BrokerError(Failure.BAD_REQUEST, f"REGISTER_BROKER: {refused}")
        if known is None or known.addr != entry.addr:
            log.info("broker %s (%s, cluster %s) registered with %d topics", header.brokerName, header.brokerAddr,
                     header.clusterName, len(topics))
        # As RocketMQ's: the group leader's replication and broker addresses, where its followers find it.
        leader = self.table.leader(header.brokerName)
        return cmd.response(ResponseCode.SUCCESS, ext_fields=RegisterBrokerResponseHeader(
            haServerAddr=leader.ha_addr if leader is not None else "",
            masterAddr=leader.addr if leader is not None else "").to_ext())

    def _topics_of(self, header: RegisterBrokerRequestHeader, body: bytes) -> dict[str, QueueData]:
        """The registration's topics (RegisterBrokerBody.topicConfigSerializeWrapper.topicConfigTable)."""
        if header.compressed:
            raise BrokerError(Failure.BAD_REQUEST, "REGISTER_BROKER: compressed bodies are not served; send "
                                                   "the JSON body (compressed=false)")
        if header.bodyCrc32 and zlib.crc32(body) & 0x7FFFFFFF != header.bodyCrc32 & 0x7FFFFFFF:
            raise BrokerError(Failure.BAD_REQUEST, "REGISTER_BROKER: the body does not match its bodyCrc32")
        try:
            table = json.loads(body)["topicConfigSerializeWrapper"]["topicConfigTable"] if body else {}
            if not isinstance(table, dict):
                raise TypeError("topicConfigTable is not an object")
            if len(table) > self.max_topics_per_broker:
                raise BrokerError(Failure.BAD_REQUEST, f"REGISTER_BROKER: {len(table)} topics, more than "
                                                       f"namesrvMaxTopicsPerBroker {self.max_topics_per_broker}")
            topics = {}
            for name, config in table.items():
                check_topic(name)
                read, write, perm = (int(config["readQueueNums"]), int(config["writeQueueNums"]),
                                     int(config["perm"]))
                if not (0 <= read <= 1024 and 0 <= write <= 1024 and 0 <= perm <= _ALL_PERMS):
                    raise ValueError(f"topic {name}: queues or perm out of range")
                topics[name] = QueueData(read, write, perm, int(config.get("topicSysFlag") or 0))
        except BrokerError:
            raise
        except (ValueError, TypeError, KeyError) as exc:
            raise BrokerError(Failure.BAD_REQUEST, f"REGISTER_BROKER: malformed body: {exc}") from None
        return topics

    def unregister_broker(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        header = UnregisterBrokerRequestHeader.from_ext(cmd.ext_fields)
        if self.table.unregister(header.brokerName, header.brokerId, header.brokerAddr):
            log.info("broker %s (%s) unregistered", header.brokerName, header.brokerAddr)
        return cmd.response(ResponseCode.SUCCESS)

    def delete_topic(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        header = DeleteTopicFromNamesrvRequestHeader.from_ext(cmd.ext_fields)
        self.table.delete_topic(header.topic, header.clusterName or None)
        return cmd.response(ResponseCode.SUCCESS)

    def channel_closed(self, channel) -> None:
        self.pace.forget(channel)
        for entry in self.table.channel_closed(channel):
            log.info("broker %s (%s) left: its connection closed", entry.broker_name, entry.addr)

    def expire(self) -> None:
        for entry in self.table.expire():
            log.warning("broker %s (%s) dropped: no registration for %.0f s", entry.broker_name, entry.addr,
                        entry.timeout_s)
