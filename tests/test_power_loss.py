"""Power loss under load: after the power comes back the store opens, every write the broker acknowledged is there,
and no rolled-back message is ever visible.

A live broker (a subprocess in its own process group, as users start it) keeps its store on powerfs
(tests/support/powerfs.py), a FUSE layer on which only fsynced data is durable. Producers send plain messages and
run transactions concurrently (single halves, and batch halves whose messages must be all visible or none); after
a seeded number of acknowledged operations the power is cut (``drop``: every unsynced write is lost; ``partial``:
unsynced pages reach the disk in file-offset order up to a seeded point), the broker's whole process group is
killed, the disk is remounted and a new broker is started on the same store.
Each case's disk takes a seeded 2-20 ms per fsync (an SSD to a network disk).
Every queue of both topics is then read from offset 0.

What "acknowledged" means here, honestly:

- a plain send is acknowledged when the producer got SEND_OK (flushDiskType=SYNC_FLUSH, the default: the broker
  says the message is durable). It must be stored at the queue and offset the SendResult named.
- a commit is acknowledged when the broker answered END_TRANSACTION(commit) with SUCCESS. The reference client
  sends END_TRANSACTION oneway, which tells the producer nothing, so this test's producer sends its decisions and
  its answers to check-backs two-way (the broker answers a two-way END_TRANSACTION once the decision is durable).
  A commit still unanswered at the cut may or may not survive; either is correct.
- rolled back: every message whose local transaction says rollback, at once or when checked back. Nobody ever
  commits those, so none may ever be visible, whether or not its rollback reached the broker before the cut.

Answers that arrive after the cut count as acknowledged too: the broker can only have sent them for writes it had
made durable before the power went out. Nothing may be visible twice, nor anything that was never sent.

Seeds: ``POWER_LOSS_SEEDS=3,17`` and ``POWER_LOSS_MODELS=partial`` rerun chosen cases (not HALFMQ_*: the broker
reads those as configuration); every failure message
names its seed and model.
"""
from __future__ import annotations

import asyncio
import collections
import os
import random
from dataclasses import dataclass, field

import pytest

from halfmq.client import (LocalTransactionState, Message, Producer, PullConsumer, SendStatus,
                           TransactionProducer)
from halfmq.client.consumer import PullStatus
from halfmq.client.errors import ClientError, TopicNotExistError
from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.message import decode_offset_msg_id, decode_record

from tests.support.broker_process import BrokerDidNotStart, BrokerProcess
from tests.support.powermount import PowerDisk

pytestmark = pytest.mark.slow  # FUSE disks whose power is cut under broker processes

S = LocalTransactionState
PLAIN, TX = "PowerPlain", "PowerTx"
BROKER_FLAGS = ("--mapSize=268435456", "--transactionTimeOut=100", "--transactionCheckInterval=100",
                "--transactionCheckMax=1000")
#: what the local transaction answers, and what a check-back answers, by the message's kind (its keys)
LOCAL = {"commit": S.COMMIT_MESSAGE, "rollback": S.ROLLBACK_MESSAGE, "check-commit": S.UNKNOW,
         "check-rollback": S.UNKNOW}
CHECK = {"commit": S.COMMIT_MESSAGE, "rollback": S.ROLLBACK_MESSAGE, "check-commit": S.COMMIT_MESSAGE,
         "check-rollback": S.ROLLBACK_MESSAGE}
PLAIN_SENDERS, TX_SENDERS, BATCH_SENDERS = 12, 6, 2
FSYNC_MS = (2, 5, 10, 20)  #: the disk's fsync latency, one drawn per case
LOAD_TIMEOUT_S = 90  #: the load must reach its cut point by then (a slow store is a failure too)


def _env_list(name: str, default: list) -> list:
    text = os.environ.get(name, "").strip()
    return [type(default[0])(x) for x in text.split(",")] if text else default


SEEDS = _env_list("POWER_LOSS_SEEDS", list(range(1, 11)))
MODELS = _env_list("POWER_LOSS_MODELS", ["drop", "partial"])


@dataclass
class Ledger:
    """What the producers sent and what the broker acknowledged."""
    cut_after: int  #: acknowledged operations (sends, stored halves, commits) before the power is cut
    acks: int = 0
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    sent: set[bytes] = field(default_factory=set)
    acked_sends: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # body → (queue id, queue offset)
    acked_commits: set[bytes] = field(default_factory=set)
    rolled_back: set[bytes] = field(default_factory=set)
    batches: dict[str, list[bytes]] = field(default_factory=dict)  # a batch half's transaction id → its bodies
    checks: int = 0
    cut: bool = False
    errors_before_cut: list[str] = field(default_factory=list)

    def ack(self) -> None:
        self.acks += 1
        if self.acks >= self.cut_after:
            self.reached.set()

    def failed(self, what: str, exc: Exception) -> None:
        if not self.cut:
            self.errors_before_cut.append(f"{what}: {exc!r}")


