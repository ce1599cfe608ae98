"""Transactional messages over gRPC: EndTransaction from the producer, and orphan recovery pushed down the
telemetry stream (RecoverOrphanedTransactionCommand) answered by the checker (EndTransaction, SERVER_CHECK)."""
from __future__ import annotations

import asyncio
import queue

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer, TransactionChecker, TransactionResolution

from halfmq.client import LocalTransactionState, Message as RemotingMessage, TransactionProducer
from halfmq.store import HalfStatus

from .conftest import receive_all, wait_until
from .test_produce_consume import message

pytestmark = pytest.mark.grpc
FAST_CHECKS = {"transactionTimeOut": 300, "transactionCheckInterval": 300}


class Checker(TransactionChecker):
    """Answers every check with ``resolution`` and reports each checked message."""

    def __init__(self, resolution):
        self.resolution = resolution
        self.checked: queue.Queue = queue.Queue()

    def check(self, msg):
        self.checked.put(msg)
        return self.resolution


def half_states(broker) -> list[HalfStatus]:
    return [state.status for _offset, state in broker.broker.store.iter_halves()]


def consumer_of(grpc_broker, clients, topic: str, group: str) -> SimpleConsumer:
    return clients(SimpleConsumer(grpc_broker.config(), group, {topic: FilterExpression("*")}, await_duration=1))


@pytest.mark.parametrize("commit", [True, False])
def test_commit_and_rollback_from_the_producer(grpc_broker, clients, commit):
    producer = clients(Producer(grpc_broker.config(), ("Pay",), Checker(TransactionResolution.ROLLBACK)))
    consumer = consumer_of(grpc_broker, clients, "Pay", "PayReaders")
    transaction = producer.begin_transaction()
    receipt = producer.send(message("Pay", b"charge 10"), transaction)
    assert receipt.transaction_id
    assert consumer.receive(32, 30) == []  # a half is not visible
    if commit:
        transaction.commit()
        [got] = receive_all(consumer, 1)
        assert (got.body, got.message_id) == (b"charge 10", receipt.message_id)
    else:
        transaction.rollback()
        assert consumer.receive(32, 30) == []
    assert half_states(grpc_broker) == [HalfStatus.COMMITTED if commit else HalfStatus.ROLLED_BACK]


@pytest.mark.parametrize("resolution", [TransactionResolution.COMMIT, TransactionResolution.ROLLBACK])
def test_unknown_transaction_is_resolved_by_the_checker(grpc_broker_factory, clients, resolution):
    grpc_broker = grpc_broker_factory(**FAST_CHECKS)
    checker = Checker(resolution)
    producer = clients(Producer(grpc_broker.config(), ("Stock",), checker))
    consumer = consumer_of(grpc_broker, clients, "Stock", "StockReaders")
    receipt = producer.send(message("Stock", b"reserve 1", keys="sku-1"), producer.begin_transaction())
    checked = checker.checked.get(timeout=20)  # neither committed nor rolled back: the broker asks
    assert (checked.message_id, checked.body, checked.topic) == (receipt.message_id, b"reserve 1", "Stock")
    if resolution == TransactionResolution.COMMIT:
        [got] = receive_all(consumer, 1)
        assert got.message_id == receipt.message_id
    else:
        wait_until(lambda: grpc_broker.broker.store.pending_halves_count() == 0)
        assert consumer.receive(32, 30) == []
    assert half_states(grpc_broker) == [HalfStatus.COMMITTED if resolution == TransactionResolution.COMMIT
                                        else HalfStatus.ROLLED_BACK]


def test_restarted_producer_recovers_an_open_transaction_through_its_checker(grpc_broker_factory, clients):
    grpc_broker = grpc_broker_factory(transactionTimeOut=1500, transactionCheckInterval=60_000)
    first = clients(Producer(grpc_broker.config(), ("Ship",), Checker(TransactionResolution.ROLLBACK)))
    receipt = first.send(message("Ship", b"ship order 7"), first.begin_transaction())
    first.shutdown()  # gone before deciding, and before its check was due
    waiting = grpc_broker.broker.ctx.check_back.waiting_for_producer
    wait_until(lambda: waiting.get("%GRPC%Ship"))  # checked with no producer of the topic alive: it waits
    checker = Checker(TransactionResolution.COMMIT)
    clients(Producer(grpc_broker.config(), ("Ship",), checker))  # its registration makes the half due now
    assert checker.checked.get(timeout=20).message_id == receipt.message_id
    consumer = consumer_of(grpc_broker, clients, "Ship", "Shippers")
    [got] = receive_all(consumer, 1)
    assert got.body == b"ship order 7"


