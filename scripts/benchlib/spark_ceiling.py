"""What PySpark's Python data source API alone allows on this machine: a Python sink that drops every row and a
Python source that yields ready Arrow batches, each against Spark's parquet write or read of the same rows, in one
run, alternated (the rows and passes of ``scripts/bench.py spark``). No broker is involved: these ratios bound what
the halfmq sink and source (Python data sources that also talk to a broker) can reach against parquet.

    scripts/bench.py spark-ceiling --messages 300000 --size 1024
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import sys
import tempfile
import time

from pyspark import cloudpickle
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceWriter, InputPartition,
                                    WriterCommitMessage)

from tests.support.local_spark import local_spark

from .results import Results


class _Written(WriterCommitMessage):
    def __init__(self, rows: int):
        self.rows = rows


class _DroppingWriter(DataSourceWriter):
    def write(self, iterator) -> _Written:
        rows = 0
        for _row in iterator:  # each row crosses from the JVM into Python, as the halfmq sink's rows do
            rows += 1
        return _Written(rows)

    def commit(self, messages) -> None:
        pass

    def abort(self, messages) -> None:
        pass


class _File(InputPartition):
    def __init__(self, path: str):
        self.path = path


class _ArrowReader(DataSourceReader):
    def __init__(self, folder: str):
        self.folder = folder

    def partitions(self):
        return [_File(path) for path in sorted(glob.glob(os.path.join(self.folder, "*.parquet")))]

    def read(self, partition: _File):
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(partition.path)
        table = table.cast(pa.schema([field.with_nullable(True) for field in table.schema]))  # nullable
        # Ready Arrow batches: the halfmq source yields batches of about this many rows too.
        yield from table.to_batches(max_chunksize=8192)


class Ceiling(DataSource):
    """format("ceiling"): writes drop their rows; reads yield the parquet files of option "folder" as Arrow
    batches, with option "schema" (JSON) as their schema."""

    @classmethod
    def name(cls) -> str:
        return "ceiling"

    def schema(self):
        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.options["schema"]))

    def reader(self, schema) -> _ArrowReader:
        return _ArrowReader(self.options["folder"])

    def writer(self, schema, overwrite: bool) -> _DroppingWriter:
        return _DroppingWriter()


def rates(total: int, passes: int, **writes) -> dict[str, float]:
    """Median rows/s of each write over ``passes`` alternated passes."""
    measured: dict[str, list[float]] = {name: [] for name in writes}
    for number in range(1, passes + 1):
        for name, write in writes.items():
            started = time.perf_counter()
            write()
            measured[name].append(total / (time.perf_counter() - started))
        print(f"pass {number}: " + ", ".join(f"{name} {values[-1]:,.0f} rows/s" for name, values in measured.items()),
              flush=True)
    return {name: statistics.median(values) for name, values in measured.items()}


def add_arguments(parser) -> None:
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--passes", type=int, default=3)


def run(args, results: Results) -> None:
    # Spark's Python workers do not have scripts/ on their path: the data source classes travel by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="halfmq-bench-ceiling-scratch-", ignore_cleanup_errors=True) as scratch:
        spark = local_spark("halfmq-bench-ceiling", scratch)
        spark.dataSource.register(Ceiling)
        measure(spark, args, results)
        spark.stop()


def measure(spark, args, results: Results) -> None:
    from pyspark.sql import functions as F

    rows = args.messages
    padding = "x" * max(0, args.size - 12)  # the rows of bench.py spark --sink
    df = spark.range(0, rows, numPartitions=2).select(
        F.concat(F.col("id").cast("string"), F.lit(padding)).cast("binary").alias("body")).cache()
    df.count()
    with tempfile.TemporaryDirectory(prefix="halfmq-bench-ceiling-") as folder:
        df.write.mode("overwrite").parquet(folder)  # the warm-up, and the files the Python source reads
        dropping = df.write.format("ceiling").mode("append")
        dropping.save()
        sink = rates(rows, args.passes, python_sink=dropping.save,
                     parquet_write=lambda: df.write.mode("overwrite").parquet(folder))
        source = (spark.read.format("ceiling").option("folder", folder)
                  .option("schema", spark.read.parquet(folder).schema.json()).load())
        parquet = spark.read.parquet(folder)
        source.write.format("noop").mode("overwrite").save()
        read = rates(rows, args.passes, python_source=lambda: source.write.format("noop").mode("overwrite").save(),
                     parquet_read=lambda: parquet.write.format("noop").mode("overwrite").save())
    results.add_all({"python_sink_rows_per_s": (sink["python_sink"], "rows/s"),
                     "parquet_write_rows_per_s": (sink["parquet_write"], "rows/s"),
                     "sink_ceiling": (sink["python_sink"] / sink["parquet_write"], ""),
                     "python_source_rows_per_s": (read["python_source"], "rows/s"),
                     "parquet_read_rows_per_s": (read["parquet_read"], "rows/s"),
                     "source_ceiling": (read["python_source"] / read["parquet_read"], "")},
                    rows=rows, size=args.size, passes=args.passes)
