"""The broker process: store, services, the broker listener and the built-in name server.

Lifecycle: start = open store → load tables → listen → take the broker group role (leader services or the
replication link) → periodic tasks → the other ports → register; stop is the reverse, by construction (one
AsyncExitStack): unregister → close the other ports → stop accepting, answer held pulls, drain in-progress requests
with a grace period → stop periodic tasks → leave the role (stop services) → flush offsets → close connections →
close the store.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time

from halfmq.store import MessageStore, StoreConfig

from .acl import AccessValidator, load_accounts
from .config import WILDCARDS, BrokerConfig, ConfigError
from .context import BrokerContext
from .dispatch import Dispatcher
from .metrics import BrokerMetrics
from .processors.admin import AdminProcessor
from .processors.client_manage import ClientManageProcessor
from .processors.end_transaction import EndTransactionProcessor
from .processors.inspect import InspectProcessor
from .processors.lifecycle import LifecycleProcessor
from .processors.offsets import OffsetProcessor
from .processors.pull import PullProcessor
from .processors.replication import ReplicationProcessor
from .processors.send import SendProcessor
from .messaging.consumer import ConsumerService
from .messaging.producer import ProducerService
from .messaging.transactions import TransactionService
from .errors import BrokerError
from .listen import StartError, bind_error, format_address, listen  # noqa: F401 (StartError: imported from here too)
from .names import check_broker_name
from .namesrv.link import parse_namesrv_addrs
from .namesrv.processor import NameServerProcessor
from .namesrv.registration import LocalTopics, Registrar
from .namesrv.routes import BrokerEntry, RouteTable
from .replication.member import GroupMember
from .services.leading import LeaderServices
from .services.offsets import ConsumerOffsetManager
from .services.periodic import PeriodicTask
from .services.transaction import TransactionStates
from .topics import TopicManager
from .transport import BrokerProtocol, ConnectionLimits, ConnectionSet

log = logging.getLogger(__name__)
CLIENT_SCAN_INTERVAL_S = 10.0


class Broker:
    """One broker. ``await start()`` binds its ports (0 = any free port); ``addr``/``namesrv_addr``/
    ``metrics_addr`` are the addresses bound (``0.0.0.0:10911`` when bound to every interface).

    Lifecycle by construction: each component started pushes its stop onto one ``AsyncExitStack``, so stopping is
    the reverse of starting (and a failed start stops exactly what had started), with no second list to keep."""

    def __init__(self, config: BrokerConfig):
        self.config = config
        self.ctx: BrokerContext | None = None
        self.store: MessageStore | None = None
        self.dispatcher = Dispatcher("broker")
        self.namesrv_dispatcher = Dispatcher("namesrv")
        self.ha_dispatcher = Dispatcher("replication")
        self.connections = ConnectionSet(config.serverMaxConnections)
        self.namesrv_connections = ConnectionSet(config.serverMaxConnections)
        self.ha_connections = ConnectionSet(config.serverMaxConnections)
        self.servers: list[asyncio.base_events.Server] = []
        self.periodic: list[PeriodicTask] = []
        self.addr = ""
        self.namesrv_addr = ""
        self.port = 0
        self.namesrv_port = 0
        self.metrics_port = 0
        self.metrics_addr = ""
        self.ha_port = 0
        self.ha_addr = ""
        self.producer: ProducerService | None = None
        self.consumer: ConsumerService | None = None
        self.transactions: TransactionService | None = None
        self.member: GroupMember | None = None  #: the broker's role in its broker group (replication)
        self.grpc = None  #: broker/grpc's GrpcEndpoint, when grpcListenPort >= 0 and the grpc extra is installed
        self.dashboard = None  #: halfmq.dashboard's DashboardServer, when dashboardPort >= 0
        self.dashboard_addr = ""
        self.routes: RouteTable | None = None  #: the built-in name server's table: this broker alone
        self.registrar: Registrar | None = None  #: with namesrvAddr: this broker's registrations
        self.grpc_port = 0
        self.grpc_addr = ""
        self.stopped = asyncio.Event()
        self._stopping = False
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> None:
        cfg = self.config
        # Refused before anything is made: a bad name or address leaves no store folder behind.
        parse_namesrv_addrs(cfg.namesrvAddr)
        if cfg.haMasterAddress:
            parse_namesrv_addrs(cfg.haMasterAddress, "haMasterAddress")
        for key in ("brokerName", "brokerClusterName"):  # routes, message properties and pages show them
            try:
                check_broker_name(getattr(cfg, key), key)
            except BrokerError as exc:
                raise ConfigError(exc.remark) from None
        try:
            await self._start(asyncio.get_running_loop())
        except BaseException:
            # Stop what was started (services, periodic tasks, listeners, the store's writer): a failed start
            # leaves no task pending and no process behind.
            await self._shutdown()
            raise

    async def _start(self, loop) -> None:
        cfg = self.config
        stack = self._stack
        self.store = MessageStore(StoreConfig(root=cfg.storePathRootDir, map_size=cfg.mapSize,
                                              max_map_size=cfg.maxMapSize, flush_disk_type=cfg.flushDiskType,
                                              flush_interval_ms=cfg.flushIntervalCommitLog))
        await self.store.open()
        stack.push_async_callback(self.store.close)
        # Last to stop before the store: connections, and the listeners' own ends.
        stack.push_async_callback(self._close_connections)
        topics = TopicManager(self.store, cfg.defaultTopicQueueNums, cfg.autoCreateTopicEnable,
                              len(cfg.delay_levels_ms), max_topics=cfg.maxAutoCreatedTopics,
                              auto_create_groups=cfg.autoCreateSubscriptionGroup,
                              max_groups=cfg.maxAutoCreatedSubscriptionGroups)
        topics.load()
        offsets = ConsumerOffsetManager(self.store)
        offsets.load()
        ctx = self.ctx = BrokerContext(cfg, self.store, topics, offsets)
        stack.push_async_callback(self._flush_offsets)
        stack.callback(ctx.consumers.close)
        ctx.metrics = BrokerMetrics(ctx)
        stack.callback(ctx.metrics.close)
        self.dispatcher.request_observer = ctx.metrics.request_done
        ctx.transactions = TransactionStates(ctx)
        services = LeaderServices(ctx)
        services.build()
        self.producer = ProducerService(ctx)
        self.consumer = ConsumerService(ctx)
        self.transactions = TransactionService(ctx)

        # Both listeners bound their connections as configured (memory, requests in progress, partial frames).
        self.dispatcher.limits = self.namesrv_dispatcher.limits = ConnectionLimits.from_config(cfg)
        self.ha_dispatcher.limits = self.dispatcher.limits
        validator = ctx.acl = AccessValidator(load_accounts(cfg.aclConfigFile) if cfg.aclEnable else None,
                                              cfg.authorizationSkewSeconds)
        self.dispatcher.authorize = self.ha_dispatcher.authorize = validator.check
        tls = self._tls_context()
        if not cfg.brokerIP1 and ":" in cfg.bindAddress and cfg.bindAddress not in WILDCARDS:
            raise ConfigError(f"bindAddress {cfg.bindAddress} is one IPv6 address: set brokerIP1 to the IPv4 address "
                              f"clients reach the broker at (message ids and routes carry an IPv4 address)")
        # The broker port must be known before anything is stored: it is part of every record's store host.
        server = await self._listen(loop, self._protocol_factory(self.dispatcher, self.connections),
                                    cfg.listenPort, tls, "listenPort")
        self.port = server.sockets[0].getsockname()[1]
        ctx.store_host = ctx.broker_addr = f"{cfg.advertised_ip}:{self.port}"
        self.addr = format_address(server.sockets[0].getsockname())

        self.member = ctx.member = GroupMember(ctx, services, find_leader=self._find_leader,
                                               on_role_change=self._role_changed)
        for processor in (SendProcessor(ctx, self.producer), PullProcessor(ctx, self.consumer),
                          OffsetProcessor(ctx, self.consumer),
                          ClientManageProcessor(ctx), AdminProcessor(ctx),
                          EndTransactionProcessor(ctx, self.transactions),
                          InspectProcessor(ctx), LifecycleProcessor(ctx), ReplicationProcessor(self.member)):
            processor.register(self.dispatcher)
        # The name-server requests a client may send to the broker port too; with namesrvAddr they describe the
        # built-in table of this broker alone, which is also what a client asking this broker should learn.
        self.routes = RouteTable()
        self.routes.register(BrokerEntry(cfg.brokerClusterName, cfg.brokerName, cfg.brokerId, ctx.broker_addr,
                                         LocalTopics(topics)))
        NameServerProcessor(self.routes).register(self.dispatcher, registrations=False)
        self.dispatcher.on_channel_closed(ctx.producers.channel_closed)
        self.store.publish_hooks.append(self.dispatcher.flush_answers)
        self.dispatcher.store = self.store
        self.dispatcher.on_channel_closed(ctx.consumers.channel_closed)
        self.store.add_arrival_listener(ctx.long_poll.on_arrival)
        if self.member.enabled:
            self.member.register(self.ha_dispatcher)
            ha = await self._listen(loop, self._protocol_factory(self.ha_dispatcher, self.ha_connections),
                                    cfg.haListenPort, tls, "haListenPort")
            self.ha_port = ha.sockets[0].getsockname()[1]
            self.ha_addr = self.member.ha_addr = cfg.haAdvertisedAddress or f"{cfg.advertised_ip}:{self.ha_port}"
        await self.member.start()
        stack.push_async_callback(self.member.stop)

        self.periodic = [
            PeriodicTask("flush-consumer-offsets", cfg.flushConsumerOffsetInterval / 1000, offsets.flush),
            PeriodicTask("expire-clients", CLIENT_SCAN_INTERVAL_S, self._expire_clients),
        ]
        if cfg.serverChannelMaxIdleTimeSeconds > 0:
            idle = cfg.serverChannelMaxIdleTimeSeconds
            self.periodic.append(PeriodicTask("close-idle", min(idle, 10), lambda: self._close_idle(idle)))
        for task in self.periodic:
            task.start()
            stack.push_async_callback(task.stop)
        # Before services stop: no new requests, held pulls answered, requests in progress drained.
        stack.push_async_callback(self._quiesce)

        if cfg.namesrvListenPort >= 0 and not cfg.namesrvAddr:
            NameServerProcessor(self.routes).register(self.namesrv_dispatcher, registrations=False)
            ns = await self._listen(loop, self._protocol_factory(self.namesrv_dispatcher, self.namesrv_connections),
                                    cfg.namesrvListenPort, tls, "namesrvListenPort")
            self.namesrv_port = ns.sockets[0].getsockname()[1]
            self.namesrv_addr = format_address(ns.sockets[0].getsockname())
        if cfg.grpcListenPort >= 0:
            await self._start_grpc(ctx)
        if cfg.metricsPromExporterPort >= 0:
            host = cfg.metricsPromExporterHost or cfg.bindAddress
            try:
                bound = ctx.metrics.serve(host, cfg.metricsPromExporterPort)
            except OSError as exc:
                raise bind_error("metricsPromExporterPort", host, cfg.metricsPromExporterPort, exc) from None
            self.metrics_port = bound[1]
            self.metrics_addr = format_address(bound)
        if cfg.dashboardPort >= 0:
            await self._start_dashboard(ctx)
        if cfg.namesrvAddr:
            grpc_addr = f"{cfg.advertised_ip}:{self.grpc_port}" if self.grpc is not None else ""
            self.registrar = Registrar(cfg, topics, ctx.broker_addr, grpc_addr, member=self.member)
            topics.change_listeners.append(self.registrar.topics_changed)
            await self.registrar.start()
            # First at shutdown: clients' routes leave this broker before its port closes.
            stack.push_async_callback(self.registrar.stop)
        log.info("effective configuration: %s", " ".join(f"{k}={v}" for k, v in cfg.as_dict().items()))
        log.info("listening: broker %s namesrv %s metrics %s grpc %s dashboard %s replication %s; routes and "
                 "message ids advertise %s", self.addr, self.namesrv_addr or "-", self.metrics_addr or "-",
                 self.grpc_addr or "-", self.dashboard_addr or "-", self.ha_addr or "-", ctx.broker_addr)
        if not cfg.brokerIP1 and cfg.bindAddress in WILDCARDS:
            log.warning("bound to every interface but brokerIP1 is not set: routes advertise %s, which only "
                        "clients on this host can reach", ctx.broker_addr)

    async def _find_leader(self) -> str | None:
        """The replication address of this group's leader, as the name servers know it (not known yet: a
        registration now asks them again, rather than a period later)."""
        if self.registrar is None:
            return None
        if self.registrar.leader_ha_addr is None:
            self.registrar.topics_changed()
        return self.registrar.leader_ha_addr

    async def _role_changed(self) -> None:
        """Took or handed over the leadership: the name servers hear of the new id at once."""
        if self.registrar is not None:
            self.registrar.topics_changed()

    async def _start_grpc(self, ctx) -> None:
        """The gRPC endpoint for RocketMQ 5 clients (broker/grpc/), on bindAddress with the broker port's TLS
        certificates. Without the grpc extra installed it is not served, and the log says so."""
        cfg = self.config
        try:
            from .grpc.server import GrpcEndpoint
        except ImportError as exc:
            log.warning("grpcListenPort=%d: RocketMQ 5 (gRPC) clients are not served: %s (install the grpc extra: "
                        "pip install 'halfmq[grpc]'; grpcListenPort=-1 turns this off)", cfg.grpcListenPort, exc)
            return
        tls = self._tls_context()
        if tls is not None:
            tls.set_alpn_protocols(["h2"])  # gRPC clients ask for HTTP/2 by ALPN
        loop = asyncio.get_running_loop()
        grpc = GrpcEndpoint(ctx, self.producer, self.consumer, self.transactions)
        self.grpc_port = await grpc.start(
            lambda factory: self._listen(loop, factory, cfg.grpcListenPort, tls, "grpcListenPort"),
            self.dispatcher.limits.frame_budget)
        self.grpc = grpc
        self._stack.push_async_callback(grpc.stop, min(cfg.shutdownGraceSeconds, 2))
        self.grpc_addr = format_address((cfg.bindAddress or "0.0.0.0", self.grpc_port))
        task = PeriodicTask("expire-grpc-clients", CLIENT_SCAN_INTERVAL_S, self.grpc.expire_sessions)
        self.periodic.append(task)
        task.start()
        self._stack.push_async_callback(task.stop)

    async def _start_dashboard(self, ctx) -> None:
        """The dashboard (halfmq.dashboard): a client of the brokers like `halfmq admin`, so it asks this broker's
        own port for routes (the name-server requests are served there too) or the cluster's name servers."""
        cfg = self.config
        from halfmq.dashboard.server import DashboardServer
        from halfmq.dashboard.settings import DashboardSettings
        own = f"{cfg.advertised_ip}:{self.namesrv_port}" if self.namesrv_addr else ctx.broker_addr
        settings = DashboardSettings.from_broker_config(cfg, cfg.namesrvAddr or own)
        server = DashboardServer(settings)
        try:
            await server.start()
        except OSError as exc:
            raise bind_error("dashboardPort", settings.host, cfg.dashboardPort, exc) from None
        self.dashboard = server
        self._stack.push_async_callback(server.stop)
        self.dashboard_addr = server.addr

    def _tls_context(self) -> ssl.SSLContext | None:
        cfg = self.config
        if not cfg.tlsEnable:
            return None
        if not cfg.tlsServerCertPath or not cfg.tlsServerKeyPath:
            raise ConfigError("tlsEnable=true needs tlsServerCertPath and tlsServerKeyPath")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(cfg.tlsServerCertPath, cfg.tlsServerKeyPath)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tlsServerCertPath/tlsServerKeyPath: cannot load: {exc}") from None
        return context

    async def _listen(self, loop, factory, port: int, tls, setting: str) -> asyncio.base_events.Server:
        server = await listen(loop, factory, self.config.bindAddress, port, tls, setting)
        self.servers.append(server)
        return server

    def _protocol_factory(self, dispatcher: Dispatcher, connections: ConnectionSet):
        cfg = self.config
        return lambda: BrokerProtocol(dispatcher, connections, cfg.serverMaxFrameSize,
                                      cfg.serverMaxInflightPerConnection)

    def _expire_clients(self) -> None:
        cutoff = time.monotonic() - self.config.channelExpiredTimeout / 1000
        self.ctx.producers.expire(cutoff)
        self.ctx.consumers.expire(cutoff)

    def _close_idle(self, idle_seconds: float) -> None:
        """serverChannelMaxIdleTimeSeconds, for every door: a connection whose client sent nothing for so long is
        closed."""
        self.connections.close_idle(idle_seconds)
        self.namesrv_connections.close_idle(idle_seconds)
        if self.grpc is not None:
            self.grpc.close_idle(idle_seconds)

    async def _quiesce(self) -> None:
        """Stop taking requests on every port, answer held pulls, and drain what is in progress (a grace period)."""
        for server in self.servers:
            server.close()
        self.connections.stop_reading()
        self.namesrv_connections.stop_reading()
        self.ha_connections.stop_reading()
        self.ctx.long_poll.release_all()
        await self.dispatcher.drain(self.config.shutdownGraceSeconds)

    async def _flush_offsets(self) -> None:
        try:
            await self.ctx.offsets.flush()
        except Exception:
            log.exception("could not persist consumer offsets at shutdown")

    async def _close_connections(self) -> None:
        self.connections.close_all()
        self.namesrv_connections.close_all()
        self.ha_connections.close_all()
        for server in self.servers:
            server.close()
            await server.wait_closed()

    async def stop(self) -> None:
        if self._stopping:
            await self.stopped.wait()
            return
        self._stopping = True
        log.info("halfmq shutting down")
        await self._shutdown()
        log.info("halfmq stopped")

    async def _shutdown(self) -> None:
        """Stop whatever has been started, in the reverse order of start; safe after a partial start."""
        self._stopping = True
        try:
            await self._stack.aclose()
        finally:
            self.stopped.set()
