"""Found by the chaos test (test_failover_chaos.py), failover on etcd; each is fixed (the member's ``Between`` gate,
a role's stop leaving the next role's gate alone, decisions and pulls asking for the route again) and these tests
keep it so. What each was:

0. A leader that lost its lease must acknowledge nothing until it follows the next leader. It acknowledges
every send, alone: ``GroupMember.step_down`` stops the ``ReplicationLeader`` (whose ``stop`` sets the store's gate
to None and lifts its write refusal) and the member stays without a role (status "candidate") until the election
loop can read etcd again and names a leader to follow. Meanwhile the store has no gate and no refusal, so the
broker takes writes as a broker alone, at the old epoch, and answers them once durable on its own disk. When the
next leader (which never had them) takes over, the former leader's store is resynced and those acknowledged
messages are gone. The chaos test lost 656 to 1997 acknowledged sends this way after an etcd member was paused or
killed (the leader's renewal timed out, it stepped down, and etcd answered again ~0.7 s later).

A leader paused past its lease:

1. The paused leader, once continued, must rejoin its group's in-sync set. It does not: it steps down (``Failover._lost`` starts
``GroupMember.step_down`` as a task) while the election loop makes it follow the new leader (``GroupMember.follow``
finds ``member.leader`` already None and starts a ``ReplicationFollower`` at once, which makes itself the store's
gate); the step-down then reaches ``ReplicationLeader.stop``, whose ``store.set_gate(None)`` removes the follower's
gate. The follower applies the records it receives but never acknowledges them (``ReplicationFollower.durable`` is
no longer called), so the leader never counts it in sync again, and readers of that member see records before the
leader committed them.

2. A TransactionProducer's decisions must reach the new leader. They do not while the deposed leader's connection
stays open: ``TransactionProducer._broker_connection`` keeps one connection per broker name and looks the route up
again only once it closed, so every END_TRANSACTION (oneway) goes to the deposed leader, now a follower, which
refuses it ("is a follower: writes go to the group's leader") unseen; each half then waits for its check-back
(``transactionTimeOut``, 6 s by default, then every ``transactionCheckInterval``).

3. A pull that gets no answer from a paused (or cut-off) leader must ask for the route again, as a failed send
does. ``PullConsumer._request`` does so only on ``ConnectionClosedError``; on ``RequestTimeoutError`` it keeps the
cached route, so every pull goes to the paused member until the route's TTL (30 s) runs out. (The chaos test's
consumer asks again itself.)
"""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from halfmq.client import LocalTransactionState, Message, Producer, TransactionProducer

from tests.replication.test_failover import ElectedGroup, elected
from tests.replication.test_group_faults import status, until

pytestmark = pytest.mark.slow
TOPIC = "Rejoin"


async def test_a_leader_paused_past_its_lease_under_load_rejoins_the_in_sync_set(tmp_path, etcd):
    group = await ElectedGroup(tmp_path, etcd).start()
    stop = asyncio.Event()
    acked = []
    try:
        leader = await elected(group)
        async with Producer("PG_REJOIN", group.namesrv_addr, send_timeout=2.0, retry_times=0) as producer:
            async def sender(index: int) -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    try:
                        await producer.send(Message(TOPIC, f"{index}-{n}".encode()))
                        acked.append(n)
                    except Exception:  # noqa: BLE001 - refused or unanswered during the failover
                        await asyncio.sleep(0.05)
            senders = [asyncio.ensure_future(sender(i)) for i in range(64)]
            try:
                await until(lambda: _at_least(acked, 300), 60, "sends before the pause")
                old = group.members[leader]
                os.killpg(old.pgid, signal.SIGSTOP)
                try:
                    new_leader = await elected(group, exclude=leader)
                finally:
                    os.killpg(old.pgid, signal.SIGCONT)
                count = len(acked)
                await until(lambda: _at_least(acked, count + 300), 60, "sends to the new leader")

                async def all_in_sync():
                    state = await status(group.members[new_leader])
                    return state["role"] == "leader" and len(state["inSync"]) == 3
                await until(all_in_sync, 60, f"the former leader (member {leader}) back in the in-sync set: "
                                             f"{await status(group.members[new_leader])}")
            finally:
                stop.set()
                await asyncio.gather(*senders)
    finally:
        await group.stop()


