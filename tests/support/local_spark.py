"""The local Spark of the tests and the Spark benchmarks: on loopback, without UI, and leaving nothing in /tmp."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def local_spark(app_name: str, scratch: Path | str, master: str = "local[2]", **conf: str):
    """A SparkSession of ``master`` bound to 127.0.0.1 with the "halfmq" format registered, and ``conf`` set.

    Every folder Spark makes (the block manager's, pyspark's, the artifact manager's) goes under ``scratch``, which
    the caller removes. By default they go to /tmp, and Spark deletes them only in its JVM's shutdown hooks, which
    a killed driver (the crash tests) never runs: measured, every test session left two ``spark-*`` folders and an
    ``artifacts-*`` folder in /tmp, and the crash tests ``blockmgr-*`` folders too."""
    from pyspark.sql import SparkSession

    from halfmq.pipeline import register

    Path(scratch).mkdir(parents=True, exist_ok=True)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               # spark.local.dir: the block manager; java.io.tmpdir: the other folders (Utils.createTempDir)
               .config("spark.local.dir", str(scratch))
               .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={scratch}")
               # TMPDIR of the Python workers: the sink's owner records (pipeline/sink_lease.py)
               .config("spark.executorEnv.TMPDIR", str(scratch)))
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    register(session)
    return session


def spark_fixture(app_name: str, tmp_path_factory):
    """A pytest fixture's body: the tests' local Spark (Python workers on this interpreter, shuffles in 2
    partitions), stopped and its scratch folder removed when the fixture ends."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    scratch = tmp_path_factory.mktemp("spark")
    session = local_spark(app_name, scratch, **{"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()
    shutil.rmtree(scratch, ignore_errors=True)  # the JVM lives on until pytest exits, idle
