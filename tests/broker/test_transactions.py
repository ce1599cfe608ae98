"""Half messages, END_TRANSACTION and the check-back service against a real broker."""
from __future__ import annotations

import asyncio

import pytest

from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode, ResponseCode, SysFlag
from halfmq.broker.services.check_back import with_check_times
from halfmq.protocol.message import decode_offset_msg_id, decode_record, decode_records
from halfmq.protocol.properties import decode_properties

from tests.support.raw import RawClient

GROUP = "PG_TX"


async def send_half(c: RawClient, topic="TX", body=b"tx", props=None, group=GROUP, queue_id=0):
    properties = {P.TRAN_MSG: "true", P.PGROUP: group, **(props or {})}
    r = await c.send(topic, body, group=group, props=properties, sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE,
                     queue_id=queue_id)
    assert r.code == ResponseCode.SUCCESS, r.remark
    _host, offset = decode_offset_msg_id(r.ext_fields["msgId"])
    return r, offset


def end_ext(r, offset, decision, group=GROUP, from_check=False):
    return {"producerGroup": group, "tranStateTableOffset": r.ext_fields["queueOffset"],
            "commitLogOffset": offset, "commitOrRollback": decision, "msgId": r.ext_fields["transactionId"],
            "transactionId": "", "fromTransactionCheck": "true" if from_check else "false"}


def arrival_event(broker, topic) -> asyncio.Event:
    event = asyncio.Event()
    broker.store.add_arrival_listener(lambda t, q, m: event.set() if t == topic else None)
    return event


async def test_half_is_invisible_until_commit(broker):
    c = await RawClient.connect(broker.addr)
    r, offset = await send_half(c, props={"k": "v"})
    assert r.ext_fields["transactionId"] and r.ext_fields["queueId"] == "0"
    assert (await c.pull("TX", 0, 0)).code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.TOPIC_NOT_EXIST)
    assert (await c.request(RequestCode.GET_MAX_OFFSET, {"topic": "TX", "queueId": 0})).ext_fields["offset"] == "0"
    view = await c.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
    assert view.code == ResponseCode.SYSTEM_ERROR  # a half is not shown as a message of any topic
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r, offset, 8))).code == ResponseCode.SUCCESS
    p = await c.pull("TX", 0, 0)
    (msg,) = decode_records(p.body)
    assert msg.body == b"tx" and msg.properties["k"] == "v" and msg.topic == "TX"
    assert msg.sys_flag & SysFlag.TRANSACTION_MASK == SysFlag.TRANSACTION_COMMIT_TYPE
    assert msg.prepared_transaction_offset == offset
    assert msg.properties[P.TRAN_MSG] == "true" and msg.properties[P.PGROUP] == GROUP
    c.close()


async def test_commit_wakes_a_held_pull(broker):
    c = await RawClient.connect(broker.addr)
    consumer = await RawClient.connect(broker.addr)
    await c.send("TX", b"plain")
    r, offset = await send_half(c)
    held = asyncio.ensure_future(consumer.pull("TX", 0, 1, suspend_ms=20_000, timeout=10))
    c.oneway(RequestCode.END_TRANSACTION, end_ext(r, offset, 8))
    resp = await asyncio.wait_for(held, 5)
    assert [m.body for m in decode_records(resp.body)] == [b"tx"]
    c.close()
    consumer.close()


async def test_rollback_publishes_nothing_and_decisions_are_first_wins(broker):
    c = await RawClient.connect(broker.addr)
    r, offset = await send_half(c)
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r, offset, 12))).code == 0
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r, offset, 12))).code == 0  # repeat: no effect
    conflict = await c.request(RequestCode.END_TRANSACTION, end_ext(r, offset, 8))
    assert conflict.code == ResponseCode.ILLEGAL_OPERATION
    assert (await c.request(RequestCode.GET_MAX_OFFSET, {"topic": "TX", "queueId": 0})).ext_fields["offset"] == "0"
    r2, offset2 = await send_half(c)
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r2, offset2, 8))).code == 0
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r2, offset2, 8))).code == 0
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r2, offset2, 12))).code == 604
    assert len(decode_records((await c.pull("TX", 0, 0)).body)) == 1  # committed exactly once
    c.close()


