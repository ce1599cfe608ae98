"""A broker's membership of a cluster: it registers with every name server of ``namesrvAddr`` every
``registerNameServerPeriod`` ms, and at once when its topics change; it unregisters when it stops. Each name
server is registered with independently: one that is down delays no other."""
from __future__ import annotations

import asyncio
import json
import logging
import zlib
from collections.abc import Iterator, Mapping

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import RegisterBrokerRequestHeader, UnregisterBrokerRequestHeader

from ..topics import TopicConfig
from .link import NamesrvLink, signed
from .routes import QueueData

log = logging.getLogger(__name__)
REQUEST_TIMEOUT_S = 6.0  #: RocketMQ's registerBrokerTimeoutMills
#: topic changes arriving in a burst (a script creating topics) reach the name servers in one registration per gap,
#: not one each: a registration carries every topic, and name servers bound how often a connection may send one
#: (pacing.py)
MIN_REGISTER_GAP_S = 0.1


def queue_data(config: TopicConfig) -> QueueData:
    return QueueData(config.read_queue_nums, config.write_queue_nums, config.perm, config.topic_sys_flag)


class LocalTopics(Mapping):
    """A broker's topics as routes see them, read live from its TopicManager (the built-in name server's view)."""

    def __init__(self, topics):
        self._topics = topics.topics  # name → TopicConfig, owned by TopicManager

    def __getitem__(self, name: str) -> QueueData:
        return queue_data(self._topics[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._topics)

    def __len__(self) -> int:
        return len(self._topics)


def registration_body(topics) -> bytes:
    """RocketMQ's RegisterBrokerBody in JSON: the topic table, as the broker's TopicConfig fields."""
    table = {name: {"topicName": name, "readQueueNums": c.read_queue_nums, "writeQueueNums": c.write_queue_nums,
                    "perm": c.perm, "topicFilterType": c.topic_filter_type, "topicSysFlag": c.topic_sys_flag,
                    "order": c.order} for name, c in topics.topics.items()}
    return json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": table, "dataVersion": {}},
                       "filterServerList": []}).encode()


class Registrar:
    """Keeps this broker registered with every name server of ``namesrvAddr``."""

    def __init__(self, config, topics, broker_addr: str, grpc_addr: str = "", member=None):
        self.config = config
        self.member = member  #: the broker's place in its group (replication/member.py): the id it registers
        #: the replication address of this group's leader, as the last name server to answer knows it
        self.leader_ha_addr: str | None = None
        self.topics = topics
        self.broker_addr = broker_addr
        self.grpc_addr = grpc_addr
        self.links = [NamesrvLink(a.strip()) for a in config.namesrvAddr.split(";") if a.strip()]
        self._changed = asyncio.Event()
        #: resolved once the registration round after the latest change answered (or failed) on every name server
        self._next_round: asyncio.Future | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.registered: dict[str, bool] = {link.addr: False for link in self.links}

    def topics_changed(self) -> asyncio.Future:
        """A topic was created, changed or deleted: every name server hears of it now, not a period later. The
        future is done once they did (or failed to answer), for a caller that must not answer before."""
        self._changed.set()
        if self._next_round is None:
            self._next_round = asyncio.get_running_loop().create_future()
        return self._next_round

    async def start(self) -> None:
        """Registers once with every name server (waiting at most one request timeout: a name server that is down
        does not hold the broker's start), then keeps registering in the background."""
        await asyncio.gather(*(self._register(link) for link in self.links))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keep_registered(), name="register-broker")]

    async def _keep_registered(self) -> None:
        period = self.config.registerNameServerPeriod / 1000
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._changed.wait(), period)
            except asyncio.TimeoutError:
                pass
            if self._stop.is_set():
                return
            self._changed.clear()
            announced, self._next_round = self._next_round, None
            await asyncio.gather(*(self._register(link) for link in self.links))
            if announced is not None:
                announced.set_result(None)
            try:
                await asyncio.wait_for(self._stop.wait(), MIN_REGISTER_GAP_S)
            except asyncio.TimeoutError:
                pass

    async def _register(self, link: NamesrvLink) -> None:
        cfg = self.config
        body = registration_body(self.topics)
        member = self.member
        header = RegisterBrokerRequestHeader(
            brokerName=cfg.brokerName, brokerAddr=self.broker_addr, clusterName=cfg.brokerClusterName,
            haServerAddr=member.ha_addr if member is not None else "", brokerId=self.broker_id,
            heartbeatTimeoutMillis=cfg.brokerNotActiveTimeoutMillis,
            compressed=False, bodyCrc32=zlib.crc32(body) & 0x7FFFFFFF, grpcAddr=self.grpc_addr or None,
            epoch=member.epoch if member is not None and member.epoch else None)
        cmd = signed(RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=header.to_ext(), body=body), cfg)
        try:
            answer = await link.request(cmd, REQUEST_TIMEOUT_S)
        except (OSError, ConnectionError, asyncio.TimeoutError) as exc:
            if self.registered[link.addr]:
                log.warning("cannot register with name server %s: %s", link.addr, exc or type(exc).__name__)
            self.registered[link.addr] = False
            return
        ok = answer.code == ResponseCode.SUCCESS
        if ok and answer.ext_fields.get("haServerAddr"):
            self.leader_ha_addr = answer.ext_fields["haServerAddr"]
        if not ok:
            log.error("name server %s refused this broker's registration: code %d %s", link.addr, answer.code,
                      answer.remark)
        elif not self.registered[link.addr]:
            log.info("registered with name server %s", link.addr)
        self.registered[link.addr] = ok

    @property
    def broker_id(self) -> int:
        return self.member.broker_id if self.member is not None else self.config.brokerId

    async def stop(self) -> None:
        """Unregisters (routes drop this broker at once, not after the name servers' timeout) and closes."""
        self._stop.set()
        self._changed.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._next_round is not None:
            self._next_round.set_result(None)  # nobody waits on name servers this broker leaves
        cfg = self.config
        header = UnregisterBrokerRequestHeader(brokerName=cfg.brokerName, brokerAddr=self.broker_addr,
                                               clusterName=cfg.brokerClusterName, brokerId=self.broker_id)

        async def leave(link: NamesrvLink) -> None:
            cmd = signed(RemotingCommand(RequestCode.UNREGISTER_BROKER, ext_fields=header.to_ext()), cfg)
            try:
                await link.request(cmd, 2.0)
            except (OSError, ConnectionError, asyncio.TimeoutError):
                pass  # its connection closing tells the name server as much
            await link.close()
        await asyncio.gather(*(leave(link) for link in self.links))
