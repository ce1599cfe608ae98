"""Faults under load (issue 25 item 7): a broker and a name server killed while producers send. Nothing
acknowledged is lost, sends succeed again at once on the other brokers, and the broker rejoins when restarted."""
from __future__ import annotations

import asyncio
import collections

import pytest

from halfmq.client import ClientError, Message, Producer, PullConsumer

from tests.support.cluster import LocalCluster, until

TOPIC = "FaultLoad"
SENDERS = 8


@pytest.fixture
async def cluster(tmp_path):
    cluster = await LocalCluster(tmp_path, namesrvs=2, brokers=3, broker_flags=(
        "--registerNameServerPeriod=500",)).start()
    yield cluster
    await cluster.stop()


async def test_killing_a_broker_and_a_name_server_under_load_loses_nothing_acknowledged(cluster):
    acked: dict[str, tuple[str, float]] = {}  # body → (broker name, when acknowledged)
    failed: list[tuple[float, str]] = []
    killed_at = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    async with Producer("PG_FAULTS", cluster.namesrv_addr, send_timeout=2.0) as producer:
        async def sender(index: int) -> None:
            n = 0
            while not stop.is_set():
                body = f"{index}-{n}"
                n += 1
                started = loop.time()
                try:
                    result = await producer.send(Message(TOPIC, body.encode()))
                except Exception as exc:  # noqa: BLE001 - recorded, judged below
                    failed.append((started, repr(exc)))
                    continue
                acked[body] = (result.queue.broker_name, loop.time())

        senders = [asyncio.ensure_future(sender(i)) for i in range(SENDERS)]
        try:
            await until(lambda: _acked_on_every_broker(acked), 20, "sends reach every broker")
            await asyncio.gather(cluster.brokers[1].kill_group(), cluster.namesrvs[0].kill())
            killed_at.set_result(loop.time())
            before = len(acked)
            # Load goes on: within the route refresh the client stops choosing the dead broker.
            await until(lambda: _count_after(acked, killed_at.result(), 500), 30, "500 sends acknowledged after "
                                                                                  "the kills")
            assert len(acked) > before
        finally:
            stop.set()
            await asyncio.gather(*senders)

    kill_time = killed_at.result()
    late = [f for f in failed if f[0] > kill_time + 1.0]
    assert not late, f"{len(late)} sends started more than 1 s after the kills failed: {late[:3]}"
    assert not [b for b, (name, t) in acked.items() if name == "broker-1" and t > kill_time], \
        "acknowledged by a killed broker"

    cluster.brokers[1] = cluster.broker_process(1)
    await cluster.brokers[1].start()  # same store: it rejoins with what it acknowledged
    stored = await _read_all(cluster.namesrvs[1].addr)
    missing = [b for b in acked if b not in stored]
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
    by_broker = collections.Counter(name for name, _t in acked.values())
    assert set(by_broker) == {"broker-0", "broker-1", "broker-2"}, by_broker


async def _acked_on_every_broker(acked) -> bool:
    return {name for name, _t in list(acked.values())} == {"broker-0", "broker-1", "broker-2"}


async def _count_after(acked, when: float, count: int) -> bool:
    return sum(1 for _name, t in list(acked.values()) if t > when) >= count


async def _read_all(namesrv: str) -> set[str]:
    """Every body of TOPIC stored on the brokers the route lists, read from offset 0."""
    bodies: set[str] = set()
    async with PullConsumer("CG_FAULTS_AUDIT", namesrv) as consumer:
        async def queues():
            found = await consumer.fetch_subscribe_queues(TOPIC)
            return len({q.broker_name for q in found}) == 3 and found
        for queue in await until(queues, 20, "the restarted broker is routed again"):
            offset = 0
            while True:
                result = await consumer.pull(queue, offset, 32)
                if not result.messages:
                    break
                bodies.update(m.body.decode() for m in result.messages)
                offset = result.next_begin_offset
    return bodies


async def test_after_one_failed_send_a_producer_avoids_the_dead_broker(cluster, caplog):
    async with Producer("PG_AVOID", cluster.namesrv_addr) as producer:
        for i in range(12):  # the route is cached with every broker in it
            await producer.send(Message("AvoidDead", b"%d" % i))
        await cluster.brokers[1].kill_group()
        caplog.set_level("DEBUG", logger="halfmq.client.producer")
        landed = collections.Counter()
        for i in range(24):  # the cached route still lists broker-1: twice round all its queues
            landed[(await producer.send(Message("AvoidDead", b"after %d" % i))).queue.broker_name] += 1
        # Oneway sends avoid it too (before: they went round every queue, and each third one failed to connect).
        for i in range(24):
            await producer.send_oneway(Message("AvoidDead", b"oneway %d" % i))
    failed_attempts = [r for r in caplog.records if "send attempt" in r.getMessage()]
    assert "broker-1" not in landed
    assert len(failed_attempts) == 1, [r.getMessage() for r in failed_attempts]


async def test_a_oneway_send_that_cannot_reach_its_broker_makes_the_next_ones_avoid_it(cluster):
    async with Producer("PG_AVOID_ONEWAY", cluster.namesrv_addr) as producer:
        for i in range(12):  # the route is cached with every broker in it
            await producer.send(Message("AvoidDeadOneway", b"%d" % i))
        await cluster.brokers[1].kill_group()
        failures = 0
        for i in range(24):  # twice round all the queues of the cached route
            try:
                await producer.send_oneway(Message("AvoidDeadOneway", b"oneway %d" % i))
            except ClientError:
                failures += 1
    assert failures == 1
