"""halfmq topics in Spark: ``spark.read/readStream.format("halfmq")`` and ``df.write/writeStream.format("halfmq")``.

    from halfmq.pipeline import register
    register(spark)
"""
import os
import sys

from .source import HalfmqDataSource


def register(spark) -> None:
    """Register the "halfmq" format with a SparkSession.

    Spark runs the source and sink in Python workers started with PYSPARK_PYTHON (``spark.pyspark.python``),
    else with whatever ``python3`` is on the PATH, which outside an activated venv has no halfmq: unless the user
    chose one, the workers run the driver's own Python, the one that imported halfmq."""
    from pyspark.sql.session import SparkSession as ClassicSession  # a Spark Connect server runs its own workers

    if isinstance(spark, ClassicSession):
        _default_workers_python(spark.sparkContext)
    spark.dataSource.register(HalfmqDataSource)


def _default_workers_python(sc) -> None:
    if os.environ.get("PYSPARK_PYTHON") or sc.getConf().get("spark.pyspark.python"):
        return
    # Read when a Python function (this data source, a UDF) is wrapped for the JVM: it names the workers' Python.
    sc.pythonExec = sys.executable


__all__ = ["HalfmqDataSource", "register"]
