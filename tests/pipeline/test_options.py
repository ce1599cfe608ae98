"""Source and sink options as spark-sql-kafka users expect them (issue 12): empty ranges, unknown options,
Kafka's -2/-1 JSON offsets, any broker name."""
from __future__ import annotations

import json

from tests.pipeline.test_spark import fill, read


def test_empty_range_reads_no_rows(spark, live_broker):
    fill(live_broker, "EmptyT", 6)
    assert read(spark, live_broker, subscribe="EmptyT", startingOffsets="latest").count() == 0
    everything = json.dumps({"EmptyT": {str(q): 0 for q in range(4)}})
    assert read(spark, live_broker, subscribe="EmptyT", endingOffsets=everything).count() == 0
    assert read(spark, live_broker, subscribe="EmptyT").count() == 6
