"""Honest addresses: what the broker says it listens on is what it bound; `::` is dual stack; metrics have their
own bind setting."""
from __future__ import annotations

import socket
import urllib.request

import pytest

from halfmq.broker.config import ConfigError
from halfmq.protocol.codes import RequestCode, ResponseCode

from tests.support.raw import RawClient


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


async def works(addr: str) -> bool:
    c = await RawClient.connect(addr)
    try:
        r = await c.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})
        return r.code == ResponseCode.SUCCESS
    finally:
        c.close()


async def test_ready_addresses_are_the_bound_ones(broker_factory):
    """Attack surface: every port listened on 0.0.0.0 while the ready line printed 127.0.0.1."""
    broker = await broker_factory(bindAddress="0.0.0.0", metricsPromExporterPort=0)
    assert broker.addr.startswith("0.0.0.0:") and broker.namesrv_addr.startswith("0.0.0.0:")
    assert broker.metrics_addr.startswith("0.0.0.0:")
    assert broker.ctx.broker_addr == f"127.0.0.1:{broker.port}"  # routes: set brokerIP1 for other hosts
    loopback = await broker_factory(store_dir=broker.config.storePathRootDir + "-2", metricsPromExporterPort=0)
    assert loopback.addr == f"127.0.0.1:{loopback.port}" and loopback.metrics_addr.startswith("127.0.0.1:")


async def test_metrics_have_their_own_bind_address(broker_factory):
    broker = await broker_factory(bindAddress="0.0.0.0", metricsPromExporterHost="127.0.0.1",
                                  metricsPromExporterPort=0)
    assert broker.addr.startswith("0.0.0.0:")
    assert broker.metrics_addr == f"127.0.0.1:{broker.metrics_port}"
    body = urllib.request.urlopen(f"http://{broker.metrics_addr}/metrics", timeout=5).read()
    assert b"rocketmq_producer_connections" in body


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback here")
async def test_bind_all_ipv6_is_dual_stack(broker_factory):
    """`bindAddress=::` was IPv6-only yet advertised 127.0.0.1."""
    broker = await broker_factory(bindAddress="::")
    assert broker.addr == f"[::]:{broker.port}"
    assert await works(f"127.0.0.1:{broker.port}")
    assert await works(f"::1:{broker.port}")
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):  # the name server too
        with socket.create_connection((host, broker.namesrv_port), timeout=5) as sock:
            assert sock.family == family
    assert broker.ctx.broker_addr == f"127.0.0.1:{broker.port}"  # reachable: the socket takes IPv4 too


async def test_one_ipv6_address_needs_broker_ip1(broker_factory):
    if not has_ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    with pytest.raises(ConfigError, match="brokerIP1"):
        await broker_factory(bindAddress="::1")
    broker = await broker_factory(store_dir=None, bindAddress="::1", brokerIP1="127.0.0.1")
    assert broker.addr == f"[::1]:{broker.port}"
