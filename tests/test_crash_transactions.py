"""Transactions under repeated SIGKILL, SIGTERM and SIGSTOP of the broker (issue 23, item 8).

Two transactional producers send halves (their local transaction answers COMMIT, ROLLBACK or UNKNOW, and a
check-back answers each half's decision by its key) while the broker is killed, stopped or paused again and again
at random. After the last fault the producers keep sending for a moment, as live producers do, then stop. The
bound: every half whose producer answers is resolved within RESOLVE_BOUND_S of that (transactionTimeOut and
transactionCheckInterval are 1 s); every acknowledged half meant to commit is committed once, none meant to roll
back is, and nothing is committed twice.

Seeded: CRASH_SEEDS (default "1 2 3"); a failure names its seed.
"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
from collections import Counter

import pytest

from halfmq.client import LocalTransactionState, Message, PullConsumer, TransactionProducer

from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.slow  # broker processes killed, stopped and restarted over and over

SEEDS = [int(s) for s in os.environ.get("CRASH_SEEDS", "1 2 3").split()]
FAULTS = 4
RESOLVE_BOUND_S = 20.0
TOPIC = "CrashTx"
S = LocalTransactionState


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Decisions:
    """Each half's key decides its fate: even keys commit, odd ones roll back. The local transaction answers UNKNOW
    for a third of them, so their check-back decides."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    @staticmethod
    def commits(key: int) -> bool:
        return key % 2 == 0

    def execute_local_transaction(self, msg, arg) -> LocalTransactionState:
        if self.rng.random() < 1 / 3:
            return S.UNKNOW
        return S.COMMIT_MESSAGE if self.commits(int(msg.keys)) else S.ROLLBACK_MESSAGE

    def check_local_transaction(self, msg) -> LocalTransactionState:
        return S.COMMIT_MESSAGE if self.commits(int(msg.properties["KEYS"])) else S.ROLLBACK_MESSAGE


class Broker:
    """The broker process on fixed ports, so the producers find it again at the same address after a restart."""

    def __init__(self, store_dir):
        self.ports = (_free_port(), _free_port())
        self.flags = (f"--listenPort={self.ports[0]}", f"--namesrvListenPort={self.ports[1]}",
                      "--transactionTimeOut=1000", "--transactionCheckInterval=1000", "--brokerIP1=127.0.0.1")
        self.store_dir = store_dir
        self.process: BrokerProcess | None = None

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.ports[1]}"

    async def start(self) -> None:
        self.process = await BrokerProcess(self.store_dir, *self.flags).start()

    async def fault(self, rng: random.Random) -> str:
        kind = rng.choice(["kill", "term", "stop"])
        if kind == "kill":
            await self.process.kill_group()
            await self.start()
        elif kind == "term":
            await self.process.stop()
            await self.start()
        else:
            os.killpg(self.process.pgid, signal.SIGSTOP)
            await asyncio.sleep(rng.uniform(0.5, 2.0))  # how long it stays paused: the fault itself
            os.killpg(self.process.pgid, signal.SIGCONT)
        return kind


async def _committed(namesrv: str) -> Counter:
    """Keys of the messages committed into TOPIC, counted."""
    found: Counter = Counter()
    async with PullConsumer("CrashCheck", namesrv) as consumer:
        for queue in await consumer.fetch_subscribe_queues(TOPIC):
            offset = 0
            while (result := await consumer.pull(queue, offset, max_nums=1000)).messages:
                found.update(int(m.keys) for m in result.messages)
                offset = result.next_begin_offset
    return found


async def _run(seed: int, store_dir) -> None:
    rng = random.Random(seed)
    broker = Broker(store_dir)
    await broker.start()
    keys = iter(range(10 ** 9))
    sent: set[int] = set()      # every key a send was tried for (it may have been stored without an answer)
    acked: set[int] = set()     # the keys whose half the broker acknowledged
    stop_sending = asyncio.Event()
    producers = [TransactionProducer(f"PG_CRASH_{i}", Decisions(random.Random(seed * 10 + i)), broker.namesrv,
                                     retry_times=0) for i in range(2)]
    faults = []

    async def send_loop(producer) -> None:
        while not stop_sending.is_set():
            key = next(keys)
            sent.add(key)
            try:
                await producer.send_message_in_transaction(Message(TOPIC, f"tx-{key}".encode(), keys=str(key)))
                acked.add(key)
            except Exception:  # the broker is down or paused: the next send tries again
                await asyncio.sleep(0.05)

    try:
        for producer in producers:
            await producer.start()
        senders = [asyncio.ensure_future(send_loop(p)) for p in producers]
        for _ in range(FAULTS):
            await asyncio.sleep(rng.uniform(1.0, 2.5))  # load between faults
            faults.append(await broker.fault(rng))
        await asyncio.sleep(2.0)  # live producers go on after the last restart
        stop_sending.set()
        await asyncio.gather(*senders)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESOLVE_BOUND_S
        want = {k for k in acked if Decisions.commits(k)}
        while True:
            committed = await _committed(broker.namesrv)
            if want <= set(committed) or loop.time() > deadline:
                break
            await asyncio.sleep(0.5)  # polling the topic: each pull is a fresh look at what committed
        missing = sorted(want - set(committed))
        assert not missing, (f"seed {seed}, faults {faults}: {len(missing)} of {len(want)} acknowledged halves meant "
                             f"to commit were not committed within {RESOLVE_BOUND_S} s: {missing[:10]}")
        wrong = sorted(k for k in committed if not Decisions.commits(k) or k not in sent)
        assert not wrong, f"seed {seed}, faults {faults}: halves meant to roll back were committed: {wrong[:10]}"
        twice = sorted(k for k, n in committed.items() if n > 1)
        assert not twice, f"seed {seed}, faults {faults}: committed more than once: {twice[:10]}"
        assert len(acked) > 20, f"seed {seed}: only {len(acked)} halves were acknowledged"
    finally:
        for producer in producers:
            try:
                await asyncio.wait_for(producer.close(), 10)
            except Exception:
                pass
        if broker.process is not None:
            if broker.process.proc.returncode is None:
                os.killpg(broker.process.pgid, signal.SIGCONT)  # a failure while it was paused
            await broker.process.stop()


@pytest.mark.parametrize("seed", SEEDS)
async def test_every_answered_half_is_resolved_after_repeated_crashes(tmp_path, seed):
    await _run(seed, tmp_path / "store")
