"""What every producer and consumer needs: connections, routes, an id, and heartbeats to each broker."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import uuid
from typing import Callable, Self

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.headers import UnregisterClientRequestHeader

from .errors import error_for
from .remoting import ConnectionPool, Credentials, RequestHandler
from .route import RouteCache

log = logging.getLogger(__name__)
HEARTBEAT_INTERVAL_S = 30.0


class Startable:
    """A producer or consumer used as ``async with``: its ``start()`` on entering, its ``close()`` on leaving."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class ClientInstance:
    """Shared by one producer or consumer object.

    Args:
        namesrv: "host:port" (several separated by ";").
        client_ip: the address put in client ids and message ids.
    """

    def __init__(self, namesrv: str, client_ip: str = "127.0.0.1", request_timeout: float = 3.0,
                 credentials: Credentials | None = None, tls: ssl.SSLContext | None = None):
        self.handlers: dict[int, RequestHandler] = {}
        self.pool = ConnectionPool(self.handlers, credentials=credentials, tls=tls)
        self.routes = RouteCache(self.pool, namesrv, timeout=request_timeout)
        self.client_ip = client_ip
        self.client_id = f"{client_ip}@{os.getpid()}#{uuid.uuid4().hex[:12]}"
        self.request_timeout = request_timeout
        self.producer_groups: set[str] = set()
        self.consumer_data: Callable[[], list[dict]] = lambda: []
        self.brokers: set[str] = set()
        self._heartbeat_task: asyncio.Task | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    async def close(self) -> None:
        self._stop.set()
        if self._heartbeat_task is not None:
            await self._heartbeat_task
        await self.pool.close()

    def heartbeat_body(self) -> bytes:
        return json.dumps({"clientID": self.client_id,
                           "producerDataSet": [{"groupName": g} for g in sorted(self.producer_groups)],
                           "consumerDataSet": self.consumer_data()}).encode()

    async def heartbeat(self, addr: str) -> None:
        """Send one heartbeat to a broker.

        Raises:
            BrokerError: the broker refused it.
        """
        self.brokers.add(addr)
        conn = await self.pool.get(addr)
        resp = await conn.request(RequestCode.HEART_BEAT, body=self.heartbeat_body(), timeout=self.request_timeout)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)

    async def heartbeat_all(self) -> None:
        for addr in list(self.brokers):
            try:
                await self.heartbeat(addr)
            except Exception as exc:
                log.warning("heartbeat to %s failed: %s", addr, exc)

    async def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), HEARTBEAT_INTERVAL_S)
                return
            except asyncio.TimeoutError:
                await self.heartbeat_all()

    async def unregister(self, producer_group: str | None = None, consumer_group: str | None = None) -> None:
        ext = UnregisterClientRequestHeader(clientID=self.client_id, producerGroup=producer_group or None,
                                            consumerGroup=consumer_group or None).to_ext()
        for addr in list(self.brokers):
            try:
                conn = await self.pool.get(addr)
                await conn.request(RequestCode.UNREGISTER_CLIENT, ext, timeout=self.request_timeout)
            except Exception as exc:
                log.debug("unregister at %s failed: %s", addr, exc)
