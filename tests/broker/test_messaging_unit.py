"""The messaging service's operations alone (broker/messaging/): no socket, no broker, no store. Each test calls one
operation with a plain request and a sender, as either door would, against stand-ins that record what the service
hands the store, so a rule of a flow is pinned where it lives."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from halfmq.broker.config import BrokerConfig
from halfmq.broker.errors import BrokerError, Failure
from halfmq.broker.messaging.batch import BatchRequest
from halfmq.broker.messaging.producer import (DEFAULT_MAX_RECONSUME_TIMES, ProducerService, Sender, SendRequest,
                                              fifo_queue, retry_limit)
from halfmq.broker.topics import TopicConfig
from halfmq.protocol import properties as P
from halfmq.protocol.message import BatchItem, MessageRecord, encode_batch
from halfmq.protocol.properties import encode_properties
from halfmq.store.completion import Completion
from halfmq.store.ops import PutMessage, PutMessages
from halfmq.store.requests import PutResult


class FakeStore:
    """Records each op submitted; ``finish`` makes them durable, the n-th at offset n."""

    def __init__(self):
        self.ops: list = []
        self.completions: list[Completion] = []

    def submit(self, op) -> Completion:
        completion = Completion(asyncio.get_running_loop())
        self.ops.append(op)
        self.completions.append(completion)
        return completion

    def finish(self) -> None:
        for n, (op, completion) in enumerate(zip(self.ops, self.completions)):
            if not completion.done():
                if isinstance(op, PutMessages):
                    completion.set_result([PutResult(100 + i, i, 0, 1) for i in range(len(op.requests))])
                else:
                    completion.set_result(PutResult(100 + n, n, 0, 1))


class FakeTopics:
    def __init__(self, *configs: TopicConfig):
        self.configs = {c.name: c for c in configs}
        self.created: list[str] = []

    def get(self, name: str):
        return self.configs.get(name)

    async def ensure_for_send(self, name: str, default_topic: str, default_queue_nums: int) -> TopicConfig:
        self.created.append(name)
        config = self.configs[name] = TopicConfig(name, 4, 4)
        return config


class FakeTransactions:
    def __init__(self, store: FakeStore):
        self.store, self.prepared = store, []

    def prepare(self, rec, group, channel, batch=None):
        self.prepared.append((rec, group, channel, batch))
        completion = Completion(asyncio.get_running_loop())
        completion.set_result((PutResult(7, 3, 0, 1), SimpleNamespace(uniq="TX", queue_offset=3)))
        return completion


class FakeChannel:
    """A connection as the service sees it: something a batch's turn can be kept for (weakly)."""


class RecordingSender(Sender):
    __slots__ = ("halves",)

    def __init__(self, group, channel=None):
        super().__init__(group, channel if channel is not None else FakeChannel())
        self.halves = []

    def half_sent(self, producers, group, topic):
        self.halves.append((group, topic))


def service(*configs: TopicConfig, **settings) -> tuple[ProducerService, FakeStore, SimpleNamespace]:
    store = FakeStore()
    ctx = SimpleNamespace(config=BrokerConfig(**settings), store=store, topics=FakeTopics(*configs),
                          transactions=FakeTransactions(store), producers=None, metrics=None, store_host="1.2.3.4:5",
                          timers=SimpleNamespace(deliver_at=lambda props: None),
                          schedule=SimpleNamespace(max_level=18))
    return ProducerService(ctx), store, ctx


def message(topic: str, body: bytes = b"hello", **props: str) -> MessageRecord:
    return MessageRecord(topic=topic, body=body, born_host="9.9.9.9:1", properties=dict(props))