async def test_a_leader_that_lost_its_lease_acknowledges_nothing_while_etcd_has_no_quorum(tmp_path, etcd):
    from tests.support.raw import RawClient

    group = await ElectedGroup(tmp_path, etcd).start()
    try:
        leader = await elected(group)
        old = group.members[leader]
        async with Producer("PG_NO_QUORUM", group.namesrv_addr, send_timeout=3.0) as producer:
            await producer.send(Message(TOPIC, b"before"))
        etcd.pause(0)
        etcd.pause(1)  # no quorum: the leader's renewals fail, nobody can be elected
        try:
            async def stepped_down():
                return (await status(old))["role"] != "leader"
            await until(stepped_down, 30, "the leader steps down once its lease cannot be renewed")
            client = await RawClient.connect(old.broker_addr)
            try:
                answers = [await client.send(TOPIC, b"no quorum %d" % i, timeout=10) for i in range(3)]
            finally:
                client.close()
            state = await status(old)
        finally:
            etcd.resume(0)
            etcd.resume(1)
        assert all(a.code != 0 for a in answers), (f"acknowledged by a member that does not lead ({state}), on its "
                                                   f"own copy alone: {[a.code for a in answers]}")
    finally:
        await group.stop()


class Commits:
    async def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    async def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


async def test_decisions_reach_the_new_leader_when_the_deposed_one_is_back(tmp_path, etcd):
    from tests.replication.test_group_faults import bodies_at

    # No check-back within the test: a committed message is there only if its decision reached a leader.
    group = await ElectedGroup(tmp_path, etcd, flags=("--transactionTimeOut=600000",)).start()
    try:
        leader = await elected(group)
        async with TransactionProducer("TXG_REJOIN", Commits(), group.namesrv_addr, send_timeout=3.0) as producer:
            await producer.send_message_in_transaction(Message(TOPIC, b"before"))
            old = group.members[leader]
            os.killpg(old.pgid, signal.SIGSTOP)
            try:
                new_leader = await elected(group, exclude=leader)
            finally:
                os.killpg(old.pgid, signal.SIGCONT)
            await until(lambda: _follows(old), 30, "the deposed leader follows")

            async def sent():
                await producer.send_message_in_transaction(Message(TOPIC, b"after"))
                return True
            await until(sent, 30, "a transaction through the new leader")
            addr = group.members[new_leader].broker_addr

            async def committed():
                return b"after" in await bodies_at(addr, TOPIC)
            await until(committed, 20, "the decision of a transaction sent after the failover applied (no "
                                       "check-back within the test)")
    finally:
        await group.stop()


async def test_a_pull_that_times_out_on_a_paused_leader_asks_for_the_route_again(tmp_path, etcd):
    from halfmq.client import PullConsumer

    group = await ElectedGroup(tmp_path, etcd).start()
    try:
        leader = await elected(group)
        old = group.members[leader]
        async with Producer("PG_PULL_PAUSE", group.namesrv_addr, send_timeout=3.0) as producer:
            for i in range(8):
                await producer.send(Message(TOPIC, b"before %d" % i))
        async with PullConsumer("CG_PULL_PAUSE", group.namesrv_addr, request_timeout=1.0) as consumer, \
                PullConsumer("CG_PULL_ROUTE", group.namesrv_addr) as fresh:
            queues = await consumer.fetch_subscribe_queues(TOPIC)  # its route names the leader
            os.killpg(old.pgid, signal.SIGSTOP)
            try:
                await elected(group, exclude=leader)

                async def rerouted():
                    route = await fresh.instance.routes.fetch(TOPIC)
                    return route.read_addr_of("g") != old.broker_addr
                await until(rerouted, 30, "the name servers route to the new leader")

                async def pulled():
                    for queue in queues:
                        try:
                            if (await consumer.pull(queue, 0, max_nums=32, timeout=1.0)).messages:
                                return True
                        except Exception:  # noqa: BLE001 - the paused member does not answer
                            continue
                    return False
                await until(pulled, 10, "a pull answered within 10 s of the new route (the cached one lives 30 s)")
            finally:
                os.killpg(old.pgid, signal.SIGCONT)
    finally:
        await group.stop()


async def _follows(member) -> bool:
    return (await status(member))["role"] == "follower"


async def _at_least(items: list, count: int) -> bool:
    return len(items) >= count