async def test_end_transaction_validation(broker):
    c = await RawClient.connect(broker.addr)
    r, offset = await send_half(c)
    bad_group = await c.request(RequestCode.END_TRANSACTION, end_ext(r, offset, 8, group="other"))
    assert bad_group.code == ResponseCode.SYSTEM_ERROR and "group" in bad_group.remark
    bad_offset = await c.request(RequestCode.END_TRANSACTION, {**end_ext(r, offset, 8), "tranStateTableOffset": 77})
    assert bad_offset.code == ResponseCode.SYSTEM_ERROR and "offset" in bad_offset.remark
    missing = await c.request(RequestCode.END_TRANSACTION, end_ext(r, offset + 1, 8))
    assert missing.code == ResponseCode.SYSTEM_ERROR and "Find prepared" in missing.remark
    bad_value = await c.request(RequestCode.END_TRANSACTION, end_ext(r, offset, 5))
    assert bad_value.code == ResponseCode.SYSTEM_ERROR
    # UNKNOWN leaves the half pending; sent two-way it is answered (the reference would leave the caller hanging).
    c.oneway(RequestCode.END_TRANSACTION, end_ext(r, offset, 0))
    unknown = await c.request(RequestCode.END_TRANSACTION, end_ext(r, offset, 0))
    assert unknown.code == ResponseCode.SUCCESS and "pending" in unknown.remark
    assert broker.store.get_half(offset).status.value == "PREPARED"
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r, offset, 8))).code == 0
    c.close()


async def test_half_with_delay_level_is_refused(broker):
    c = await RawClient.connect(broker.addr)
    r = await c.send("TX", b"x", props={P.TRAN_MSG: "true", P.PGROUP: GROUP, P.DELAY: "3"})
    assert r.code == ResponseCode.MESSAGE_ILLEGAL
    c.close()


async def test_check_goes_to_the_sender_and_its_answer_commits(broker_factory):
    broker = await broker_factory(transactionTimeOut=50, transactionCheckInterval=60_000)
    sender = await RawClient.connect(broker.addr)
    other = await RawClient.connect(broker.addr)
    await other.heartbeat("other", producer_groups=[GROUP])
    await sender.heartbeat("sender", producer_groups=[GROUP])
    r, offset = await send_half(sender, props={"k": "v"})
    check = await asyncio.wait_for(sender.incoming.get(), 5)
    assert check.code == RequestCode.CHECK_TRANSACTION_STATE and check.is_oneway
    assert check.ext_fields["commitLogOffset"] == str(offset)
    assert check.ext_fields["tranStateTableOffset"] == r.ext_fields["queueOffset"]
    msg = decode_record(check.body)
    assert msg.topic == "TX" and msg.properties[P.TRANSACTION_CHECK_TIMES] == "1" and msg.body == b"tx"
    assert other.incoming.empty()
    sender.oneway(RequestCode.END_TRANSACTION, {
        "producerGroup": GROUP, "tranStateTableOffset": check.ext_fields["tranStateTableOffset"],
        "commitLogOffset": check.ext_fields["commitLogOffset"], "commitOrRollback": 8,
        "msgId": check.ext_fields["msgId"], "fromTransactionCheck": "true"})
    committed = arrival_event(broker, "TX")
    await asyncio.wait_for(committed.wait(), 5)
    assert broker.store.get_half(offset).status.value == "COMMITTED"
    sender.close()
    other.close()