# --- send ---------------------------------------------------------------------------------------------------------
async def test_a_send_to_a_known_topic_is_a_store_completion_of_one_stamped_put_to_the_queue_asked_for():
    producer, store, _ctx = service(TopicConfig("T", 4, 4))
    request = SendRequest(message("T", WAIT="true"), queue_id=2)
    sent = producer.send(request, RecordingSender("PG"))
    assert isinstance(sent, Completion)  # no task, no coroutine: the hot path
    [op] = store.ops
    assert isinstance(op, PutMessage) and request.queue_id == 2 and request.rec.queue_id == 2
    assert P.WAIT not in request.rec.properties and request.rec.properties[P.CLUSTER] == producer.cluster
    store.finish()
    assert (await sent).queue_offset == 0 and not request.half


async def test_a_send_refuses_before_anything_is_stored():
    producer, store, _ctx = service(TopicConfig("T", 4, 4))
    with pytest.raises(BrokerError) as refused:
        producer.send(SendRequest(message("T", body=b"")), RecordingSender("PG"))
    assert refused.value.failure is Failure.BODY_EMPTY
    with pytest.raises(BrokerError) as refused:
        producer.send(SendRequest(message("T"), queue_id=9), RecordingSender("PG"))
    assert refused.value.failure is Failure.BAD_REQUEST
    with pytest.raises(BrokerError) as refused:
        producer.send(SendRequest(message("SCHEDULE_TOPIC_XXXX")), RecordingSender("PG"))
    assert refused.value.failure is Failure.FORBIDDEN
    assert store.ops == []


async def test_a_send_to_an_unknown_topic_creates_it_then_stores():
    producer, store, ctx = service()
    sent = producer.send(SendRequest(message("New")), RecordingSender("PG"))
    assert asyncio.isfuture(sent) and not isinstance(sent, Completion)
    while not store.ops and not sent.done():
        await asyncio.sleep(0)
    store.finish()
    await sent
    assert ctx.topics.created == ["New"] and store.ops[0].request.topic == "New"


@pytest.mark.parametrize("times, limit, to", [(15, None, "%RETRY%G"), (16, None, "%DLQ%G"), (2, 3, "%RETRY%G"),
                                              (3, 3, "%DLQ%G"), (16, -1, "%DLQ%G")])
async def test_a_retry_past_its_deliveries_goes_to_the_groups_dlq(times, limit, to):
    producer, store, _ctx = service(TopicConfig("%RETRY%G", 1, 1), TopicConfig("%DLQ%G", 1, 1))
    rec = message("%RETRY%G", DELAY="3")
    rec.reconsume_times = times
    sent = producer.send(SendRequest(rec, max_reconsume_times=limit), RecordingSender("PG"))
    while not store.ops and not sent.done():
        await asyncio.sleep(0)
    store.finish()
    await sent
    op = store.ops[0]
    if to.startswith("%DLQ%"):
        assert op.request.topic == to and P.DELAY not in rec.properties
    else:  # a retry keeps its delay level: it goes through the schedule topic
        assert rec.properties[P.REAL_TOPIC] == to


def test_the_retry_limit_is_the_consumers_else_the_default():
    assert retry_limit(None) == retry_limit(-1) == DEFAULT_MAX_RECONSUME_TIMES
    assert retry_limit(0) == 0 and retry_limit(5) == 5


async def test_a_message_group_keeps_its_queue():
    producer, store, _ctx = service(TopicConfig("T", 8, 8))
    queues = set()
    for _ in range(5):
        request = SendRequest(message("T"), message_group="order-42")
        producer.send(request, RecordingSender(None))
        queues.add(request.queue_id)
    assert queues == {fifo_queue("order-42", 8)}


async def test_a_half_is_prepared_under_the_senders_group_and_its_producer_told():
    producer, store, ctx = service(TopicConfig("T", 4, 4))
    sender = RecordingSender("PG", channel="the-channel")
    request = SendRequest(message("T", TRAN_MSG="true"), queue_id=1)
    result, state = await producer.send(request, sender)
    assert request.half and sender.halves == [("PG", "T")] and state.uniq == "TX"
    [(rec, group, channel, batch)] = ctx.transactions.prepared
    assert (rec.topic, group, channel, batch) == ("T", "PG", "the-channel", None) and store.ops == []


