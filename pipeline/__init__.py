"""halfmq topics in Spark: ``spark.read/readStream.format("halfmq")`` and ``df.write/writeStream.format("halfmq")``.

    from halfmq.pipeline import register
    register(spark)
"""
from .source import HalfmqDataSource


def register(spark) -> None:
    """Register the "halfmq" format with a SparkSession."""
    spark.dataSource.register(HalfmqDataSource)


__all__ = ["HalfmqDataSource", "register"]
