"""The real RocketMQ C++ client against a cluster (issue 25): 2 name servers, 3 brokers, all real processes."""
from __future__ import annotations

import asyncio
import collections
import json

import pytest

from halfmq.client import PullConsumer
from halfmq.client.admin import Admin
from halfmq.protocol.codes import RequestCode, ResponseCode

from tests.support.cluster import LocalCluster, until
from tests.support.raw import RawClient

pytestmark = pytest.mark.interop
TOPIC = "ClusterInterop"


@pytest.fixture
async def cluster(tmp_path):
    cluster = await LocalCluster(tmp_path, namesrvs=2, brokers=3, broker_flags=(
        "--registerNameServerPeriod=1000", "--transactionTimeOut=1000", "--transactionCheckInterval=1000")).start()
    try:
        for broker in cluster.brokers:  # 4 queues on each broker, as updateTopic -c does
            async with Admin(cluster.namesrvs[0].addr, broker=broker.broker_addr) as admin:
                await admin.update_topic(TOPIC, 4, 4)

        async def routed():
            async with Admin(cluster.namesrvs[1].addr) as admin:
                return len((await admin.topic_route(TOPIC))["queueDatas"]) == 3
        await until(routed, 10, "the topic is routed to every broker")
        yield cluster
    finally:
        await cluster.stop()


class Brokers:
    """One raw connection per broker, for what the test checks on each."""

    def __init__(self, cluster: LocalCluster):
        self.addrs = [b.broker_addr for b in cluster.brokers]
        self.clients: list[RawClient] = []

    async def __aenter__(self) -> "Brokers":
        self.clients = [await RawClient.connect(addr) for addr in self.addrs]
        return self

    async def __aexit__(self, *exc) -> None:
        for client in self.clients:
            client.transport.close()

    async def consumers(self, group: str) -> list[int]:
        counts = []
        for client in self.clients:
            answer = await client.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
            counts.append(len(json.loads(answer.body or b"{}").get("consumerIdList", []))
                          if answer.code == ResponseCode.SUCCESS else 0)
        return counts

    async def ends(self) -> list[dict[int, int]]:
        """Per broker: queue id → max offset of TOPIC."""
        out = []
        for client in self.clients:
            ends = {}
            for queue_id in range(4):
                answer = await client.request(RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": queue_id})
                ends[queue_id] = int(answer.ext_fields["offset"])
            out.append(ends)
        return out

    async def caught_up(self, group: str) -> bool:
        for client, ends in zip(self.clients, await self.ends()):
            for queue_id, end in ends.items():
                answer = await client.request(RequestCode.QUERY_CONSUMER_OFFSET,
                                              {"consumerGroup": group, "topic": TOPIC, "queueId": queue_id})
                committed = int(answer.ext_fields.get("offset", -1)) if answer.code == ResponseCode.SUCCESS else -1
                if committed < end:
                    return False
        return True


async def test_cpp_client_sends_10000_messages_and_a_group_of_two_reads_each_once(cluster, run_peer):
    namesrv = cluster.namesrv_addr
    group = "CG_CLUSTER_CPP"
    async with Brokers(cluster) as brokers:
        done = asyncio.Event()
        consumers = [asyncio.ensure_future(run_peer(
            "consume", {"namesrv": namesrv, "group": group, "topic": TOPIC, "until_eof": True, "expect": 0,
                        "timeout": 0}, timeout=240, until=done.wait)) for _ in range(2)]
        try:
            # Both members known to every broker before anything is sent: the queues are split once, while empty.
            await until(lambda: _all_equal(brokers.consumers(group), 2), 60, "both consumers join on every broker")
            sent = await run_peer("produce", {"namesrv": namesrv, "group": "PG_CLUSTER_CPP", "topic": TOPIC,
                                              "count": 10_000}, timeout=240)
            results = [line for line in sent if "i" in line]
            assert len(results) == 10_000 and all(r["status"] == 0 for r in results)
            per_broker = [sum(ends.values()) for ends in await brokers.ends()]
            assert sum(per_broker) == 10_000 and all(n > 0 for n in per_broker), per_broker
            await until(lambda: brokers.caught_up(group), 120, "the group committed every queue to its end")
        finally:
            done.set()
        outputs = [await c for c in consumers]
    received = [m for out in outputs for line in out for m in line.get("received", [])]
    counts = collections.Counter(m["id"] for m in received)
    assert len(received) == 10_000 and set(counts) == {r["msg_id"] for r in results}, \
        f"{len(received)} received, {sum(1 for c in counts.values() if c > 1)} twice"
    assert all(len(line.get("received", [])) > 0 for out in outputs for line in out), "one member read nothing"


async def _all_equal(counts_coro, want: int) -> bool:
    return all(n == want for n in await counts_coro)


PLAN = [{"local": "unknown", "check": "commit" if i % 2 == 0 else "rollback"} for i in range(12)]


async def test_cpp_transactions_are_checked_back_by_the_broker_holding_each_half(cluster, run_peer):
    namesrv = cluster.namesrv_addr

    async def decided() -> bool:
        committed = await _committed(namesrv)
        return sum(len(v) for v in committed.values()) == 6

    (tx,) = await run_peer("tx", {"namesrv": namesrv, "group": "PG_CLUSTER_TX", "topic": TOPIC, "plan": PLAN,
                                  "timeout": 60}, timeout=120,
                           until=lambda: until(decided, 60, "every half decided by its check-back"))
    assert [s["status"] for s in tx["sent"]] == [0] * len(PLAN)
    assert sorted({c["i"] for c in tx["checks"]}) == list(range(12))  # every half was checked back
    committed = await _committed(namesrv)
    assert sorted(i for idx in committed.values() for i in idx) == [i for i in range(12) if i % 2 == 0]
    assert len(committed) == 3, f"halves committed by check-back on {sorted(committed)} only"


async def _committed(namesrv: str) -> dict[str, list[int]]:
    """Broker name → idx of the messages of TOPIC readable there (committed halves)."""
    out: dict[str, list[int]] = {}
    async with PullConsumer("CG_CLUSTER_TX_READ", namesrv) as consumer:
        for queue in await consumer.fetch_subscribe_queues(TOPIC):
            result = await consumer.pull(queue, 0, 32)
            for msg in result.messages:
                out.setdefault(queue.broker_name, []).append(int(msg.properties["idx"]))
    return out