async def test_a_half_naming_another_group_than_its_sender_is_refused():
    producer, _store, ctx = service(TopicConfig("T", 4, 4))
    with pytest.raises(BrokerError) as refused:
        producer.send(SendRequest(message("T", TRAN_MSG="true", PGROUP="other")), RecordingSender("PG"))
    assert refused.value.code == Failure.BAD_MESSAGE.value[0] and not ctx.transactions.prepared


async def test_writes_go_through_the_callers_group_commit_when_given():
    producer, store, _ctx = service(TopicConfig("T", 4, 4))
    queued = []

    class Writes:
        def store(self, write):
            queued.append(write)
            return "future"

    assert producer.send(SendRequest(message("T")), RecordingSender(None), Writes()) == "future"
    assert store.ops == [] and len(queued) == 1
    queued[0]()
    assert len(store.ops) == 1


# --- send_batch ---------------------------------------------------------------------------------------------------
def batch(*bodies: bytes, **props: str) -> bytes:
    return encode_batch([BatchItem(body, encode_properties(props)) for body in bodies])


async def test_a_batch_is_stored_in_one_write_each_message_inheriting_the_batchs_properties():
    producer, store, _ctx = service(TopicConfig("T", 4, 4))
    sending = asyncio.ensure_future(producer.send_batch(
        BatchRequest("T", batch(b"a", b"bb", b"ccc"), "KEYS\x01k\x02", queue_id=3), RecordingSender("PG")))
    while not store.ops and not sending.done():
        await asyncio.sleep(0)
    store.finish()
    sent = await sending
    [op] = store.ops
    assert isinstance(op, PutMessages) and len(op.requests) == 3 and sent.queue_id == 3 and sent.half is None
    assert [r.queue_offset for r in sent.results] == [0, 1, 2]


@pytest.mark.parametrize("request_, failure", [
    (BatchRequest("%RETRY%G", b"x"), Failure.BAD_MESSAGE),
    (BatchRequest("T", b""), Failure.BODY_EMPTY),
    (BatchRequest("T", batch(b"a", DELAY="2")), Failure.BAD_MESSAGE),
    (BatchRequest("T", batch(b"a", TRAN_MSG="true")), Failure.BAD_MESSAGE),
    (BatchRequest("T", batch(*[b"a"] * 5)), Failure.BAD_MESSAGE),  # over maxBatchMessageCount
])
async def test_a_refused_batch_stores_nothing(request_, failure):
    producer, store, _ctx = service(TopicConfig("T", 4, 4), TopicConfig("%RETRY%G", 1, 1), maxBatchMessageCount=4)
    with pytest.raises(BrokerError) as refused:
        await producer.send_batch(request_, RecordingSender("PG"))
    assert refused.value.failure is failure and store.ops == []


async def test_a_batch_half_is_one_half_of_all_its_messages():
    producer, store, ctx = service(TopicConfig("T", 4, 4))
    sender = RecordingSender("PG")
    sent = await producer.send_batch(BatchRequest("T", batch(b"a", b"b"), "TRAN_MSG\x01true\x02UNIQ_KEY\x01U1\x02",
                                                  queue_id=0), sender)
    [(half, group, _channel, requests)] = ctx.transactions.prepared
    assert group == "PG" and len(requests) == 2 and half.properties[P.UNIQ_KEY] == "U1"
    assert sent.half.uniq == "TX" and sender.halves == [("PG", "T")] and store.ops == []


# --- ReceiptService -----------------------------------------------------------------------------------------------
class ReceiptStore:
    """What the receipt model asks of a store: a queue of records, the receipts and cursor (``held``, ``cursor``),
    and the ops it submits, each answered by ``answer(op)``."""

    def __init__(self, records: list[bytes], held: list, cursor: int | None):
        self.records, self.held, self.cursor = records, held, cursor
        self.reads_held = None
        self.ops: list = []
        self.answer = lambda op: None

    def submit(self, op) -> Completion:
        self.ops.append(op)
        completion = Completion(asyncio.get_running_loop())
        completion.set_result(self.answer(op))
        return completion

    def read_record(self, physical_offset: int) -> bytes | None:
        return self.records[physical_offset] if physical_offset < len(self.records) else None

    def min_offset(self, topic, queue_id):
        return 0

    def max_offset(self, topic, queue_id):
        return len(self.records)

    def read_queue(self, topic, queue_id, start, count, tag_codes, max_bytes):
        return self.records[start:start + count], min(start + count, len(self.records))


