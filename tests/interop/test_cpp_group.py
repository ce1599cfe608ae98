"""The real RocketMQ C++ client against a broker group (a leader and a follower, minInSyncReplicas=2, real
processes): what it is told SEND_OK is on both members, and with the follower down its sends are refused, never
SEND_OK on one copy (nor FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE, which 4.x producers count as sent)."""
from __future__ import annotations

import pytest

from halfmq.client.admin import Admin

from tests.replication.test_group_faults import bodies_at, in_sync, until
from tests.support.cluster import BrokerGroup

pytestmark = [pytest.mark.interop, pytest.mark.slow]
TOPIC = "GroupInterop"


async def test_cpp_sends_are_on_every_in_sync_member_and_refused_without_enough_copies(tmp_path, run_peer):
    group = await BrokerGroup(tmp_path, size=2, broker_flags=("--minInSyncReplicas=2",
                                                              "--haMaxLagMillis=500")).start()
    try:
        await until(lambda: in_sync(group, (0, 1)), 30, "the follower in sync")
        leader, follower = group.members
        async with Admin(group.namesrv_addr, broker=leader.broker_addr) as admin:
            await admin.update_topic(TOPIC, 4, 4)
        namesrv = group.namesrv_addr
        sent = await run_peer("produce", {"namesrv": namesrv, "group": "PG_GROUP_CPP", "topic": TOPIC,
                                          "count": 2000}, timeout=240)
        results = [line for line in sent if "i" in line]
        assert len(results) == 2000 and all(r["status"] == 0 for r in results)
        expected = sorted(f"body-{i}".encode() for i in range(2000))
        assert await bodies_at(follower.broker_addr, TOPIC) == expected
        assert await bodies_at(leader.broker_addr, TOPIC) == expected

        await follower.kill_group()
        await until(lambda: in_sync(group, (0,)), 30, "the follower left the in-sync set")
        refused = await run_peer("produce", {"namesrv": namesrv, "group": "PG_GROUP_CPP", "topic": TOPIC,
                                             "count": 3, "prefix": "r", "tolerate": True}, timeout=240)
        outcomes = [line for line in refused if "i" in line]
        assert len(outcomes) == 3 and all("error" in o for o in outcomes), outcomes

        await group.start_member(1)
        await until(lambda: in_sync(group, (0, 1)), 60, "the follower is back in sync")
        again = await run_peer("produce", {"namesrv": namesrv, "group": "PG_GROUP_CPP", "topic": TOPIC,
                                           "count": 3, "prefix": "a"}, timeout=240)
        assert [line["status"] for line in again if "i" in line] == [0, 0, 0]
    finally:
        await group.stop()


async def test_a_cpp_producer_keeps_sending_through_a_failover_with_nothing_acknowledged_lost(tmp_path, run_peer,
                                                                                           etcd):
    import asyncio

    from tests.replication.test_failover import ElectedGroup, elected

    group = await ElectedGroup(tmp_path, etcd).start()
    try:
        leader = await elected(group)
        async with Admin(group.namesrv_addr, broker=group.members[leader].broker_addr) as admin:
            await admin.update_topic(TOPIC, 4, 4)
        producing = asyncio.ensure_future(run_peer(
            "produce", {"namesrv": group.namesrv_addr, "group": "PG_FAILOVER_CPP", "topic": TOPIC, "count": 500,
                        "interval": 0.1, "tolerate": True}, timeout=240))
        await until(lambda: _stored_at_least(group, leader, 50), 60, "the C++ producer's first sends")
        await group.members[leader].kill_group()
        new_leader = await elected(group, exclude=leader)
        outcomes = [line for line in await producing if "i" in line]
    finally:
        survivors = [m for i, m in enumerate(group.members) if m.proc.returncode is None]
        held = set(await bodies_at(survivors[0].broker_addr, TOPIC)) if survivors else set()
        await group.stop()
    acked = {f"body-{o['i']}".encode() for o in outcomes if o.get("status") == 0}
    after = [o for o in outcomes if o.get("status") == 0 and o["i"] > 100]
    assert after, "the C++ producer sent nothing through the new leader"
    assert acked <= held, f"{len(acked - held)} acknowledged messages lost"
    assert all(o.get("status") in (0, None) for o in outcomes), "a status other than SEND_OK"


async def _stored_at_least(group, index: int, count: int) -> bool:
    return len(await bodies_at(group.members[index].broker_addr, TOPIC)) >= count