async def test_no_producer_then_heartbeat_checks_at_once_without_burning_attempts(broker_factory):
    broker = await broker_factory(transactionTimeOut=20, transactionCheckInterval=3_600_000)
    c = await RawClient.connect(broker.addr)
    r, offset = await send_half(c)
    c.close()
    await c.closed.wait()
    # Wait for the pass that finds no producer.
    while broker.ctx.check_back.checks_undeliverable == 0:
        await asyncio.wait_for(wait_for_pass(broker), 5)
    assert broker.store.get_half(offset).checks == 0
    back = await RawClient.connect(broker.addr)
    await back.heartbeat("back", producer_groups=[GROUP])
    check = await asyncio.wait_for(back.incoming.get(), 5)  # the interval is an hour: only the heartbeat did it
    assert check.ext_fields["commitLogOffset"] == str(offset)
    back.close()


@pytest.mark.parametrize("goodbye", [False, True])
async def test_a_check_its_producer_closed_on_unanswered_goes_to_the_groups_next_producer_at_once(broker_factory,
                                                                                                goodbye):
    """CI: a producer that crashed right after its half (tests/client: the database committed, END_TRANSACTION never
    sent) still had an open channel when the half came due; the check went there, and the group's next producer
    waited the whole check interval (60 s) for it. Again (CI, with ``goodbye``): a producer closing unregisters
    first, and a channel heard from after its check was taken to have read it, closed or not."""
    broker = await broker_factory(transactionTimeOut=20, transactionCheckInterval=3_600_000)
    crashed = await RawClient.connect(broker.addr)
    await crashed.heartbeat("crashed", producer_groups=[GROUP])
    _r, offset = await send_half(crashed)
    check = await asyncio.wait_for(crashed.incoming.get(), 5)  # written to it; it dies without reading
    assert check.ext_fields["commitLogOffset"] == str(offset)
    if goodbye:
        await crashed.request(RequestCode.UNREGISTER_CLIENT, {"clientID": "crashed", "producerGroup": GROUP})
    crashed.close()
    await crashed.closed.wait()
    back = await RawClient.connect(broker.addr)
    try:
        await back.heartbeat("back", producer_groups=[GROUP])
        check = await asyncio.wait_for(back.incoming.get(), 5)  # the interval is an hour: the registration did it
        assert check.ext_fields["commitLogOffset"] == str(offset)
    finally:
        back.close()


def wait_for_pass(broker) -> asyncio.Future:
    """A future resolved after the check-back service's next pass (instrumentation around the real service)."""
    service = broker.ctx.check_back
    fut = asyncio.get_running_loop().create_future()
    original = service.run_pass

    async def run_pass():
        try:
            return await original()
        finally:
            service.run_pass = original
            if not fut.done():
                fut.set_result(None)

    service.run_pass = run_pass
    return fut


async def test_discard_after_check_max_then_resume(broker_factory):
    broker = await broker_factory(transactionTimeOut=10, transactionCheckInterval=10, transactionCheckMax=2)
    c = await RawClient.connect(broker.addr)
    await c.heartbeat("p", producer_groups=[GROUP])
    r, offset = await send_half(c, body=b"lost")
    discarded = arrival_event(broker, "TRANS_CHECK_MAX_TIME_TOPIC")
    checks = []
    for _ in range(2):  # a producer that reads its checks answers each (UNKNOW here), as stock clients do
        checks.append(await asyncio.wait_for(c.incoming.get(), 5))
        c.oneway(RequestCode.END_TRANSACTION, end_ext(r, offset, 0, from_check=True))
    assert [decode_record(ch.body).properties[P.TRANSACTION_CHECK_TIMES] for ch in checks] == ["1", "2"]
    await asyncio.wait_for(discarded.wait(), 5)
    assert broker.store.get_half(offset).status.value == "DISCARDED"
    (kept,) = decode_records((await c.pull("TRANS_CHECK_MAX_TIME_TOPIC", 0, 0)).body)
    assert kept.body == b"lost"
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r, offset, 8))).code == 604
    resumed = await c.request(RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": r.ext_fields["msgId"]})
    assert resumed.code == ResponseCode.SUCCESS, resumed.remark
    check = await asyncio.wait_for(c.incoming.get(), 5)
    assert decode_record(check.body).properties[P.TRANSACTION_CHECK_TIMES] == "1"
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r, offset, 8, from_check=True))).code == 0
    c.close()