def receipt_service(monkeypatch, records=(), held=(), cursor=None, **settings):
    from halfmq.broker.messaging import receipts

    store = ReceiptStore(list(records), list(held), cursor)
    monkeypatch.setattr(receipts, "read_receipts", lambda _store, *_key: list(store.held))
    monkeypatch.setattr(receipts, "read_cursor", lambda _store, *_key: store.cursor)
    offsets = SimpleNamespace(committed={}, get=lambda *key: None,
                              commit=lambda g, t, q, o: offsets.committed.__setitem__((g, t, q), o))
    woken = []

    async def ensure_dlq(group):
        return TopicConfig(f"%DLQ%{group}", 1, 1)

    ctx = SimpleNamespace(config=BrokerConfig(brokerName="b1", **settings), store=store, offsets=offsets,
                          topics=SimpleNamespace(ensure_dlq=ensure_dlq), store_host="1.2.3.4:5",
                          long_poll=SimpleNamespace(wake_topic=woken.append))
    consumer = SimpleNamespace(start_offset=lambda *key: 0)
    return receipts.ReceiptService(ctx, consumer), store, woken


def test_a_handle_names_its_broker_queue_offset_and_version_and_no_other_is_taken():
    from halfmq.broker.messaging.receipts import parse_handle, receipt_handle

    assert parse_handle(receipt_handle("b1", 3, 1000, 2**63), "b1") == (3, 1000, 2**63)
    for bad in (receipt_handle("b2", 3, 1000, 7), "b1:3:x:7", "b1:-1:0:0", f"b1:{2**31:x}:0:0", "garbage"):
        with pytest.raises(BrokerError) as refused:
            parse_handle(bad, "b1")
        assert refused.value.failure is Failure.INVALID_RECEIPT


def test_the_stores_receipt_error_answers_invalid_receipt_at_either_door():
    from halfmq.broker.errors import as_broker_error, grpc_code_name
    from halfmq.store.receipts import ReceiptError

    error = as_broker_error(ReceiptError("acknowledged meanwhile"))
    assert error.failure is Failure.INVALID_RECEIPT and grpc_code_name(error) == "INVALID_RECEIPT_HANDLE"


async def test_an_ack_answers_each_handle_and_moves_the_groups_offset(monkeypatch):
    from halfmq.broker.messaging.receipts import receipt_handle
    from halfmq.store.receipts import Receipt, ReceiptError

    service, store, woken = receipt_service(monkeypatch, held=[Receipt(5, 0, 1, 0, 9, False)], cursor=6)
    store.answer = lambda op: [None, ReceiptError("not held")]
    service.renewing[("G", "T", 0, 4, 9)] = ("client", 10**15)
    outcomes = await service.ack("G", "T", [receipt_handle("b1", 0, 4, 9), "b2:0:5:9", receipt_handle("b1", 0, 5, 1)])
    assert outcomes[0] is None and [o.failure for o in outcomes[1:]] == [Failure.INVALID_RECEIPT] * 2
    [op] = store.ops
    assert op.items == [("G", "T", 0, 4, 9), ("G", "T", 0, 5, 1)]  # the foreign handle never reaches the store
    assert service.renewing == {} and woken == ["T"]
    assert service.ctx.offsets.committed == {("G", "T", 0): 5}  # the first message still held