class KindListener:
    """The local transaction and the check-back answer by the message's kind (see LOCAL and CHECK)."""

    def execute_local_transaction(self, msg, arg):
        return LOCAL[msg.keys]

    def check_local_transaction(self, msg):
        return CHECK[msg.keys or msg.properties["kind"]]  # a batch half's kind is its own property


class TwoWayTransactionProducer(TransactionProducer):
    """A TransactionProducer whose END_TRANSACTIONs wait for the broker's answer, so the test knows which
    decisions the broker acknowledged (the reference sends them oneway)."""

    def __init__(self, group, namesrv, ledger: Ledger):
        super().__init__(group, KindListener(), namesrv, retry_times=0)
        self.ledger = ledger

    async def end_two_way(self, result, state: S) -> bool:
        """END_TRANSACTION for the half ``result``; True when the broker acknowledged it."""
        route = await self.instance.routes.get(result.queue.topic, self.auto_create)
        conn = await self.instance.pool.get(route.addr_of(result.queue.broker_name))
        _host, commit_log_offset = decode_offset_msg_id(result.offset_msg_id)
        return await self._end(conn, state, {
            "producerGroup": self.group, "tranStateTableOffset": str(result.queue_offset),
            "commitLogOffset": str(commit_log_offset), "msgId": result.msg_id,
            "transactionId": result.transaction_id or result.msg_id, "fromTransactionCheck": "false"})

    async def _end(self, conn, state: S, ext: dict) -> bool:
        resp = await conn.request(RequestCode.END_TRANSACTION, {**ext, "commitOrRollback": str(state.value)},
                                  timeout=self.send_timeout)
        if resp.code != ResponseCode.SUCCESS:
            self.ledger.failed("END_TRANSACTION", RuntimeError(f"answered {resp.code}: {resp.remark}"))
        return resp.code == ResponseCode.SUCCESS

    async def _answer_check(self, conn, cmd) -> None:
        """Replaces the client's oneway answer to CHECK_TRANSACTION_STATE with a two-way one."""
        msg = decode_record(cmd.body)
        state = self.listener.check_local_transaction(msg)
        self.ledger.checks += 1
        ext = cmd.ext_fields
        try:
            ok = await self._end(conn, state, {
                "producerGroup": self.group, "tranStateTableOffset": ext.get("tranStateTableOffset", "0"),
                "commitLogOffset": ext.get("commitLogOffset", "0"), "msgId": ext.get("msgId") or msg.uniq_key,
                "transactionId": ext.get("transactionId", ""), "fromTransactionCheck": "true"})
        except ClientError as exc:
            self.ledger.failed("answering a check-back", exc)
            return
        if ok and state is S.COMMIT_MESSAGE:  # a batch half is checked without its messages: the ledger has them
            self.ledger.acked_commits.update(self.ledger.batches.get(ext.get("transactionId"), [msg.body]))


def _body(prefix: str, rng: random.Random) -> bytes:
    # Sizes from 100 B to 3 KiB: commits touch a varying number of pages, some records span two.
    return prefix.encode() + b"." * rng.randint(100, 3000)


async def plain_sender(producer: Producer, ledger: Ledger, worker: int, rng: random.Random) -> None:
    for n in range(1_000_000):
        body = _body(f"plain-{worker}-{n}:", rng)
        ledger.sent.add(body)
        try:
            result = await producer.send(Message(PLAIN, body))
        except ClientError as exc:  # after the cut: the broker is gone
            ledger.failed("send", exc)
            return
        if result.status is SendStatus.SEND_OK:
            ledger.acked_sends[body] = (result.queue.queue_id, result.queue_offset)
            ledger.ack()


