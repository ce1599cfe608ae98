"""The broker side of the Spark sink (protocol: docs/spark-sink.md): pipelined half sends to every broker of a
topic, the decision log that decides each batch (on one broker, which every half names), acknowledged decisions,
and the check-back answers every producer of a sink group gives to every broker.

The public functions are plain (each runs its own event loop): Spark calls them from tasks and driver workers.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Iterable

from halfmq.client import LocalTransactionState, Message, MessageQueue, TransactionProducer
from halfmq.client.admin import Admin
from halfmq.client.errors import (BrokerError, ClientError, ConnectionClosedError, IllegalOperationError,
                                  RequestTimeoutError, TopicNotExistError)
from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.headers import ConnectionListRequestHeader

log = logging.getLogger(__name__)

COMMIT, ROLLBACK, UNKNOWN = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                             LocalTransactionState.UNKNOW)

#: The system topic holding the decision records: queue 0 of it on one broker (_decision_broker).
SINK_COMMITS_TOPIC = "HALFMQ_SINK_COMMITS"
DEFAULT_GROUP = "halfmq-spark-sink"
#: The owner of a driver's attempts (sink_lease.py) is a producer of this group + its owner id while it lives.
OWNER_GROUP_PREFIX = "HALFMQ_SINK_OWNER_"
#: Properties every sink half carries: what identifies its row, the attempt and task attempt it belongs to, and
#: the broker whose decision log decides that attempt.
IDEMPOTENCY_KEY = "HALFMQ_IDEMPOTENCY_KEY"
SINK_ID, SINK_BATCH, SINK_ATTEMPT, SINK_TASK, SINK_OWNER = ("HALFMQ_SINK_ID", "HALFMQ_SINK_BATCH",
                                                          "HALFMQ_SINK_ATTEMPT", "HALFMQ_SINK_TASK",
                                                          "HALFMQ_SINK_OWNER")
SINK_LOG = "HALFMQ_SINK_LOG"
SINK_PROPERTIES = frozenset({IDEMPOTENCY_KEY, SINK_ID, SINK_BATCH, SINK_ATTEMPT, SINK_TASK, SINK_OWNER, SINK_LOG})
#: A task's rows go as batch halves (one half, one decision, one check-back per batch) of one topic and queue,
#: each of at most this many rows (option rowsPerHalf) and about this many bytes (the broker's maxMessageSize is
#: 4 MiB by default), with this many halves in flight per task; and decisions in flight per commit.
HALF_BATCH_ROWS = 1000
HALF_BATCH_BYTES = 1 << 20
SEND_WINDOW = 4
DECIDE_WINDOW = 256
#: Rows of this many (topic, queue) pairs are gathered at once; past it the oldest pair's rows go first.
_OPEN_BATCHES = 64
#: QUERY_MESSAGE answers at most this many records of a key; a batch never gets near it (see DecisionLog.read).
_QUERY_MAX = 64
#: How long the driver's commit and abort retry a call to a broker that does not answer or does not lead now
#: (deciding and appending again are harmless): a broker group on etcd elects a new leader about 2 s after its
#: leader died (docs/replication.md), and the commit then carries on there. Longer: the call's error is raised.
FAILOVER_WAIT_S = 30.0
_RETRY_PAUSE_S = 0.2


class SinkError(RuntimeError):
    """The sink cannot publish a batch as asked; the message says what happened to its rows."""


def _between_leaders(exc: ClientError) -> bool:
    """Whether a failed call may succeed once its broker (group) has a leader again: it was not answered, its
    broker could not be reached or is not known now, or a member that does not lead refused it (code 14)."""
    if isinstance(exc, BrokerError):
        return exc.code == ResponseCode.SERVICE_NOT_AVAILABLE
    return type(exc) is ClientError or isinstance(exc, (ConnectionClosedError, RequestTimeoutError))


async def _patiently(call, what: str, patience: float):
    """``await call()``, called again while it fails as _between_leaders says, for up to ``patience`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while True:
        try:
            return await call()
        except ClientError as exc:
            if not _between_leaders(exc) or loop.time() >= deadline:
                raise
            log.info("%s failed (%s): asking again while its broker group may be changing leaders", what, exc)
        await asyncio.sleep(_RETRY_PAUSE_S)


@dataclass(frozen=True)
class HalfTag:
    """Which row set a task's halves belong to."""

    sink_id: str
    batch_id: int
    attempt: str  # the writer's id: one per batch write or micro-batch run
    task: str     # "<partition>.<task attempt number>"
    owner: str    # the id of the driver's owner process (sink_lease.py)
    log_broker: str  # the broker whose decision log decides the attempt (_decision_broker)

    def half_properties(self) -> dict[str, str]:
        """The properties of each of the task's (batch) halves, which every row it holds inherits."""
        return {SINK_ID: self.sink_id, SINK_BATCH: str(self.batch_id), SINK_ATTEMPT: self.attempt,
                SINK_TASK: self.task, SINK_OWNER: self.owner, SINK_LOG: self.log_broker}

    def row_key(self, row: int) -> str:
        """IDEMPOTENCY_KEY of the task's ``row``-th row: the same in every attempt of the batch."""
        return f"{self.row_key_prefix()}{row}"

    def row_key_prefix(self) -> str:
        """What every row_key of the task starts with (its row number follows)."""
        return f"{self.sink_id}:{self.batch_id}:{self.task.split('.', 1)[0]}:"


#: What a task hands the driver for each half it stored: topic, broker name, queue id, queue offset, msg id,
#: offset msg id (a plain tuple: a commit message carries one per row).
HalfRecord = tuple[str, str, int, int, str, str]


def owner_group(owner: str) -> str:
    return OWNER_GROUP_PREFIX + owner


# --- the decision log ---
@dataclass(frozen=True)
class Decision:
    """One record of HALFMQ_SINK_COMMITS: an attempt of a batch is committed (with the task attempts whose halves
    it publishes) or rolled back."""

    attempt: str
    commit: bool
    tasks: frozenset[str] = frozenset()

    def encode(self, sink_id: str, batch_id: int) -> bytes:
        return json.dumps({"sink": sink_id, "batch": batch_id, "attempt": self.attempt,
                           "verdict": "commit" if self.commit else "rollback", "tasks": sorted(self.tasks)}).encode()

    @classmethod
    def decode(cls, body: bytes) -> "Decision":
        data = json.loads(body)
        return cls(data["attempt"], data["verdict"] == "commit", frozenset(data.get("tasks", ())))


def batch_winner(records: list[Decision]) -> tuple[Decision | None, set[str]]:
    """The batch's published attempt: the first commit record (in log order) of an attempt not rolled back by an
    earlier record; and the attempts rolled back before it. Records after the winner change nothing."""
    rolled_back: set[str] = set()
    for record in records:
        if not record.commit:
            rolled_back.add(record.attempt)
        elif record.attempt not in rolled_back:
            return record, rolled_back
    return None, rolled_back


def half_verdict(records: list[Decision], attempt: str, task: str) -> bool | None:
    """True: publish a half of ``attempt`` written by ``task``; False: roll it back; None: not decided yet."""
    winner, rolled_back = batch_winner(records)
    if winner is not None:
        return winner.attempt == attempt and task in winner.tasks
    return False if attempt in rolled_back else None


def batch_key(sink_id: str, batch_id: int) -> str:
    return f"{sink_id}:{batch_id}"


async def _decision_broker(admin: Admin) -> str:
    """The broker whose decision log decides the attempts starting now: the one already holding the log (the
    first by name, should several), else the first broker by name. A log stays where it is when brokers join;
    each half names its attempt's, so a check-back never reads another log than its attempt's commit."""
    try:
        route = await admin.topic_route(SINK_COMMITS_TOPIC)
        holders = sorted(q["brokerName"] for q in route.get("queueDatas") or [])
    except TopicNotExistError:
        holders = []
    names = holders or sorted(await admin.broker_addrs())
    if not names:
        raise ClientError("the name servers know no broker")
    return names[0]


def decision_broker(namesrv: str) -> str:
    """_decision_broker, from the driver."""
    async def run() -> str:
        async with Admin(namesrv) as admin:
            return await _decision_broker(admin)
    return asyncio.run(run())


async def _broker_addr(admin: Admin, broker_name: str) -> str:
    """Where a broker is now (one restarted may have moved)."""
    addr = (await admin.broker_addrs()).get(broker_name)
    if addr is None:
        raise ClientError(f"the name servers know no broker {broker_name}")
    return addr


class DecisionLog:
    """Reads and appends the decision records of one broker's log, through a producer and an admin client of the
    caller's loop. ``patience``: seconds a read or append is retried while the log's broker (group) does not
    answer or has no leader (the driver's commit waits out a failover; a check-back answer does not wait, it is
    asked again)."""

    def __init__(self, producer, admin: Admin, broker_name: str, patience: float = 0.0):
        self.producer = producer
        self.admin = admin
        # Records are compared by queue offset, so every one goes to one queue: queue 0 of the log's broker.
        self.queue = MessageQueue(SINK_COMMITS_TOPIC, broker_name, 0)
        self.patience = patience

    async def read(self, sink_id: str, batch_id: int) -> list[Decision]:
        """The batch's records in log order. Only the broker's "no such key" means none: any other failure
        raises (a batch must never be published on a guess)."""
        return await _patiently(lambda: self._read(sink_id, batch_id), "reading the decision log", self.patience)

    async def _read(self, sink_id: str, batch_id: int) -> list[Decision]:
        # The log's broker is looked up each time: after a failover its group's new leader has the log.
        addr = await _broker_addr(self.admin, self.queue.broker_name)
        try:
            found = await self.admin.query_msg_by_key(SINK_COMMITS_TOPIC, batch_key(sink_id, batch_id), _QUERY_MAX,
                                                      addr)
        except BrokerError as exc:
            if exc.code == ResponseCode.QUERY_NOT_FOUND:
                return []
            raise
        if len(found) >= _QUERY_MAX:
            # The query answers the newest records only, and the first decides: never guess. (A batch gets one
            # record per commit attempt plus one per concurrent check answerer that found its owner dead.)
            raise SinkError(f"batch {batch_key(sink_id, batch_id)} has {len(found)} or more decision records; "
                            f"its first cannot be read")
        return [Decision.decode(m.body) for m in sorted(found, key=lambda m: m.queue_offset)]

    async def append(self, sink_id: str, batch_id: int, decision: Decision) -> None:
        """Append with an acknowledged (SYNC) send: once this returns the record is durable and readable. A send
        not answered may have been stored (its leader died after its followers had it), so a retry can append the
        record twice: harmless, as only the first decision of an attempt counts."""
        message = Message(SINK_COMMITS_TOPIC, decision.encode(sink_id, batch_id), keys=batch_key(sink_id, batch_id))
        await _patiently(lambda: self.producer.send(message, self.queue), "appending to the decision log",
                         self.patience)


async def owner_alive(admin: Admin, owner: str) -> bool | None:
    """Whether an owner process (sink_lease.py, alive as long as its Spark driver) is connected to some broker: it
    registers with every broker when it starts, so one that joined or came back since may not list it. False only
    when every broker says so; None when none lists it and some cannot tell."""
    try:
        addrs = list((await admin.broker_addrs()).values())
    except ClientError:
        return None
    answers = [await _owner_listed(admin, addr, owner) for addr in addrs]
    if True in answers:
        return True
    return None if None in answers or not answers else False


async def _owner_listed(admin: Admin, addr: str, owner: str) -> bool | None:
    try:
        data = await admin.json_call(addr, RequestCode.GET_PRODUCER_CONNECTION_LIST,
                                     ConnectionListRequestHeader(producerGroup=owner_group(owner)).to_ext())
        return bool(data["connectionSet"])
    except BrokerError as exc:
        if exc.code == ResponseCode.SYSTEM_ERROR and "not online" in (exc.remark or ""):
            return False
        return None
    except ClientError:
        return None


# --- check-back answers ---
@dataclass(frozen=True)
class _Resolved:
    """What the decision log says about one attempt of a batch (final: it never changes once known)."""

    winner: Decision | None  # None: the attempt was rolled back and no other attempt won yet


class SinkCheckListener:
    """The check-back answers of every producer of a sink group (tasks, commit workers, the attempt's owner).

    A half, on whichever broker, is answered from the decision log its attempt is decided in (the broker its
    HALFMQ_SINK_LOG names): COMMIT if its batch's winning decision names its attempt and its task attempt,
    ROLLBACK if another attempt won or its attempt was rolled back; with no decision, UNKNOW while the attempt's
    owner is connected (a long job never loses rows) and, once it is gone, a rollback record is appended first (the
    first decision wins, so a late commit record loses the race cleanly) and the half is answered from the log
    again. Checks of one attempt share one look-up.
    """

    def __init__(self, namesrv: str):
        self.namesrv = namesrv
        self.producer = None
        self.admin: Admin | None = None
        self._resolving: dict[tuple[str, int, str], asyncio.Task] = {}

    def bind(self, producer) -> None:
        self.producer = producer
        self.admin = Admin(self.namesrv)

    def decision_log(self, broker_name: str, patience: float = 0.0) -> DecisionLog:
        return DecisionLog(self.producer, self.admin, broker_name, patience)

    async def close(self) -> None:
        if self.admin is not None:
            await self.admin.close()

    async def execute_local_transaction(self, msg, arg) -> LocalTransactionState:
        return UNKNOWN

    async def check_local_transaction(self, msg) -> LocalTransactionState:
        props = msg.properties
        try:
            sink_id, batch_id, attempt, task, owner = (props[SINK_ID], int(props[SINK_BATCH]), props[SINK_ATTEMPT],
                                                       props[SINK_TASK], props[SINK_OWNER])
        except (KeyError, ValueError):
            # A half of this group without the sink's properties: written by a sink before the decision log
            # (whose job is long gone), or by something else using the group: it cannot be published safely.
            log.warning("check-back for a half without sink properties (%s): rolled back", msg.msg_id)
            return ROLLBACK
        # A half of a sink that kept one log, on its only broker, names none: the log is where it always was.
        log_broker = props.get(SINK_LOG)
        key = (sink_id, batch_id, attempt)
        task_future = self._resolving.get(key)
        if task_future is None:
            task_future = asyncio.get_running_loop().create_task(
                self._resolve(sink_id, batch_id, attempt, owner, log_broker))
            self._resolving[key] = task_future
            task_future.add_done_callback(lambda f, k=key: self._forget_unless_final(k, f))
        resolved = await asyncio.shield(task_future)
        if resolved is None:
            return UNKNOWN
        winner = resolved.winner
        return COMMIT if winner is not None and winner.attempt == attempt and task in winner.tasks else ROLLBACK

    def _forget_unless_final(self, key, future: asyncio.Task) -> None:
        if future.cancelled() or future.exception() is not None or future.result() is None:
            self._resolving.pop(key, None)
        elif len(self._resolving) > 10_000:  # a long-lived owner: keep the memory bounded
            self._resolving.clear()

    async def _resolve(self, sink_id: str, batch_id: int, attempt: str, owner: str,
                       log_broker: str | None) -> _Resolved | None:
        decisions = self.decision_log(log_broker or await _decision_broker(self.admin))
        records = await decisions.read(sink_id, batch_id)
        if half_verdict(records, attempt, "") is None:
            if await owner_alive(self.admin, owner) is not False:
                return None
            log.info("sink attempt %s of batch %s: its owner is gone and nothing was decided: rolling it back",
                     attempt, batch_key(sink_id, batch_id))
            await decisions.append(sink_id, batch_id, Decision(attempt, False))
            records = await decisions.read(sink_id, batch_id)
        winner, _rolled_back = batch_winner(records)
        return _Resolved(winner)


def sink_producer(namesrv: str, group: str) -> tuple[TransactionProducer, SinkCheckListener]:
    """A producer of the sink group answering check-backs (not started; close the listener after it). Running
    one is how a dead job's undecided halves get resolved when no job of the group runs."""
    listener = SinkCheckListener(namesrv)
    producer = TransactionProducer(group, listener, namesrv, send_timeout=30.0)
    listener.bind(producer)
    return producer, listener


# --- task side ---
#: A row to store: the message, and the broker name and queue id of the queue it must go to (see _queue_of).
Row = tuple[Message, str | None, int | None]


def send_halves(namesrv: str, group: str, tag: HalfTag, messages: Iterable[Row], immunity_seconds: int,
                rows_per_half: int = HALF_BATCH_ROWS, window: int = SEND_WINDOW) -> list[HalfRecord]:
    """Store messages in batch halves of one topic and queue of at most ``rows_per_half`` rows, ``window`` halves
    in flight, reading ``messages`` as it goes; no check-back comes before ``immunity_seconds``. On failure the
    halves stored are rolled back and the error raised."""
    half_properties = tag.half_properties()

    async def run() -> list[HalfRecord]:
        producer, listener = sink_producer(namesrv, group)
        sent: list[HalfRecord] = []
        failures: list[BaseException] = []
        slots = asyncio.Semaphore(window)
        inflight: set[asyncio.Task] = set()

        async def one(batch: list[Message], broker_name: str | None, queue_id: int | None) -> None:
            try:
                queue = None if queue_id is None else await _queue_of(producer, batch[0].topic, broker_name,
                                                                      queue_id)
                r = await producer.send_half_batch(batch, queue, half_properties, immunity_seconds)
                sent.append((r.queue.topic, r.queue.broker_name, r.queue.queue_id, r.queue_offset, r.msg_id,
                             r.offset_msg_id))
            except BaseException as exc:
                failures.append(exc)
            finally:
                slots.release()

        async def launch(batch: list[Message], broker_name: str | None, queue_id: int | None) -> bool:
            await slots.acquire()
            if failures:
                slots.release()
                return False
            task = asyncio.get_running_loop().create_task(one(batch, broker_name, queue_id))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            return True

        await producer.start()
        try:
            try:
                for (_topic, broker_name, queue_id), batch in _half_batches(messages, rows_per_half):
                    if not await launch(batch, broker_name, queue_id):
                        break
                if inflight:
                    await asyncio.gather(*inflight)
                if failures:
                    raise failures[0]
            except BaseException:
                for task in inflight:
                    task.cancel()
                await asyncio.gather(*inflight, return_exceptions=True)
                try:
                    await _decide_all(producer, listener.admin, sent, ROLLBACK)
                except Exception as exc:  # the check-backs roll them back (the attempt will not commit them)
                    log.warning("rolling back %d halves of a failed task failed: %s", len(sent), exc)
                raise
        finally:
            await producer.close()
            await listener.close()
        return sent
    return asyncio.run(run())


def _half_batches(messages: Iterable[Row], rows_per_half: int):
    """(topic, broker name, queue id) and the rows of one batch half, as each fills up (``rows_per_half``,
    HALF_BATCH_BYTES), then what is left; a queue's rows keep their order."""
    open_batches: dict[tuple[str, str | None, int | None], tuple[list[Message], list[int]]] = {}
    for msg, broker_name, queue_id in messages:
        key = (msg.topic, broker_name, queue_id)
        entry = open_batches.get(key)
        if entry is None:
            if len(open_batches) >= _OPEN_BATCHES:
                oldest = next(iter(open_batches))
                yield oldest, open_batches.pop(oldest)[0]
            entry = open_batches[key] = ([], [0])
        batch, size = entry
        batch.append(msg)
        # The batch body's share of the row: its body, its properties and the item's fixed fields.
        props = msg.properties
        size[0] += (len(msg.body) + 64 + len(msg.keys or "") + len(msg.tags or "") + sum(map(len, props))
                    + sum(map(len, props.values())) + 2 * len(props))
        if len(batch) >= rows_per_half or size[0] >= HALF_BATCH_BYTES:
            yield key, open_batches.pop(key)[0]
    for key, (batch, _size) in open_batches.items():
        yield key, batch


async def _queue_of(producer, topic: str, broker_name: str | None, queue_id: int) -> MessageQueue:
    """The writable queue columns 'broker_name' and 'queue_id' name; without a broker name, the queue of that id
    of the topic's one broker that has it (a topic on several brokers has queue ids on each)."""
    route = producer.instance.routes.cached(topic) or await producer.instance.routes.get(topic, producer.auto_create)
    found = [q for q in route.write_queues if q.queue_id == queue_id and broker_name in (None, q.broker_name)]
    if len(found) > 1:
        raise SinkError(f"column 'queue_id': topic {topic} has a queue {queue_id} on each of "
                        f"{', '.join(sorted(q.broker_name for q in found))}: column 'broker_name' says which")
    if not found:
        where = f" on broker {broker_name}" if broker_name is not None else ""
        raise SinkError(f"column 'queue_id': topic {topic} has no writable queue {queue_id}{where} "
                        f"(it has {len(route.write_queues)})")
    return found[0]


# --- driver side ---
async def _decide_one(producer: TransactionProducer, admin: Admin, half: HalfRecord,
                      state: LocalTransactionState) -> None:
    topic, broker_name, queue_id, queue_offset, msg_id, offset_msg_id = half
    queue = MessageQueue(topic, broker_name, queue_id)
    resumed = False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FAILOVER_WAIT_S
    while True:
        try:
            await producer.decide(queue, queue_offset, offset_msg_id, msg_id, state)
            return
        except IllegalOperationError as exc:
            # A commit refused: the half was discarded after its checks (a job longer than the checks last:
            # resume it and commit again), or it was rolled back (resuming is refused then: fail loudly).
            if state is not COMMIT or resumed:
                raise SinkError(f"the broker refused to {'commit' if state is COMMIT else 'roll back'} half "
                                f"{offset_msg_id} ({topic}/{queue_id}@{queue_offset}): {exc}") from exc
            try:
                await admin.resume_half(offset_msg_id)  # on the broker the id names
            except BrokerError as resume_exc:
                raise SinkError(f"half {offset_msg_id} ({topic}/{queue_id}@{queue_offset}) was decided the other "
                                f"way before this commit: {exc}; {resume_exc}") from exc
            resumed = True
            continue
        except ClientError as exc:
            # Not answered, or its broker group between leaders (which holds the half on every in-sync member:
            # the next leader takes the decision). Deciding twice is harmless.
            if not _between_leaders(exc) or loop.time() >= deadline:
                raise
            log.info("decision for half %s not taken (%s); sending it again", offset_msg_id, exc)
        await asyncio.sleep(_RETRY_PAUSE_S)


async def _decide_all(producer: TransactionProducer, admin: Admin, halves: list[HalfRecord],
                      state: LocalTransactionState, window: int = DECIDE_WINDOW) -> None:
    """Every decision acknowledged (each by the broker holding its half), ``window`` in flight; the first failure
    raises after the others finished."""
    slots = asyncio.Semaphore(window)

    async def one(half: HalfRecord) -> None:
        async with slots:
            await _decide_one(producer, admin, half, state)

    results = await asyncio.gather(*(one(h) for h in halves), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]


def commit_batch(namesrv: str, group: str, log_broker: str, sink_id: str, batch_id: int, attempt: str,
                 tasks: Iterable[str], halves: list[HalfRecord]) -> bool:
    """Decide a batch for ``attempt`` in the decision log of ``log_broker`` and carry the decision out on every
    broker holding its halves. Returns True if this attempt's rows were published, False if another attempt of
    the batch had already been (a streaming replay: its halves are rolled back). Raises SinkError if the attempt
    was rolled back first (a check found its owner gone)."""
    async def run() -> bool:
        producer, listener = sink_producer(namesrv, group)
        decisions = listener.decision_log(log_broker, FAILOVER_WAIT_S)
        await producer.start()
        try:
            records = await decisions.read(sink_id, batch_id)
            winner, _ = batch_winner(records)
            if winner is None:
                await decisions.append(sink_id, batch_id, Decision(attempt, True, frozenset(tasks)))
                winner, _ = batch_winner(await decisions.read(sink_id, batch_id))
            if winner is not None and winner.attempt == attempt:
                try:
                    await _decide_all(producer, listener.admin, halves, COMMIT)
                except Exception as exc:
                    raise SinkError(f"batch {batch_key(sink_id, batch_id)} is decided COMMIT and some of its halves "
                                    f"could not be committed now ({exc}); the broker's check-backs publish them: "
                                    f"do not run the job again") from exc
                return True
            await _decide_all(producer, listener.admin, halves, ROLLBACK)
            if winner is None:
                raise SinkError(f"batch {batch_key(sink_id, batch_id)} was rolled back before it could commit (a "
                                f"check-back found its driver gone): nothing of it was published")
            return False
        finally:
            await producer.close()
            await listener.close()
    return asyncio.run(run())


def abort_batch(namesrv: str, group: str, log_broker: str, sink_id: str, batch_id: int, attempt: str,
                halves: list[HalfRecord]) -> None:
    """Roll the attempt back: a rollback record first, in the decision log of ``log_broker`` (so orphans of its
    failed tasks are answered ROLLBACK at once, on every broker), then its halves. An attempt already decided
    COMMIT is left to its commit."""
    async def run() -> None:
        producer, listener = sink_producer(namesrv, group)
        decisions = listener.decision_log(log_broker, FAILOVER_WAIT_S)
        await producer.start()
        try:
            records = await decisions.read(sink_id, batch_id)
            if half_verdict(records, attempt, "") is None:
                await decisions.append(sink_id, batch_id, Decision(attempt, False))
                records = await decisions.read(sink_id, batch_id)
            winner, _ = batch_winner(records)
            if winner is not None and winner.attempt == attempt:
                log.warning("batch %s is decided COMMIT: abort leaves it to be published",
                            batch_key(sink_id, batch_id))
                return
            await _decide_all(producer, listener.admin, halves, ROLLBACK)
        finally:
            await producer.close()
            await listener.close()
    asyncio.run(run())

