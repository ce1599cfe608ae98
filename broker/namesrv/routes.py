"""The route table: which brokers are live, in which cluster, and which queues each holds of every topic.

One table serves both the standalone name server (brokers register over the network, REGISTER_BROKER) and the
broker's built-in name server (its one broker is registered in-process, with a live view of its topics). Routes
merge every live broker's queues; ``brokerAddrs`` is keyed by brokerId so a broker group can later have followers.
The JSON shapes are RocketMQ's (TopicRouteData, ClusterInfo, TopicList): every 4.x client parses them.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class QueueData:
    """One topic's queues on one broker, as a registration carries them (TopicConfig's route fields)."""
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def as_json(self, broker_name: str) -> dict:
        return {"brokerName": broker_name, "readQueueNums": self.read_queue_nums,
                "writeQueueNums": self.write_queue_nums, "perm": self.perm, "topicSysFlag": self.topic_sys_flag,
                "topicSynFlag": self.topic_sys_flag}


@dataclass(slots=True)
class BrokerEntry:
    """One registered broker (one member of a broker group: ``broker_id`` 0 is its master)."""
    cluster: str
    broker_name: str
    broker_id: int
    addr: str
    topics: Mapping[str, QueueData]
    grpc_addr: str = ""
    ha_addr: str = ""  #: its replication port (a broker group's followers learn their leader's here)
    epoch: int = 0     #: the leadership a group's leader registered at (0: none given)
    #: monotonic time of the last registration; None: registered in-process, never expires
    heard_at: float | None = None
    timeout_s: float = 120.0
    channel: object = None  #: the connection it registered over: when it closes, the broker is gone


@dataclass
class RouteTable:
    """Owner of the name server's state. Every method runs on the event loop; none blocks."""
    max_brokers: int = 1024
    #: topics kept over all brokers together: a table of max_brokers each with the most topics a registration may
    #: carry would not fit in memory
    max_topic_entries: int = 1_000_000
    brokers: dict[tuple[str, int], BrokerEntry] = field(default_factory=dict)  # (brokerName, brokerId) → entry

    def register(self, entry: BrokerEntry) -> str | None:
        """Adds or refreshes a broker; None, or why the table has no room for it (the bound it would pass)."""
        key = (entry.broker_name, entry.broker_id)
        known = self.brokers.get(key)
        if known is None and len(self.brokers) >= self.max_brokers:
            return f"this name server already keeps {len(self.brokers)} brokers (namesrvMaxBrokers)"
        others = sum(len(e.topics) for e in self.brokers.values()) - (len(known.topics) if known else 0)
        if others + len(entry.topics) > self.max_topic_entries:
            return (f"{len(entry.topics)} topics would make {others + len(entry.topics)} kept over all brokers, more "
                    f"than namesrvMaxTopicEntries {self.max_topic_entries}")
        # A member whose role changed (a follower elected leader, a leader that stepped down) registers under its
        # new brokerId: its entry under the old one goes, as in RocketMQ's name server, so routes list one address
        # once and never name a leader as its group's follower.
        for stale in [k for k, e in self.brokers.items()
                      if k != key and k[0] == entry.broker_name and e.addr == entry.addr]:
            del self.brokers[stale]
        self.brokers[key] = entry
        return None

    def unregister(self, broker_name: str, broker_id: int, addr: str) -> bool:
        entry = self.brokers.get((broker_name, broker_id))
        if entry is None or entry.addr != addr:
            return False
        del self.brokers[(broker_name, broker_id)]
        return True

    def channel_closed(self, channel) -> list[BrokerEntry]:
        """Brokers registered over ``channel`` are gone at once (their process stopped or the link broke)."""
        gone = [e for e in self.brokers.values() if e.channel is channel]
        for entry in gone:
            del self.brokers[(entry.broker_name, entry.broker_id)]
        return gone

    def expire(self, now: float | None = None) -> list[BrokerEntry]:
        """Drops brokers that have not re-registered within their timeout."""
        now = time.monotonic() if now is None else now
        gone = [e for e in self.brokers.values() if e.heard_at is not None and now - e.heard_at > e.timeout_s]
        for entry in gone:
            del self.brokers[(entry.broker_name, entry.broker_id)]
        return gone

    def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        """Forgets a topic on every broker (of ``cluster``) until a broker registers it again."""
        for entry in self.brokers.values():
            if (cluster is None or entry.cluster == cluster) and topic in entry.topics:
                if isinstance(entry.topics, dict):
                    entry.topics = {k: v for k, v in entry.topics.items() if k != topic}

    def _masters(self) -> dict[str, list[BrokerEntry]]:
        groups: dict[str, list[BrokerEntry]] = {}
        for entry in self.brokers.values():
            groups.setdefault(entry.broker_name, []).append(entry)
        return groups

    @staticmethod
    def _broker_data(members: list[BrokerEntry]) -> dict:
        first = members[0]
        data = {"cluster": first.cluster, "brokerName": first.broker_name,
                "brokerAddrs": {str(m.broker_id): m.addr for m in sorted(members, key=lambda m: m.broker_id)}}
        grpc = {str(m.broker_id): m.grpc_addr for m in members if m.grpc_addr}
        if grpc:  # halfmq's addition: where each member serves RocketMQ 5 clients (4.x clients ignore the field)
            data["grpcAddrs"] = grpc
        return data

    def leader(self, broker_name: str) -> BrokerEntry | None:
        """A broker group's leader (brokerId 0), if registered."""
        return self.brokers.get((broker_name, 0))

    def route(self, topic: str) -> dict | None:
        """TopicRouteData of ``topic``: the queues of every broker group whose leader holds it (a group whose leader
        is gone: its followers', so consumers go on reading from them); None: no broker."""
        queue_datas, broker_datas = [], []
        for name, members in sorted(self._masters().items()):
            holder = min(members, key=lambda m: m.broker_id)
            queues = holder.topics.get(topic)
            if queues is None:
                continue
            queue_datas.append(queues.as_json(name))
            broker_datas.append(self._broker_data(members))
        if not queue_datas:
            return None
        return {"orderTopicConf": None, "queueDatas": queue_datas, "brokerDatas": broker_datas,
                "filterServerTable": {}}

    def cluster_info(self) -> dict:
        """ClusterInfo: every broker group and the clusters they belong to."""
        addr_table, clusters = {}, {}
        for name, members in sorted(self._masters().items()):
            addr_table[name] = self._broker_data(members)
            clusters.setdefault(members[0].cluster, [])
            if name not in clusters[members[0].cluster]:
                clusters[members[0].cluster].append(name)
        return {"brokerAddrTable": addr_table, "clusterAddrTable": clusters}

    def topics(self, cluster: str | None = None) -> list[str]:
        names: set[str] = set()
        for entry in self.brokers.values():
            if entry.broker_id == 0 and (cluster is None or entry.cluster == cluster):
                names.update(entry.topics)
        return sorted(names)
