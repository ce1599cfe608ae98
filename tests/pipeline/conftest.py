"""One local Spark for the whole session, and a broker on its own thread (Spark actions block the test thread)."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.broker_thread import BrokerThread
from tests.support.local_spark import local_spark


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath).startswith(str(Path(__file__).parent)):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    scratch = tmp_path_factory.mktemp("spark")
    session = local_spark("halfmq-tests", scratch, **{"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()
    shutil.rmtree(scratch, ignore_errors=True)  # the JVM lives on until pytest exits, idle


@pytest.fixture
def live_broker(tmp_path):
    bt = BrokerThread(tmp_path / "store")
    yield bt.broker
    bt.stop()
