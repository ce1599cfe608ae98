"""The "halfmq" Spark sink: tasks store their rows as half messages, the driver decides each batch once in the
decision log and carries it out (protocol: docs/spark-sink.md)."""
from __future__ import annotations

import re
import uuid

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from halfmq.protocol.properties import RESERVED_KEYS

from . import sink_io, sink_lease
from .options import OptionError, namesrv_option

#: Long enough for normal jobs between a task's write and the commit; a check before the decision is answered
#: UNKNOW while the driver lives, so a shorter time only costs check-backs (each burns one of
#: transactionCheckMax; a half discarded after its last one is resumed by the commit).
DEFAULT_CHECK_IMMUNITY_SECONDS = 300
#: The broker's default maxBatchMessageCount: a batch half holds at most that many messages.
_MAX_ROWS_PER_HALF = 10_000
_SINK_ID = re.compile(r"[A-Za-z0-9_.\-]{1,100}")
#: Spark's local properties of a streaming query's tasks: the query id (kept in the checkpoint, so the same
#: across restarts) and the micro-batch id.
_QUERY_ID, _BATCH_ID = "sql.streaming.queryId", "streaming.sql.batchId"
#: the columns a row may have, in the order _messages reads them
_COLUMNS = ("topic", "body", "tags", "keys", "properties", "broker_name", "queue_id")


class HalfmqCommit(WriterCommitMessage):
    """One task's halves, and which sink, batch, attempt and task attempt they belong to."""

    def __init__(self, tag: sink_io.HalfTag, halves: list):
        self.tag = tag
        self.halves = halves


class _Writing:
    def __init__(self, options: dict[str, str]):
        self.namesrv = namesrv_option(options)
        self.topic = options.get("topic") or None
        self.group = options.get("producergroup", sink_io.DEFAULT_GROUP)
        self.sink_id = options.get("sinkid")
        if self.sink_id is not None and not _SINK_ID.fullmatch(self.sink_id):
            raise OptionError(f"option 'sinkId' {self.sink_id!r}: 1 to 100 letters, digits, '_', '.' or '-'")
        text = options.get("checkimmunityseconds", str(DEFAULT_CHECK_IMMUNITY_SECONDS))
        try:
            self.immunity = int(text)
        except ValueError:
            self.immunity = 0
        if self.immunity < 1:
            raise OptionError(f"option 'checkImmunitySeconds' {text!r} is not a whole number of seconds >= 1")
        text = options.get("rowsperhalf", str(sink_io.HALF_BATCH_ROWS))
        try:
            self.rows_per_half = int(text)
        except ValueError:
            self.rows_per_half = 0
        if not 1 <= self.rows_per_half <= _MAX_ROWS_PER_HALF:
            raise OptionError(f"option 'rowsPerHalf' {text!r} is not a whole number from 1 to {_MAX_ROWS_PER_HALF}")
        self.attempt = uuid.uuid4().hex
        self.owner: str | None = None
        self.log_broker: str | None = None

    def __getstate__(self):
        # Spark pickles the writer on the driver to ship it to the tasks (and, for a batch, to the commit): the
        # attempt starts then, so the driver's owner process must be running, and the broker whose decision log
        # decides the attempt is chosen once, for every task to name in its halves.
        if self.owner is None:
            self.owner = sink_lease.ensure(self.namesrv, self.group)
            self.log_broker = sink_io.decision_broker(self.namesrv)
        return self.__dict__

    def __setstate__(self, state):
        self.__dict__.update(state)

    def _messages(self, batches, tag: sink_io.HalfTag):
        """Each row of Spark's Arrow record batches as a message, its IDEMPOTENCY_KEY from its place among the
        task's rows. A batch's columns become Python lists in one call each: Spark's Row objects, made and read
        field by field, were a fifth of a task's time."""
        from halfmq.client import Message

        prefix = tag.row_key_prefix()
        index = 0
        for batch in batches:
            names = batch.schema.names
            column = {name: batch.column(place).to_pylist() for place, name in enumerate(names) if name in _COLUMNS}
            topics, bodies, tags, keys, user_props, brokers, queues = (column.get(name) for name in _COLUMNS)
            if not self.topic and topics is None:  # as in Kafka's sink: the option beats the column
                raise OptionError("rows need a 'topic' column or the sink needs option 'topic'")
            if bodies is None:
                raise OptionError("rows need a 'body' column")
            for place in range(batch.num_rows):
                topic = self.topic or topics[place]
                if not topic:
                    raise OptionError("rows need a 'topic' column or the sink needs option 'topic'")
                body = bodies[place]
                if body is None:
                    raise OptionError("rows need a 'body' column")
                # A source row's properties can be written back: the names the broker and client set are theirs, and
                # the sink's own are this write's. (A map column arrives as its (key, value) pairs.)
                user = (user_props is not None and user_props[place]) or ()
                props = {k: v for k, v in user if k not in RESERVED_KEYS and k not in sink_io.SINK_PROPERTIES
                         and v is not None}
                props[sink_io.IDEMPOTENCY_KEY] = f"{prefix}{index}"
                index += 1
                yield (Message(topic, body.encode() if isinstance(body, str) else bytes(body),
                               tags=None if tags is None else tags[place],
                               keys=None if keys is None else keys[place], properties=props),
                       None if brokers is None else brokers[place], None if queues is None else queues[place])

    def _write(self, rows, tag: sink_io.HalfTag) -> HalfmqCommit:
        return HalfmqCommit(tag, sink_io.send_halves(self.namesrv, self.group, tag, self._messages(rows, tag),
                                                     self.immunity, self.rows_per_half))

    def _task(self) -> str:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return f"{ctx.partitionId()}.{ctx.attemptNumber()}" if ctx else "0.0"

    @staticmethod
    def _collect(messages) -> tuple[sink_io.HalfTag | None, list[str], list]:
        present = [m for m in messages if m is not None]
        halves = [h for m in present for h in m.halves]
        return (present[0].tag if present else None), [m.tag.task for m in present], halves


