"""``halfmq namesrv``: a standalone name server. Stateless: brokers register with every name server listed in
their ``namesrvAddr`` and clients ask any of them, so two or more give redundancy and any can restart empty (it is
whole again once each broker has re-registered, within registerNameServerPeriod)."""
from __future__ import annotations

import asyncio
import logging

from ..acl import AccessValidator, load_accounts
from ..dispatch import Dispatcher
from ..listen import format_address, listen
from ..services.periodic import PeriodicTask
from ..transport import BrokerProtocol, ConnectionLimits, ConnectionSet
from .config import NamesrvConfig
from .processor import NameServerProcessor
from .routes import RouteTable

log = logging.getLogger(__name__)


class NameServer:
    """One name server. ``await start()`` binds ``listenPort`` (0 = any free port); ``addr`` is the address bound."""

    def __init__(self, config: NamesrvConfig):
        self.config = config
        self.table = RouteTable(max_brokers=config.namesrvMaxBrokers,
                                max_topic_entries=config.namesrvMaxTopicEntries)
        self.processor = NameServerProcessor(self.table, config.namesrvMaxTopicsPerBroker)
        self.dispatcher = Dispatcher("namesrv")
        self.connections = ConnectionSet(config.serverMaxConnections)
        self.server: asyncio.base_events.Server | None = None
        self.periodic: list[PeriodicTask] = []
        self.addr = ""
        self.port = 0

    async def start(self) -> None:
        cfg = self.config
        self.dispatcher.limits = ConnectionLimits.from_config(cfg)
        self.dispatcher.authorize = AccessValidator(load_accounts(cfg.aclConfigFile) if cfg.aclEnable
                                                    else None).check
        self.processor.register(self.dispatcher)
        loop = asyncio.get_running_loop()
        self.server = await listen(loop, lambda: BrokerProtocol(self.dispatcher, self.connections,
                                                                cfg.serverMaxFrameSize,
                                                                cfg.serverMaxInflightPerConnection),
                                   cfg.bindAddress, cfg.listenPort, None, "listenPort")
        sockname = self.server.sockets[0].getsockname()
        self.port, self.addr = sockname[1], format_address(sockname)
        self.periodic = [PeriodicTask("scan-not-active-brokers", cfg.scanNotActiveBrokerInterval / 1000,
                                      self.processor.expire)]
        if cfg.serverChannelMaxIdleTimeSeconds > 0:
            idle = cfg.serverChannelMaxIdleTimeSeconds
            self.periodic.append(PeriodicTask("close-idle", min(idle, 10),
                                              lambda: self.connections.close_idle(idle)))
        for task in self.periodic:
            task.start()
        log.info("effective configuration: %s", " ".join(f"{k}={v}" for k, v in vars(cfg).items()))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.periodic:
            await task.stop()
        self.connections.close_all()
        if self.server is not None:
            await self.server.wait_closed()