async def test_a_receipt_past_its_deliveries_goes_to_the_dlq_instead_of_out_again(monkeypatch):
    from halfmq.protocol.message import encode_record
    from halfmq.store.receipts import DeadLetter, Receipt, TakeReceipts

    raw = bytes(encode_record(message("T", body=b"poison", UNIQ_KEY="U1")))
    tired = Receipt(0, 0, 3, 0, 7, False)  # visible again, delivered 3 times
    service, store, _woken = receipt_service(monkeypatch, records=[raw], held=[tired], cursor=1,
                                             grpcMaxDeliveryAttempts=3)
    taken, _next = await service.take("G", "T", [0], None, 8, 1 << 20, 30_000)
    assert taken == []
    [dead] = [op for op in store.ops if isinstance(op, DeadLetter)]
    assert dead.request.topic == "%DLQ%G" and dead.queue_offset == 0
    assert not any(isinstance(op, TakeReceipts) and op.again for op in store.ops)
    assert service.dead_lettered == 1


async def test_a_member_whose_store_its_group_has_not_seen_gives_receives_nothing_and_writes_nothing(monkeypatch):
    from halfmq.protocol.message import encode_record

    raw = bytes(encode_record(message("T", body=b"maybe taken back")))
    service, store, _woken = receipt_service(monkeypatch, records=[raw], cursor=0)
    store.reads_held = "broker g has not resynced with its group since it started"
    assert await service.take("G", "T", [0], None, 8, 1 << 20, 30_000) == ([], None)
    assert store.ops == []


# --- ConsumerService.pull -----------------------------------------------------------------------------------------
def consumer_service(records: list[bytes], start: int = 0, subscription=None):
    from halfmq.broker.messaging.consumer import ConsumerService

    committed = {}
    store = SimpleNamespace(reads_held=None, min_offset=lambda t, q: start,
                            max_offset=lambda t, q: start + len(records), read_queue=lambda t, q, offset, count, tags, max_bytes: (
                                records[offset - start:offset - start + count],
                                min(offset + count, start + len(records))))
    ctx = SimpleNamespace(config=BrokerConfig(), store=store, metrics=None,
                          topics=FakeTopics(TopicConfig("T", 2, 2)),
                          consumers=SimpleNamespace(subscription=lambda group, topic: subscription),
                          offsets=SimpleNamespace(commit=lambda *key: committed.__setitem__(key[:3], key[3])))
    return ConsumerService(ctx), committed


@pytest.mark.parametrize("records, start, offset, status, next_offset, remark", [
    ([], 0, 0, "NOT_FOUND", 0, "NO_MESSAGE_IN_QUEUE"),
    ([], 0, 3, "OFFSET_MOVED", 0, "NO_MESSAGE_IN_QUEUE"),
    ([b"a", b"b"], 5, 2, "OFFSET_MOVED", 5, "OFFSET_TOO_SMALL"),
    ([b"a", b"b"], 5, 7, "NOT_FOUND", 7, "OFFSET_OVERFLOW_ONE"),
    ([b"a", b"b"], 5, 9, "OFFSET_MOVED", 7, "OFFSET_OVERFLOW_BADLY"),
    ([b"a", b"b"], 5, 6, "FOUND", 7, "FOUND"),
])
def test_a_pull_answers_what_its_offset_finds(records, start, offset, status, next_offset, remark):
    from halfmq.broker.messaging.consumer import PullRequest

    service, _committed = consumer_service(records, start)
    pulled = service.pull(PullRequest("G", "T", 1, offset, 32, ("TAG", "*")))
    assert (pulled.status.name, pulled.next_offset, pulled.remark) == (status, next_offset, remark)
    assert (pulled.min_offset, pulled.max_offset) == (start, start + len(records))
    assert pulled.records == (records[offset - start:] if status == "FOUND" else [])


def test_a_pull_of_a_member_whose_store_its_group_has_not_seen_is_refused_and_reads_nothing():
    from halfmq.broker.messaging.consumer import PullRequest

    service, committed = consumer_service([b"a", b"b"])
    service.ctx.store.reads_held = "broker g has not resynced with its group since it started"
    with pytest.raises(BrokerError) as refused:
        service.pull(PullRequest("G", "T", 0, 0, 32, ("TAG", "*"), commit_offset=1))
    assert refused.value.failure is Failure.NOT_REPLICATED and "resynced" in str(refused.value)
    assert committed == {}


