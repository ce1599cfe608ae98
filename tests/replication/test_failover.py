"""Automatic failover (broker/replication/failover.py): a broker group of real processes elects its leader on a real
3-member etcd; a killed or paused leader is replaced, sends go on with nothing acknowledged lost, and a leader that
was paused past its lease acknowledges nothing once it is back."""
from __future__ import annotations

import asyncio
import signal
import statistics
import time

import pytest

from halfmq.client import Message, Producer

from tests.replication.test_group_faults import _same_everywhere, bodies_at, status, until
from tests.support.cluster import BrokerGroup

pytestmark = pytest.mark.slow
TOPIC = "Failover"
KILLS = 10  #: leader kills under load: the acceptance reports the failover time over ten


class ElectedGroup(BrokerGroup):
    """Members started without a role: the election on etcd gives them one."""

    def __init__(self, root, etcd, size: int = 3, flags: tuple[str, ...] = ()):
        super().__init__(root, size=size, broker_flags=(f"--haEtcdEndpoints={','.join(etcd.endpoints)}",
                                                        "--haLeaseSeconds=2", "--minInSyncReplicas=2",
                                                        "--haMaxLagMillis=1000", *flags))

    def member_process(self, index: int, *extra: str):
        process = super().member_process(index, *extra)
        # Roles come from the election: member i is only named (its election id), not told to lead.
        process.args = [a for a in process.args if not a.startswith("--brokerId=")] + [f"--brokerId={index + 1}"]
        return process


async def leader_of(group) -> int:
    """The index of the member that leads, by asking each."""
    for index, member in enumerate(group.members):
        if member is None or member.proc is None or member.proc.returncode is not None:
            continue
        try:
            if (await status(member))["role"] == "leader":
                return index
        except Exception:  # noqa: BLE001 - a member being killed: not the leader
            continue
    return -1


async def elected(group, exclude: int = -1) -> int:
    async def check():
        index = await leader_of(group)
        if index < 0 or index == exclude:
            return False
        return len((await status(group.members[index]))["inSync"]) >= 2 and index + 1
    return await until(check, 30, "a leader with a follower in sync") - 1


async def test_a_killed_leader_is_replaced_in_seconds_and_nothing_acknowledged_is_lost(tmp_path, etcd):
    group = await ElectedGroup(tmp_path, etcd).start()
    acked: dict[bytes, float] = {}  # body -> when it was acknowledged
    first_sent: dict[bytes, float] = {}  # body -> when its send began
    stop = asyncio.Event()
    gaps = []
    try:
        leader = await elected(group)
        async with Producer("PG_FAILOVER", group.namesrv_addr, send_timeout=2.0) as producer:
            async def sender(index: int) -> None:
                n = 0
                while not stop.is_set():
                    body = f"{index}-{n}".encode()
                    n += 1
                    started = time.monotonic()
                    try:
                        await producer.send(Message(TOPIC, body))
                    except Exception:  # noqa: BLE001 - refused or unanswered during the failover
                        await asyncio.sleep(0.05)
                        continue
                    acked[body] = time.monotonic()
                    first_sent[body] = started
            senders = [asyncio.ensure_future(sender(i)) for i in range(64)]
            try:
                for round_no in range(KILLS):
                    count = len(acked)
                    await until(_more(acked, count + 300), 60, f"sends before kill {round_no}")
                    killed_at = time.monotonic()
                    await group.members[leader].kill_group()
                    new_leader = await elected(group, exclude=leader)
                    print(f"kill {round_no}: member {new_leader} leads after {time.monotonic() - killed_at:.2f} s")
                    # The first send begun after the kill and acknowledged (by the new leader).
                    await until(_acked_after(first_sent, killed_at), 30, f"a send acknowledged after kill {round_no}")
                    gaps.append(min(acked[b] for b, t in first_sent.items() if t > killed_at) - killed_at)
                    await group.start_member(leader)  # it comes back as a follower
                    leader = new_leader
                await until(_more(acked, len(acked) + 300), 60, "sends after the last kill")
            finally:
                stop.set()
                await asyncio.gather(*senders)
        print(f"first acknowledgement after a leader kill: p50 {statistics.median(gaps):.2f} s, "
              f"max {max(gaps):.2f} s ({len(gaps)} kills)")
        assert max(gaps) < 5.0, gaps
        await until(lambda: _same_everywhere(group), 60, "every member holds the same records")
        for index, member in enumerate(group.members):
            held = await bodies_at(member.broker_addr, TOPIC)
            missing = set(acked) - set(held)
            assert not missing, f"{len(missing)} acknowledged messages missing at member {index}"
    finally:
        await group.stop()