class RemotingListener:
    """A 4.x producer's listener: leaves its transaction open, and reports each check it gets."""

    def __init__(self):
        self.checked: queue.Queue = queue.Queue()

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        self.checked.put(msg.body)
        return LocalTransactionState.COMMIT_MESSAGE


async def test_each_half_is_checked_over_the_protocol_it_came_in_on(grpc_broker_factory, clients):
    grpc_broker = grpc_broker_factory(transactionTimeOut=300, transactionCheckInterval=30_000)  # one check each
    v5_checker = Checker(TransactionResolution.COMMIT)
    v5 = clients(Producer(grpc_broker.config(), ("Both",), v5_checker))
    listener = RemotingListener()
    async with TransactionProducer("BothPG", listener, grpc_broker.broker.namesrv_addr) as v4:
        await v4.send_message_in_transaction(RemotingMessage("Both", b"from v4"))
        await asyncio.to_thread(v5.send, message("Both", b"from v5"), v5.begin_transaction())
        assert await asyncio.to_thread(listener.checked.get, timeout=20) == b"from v4"
        assert (await asyncio.to_thread(v5_checker.checked.get, timeout=20)).body == b"from v5"
        await asyncio.to_thread(wait_until, lambda: grpc_broker.broker.store.pending_halves_count() == 0)
    # each side was asked about its own half only
    assert listener.checked.empty() and v5_checker.checked.empty()


async def test_admin_lists_a_5x_producer_under_its_topics_transaction_group(grpc_broker, clients):
    from halfmq.client.admin import Admin
    producer = clients(Producer(grpc_broker.config(), ("Listed",), Checker(TransactionResolution.COMMIT)))
    groups = grpc_broker.broker.ctx.producers.groups
    await asyncio.to_thread(wait_until, lambda: "%GRPC%Listed" in groups)  # its settings arrive after startup()
    async with Admin(grpc_broker.broker.namesrv_addr) as admin:
        [connection] = await admin.producer_connections("%GRPC%Listed")
    assert (connection["clientId"], connection["language"]) == (producer.client_id, "PYTHON")
    assert connection["clientAddr"].startswith("127.0.0.1:")


def test_transaction_ids_and_receipt_handles_name_their_broker(grpc_broker, clients):
    """In a cluster an EndTransaction or an ack sent to the wrong broker named only offsets, which that broker
    looked up among its own halves and receipts. Transaction ids and receipt handles now carry their brokerName,
    and another broker's are refused INVALID_TRANSACTION_ID / INVALID_RECEIPT_HANDLE, changing nothing."""
    from rocketmq.grpc_protocol import AckMessageRequest, Code, EndTransactionRequest

    from .conftest import raw_call
    from .test_bounds import messages, receive_request

    name = grpc_broker.broker.ctx.config.brokerName
    producer = clients(Producer(grpc_broker.config(), ("Named",), Checker(TransactionResolution.ROLLBACK)))
    transaction = producer.begin_transaction()
    receipt = producer.send(message("Named", b"named"), transaction)
    broker_part, _, place = receipt.transaction_id.rpartition(":")
    assert broker_part == name

    def end(transaction_id: str):
        request = EndTransactionRequest(transaction_id=transaction_id, message_id=receipt.message_id,
                                        resolution=TransactionResolution.COMMIT)
        request.topic.name = "Named"
        return raw_call(grpc_broker.endpoint, "EndTransaction", request).status

    elsewhere = end(f"broker-elsewhere:{place}")
    assert elsewhere.code == Code.INVALID_TRANSACTION_ID and name in elsewhere.message
    assert half_states(grpc_broker) == [HalfStatus.PREPARED]
    assert end(receipt.transaction_id).code == Code.OK
    assert half_states(grpc_broker) == [HalfStatus.COMMITTED]

    [got] = messages(raw_call(grpc_broker.endpoint, "ReceiveMessage", receive_request("NamedReaders", "Named")))
    handle = got.system_properties.receipt_handle
    assert handle.split(":")[0] == name

    def ack(receipt_handle: str):
        request = AckMessageRequest()
        request.group.name, request.topic.name = "NamedReaders", "Named"
        request.entries.add(message_id=got.system_properties.message_id, receipt_handle=receipt_handle)
        return raw_call(grpc_broker.endpoint, "AckMessage", request).entries[0].status.code

    assert ack("broker-elsewhere:" + handle.split(":", 1)[1]) == Code.INVALID_RECEIPT_HANDLE
    assert ack(handle) == Code.OK