def test_a_pull_commits_the_groups_progress_first_and_reads_with_its_subscription():
    from halfmq.broker.messaging.consumer import PullRequest, PullStatus

    subscription = SimpleNamespace(sub_version=3, tag_codes=None)
    service, committed = consumer_service([b"a"], subscription=subscription)
    pulled = service.pull(PullRequest("G", "T", 0, 0, 32, None, sub_version=3, commit_offset=0))
    assert pulled.status is PullStatus.FOUND and committed == {("G", "T", 0): 0}
    with pytest.raises(BrokerError) as refused:
        service.pull(PullRequest("G", "T", 0, 0, 32, None, sub_version=4))
    assert refused.value.failure is Failure.STALE_SUBSCRIPTION


@pytest.mark.parametrize("request_args, failure", [
    (("G", "Nope", 0, 0, 1, ("TAG", "*")), Failure.TOPIC_NOT_FOUND),
    (("G", "T", 2, 0, 1, ("TAG", "*")), Failure.BAD_REQUEST),
    (("G", "T", 0, 0, 1, ("SQL92", "a > 1")), Failure.UNSUPPORTED_FILTER),
    (("G", "T", 0, 0, 1, None), Failure.NO_SUBSCRIPTION),
])
def test_a_pull_is_refused_before_anything_is_read_or_committed(request_args, failure):
    from halfmq.broker.messaging.consumer import PullRequest

    service, committed = consumer_service([b"a"])
    with pytest.raises(BrokerError) as refused:
        service.pull(PullRequest(*request_args, commit_offset=0))
    assert refused.value.failure is failure and committed == {}


# --- TransactionService.end ---------------------------------------------------------------------------------------
def transaction_service(acl: bool = True, half_topic: str | None = "T"):
    from halfmq.broker.messaging.transactions import TransactionService

    decided = []
    ctx = SimpleNamespace(config=BrokerConfig(brokerName="b1"), acl=SimpleNamespace(enabled=acl),
                          store=SimpleNamespace(get_half=lambda offset: (
                              None if half_topic is None else SimpleNamespace(topic=half_topic))),
                          transactions=SimpleNamespace(decide=lambda *args: decided.append(args) or "completion"))
    return TransactionService(ctx), decided


def allowing(asked: list):
    return asked.append


def forbidding(topic: str):
    raise BrokerError(Failure.FORBIDDEN, f"may not publish to {topic}")


def test_a_decision_is_authorised_for_its_halfs_topic_then_handed_to_the_state_machine():
    from halfmq.broker.messaging.transactions import EndRequest
    from halfmq.protocol.codes import TransactionResolution as R

    service, decided = transaction_service()
    asked: list = []
    assert service.end(EndRequest("PG", 100, 3, R.COMMIT, True), allowing(asked)) == "completion"
    assert asked == ["T"] and decided == [(100, "PG", 3, R.COMMIT, True)]
    # a topic named by the caller (gRPC) is the one authorised, and the write goes through the caller's writes
    queued = []
    writes = SimpleNamespace(store=lambda write: queued.append(write) or "queued")
    request = EndRequest("%GRPC%Named", 100, 3, R.ROLLBACK, topic="Named", transaction_id="b1:...")
    assert service.end(request, allowing(asked), writes) == "queued" and asked == ["T", "Named"]
    assert len(decided) == 1 and queued[0]() == "completion" and decided[1][1:4] == ("%GRPC%Named", 3, R.ROLLBACK)


def test_unknown_leaves_the_half_pending_and_acl_off_asks_nothing():
    from halfmq.broker.messaging.transactions import EndRequest
    from halfmq.protocol.codes import TransactionResolution as R

    service, decided = transaction_service(acl=False)
    assert service.end(EndRequest("PG", 100, 3, R.UNKNOWN), forbidding) is None and decided == []
    assert service.end(EndRequest("PG", 100, 3, R.COMMIT), forbidding) == "completion"