async def test_a_leader_paused_past_its_lease_acknowledges_nothing_after_and_rejoins_as_a_follower(tmp_path, etcd):
    group = await ElectedGroup(tmp_path, etcd).start()
    try:
        leader = await elected(group)
        old = group.members[leader]
        async with Producer("PG_PAUSE", group.namesrv_addr, send_timeout=2.0) as producer:
            await producer.send(Message(TOPIC, b"before"))
        old.proc.send_signal(signal.SIGSTOP)
        new_leader = await elected(group, exclude=leader)
        async with Producer("PG_PAUSE2", group.namesrv_addr, send_timeout=3.0) as producer:
            await until(_sent(producer, b"new leader"), 30, "a send to the new leader")
        # A client that still sends to the old leader once it runs again: never acknowledged.
        from tests.support.raw import RawClient
        client = await RawClient.connect(old.broker_addr)
        old.proc.send_signal(signal.SIGCONT)
        answer = await client.send(TOPIC, b"to the old leader", timeout=10)
        client.close()
        assert answer.code != 0, answer.remark
        await until(lambda: _follows(old), 30, "the old leader follows")
        held = await bodies_at(group.members[new_leader].broker_addr, TOPIC)
        assert b"to the old leader" not in held and {b"before", b"new leader"} <= set(held)
    finally:
        await group.stop()


def _more(acked, count: int):
    async def check():
        return len(acked) >= count
    return check


def _acked_after(acked: dict, when: float):
    async def check():
        return any(t > when for t in acked.values())
    return check


def _sent(producer, body: bytes):
    async def check():
        await producer.send(Message(TOPIC, body))
        return True
    return check


async def _follows(member) -> bool:
    return (await status(member))["role"] == "follower"


async def test_halves_whose_leader_died_are_checked_back_by_the_new_leader_as_the_producer_says(tmp_path, etcd):
    from halfmq.client import LocalTransactionState as S, TransactionProducer

    group = await ElectedGroup(tmp_path, etcd, flags=("--transactionTimeOut=500",
                                                      "--transactionCheckInterval=500")).start()
    try:
        leader = await elected(group)

        class Listener:
            async def execute_local_transaction(self, msg, arg):
                return S.UNKNOW  # the producer "crashed" before deciding: only a check-back decides

            async def check_local_transaction(self, msg):
                return S.COMMIT_MESSAGE if msg.keys.startswith("c") else S.ROLLBACK_MESSAGE

        async with TransactionProducer("TXG_FAILOVER", Listener(), group.namesrv_addr) as producer:
            for i in range(5):
                for kind in "cr":
                    await producer.send_half(Message("TxFailover", f"{kind}{i}".encode(), keys=f"{kind}{i}"))
            await group.members[leader].kill_group()
            new_leader = await elected(group, exclude=leader)
            # A send finds the new leader (and heartbeats it): its check-backs reach this producer.
            await until(_sent_in_transaction(producer), 30, "a transaction through the new leader")
            expected = {f"c{i}".encode() for i in range(5)} | {b"c-after"}

            async def resolved():
                return set(await bodies_at(group.members[new_leader].broker_addr, "TxFailover", queues=8)) == expected
            await until(resolved, 60, "every half resolved by the new leader's check-backs")
        held = await bodies_at(group.members[new_leader].broker_addr, "TxFailover", queues=8)
        assert sorted(b for b in held if b != b"c-after") == sorted(expected - {b"c-after"})  # each once, no r*
    finally:
        await group.stop()


def _sent_in_transaction(producer):
    async def check():
        result = await producer.send_half(Message("TxFailover", b"c-after", keys="c-after"))
        return result is not None
    return check
