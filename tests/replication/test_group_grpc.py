"""The official RocketMQ 5 Python client (gRPC) against a broker group of real processes: QueryRoute names the
group's leader, and every message it was told is sent is on the follower too."""
from __future__ import annotations

import asyncio

import pytest
from rocketmq import ClientConfiguration, Credentials, Message, Producer

from halfmq.broker.grpc.schema import Code, pb

from tests.replication.test_group_faults import bodies_at, in_sync, until
from tests.support.cluster import BrokerGroup
from tests.support.grpc_raw import GrpcRaw, signed_metadata
from tests.support import rocketmq5

pytestmark = [pytest.mark.grpc, pytest.mark.slow]
TOPIC = "GroupGrpc"


async def test_a_rocketmq5_producer_sends_through_the_leader_and_the_follower_holds_every_message(tmp_path):
    group = await BrokerGroup(tmp_path, size=2, broker_flags=("--grpcListenPort=0", "--minInSyncReplicas=2")).start()
    try:
        await until(lambda: in_sync(group, (0, 1)), 30, "the follower in sync")
        leader, follower = group.members
        raw = GrpcRaw(follower.grpc_addr)
        try:
            # A follower's QueryRoute names the group's leader: writes go there.
            async def routed():
                answer = await raw.stub("QueryRoute")(pb.QueryRouteRequest(topic=pb.Resource(name="TBW102")),
                                                      metadata=signed_metadata("group-test@1"), timeout=10)
                ends = {f"{a.host}:{a.port}" for mq in answer.message_queues for a in mq.broker.endpoints.addresses}
                return answer.status.code == Code["OK"] and ends == {leader.grpc_addr}
            await until(routed, 30, "the follower routes to the leader's gRPC endpoint")
        finally:
            await raw.close()

        def produce() -> list:
            config = ClientConfiguration(leader.grpc_addr, Credentials("", ""), request_timeout=5)
            producer = Producer(config, (TOPIC,))
            rocketmq5.started(producer)
            try:
                out = []
                for i in range(100):
                    msg = Message()
                    msg.topic, msg.body = TOPIC, b"g%d" % i
                    out.append(producer.send(msg))
                return out
            finally:
                producer.shutdown()
        receipts = await asyncio.to_thread(produce)
        assert len(receipts) == 100
        assert await bodies_at(follower.broker_addr, TOPIC, queues=8) == sorted(b"g%d" % i for i in range(100))
    finally:
        await group.stop()


async def test_a_rocketmq5_producer_keeps_sending_through_a_failover_with_nothing_acknowledged_lost(tmp_path, etcd):
    import time

    from tests.replication.test_failover import ElectedGroup, elected

    group = await ElectedGroup(tmp_path, etcd, flags=("--grpcListenPort=0",)).start()
    try:
        leader = await elected(group)
        entry = next(m for i, m in enumerate(group.members) if i != leader)  # the client's first endpoint lives
        killed = asyncio.Event()
        acked: dict[bytes, float] = {}
        begun: dict[bytes, float] = {}

        def produce() -> None:
            config = ClientConfiguration(entry.grpc_addr, Credentials("", ""), request_timeout=3)
            producer = Producer(config, (TOPIC,))
            rocketmq5.started(producer)
            try:
                deadline = time.monotonic() + 90
                i = 0
                while time.monotonic() < deadline:
                    msg = Message()
                    msg.topic, msg.body = TOPIC, b"f%d" % i
                    i += 1
                    started = time.monotonic()
                    try:
                        producer.send(msg)
                        acked[msg.body], begun[msg.body] = time.monotonic(), started
                    except Exception:  # noqa: BLE001 - the leader is gone: not acknowledged
                        time.sleep(0.1)
                        continue
                    if killed.is_set() and any(t > killed_at[0] for t in begun.values()):
                        return
                    time.sleep(0.02)
            finally:
                producer.shutdown()

        killed_at = [0.0]
        producing = asyncio.ensure_future(asyncio.to_thread(produce))
        await until(lambda: _at_least(acked, 30), 60, "the first sends")
        killed_at[0] = time.monotonic()
        await group.members[leader].kill_group()
        killed.set()
        await elected(group, exclude=leader)
        await asyncio.wait_for(producing, 120)
        resumed = min(acked[b] for b, t in begun.items() if t > killed_at[0]) - killed_at[0]
        print(f"the RocketMQ 5 producer's first send acknowledged {resumed:.1f} s after the leader was killed")
        held = set(await bodies_at(entry.broker_addr, TOPIC, queues=8))
        assert set(acked) <= held, f"{len(set(acked) - held)} acknowledged messages lost"
    finally:
        await group.stop()


async def _at_least(acked: dict, count: int) -> bool:
    return len(acked) >= count