@pytest.mark.parametrize("request_args, failure", [
    (("bad group!", 100, 3, "COMMIT"), Failure.ILLEGAL_GROUP),
    (("PG", 100, 3, "COMMIT"), Failure.FORBIDDEN),
    (("PG", None, 0, "COMMIT", False, "T", "b2:0000"), Failure.UNKNOWN_TRANSACTION),
    (("PG", 100, 3, None), Failure.BAD_REQUEST),
])
def test_a_refused_decision_writes_nothing(request_args, failure):
    from halfmq.broker.messaging.transactions import EndRequest
    from halfmq.protocol.codes import TransactionResolution as R

    service, decided = transaction_service()
    group, offset, queue_offset, decision, *rest = request_args
    authorize = forbidding if failure is Failure.FORBIDDEN else allowing([])
    with pytest.raises(BrokerError) as refused:
        service.end(EndRequest(group, offset, queue_offset, decision and R[decision], *rest), authorize)
    assert refused.value.failure is failure and decided == []


def test_a_missing_decision_is_refused_with_what_the_door_says_of_its_wire_form():
    from halfmq.broker.messaging.transactions import EndRequest

    service, decided = transaction_service()
    for malformed, remark in (("", "the resolution must be COMMIT or ROLLBACK"),
                              ("commitOrRollback 5 is not 0, 8 or 12", "commitOrRollback 5 is not 0, 8 or 12")):
        with pytest.raises(BrokerError) as refused:
            service.end(EndRequest("PG", 100, 3, None, malformed=malformed), allowing([]))
        assert refused.value.remark == remark and decided == []


def test_an_unknown_half_is_left_for_the_store_to_refuse_unasked():
    from halfmq.broker.messaging.transactions import EndRequest
    from halfmq.protocol.codes import TransactionResolution as R

    service, decided = transaction_service(half_topic=None)
    assert service.end(EndRequest("PG", 100, 3, R.COMMIT), forbidding) == "completion" and len(decided) == 1


# --- ConsumerService: consumer offsets and offset searches --------------------------------------------------------
def offset_service(committed: dict | None = None, queue_start: int = 0):
    from halfmq.broker.messaging.consumer import ConsumerService

    committed = dict(committed or {})
    durable = []

    async def commit_durable(*key):
        durable.append(key)

    store = SimpleNamespace(min_offset=lambda t, q: queue_start, searched=[],
                            offset_for_timestamp=lambda *args: store.searched.append(args) or 42)
    ctx = SimpleNamespace(config=BrokerConfig(), store=store, metrics=None,
                          offsets=SimpleNamespace(get=lambda *key: committed.get(key),
                                                  commit=lambda *key: committed.__setitem__(key[:3], key[3]),
                                                  commit_durable=commit_durable))
    return ConsumerService(ctx), committed, durable


def test_a_groups_offset_is_its_committed_one_else_the_queue_start_while_it_holds_everything():
    from halfmq.broker.messaging.consumer import OffsetRequest

    service, _committed, _durable = offset_service({("G", "T", 1): 7})
    assert service.query_offset(OffsetRequest("G", "T", 1)) == 7
    assert service.query_offset(OffsetRequest("New", "T", 1)) == 0
    trimmed, _committed, _durable = offset_service(queue_start=5)  # the queue lost its first messages
    for asked, request in ((service, OffsetRequest("New", "T", 1, from_queue_start=False)),
                           (trimmed, OffsetRequest("New", "T", 1))):
        with pytest.raises(BrokerError) as refused:
            asked.query_offset(request)
        assert refused.value.failure is Failure.OFFSET_NOT_FOUND


