"""Shared fixtures: a real broker on 127.0.0.1 port 0 over a real LMDB store in a temp folder; a real 3-member
etcd on loopback for the failover tests."""
from __future__ import annotations

import pytest

from halfmq.broker.config import BrokerConfig, build_config
from halfmq.broker.server import Broker
from tests.support.etcd import EtcdCluster


def broker_config(store_dir, **overrides) -> BrokerConfig:
    """A test broker's configuration: loopback, any free ports, a small map, the given overrides."""
    base = {"bindAddress": "127.0.0.1", "listenPort": 0, "namesrvListenPort": 0,
            "storePathRootDir": str(store_dir), "mapSize": 1 << 30, "metricsPromExporterPort": -1, "shutdownGraceSeconds": 2,
            "grpcListenPort": -1, "dashboardPort": -1, "haListenPort": 0}
    base.update(overrides)
    return build_config(base)


@pytest.fixture
async def broker_factory(tmp_path):
    """``await broker_factory(store_dir=None, **config)`` starts a broker; all are stopped at the end."""
    started: list[Broker] = []

    async def start(store_dir=None, **overrides) -> Broker:
        broker = Broker(broker_config(store_dir or tmp_path / "store", **overrides))
        await broker.start()
        started.append(broker)
        return broker

    yield start
    for broker in reversed(started):
        await broker.stop()


@pytest.fixture
async def broker(broker_factory):
    return await broker_factory()


@pytest.fixture(scope="module")
def etcd_cluster():
    """One 3-member etcd for a module's tests (a start takes 0.3-3 s): tests that share it keep their keys apart
    (each its own cluster or group name) and may kill or pause members, which ``etcd`` heals for the next test."""
    cluster = EtcdCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def etcd(etcd_cluster) -> EtcdCluster:
    """The module's etcd with every member running, continued and healthy."""
    etcd_cluster.heal()
    return etcd_cluster
