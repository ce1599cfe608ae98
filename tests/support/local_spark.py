"""The local Spark of the tests and the Spark benchmarks: on loopback, without UI, and leaving nothing in /tmp."""
from __future__ import annotations

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