class HalfmqWriter(_Writing, DataSourceArrowWriter):
    """A batch write: published all at once by commit(), or not at all."""

    def write(self, iterator) -> HalfmqCommit:
        tag = sink_io.HalfTag(self._batch_sink_id(), 0, self.attempt, self._task(), self.owner, self.log_broker)
        return self._write(iterator, tag)

    def _batch_sink_id(self) -> str:
        return self.sink_id or f"write-{self.attempt}"

    def commit(self, messages) -> None:
        # Decided even with no rows: the orphans of failed task attempts are then answered at once.
        _tag, tasks, halves = self._collect(messages)
        sink_io.commit_batch(self.namesrv, self.group, self.log_broker, self._batch_sink_id(), 0, self.attempt, tasks,
                             halves)

    def abort(self, messages) -> None:
        _tag, _tasks, halves = self._collect(messages)
        sink_io.abort_batch(self.namesrv, self.group, self.log_broker, self._batch_sink_id(), 0, self.attempt, halves)


class HalfmqStreamWriter(_Writing, DataSourceStreamArrowWriter):
    """A micro-batch is published exactly once, across driver crashes and restarts from the checkpoint: its
    sink id (option ``sinkId``, else the query's id, which the checkpoint keeps) and batch id name it in the
    decision log, and a replayed batch whose first run was decided COMMIT is rolled back. (Spark makes a writer,
    hence an attempt, per micro-batch run.)"""

    def write(self, iterator) -> HalfmqCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        sink_id = self.sink_id or (ctx and ctx.getLocalProperty(_QUERY_ID))
        batch = ctx and ctx.getLocalProperty(_BATCH_ID)
        if not sink_id or batch is None:
            raise OptionError("the halfmq stream writer runs outside a streaming query's task (no query id)")
        return self._write(iterator, sink_io.HalfTag(sink_id, int(batch), self.attempt, self._task(), self.owner,
                                                     self.log_broker))

    def commit(self, messages, batchId: int) -> None:
        tag, tasks, halves = self._collect(messages)
        if tag is None:
            return  # no task wrote anything
        if tag.batch_id != batchId:
            raise RuntimeError(f"the tasks wrote batch {tag.batch_id}, Spark commits batch {batchId}")
        sink_io.commit_batch(self.namesrv, self.group, tag.log_broker, tag.sink_id, batchId, tag.attempt, tasks,
                             halves)

    def abort(self, messages, batchId: int) -> None:
        tag, _tasks, halves = self._collect(messages)
        if tag is not None:
            sink_io.abort_batch(self.namesrv, self.group, tag.log_broker, tag.sink_id, batchId, tag.attempt, halves)