async def test_immunity_time_delays_the_first_check(broker_factory):
    broker = await broker_factory(transactionTimeOut=10, transactionCheckInterval=60_000)
    c = await RawClient.connect(broker.addr)
    await c.heartbeat("p", producer_groups=[GROUP])
    _r1, immune = await send_half(c, props={P.CHECK_IMMUNITY_TIME_IN_SECONDS: "3600"})
    _r2, plain = await send_half(c)
    check = await asyncio.wait_for(c.incoming.get(), 5)
    assert check.ext_fields["commitLogOffset"] == str(plain)
    state = broker.store.get_half(immune)
    assert state.checks == 0 and state.due >= state.store_ts + 3_600_000
    c.close()


async def test_pending_halves_survive_restart_and_decided_ones_are_never_checked(broker_factory, tmp_path):
    store = tmp_path / "s"
    # The first check is due a second after the halves: their producer has closed by then, so the check finds no
    # live producer (with 10 ms, a busy machine could run the pass first and deliver it to the closing sender).
    broker = await broker_factory(store_dir=store, transactionTimeOut=1000, transactionCheckInterval=3_600_000)
    c = await RawClient.connect(broker.addr)
    passed = wait_for_pass(broker)
    _r1, pending = await send_half(c, body=b"pending")
    r2, decided = await send_half(c, body=b"decided")
    assert (await c.request(RequestCode.END_TRANSACTION, end_ext(r2, decided, 8))).code == 0
    c.close()
    await c.closed.wait()
    await asyncio.wait_for(passed, 5)
    while broker.ctx.check_back.checks_undeliverable == 0:
        await asyncio.wait_for(wait_for_pass(broker), 5)
    await broker.stop()
    broker = await broker_factory(store_dir=store, transactionTimeOut=10, transactionCheckInterval=3_600_000)
    assert broker.store.pending_halves_count() == 1
    c = await RawClient.connect(broker.addr)
    await c.heartbeat("p", producer_groups=[GROUP])
    check = await asyncio.wait_for(c.incoming.get(), 5)
    assert check.ext_fields["commitLogOffset"] == str(pending)
    assert decode_record(check.body).body == b"pending"
    assert broker.store.get_half(decided).status.value == "COMMITTED"
    c.close()


def test_check_times_property_is_set_whatever_the_property_string_holds():
    assert with_check_times("", 1) == "TRANSACTION_CHECK_TIMES\x011\x02"
    assert decode_properties(with_check_times("KEYS\x01k\x02TAGS\x01t", 2)) == {
        "KEYS": "k", "TAGS": "t", P.TRANSACTION_CHECK_TIMES: "2"}
    replaced = with_check_times("TRANSACTION_CHECK_TIMES\x013\x02KEYS\x01k\x02", 4)
    assert decode_properties(replaced) == {P.TRANSACTION_CHECK_TIMES: "4", "KEYS": "k"}
    assert replaced.count(P.TRANSACTION_CHECK_TIMES) == 1


