"""The "halfmq" Spark sink: each task stores its rows as half messages, the driver commits or rolls them back."""
from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from . import sink_io
from .options import OptionError, namesrv_option


class HalfmqCommit(WriterCommitMessage):
    def __init__(self, halves: list):
        self.halves = halves


class _Writing:
    def __init__(self, options: dict[str, str]):
        self.namesrv = namesrv_option(options)
        self.topic = options.get("topic")
        self.group = options.get("producergroup", "halfmq-spark-sink")
        self.sink_id = options.get("sinkid")

    def _messages(self, rows, partition_tag: str):
        from halfmq.client import Message

        out = []
        for index, row in enumerate(rows):
            values = row.asDict()
            topic = values.get("topic") or self.topic
            if not topic:
                raise OptionError("rows need a 'topic' column or the sink needs option 'topic'")
            body = values.get("body")
            if body is None:
                raise OptionError("rows need a 'body' column")
            props = dict(values.get("properties") or {})
            props["HALFMQ_IDEMPOTENCY_KEY"] = f"{partition_tag}-{index}"
            out.append(Message(topic, bytes(body) if not isinstance(body, str) else body.encode(),
                               tags=values.get("tags"), keys=values.get("keys"), properties=props,
                               check_immunity_seconds=sink_io.SINK_IMMUNITY_SECONDS))
        return out

    def _write(self, iterator, partition_tag: str) -> HalfmqCommit:
        return HalfmqCommit(sink_io.send_halves(self.namesrv, self.group, self._messages(iterator, partition_tag)))

    def _end(self, messages, commit: bool) -> None:
        halves = [h for m in messages if m is not None for h in m.halves]
        if halves:
            sink_io.end_halves(self.namesrv, self.group, halves, commit)


class HalfmqWriter(_Writing, DataSourceWriter):
    """Each task stores its rows as half messages; commit() publishes them all, abort() none."""

    def write(self, iterator) -> HalfmqCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        tag = f"batch-{ctx.stageId()}-{ctx.partitionId()}-{ctx.attemptNumber()}" if ctx else "batch"
        return self._write(iterator, tag)

    def commit(self, messages) -> None:
        self._end(messages, True)

    def abort(self, messages) -> None:
        self._end(messages, False)


class HalfmqStreamWriter(_Writing, DataSourceStreamWriter):
    """Per micro-batch: halves from every task, then one commit or abort. With ``sinkId`` a batch id that was
    already committed (a replay after a driver crash) is rolled back instead of published twice."""

    def write(self, iterator) -> HalfmqCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        tag = f"{self.sink_id or 'stream'}-{ctx.partitionId() if ctx else 0}-{ctx.attemptNumber() if ctx else 0}"
        return self._write(iterator, tag)

    def commit(self, messages, batchId: int) -> None:
        if self.sink_id and sink_io.batch_committed(self.namesrv, self.sink_id, batchId):
            self._end(messages, False)
            return
        self._end(messages, True)
        if self.sink_id:
            sink_io.mark_batch_committed(self.namesrv, self.group, self.sink_id, batchId)

    def abort(self, messages, batchId: int) -> None:
        self._end(messages, False)
