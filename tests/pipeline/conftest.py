"""One local Spark for the whole session, and a broker on its own thread (Spark actions block the test thread)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.broker_thread import BrokerThread
from tests.support.local_spark import spark_fixture


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath).startswith(str(Path(__file__).parent)):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    yield from spark_fixture("halfmq-tests", tmp_path_factory)


@pytest.fixture
def live_broker(tmp_path):
    bt = BrokerThread(tmp_path / "store")
    yield bt.broker
    bt.stop()