async def test_a_registered_producers_next_heartbeat_wakes_the_halves_waiting_for_it(broker_factory):
    """Issue 23: a half postponed while the group's only producer was not reading (its last checks unanswered)
    waited for a *new* registration of the group; the same producer heartbeating again never woke it."""
    broker = await broker_factory(transactionTimeOut=20, transactionCheckInterval=3_600_000,
                                  transactionCheckMaxUnreadBytes=1024)
    producer = await RawClient.connect(broker.addr)
    try:
        await producer.heartbeat("slow", producer_groups=[GROUP])
        _r, first = await send_half(producer, body=b"x" * 2048)  # its check alone is over the unread bound
        check = await asyncio.wait_for(producer.incoming.get(), 5)
        assert check.ext_fields["commitLogOffset"] == str(first)
        other = await RawClient.connect(broker.addr)  # another sender, gone before its half's check
        _r, second = await send_half(other)
        other.close()
        await other.closed.wait()
        while second not in broker.ctx.check_back.waiting_for_producer.get(GROUP, ()):
            await asyncio.wait_for(wait_for_pass(broker), 5)  # postponed: the producer has not shown it reads
        await producer.heartbeat("slow", producer_groups=[GROUP])  # it speaks again, on the same connection
        check = await asyncio.wait_for(producer.incoming.get(), 5)  # the interval is an hour: the heartbeat did it
        assert check.ext_fields["commitLogOffset"] == str(second)
    finally:
        producer.close()


async def test_a_half_no_producer_ever_answers_is_discarded_at_the_retention_age(broker_factory):
    """Issue 23: a half whose group had no producer was postponed without spending a check, so it was never
    discarded and retention never deleted it: such halves pinned the store until every send answered 14. Now one
    older than fileReservedTime is discarded (and stays resumable), as RocketMQ drops halves with their files."""
    broker = await broker_factory(transactionTimeOut=20, transactionCheckInterval=100, fileReservedTime=0.0003,
                                  cleanResourceInterval=3_600_000)
    c = await RawClient.connect(broker.addr)
    _r, offset = await send_half(c)
    c.close()
    await c.closed.wait()
    for _ in range(100):  # 1.08 s of age, checked every 100 ms
        if broker.store.get_half(offset).status.value != "PREPARED":
            break
        await asyncio.wait_for(wait_for_pass(broker), 5)
    state = broker.store.get_half(offset)
    assert state.status.value == "DISCARDED" and state.checks == 0
    back = await RawClient.connect(broker.addr)
    try:
        await back.heartbeat("back", producer_groups=[GROUP])
        view = await back.request(RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": _r.ext_fields["msgId"]})
        assert view.code == ResponseCode.SUCCESS
        check = await asyncio.wait_for(back.incoming.get(), 5)  # resumed: checked again
        assert check.ext_fields["commitLogOffset"] == str(offset)
    finally:
        back.close()


def test_check_immunity_is_capped_at_the_retention_age():
    from halfmq.broker.services.transaction import first_check_delay_ms
    assert first_check_delay_ms({P.CHECK_IMMUNITY_TIME_IN_SECONDS: "60"}, 6_000, 3_600_000) == 60_000
    assert first_check_delay_ms({P.CHECK_IMMUNITY_TIME_IN_SECONDS: str(10 ** 12)}, 6_000, 3_600_000) == 3_600_000


async def test_a_half_sent_is_a_sign_of_life_of_its_group(broker_factory):
    """Issue 23: a producer that reconnects after a broker restart sends before its next heartbeat (30 s later for
    stock clients); the halves of its group that waited for a producer are checked with it at once."""
    broker = await broker_factory(transactionTimeOut=20, transactionCheckInterval=3_600_000)
    gone = await RawClient.connect(broker.addr)
    _r, waiting = await send_half(gone)
    gone.close()
    await gone.closed.wait()
    while waiting not in broker.ctx.check_back.waiting_for_producer.get(GROUP, ()):
        await asyncio.wait_for(wait_for_pass(broker), 5)
    back = await RawClient.connect(broker.addr)  # no heartbeat yet: only a half of the group
    try:
        await send_half(back, body=b"after the reconnection")
        checked = set()
        while str(waiting) not in checked:  # its own half's check comes too
            checked.add((await asyncio.wait_for(back.incoming.get(), 5)).ext_fields["commitLogOffset"])
    finally:
        back.close()