async def tx_sender(producer: TwoWayTransactionProducer, ledger: Ledger, worker: int, rng: random.Random) -> None:
    kinds = list(LOCAL)
    for n in range(1_000_000):
        kind = kinds[(worker + n) % len(kinds)]
        body = _body(f"tx-{kind}-{worker}-{n}:", rng)
        ledger.sent.add(body)
        if CHECK[kind] is S.ROLLBACK_MESSAGE:
            ledger.rolled_back.add(body)  # before it leaves: no one will ever commit it
        msg = Message(TX, body, keys=kind)
        try:
            result = await producer.send_half(msg)
            if result.status is not SendStatus.SEND_OK:
                continue
            ledger.ack()
            state = producer.listener.execute_local_transaction(msg, None)
            ok = await producer.end_two_way(result, state)
        except ClientError as exc:
            ledger.failed("transaction", exc)
            return
        if ok and state is S.COMMIT_MESSAGE:
            ledger.acked_commits.add(body)
            ledger.ack()


async def batch_sender(producer: TwoWayTransactionProducer, ledger: Ledger, worker: int, rng: random.Random
                       ) -> None:
    """Transactions of 2-12 messages each (batch halves): whole or not at all after the cut."""
    kinds = list(LOCAL)
    for n in range(1_000_000):
        kind = kinds[(worker + n) % len(kinds)]
        bodies = [_body(f"batch-{kind}-{worker}-{n}-{i}:", rng) for i in range(rng.randint(2, 12))]
        ledger.sent.update(bodies)
        if CHECK[kind] is S.ROLLBACK_MESSAGE:
            ledger.rolled_back.update(bodies)
        try:
            result = await producer.send_half_batch([Message(TX, body) for body in bodies], properties={"kind": kind})
            if result.status is not SendStatus.SEND_OK:
                continue
            ledger.batches[result.transaction_id] = bodies
            ledger.ack()
            state = LOCAL[kind]
            ok = await producer.end_two_way(result, state)
        except ClientError as exc:
            ledger.failed("batch transaction", exc)
            return
        if ok and state is S.COMMIT_MESSAGE:
            ledger.acked_commits.update(bodies)
            ledger.ack()