async def test_an_offset_is_committed_in_memory_or_durably_and_bad_names_commit_nothing():
    from halfmq.broker.messaging.consumer import OffsetRequest

    service, committed, durable = offset_service()
    assert service.commit_offset(OffsetRequest("G", "T", 0, 5), durable=False) is None
    await service.commit_offset(OffsetRequest("G", "T", 1, 6))
    assert committed == {("G", "T", 0): 5} and durable == [("G", "T", 1, 6)]
    for request, failure in ((OffsetRequest("bad group!", "T", 0, 1), Failure.ILLEGAL_GROUP),
                             (OffsetRequest("G", "bad topic!", 0, 1), Failure.ILLEGAL_TOPIC)):
        for is_durable in (False, True):
            with pytest.raises(BrokerError) as refused:
                service.commit_offset(request, durable=is_durable)
            assert refused.value.failure is failure
    assert len(committed) == 1 and len(durable) == 1


def test_an_offset_search_takes_a_lower_or_upper_boundary_only():
    from halfmq.broker.messaging.consumer import OffsetSearch

    service, _committed, _durable = offset_service()
    assert service.search_offset(OffsetSearch("T", 0, 1000)) == 42
    assert service.search_offset(OffsetSearch("T", 0, 1000, "UPPER")) == 42
    assert service.ctx.store.searched == [("T", 0, 1000, "lower"), ("T", 0, 1000, "upper")]
    with pytest.raises(BrokerError) as refused:
        service.search_offset(OffsetSearch("T", 0, 1000, "middle"))
    assert refused.value.failure is Failure.BAD_REQUEST


# --- ReceiptService.plan_receive ----------------------------------------------------------------------------------
def receive_planner(monkeypatch):
    from halfmq.broker.messaging.consumer import ConsumerService

    service, _store, _woken = receipt_service(monkeypatch)
    ensured = []

    async def ensure_group(group):
        ensured.append(group)

    topics = service.ctx.topics = FakeTopics(TopicConfig("T", 4, 4))
    topics.ensure_group = ensure_group
    service.consumer = ConsumerService(SimpleNamespace(config=BrokerConfig(), topics=topics))
    return service, ensured


async def test_a_receive_is_planned_from_the_queue_it_names_with_its_filter(monkeypatch):
    from halfmq.broker.messaging.receipts import AUTO_RENEW_INVISIBLE_MS, ReceiveRequest

    service, ensured = receive_planner(monkeypatch)
    plan = await service.plan_receive(ReceiveRequest("G", "T", 16, 30_000, expression=("TAG", "a || b"), queue_id=2,
                                                     broker="b1"))
    assert plan.queues == [2, 3, 0, 1] and plan.invisible_ms == 30_000 and not plan.auto_renew
    assert plan.tag_codes is not None and ensured == ["G"]
    renewed = await service.plan_receive(ReceiveRequest("G", "T", 1, None, auto_renew=True))
    assert (renewed.invisible_ms, renewed.auto_renew) == (AUTO_RENEW_INVISIBLE_MS, True)
    assert sorted(renewed.queues) == [0, 1, 2, 3]


@pytest.mark.parametrize("changes, failure", [
    ({"broker": "b2"}, Failure.BAD_REQUEST),  # another broker's queue: the client's route is stale
    ({"topic": "Nope"}, Failure.TOPIC_NOT_FOUND),
    ({"batch": 0}, Failure.BAD_REQUEST),
    ({"batch": 1025}, Failure.BAD_REQUEST),
    ({"invisible_ms": None}, Failure.ILLEGAL_INVISIBLE_TIME),
    ({"invisible_ms": 999}, Failure.ILLEGAL_INVISIBLE_TIME),
    ({"polling_ms": 60_001}, Failure.ILLEGAL_POLLING_TIME),
    ({"expression": ("SQL", "a > 1")}, Failure.UNSUPPORTED_FILTER),
])
async def test_a_refused_receive_answers_its_failure(monkeypatch, changes, failure):
    from halfmq.broker.messaging.receipts import ReceiveRequest

    service, _ensured = receive_planner(monkeypatch)
    request = ReceiveRequest("G", "T", 16, 30_000)
    for field, value in changes.items():
        setattr(request, field, value)
    with pytest.raises(BrokerError) as refused:
        await service.plan_receive(request)
    assert refused.value.failure is failure
