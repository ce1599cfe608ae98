"""Transaction audit: per broker, producer group and topic, how transactions ended and how long they took.

Reads every transaction record every broker of the cluster keeps (HALFMQ_GET_TRANSACTION_RECORDS, page by page),
writes a parquet report and prints it:
committed, rolled back, discarded and pending counts, messages committed (a batch half commits several), time to
decision p50/p99 (ms) and check-backs.

    python -m halfmq.pipeline.jobs.transaction_audit --namesrv 127.0.0.1:9876 --out /tmp/audit
    spark-submit pipeline/jobs/transaction_audit.py --namesrv 127.0.0.1:9876 --out /tmp/audit
"""
from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from halfmq.pipeline import broker_io

RECORD_SCHEMA = ("brokerName string, transactionId string, producerGroup string, topic string, state string, "
                 "storeTimestamp long, decidedTimestamp long, decidedBy string, checks int, messages int")


def audit(spark: SparkSession, namesrv: str, page_size: int | None = None) -> DataFrame:
    # Tuples as the pages arrive: the broker's dicts are not all held at once.
    rows = [(r["brokerName"], r["transactionId"], r["producerGroup"], r["topic"], r["state"], r["storeTimestamp"],
             r.get("decidedTimestamp"), r.get("decidedBy"), r["checks"], r.get("messages", 1))
            for r in broker_io.transaction_records(namesrv, page_size)]
    df = spark.createDataFrame(rows, RECORD_SCHEMA)
    latency = F.col("decidedTimestamp") - F.col("storeTimestamp")

    def count(state: str):
        return F.sum(F.when(F.col("state") == state, 1).otherwise(0)).cast("long")

    return (df.groupBy("brokerName", "producerGroup", "topic")
            .agg(count("COMMITTED").alias("committed"), count("ROLLED_BACK").alias("rolled_back"),
                 count("DISCARDED").alias("discarded"), count("PREPARED").alias("pending"),
                 F.sum(F.when(F.col("state") == "COMMITTED", F.col("messages")).otherwise(0)).cast("long")
                 .alias("committed_messages"),
                 F.percentile_approx(latency, 0.5).alias("decision_p50_ms"),
                 F.percentile_approx(latency, 0.99).alias("decision_p99_ms"),
                 F.sum("checks").cast("long").alias("check_backs"))
            .orderBy("brokerName", "producerGroup", "topic"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namesrv", default="127.0.0.1:9876", help="name server address(es): host:port;host:port")
    parser.add_argument("--out", required=True, help="folder for the parquet report")
    args = parser.parse_args(argv)
    spark = (SparkSession.builder.appName("halfmq-transaction-audit").config("spark.ui.enabled", "false")
             .getOrCreate())
    try:
        report = audit(spark, args.namesrv)
        report.write.mode("overwrite").parquet(args.out)
        report.show(truncate=False)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
