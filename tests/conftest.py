"""Shared fixtures: a real broker on 127.0.0.1 port 0 over a real LMDB store in a temp folder; a real 3-member
etcd on loopback for the failover tests."""
from __future__ import annotations

from pathlib import Path

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


ROOT = Path(__file__).resolve().parent
#: Folders whose every test is slow, and why.
SLOW_FOLDERS = {"cluster": "name servers and brokers as processes of their own",
                "interop": "the RocketMQ C++ client in subprocesses"}
#: Fixtures that make a test slow: a Spark JVM, a Docker daemon, the RocketMQ C++ client. Tests that kill
#: processes on purpose or run long randomized sequences carry ``pytest.mark.slow`` themselves.
#: ``scripts/test.sh --quick`` leaves every slow test out.
SLOW_FIXTURES = ("spark", "dockerd", "peer_python")
#: Tests that must share one xdist worker (``--dist loadgroup``), by what they share, and whether one of it serves
#: the session or each module: one install of the C++ client; a module's dockerd and base image, its 3-member etcd
#: (started once on the worker, not on each worker a test of the module lands on, and again each time tests of
#: other modules came in between).
GROUPED_FIXTURES = {"peer_python": "session", "dockerd": "module", "etcd_cluster": "module"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # tryfirst: xdist's worker reads the groups in its own hook of this name, which runs before this file's
    # otherwise (it is registered later). So this hook cannot see the marks tests/pipeline's and tests/interop's
    # conftests add (they run after it): it goes by the folder for those.
    for item in items:
        folder = Path(item.fspath).relative_to(ROOT).parts[0]
        slow = (folder in SLOW_FOLDERS or item.get_closest_marker("slow") or item.get_closest_marker("interop")
                or set(SLOW_FIXTURES) & set(item.fixturenames))
        if slow:
            item.add_marker(pytest.mark.slow)
        if slow and (folder == "pipeline" or item.get_closest_marker("spark")):
            # Every Spark run on one worker, one after the other: each is a JVM using both cores for a while, and
            # the tests' session fixture is one JVM per worker that uses it.
            item.add_marker(pytest.mark.xdist_group("spark"))
        else:
            for name, scope in GROUPED_FIXTURES.items():
                if name in item.fixturenames:
                    group = name if scope == "session" else f"{name}:{Path(item.fspath).relative_to(ROOT)}"
                    item.add_marker(pytest.mark.xdist_group(group))
                    break


class SlowFirst:
    """Under xdist the slow tests go first, so the longest do not start last and leave one worker running alone
    at the end (xdist hands out groups largest first, then single tests in collection order)."""

    @pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope
    def pytest_collection_modifyitems(self, items):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(SlowFirst(), "halfmq-slow-first")
