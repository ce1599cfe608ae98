"""One local Spark for the whole session, and a broker on its own thread (Spark actions block the test thread)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support.broker_thread import BrokerThread


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath).startswith(str(Path(__file__).parent)):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from halfmq.pipeline import register

    session = (SparkSession.builder.master("local[2]").appName("halfmq-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    register(session)
    yield session
    session.stop()


@pytest.fixture
def live_broker(tmp_path):
    bt = BrokerThread(tmp_path / "store")
    yield bt.broker
    bt.stop()