async def load_and_cut(broker: BrokerProcess, disk: PowerDisk, ledger: Ledger, rng: random.Random,
                       model: str, tag: str) -> str:
    """Run the load until ``ledger.cut_after`` acknowledged operations, cut the power, kill the broker's group."""
    plain = Producer("PG_POWER", broker.namesrv, retry_times=0)
    tx = TwoWayTransactionProducer("TG_POWER", broker.namesrv, ledger)
    tasks: list[asyncio.Task] = []
    reached = asyncio.create_task(ledger.reached.wait())
    try:
        await plain.start()
        await tx.start()
        tasks += [asyncio.create_task(plain_sender(plain, ledger, w, random.Random(rng.random())))
                  for w in range(PLAIN_SENDERS)]
        tasks += [asyncio.create_task(tx_sender(tx, ledger, w, random.Random(rng.random())))
                  for w in range(TX_SENDERS)]
        tasks += [asyncio.create_task(batch_sender(tx, ledger, w, random.Random(rng.random())))
                  for w in range(BATCH_SENDERS)]
        await asyncio.wait([reached, *tasks], timeout=LOAD_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        if not ledger.reached.is_set():
            pytest.fail(f"{tag}: the load stopped after {ledger.acks} of {ledger.cut_after} acknowledged "
                        f"operations: {ledger.errors_before_cut[:5]}\n{broker.output()}")
        summary = disk.cut(model, rng.randrange(1 << 32))
        ledger.cut = True
        await broker.kill_group()
        await asyncio.gather(*tasks)  # each ends on its first failed request: the broker is gone
    finally:
        reached.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(reached, *tasks, return_exceptions=True)
        await broker.kill_group()
        for producer in (tx, plain):
            try:
                await producer.close()
            except ClientError:
                pass  # unregistering from a broker that is gone
    return summary


async def read_back(broker: BrokerProcess) -> list[tuple[str, int, int, bytes]]:
    """Every message of both topics, every queue from offset 0: (topic, queue id, queue offset, body)."""
    found = []
    async with PullConsumer("CG_POWER_AUDIT", broker.namesrv) as consumer:
        for topic in (PLAIN, TX):
            try:
                queues = await consumer.fetch_subscribe_queues(topic)
            except TopicNotExistError:
                continue  # a topic whose creation was lost: its acknowledged messages count as lost below
            for queue in queues:
                offset = 0
                while True:
                    result = await consumer.pull(queue, offset, max_nums=32)
                    if result.status is not PullStatus.FOUND:
                        break
                    found += [(topic, queue.queue_id, m.queue_offset, m.body) for m in result.messages]
                    offset = result.next_begin_offset
    return found


def problems(ledger: Ledger, found: list[tuple[str, int, int, bytes]], durable_acks: bool = True) -> list[str]:
    """What is wrong with ``found``; ``durable_acks=False`` (ASYNC_FLUSH) allows acknowledged writes of the last
    flush interval to be missing, never anything else."""
    at = {(topic, q, o): body for topic, q, o, body in found if topic == PLAIN}
    bodies = collections.Counter(body for *_k, body in found)
    tx_bodies = {body for topic, *_k, body in found if topic == TX}
    out = []
    lost_sends = [b for b, (q, o) in ledger.acked_sends.items() if at.get((PLAIN, q, o)) != b]
    if not durable_acks:  # a send kept is still where SEND_OK put it
        lost_sends = [b for b in lost_sends if b in bodies]
        ledger.acked_commits &= tx_bodies
    if lost_sends:
        out.append(f"{len(lost_sends)} of {len(ledger.acked_sends)} acknowledged sends are not where SEND_OK "
                   f"put them, e.g. {lost_sends[0][:24]!r}")
    lost_commits = ledger.acked_commits - tx_bodies
    if lost_commits:
        out.append(f"{len(lost_commits)} of {len(ledger.acked_commits)} acknowledged commits are missing")
    visible = ledger.rolled_back & set(bodies)
    if visible:
        out.append(f"{len(visible)} rolled-back messages are visible, e.g. {min(visible)[:32]!r}")
    twice = [b for b, count in bodies.items() if count > 1]
    if twice:
        out.append(f"{len(twice)} messages are visible more than once, e.g. {twice[0][:32]!r}")
    torn = [batch for batch in ledger.batches.values() if 0 < len(tx_bodies.intersection(batch)) < len(batch)]
    if torn:
        out.append(f"{len(torn)} batch halves are partly visible, e.g. {len(tx_bodies.intersection(torn[0]))} of "
                   f"{len(torn[0])}")
    strangers = set(bodies) - ledger.sent
    if strangers:
        out.append(f"{len(strangers)} messages were never sent (garbage read back)")
    return out


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("seed", SEEDS)
async def test_power_cut_under_load_keeps_every_acknowledged_write(seed, model):
    await power_cut_case(seed, model, "SYNC_FLUSH")


@pytest.mark.parametrize("seed", SEEDS[:4])
async def test_power_cut_with_async_flush_never_corrupts_the_store(seed):
    """ASYNC_FLUSH acknowledges at commit: the last flush interval may be lost, the store never."""
    await power_cut_case(seed, "partial", "ASYNC_FLUSH")


async def power_cut_case(seed: int, model: str, flush: str) -> None:
    rng = random.Random(f"{model}:{seed}")
    ledger = Ledger(cut_after=rng.randint(50, 1500))
    # An fsync takes what a local SSD to a network disk takes: while one runs, the broker commits more groups,
    # so the power often goes out with several commits written but not yet synced.
    fsync_ms = rng.choice(FSYNC_MS)
    flags = (*BROKER_FLAGS, f"--flushDiskType={flush}")
    tag = (f"{flush} seed={seed} model={model} (rerun: POWER_LOSS_SEEDS={seed} POWER_LOSS_MODELS={model}), "
           f"fsync {fsync_ms} ms, cut after {ledger.cut_after} acknowledged operations")
    print(tag)  # shown with the failure
    with PowerDisk(fsync_delay_ms=fsync_ms) as disk:
        broker = BrokerProcess(disk.power_on(), *flags)
        try:
            await broker.start()
            summary = await load_and_cut(broker, disk, ledger, rng, model, tag)
        finally:
            await broker.kill_group()
        disk.power_off()
        tag += (f"; {summary}; {len(ledger.acked_sends)} sends and {len(ledger.acked_commits)} commits "
                f"acknowledged, {len(ledger.batches)} batch halves stored, {ledger.checks} check-backs")
        print(tag)
        assert not ledger.errors_before_cut, f"{tag}: requests failed before the cut: {ledger.errors_before_cut[:5]}"
        broker = BrokerProcess(disk.power_on(), *flags)
        try:
            try:
                await broker.start()
            except BrokerDidNotStart as exc:
                pytest.fail(f"{tag}: the store does not open after the power cut: {exc}")
            try:
                found = await read_back(broker)
            except ClientError as exc:
                pytest.fail(f"{tag}: reading the store back failed: {exc!r}\n{broker.output()}")
        finally:
            await broker.stop()
        disk.power_off()
    found_problems = problems(ledger, found, durable_acks=flush == "SYNC_FLUSH")
    assert not found_problems, f"{tag}: " + "; ".join(found_problems)
