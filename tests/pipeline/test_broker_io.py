"""The sink's decision log, verdicts and acknowledged decisions, against a real broker (no Spark needed)."""
from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest

from halfmq.client import Message, TransactionProducer
from halfmq.client.admin import Admin
from halfmq.client.errors import ClientError, IllegalOperationError
from halfmq.pipeline import sink_io
from halfmq.pipeline.sink_io import Decision, DecisionLog, HalfTag, batch_winner, half_verdict

C, R = sink_io.COMMIT, sink_io.ROLLBACK


def unused_loopback_addr() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_the_first_commit_of_an_attempt_not_rolled_back_wins():
    a, b = Decision("A", True, frozenset({"0.0", "1.1"})), Decision("B", True, frozenset({"0.0"}))
    assert batch_winner([a, b])[0] == a
    # A rolled back (its owner died undecided) before its late commit record: B's commit wins.
    assert batch_winner([Decision("A", False), a, b])[0] == b
    assert half_verdict([a, b], "A", "1.1") is True
    assert half_verdict([a, b], "A", "1.0") is False  # a failed task attempt's orphan
    assert half_verdict([a, b], "B", "0.0") is False  # a replay of a published batch
    assert half_verdict([Decision("A", False)], "A", "0.0") is False
    assert half_verdict([Decision("A", False)], "B", "0.0") is None
    assert half_verdict([], "A", "0.0") is None


def run_with_log(broker, coro_fn):
    async def run():
        async with TransactionProducer("PG_SINK", sink_io.SinkCheckListener(broker.namesrv_addr),
                                       broker.namesrv_addr) as producer, Admin(broker.namesrv_addr) as admin:
            return await coro_fn(producer, admin, DecisionLog(producer, admin, broker.config.brokerName))
    return asyncio.run(run())


def test_decision_records_are_read_in_log_order_and_only_the_brokers_word_means_none(live_broker):
    async def body(_producer, _admin, log):
        assert await log.read("sink-a", 7) == []
        await log.append("sink-a", 7, Decision("A", False))
        await log.append("sink-a", 7, Decision("B", True, frozenset({"0.0"})))
        await log.append("sink-b", 7, Decision("C", True))
        return await log.read("sink-a", 7)

    assert run_with_log(live_broker, body) == [Decision("A", False), Decision("B", True, frozenset({"0.0"}))]

    async def unreachable():
        async with Admin(unused_loopback_addr()) as admin:
            await DecisionLog(None, admin, "broker-a").read("sink-a", 8)
    # No answer is not "no decision": publishing on a guess could duplicate or lose the batch.
    with pytest.raises(ClientError):
        asyncio.run(unreachable())


def test_acknowledged_decisions_report_a_refusal(live_broker):
    async def body(producer, _admin, _log):
        sent = await producer.send_half(Message("DecideT", b"x"))
        await producer.decide(sent.queue, sent.queue_offset, sent.offset_msg_id, sent.msg_id, R)
        await producer.decide(sent.queue, sent.queue_offset, sent.offset_msg_id, sent.msg_id, R)  # repeated: fine
        with pytest.raises(IllegalOperationError):
            await producer.decide(sent.queue, sent.queue_offset, sent.offset_msg_id, sent.msg_id, C)

    run_with_log(live_broker, body)


def check_answer(broker, tag: HalfTag) -> sink_io.LocalTransactionState:
    async def body(producer, _admin, _log):
        listener = sink_io.SinkCheckListener(broker.namesrv_addr)
        listener.bind(producer)
        # What a check-back hands the listener: the half's record (its properties are what is read).
        checked = SimpleNamespace(msg_id="checked", properties=tag.half_properties())
        try:
            return await listener.check_local_transaction(checked)
        finally:
            await listener.close()
    return run_with_log(broker, body)


def test_check_answers_come_from_the_decision_log_and_the_owners_liveness(live_broker):
    namesrv = live_broker.namesrv_addr
    log_broker = live_broker.config.brokerName
    committed = HalfTag("s1", 3, "A", "0.0", "OWNER-A", log_broker)
    run_with_log(live_broker, lambda _p, _a, log: log.append("s1", 3, Decision("A", True, frozenset({"0.0"}))))
    assert check_answer(live_broker, committed) is C
    assert check_answer(live_broker, HalfTag("s1", 3, "A", "0.1", "OWNER-A", log_broker)) is R  # not the winner
    assert check_answer(live_broker, HalfTag("s1", 3, "B", "0.0", "OWNER-B", log_broker)) is R  # a replay

    async def hold_owner(owner, then):
        async with TransactionProducer(sink_io.owner_group(owner), sink_io.SinkCheckListener(namesrv), namesrv):
            return await asyncio.to_thread(then)

    undecided = HalfTag("s2", 0, "LIVE", "0.0", "DRIVER", log_broker)
    # Undecided and the owner connected: a long job's half stays pending, whatever its age.
    assert asyncio.run(hold_owner("DRIVER", lambda: check_answer(live_broker, undecided))) is sink_io.UNKNOWN
    # The owner gone: a rollback record first, then ROLLBACK; a late commit of that attempt loses.
    assert check_answer(live_broker, undecided) is R
    records = run_with_log(live_broker, lambda _p, _a, log: log.read("s2", 0))
    assert records == [Decision("LIVE", False)]
    with pytest.raises(sink_io.SinkError, match="rolled back before it could commit"):
        sink_io.commit_batch(namesrv, "PG_SINK", log_broker, "s2", 0, "LIVE", ["0.0"], [])


def test_a_commit_resumes_halves_discarded_after_their_checks(tmp_path):
    """A job longer than its halves' check-backs last (each answered UNKNOW while the driver lives) loses nothing:
    the halves are discarded by the broker, and the commit resumes and publishes them."""
    from halfmq.store import HalfStatus

    from tests.support.broker_thread import BrokerThread

    from .test_sink_crash import stored, wait_until

    bt = BrokerThread(tmp_path / "store", transactionCheckInterval=200, transactionTimeOut=100,
                      transactionCheckMax=2)
    namesrv = bt.broker.namesrv_addr
    tag = HalfTag("long", 0, "A", "0.0", "OWNER", bt.broker.config.brokerName)
    messages = [(Message("LongT", b"%d" % i, properties={sink_io.IDEMPOTENCY_KEY: tag.row_key(i)}), None, None)
                for i in range(5)]

    def discarded() -> bool:
        states = [s for _o, s in bt.broker.store.iter_halves() if s.topic == "LongT"]
        return len(states) == 1 and states[0].batch == 5 and states[0].status is HalfStatus.DISCARDED

    async def run():
        member, listener = sink_io.sink_producer(namesrv, "PG_LONG")
        async with TransactionProducer(sink_io.owner_group("OWNER"), listener, namesrv), member:
            halves = await asyncio.to_thread(sink_io.send_halves, namesrv, "PG_LONG", tag, messages, 1)
            await asyncio.to_thread(wait_until, discarded, 60, "the halves to use up their checks")
            assert await asyncio.to_thread(sink_io.commit_batch, namesrv, "PG_LONG", tag.log_broker, "long", 0, "A",
                                           ["0.0"], halves)
        await listener.close()

    try:
        asyncio.run(run())
        assert sorted(int(r.body) for _q, r in stored(bt.broker, "LongT")) == list(range(5))
    finally:
        bt.stop()
