"""`halfmq admin` over a cluster (issue 25): several name servers (-n A;B), changes on every master broker of a
cluster (-c) or on one (-b), per-broker tables over every broker; run as an operator runs it (subprocesses of the
entry point) against real name servers and brokers on loopback."""
from __future__ import annotations

import asyncio
import json
import socket
import sys
import zlib

import pytest

from halfmq.client import LocalTransactionState, Message, Producer, PullConsumer, TransactionProducer
from halfmq.client.admin import Admin
from halfmq.client.errors import TopicNotExistError
from halfmq.protocol.codes import RequestCode, ResponseCode

from tests.support.cluster import LocalCluster, NamesrvProcess, until
from tests.support.raw import RawClient

BROKERS = ["broker-0", "broker-1", "broker-2"]


@pytest.fixture
async def cluster(tmp_path):
    # Half messages stay pending, unchecked, for the tables that list them.
    cluster = await LocalCluster(tmp_path, namesrvs=2, brokers=3, broker_flags=("--transactionTimeOut=3600000",)
                                 ).start()
    yield cluster
    await cluster.stop()


async def admin(namesrv: str, *args: str, as_json: bool = True) -> tuple[int, object, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "halfmq.broker.cli", "admin", "-n", namesrv, *(["--json"] if as_json else []), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    parsed = json.loads(out) if as_json and proc.returncode == 0 else out.decode()
    return proc.returncode, parsed, err.decode()


async def ok(namesrv: str, *args: str, as_json: bool = True):
    code, out, err = await admin(namesrv, *args, as_json=as_json)
    assert code == 0, err
    return out


async def queues(namesrv: str, topic: str) -> dict[str, int]:
    """Broker name → write queues of ``topic`` in one name server's route."""
    async with Admin(namesrv) as client:
        return {q["brokerName"]: q["writeQueueNums"] for q in (await client.topic_route(topic))["queueDatas"]}


async def routed_everywhere(cluster: LocalCluster, topic: str, expected: dict[str, int]) -> None:
    async def check():
        return all([await queues(n.addr, topic) == expected for n in cluster.namesrvs])
    await until(check, 10, f"every name server routes {topic} as {expected}")


async def register_ghost(namesrv: str, name: str, addr: str, cluster: str, topics: tuple[str, ...] = ()
                         ) -> RawClient:
    """A broker entry that no broker process keeps up to date: registered once, over a connection held open (its
    closing would drop the entry)."""
    body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {
        t: {"topicName": t, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6} for t in topics}}}).encode()
    ext = {"brokerName": name, "brokerAddr": addr, "clusterName": cluster, "haServerAddr": "", "brokerId": 0,
           "compressed": "false", "bodyCrc32": zlib.crc32(body) & 0x7FFFFFFF}
    client = await RawClient.connect(namesrv)
    answer = await client.request(RequestCode.REGISTER_BROKER, ext, body)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return client


def unused_addr() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_name_servers_are_asked_in_turn_and_list_every_broker(cluster):
    await cluster.namesrvs[0].kill()  # the first of -n is down: the second answers
    rows, route = await asyncio.gather(ok(cluster.namesrv_addr, "clusterList"),
                                       ok(cluster.namesrv_addr, "topicRoute", "-t", "TBW102"))
    assert sorted((r["cluster"], r["brokerName"], r["brokerId"], r["addr"]) for r in rows) == \
        [("TestCluster", f"broker-{i}", "0", b.broker_addr) for i, b in enumerate(cluster.brokers)]
    assert sorted(q["brokerName"] for q in route["queueDatas"]) == BROKERS
    assert sorted(b["brokerName"] for b in route["brokerDatas"]) == BROKERS

    await cluster.namesrvs[1].kill()
    code, out, err = await admin(cluster.namesrv_addr, "clusterList")
    assert code == 1 and out == "" and len(err.splitlines()) == 1, err
    assert "cannot reach any name server (-n/--namesrv)" in err
    assert all(n.addr in err for n in cluster.namesrvs) and "connection refused" in err


async def test_update_topic_on_every_master_of_the_cluster_or_on_one_broker(cluster):
    ns = cluster.namesrv_addr
    await ok(ns, "updateTopic", "-t", "Orders", "-r", "2", "-w", "2", "-c", "TestCluster")
    # Each broker registers again at once when its topics change: no registration period to wait for.
    await routed_everywhere(cluster, "Orders", {"broker-0": 2, "broker-1": 2, "broker-2": 2})

    await asyncio.gather(ok(ns, "updateTopic", "-t", "Orders", "-r", "4", "-w", "4", "-b", "broker-1"),
                         ok(ns, "updateTopic", "-t", "Solo", "-b", cluster.brokers[2].broker_addr),
                         ok(ns, "updateTopic", "-t", "Everywhere", "-r", "3", "-w", "3"))  # the one cluster's
    await routed_everywhere(cluster, "Orders", {"broker-0": 2, "broker-1": 4, "broker-2": 2})
    await routed_everywhere(cluster, "Solo", {"broker-2": 8})
    await routed_everywhere(cluster, "Everywhere", dict.fromkeys(BROKERS, 3))


async def test_delete_topic_on_every_broker_and_in_every_name_server(cluster):
    ns = cluster.namesrv_addr
    await asyncio.gather(*(ok(ns, "updateTopic", "-t", t, "-r", "1", "-w", "1", "-c", "TestCluster")
                           for t in ("Gone", "AlsoGone")))
    for topic in ("Gone", "AlsoGone"):
        await routed_everywhere(cluster, topic, dict.fromkeys(BROKERS, 1))
    # An entry whose last registration still lists the topic (its broker, broker-0's address, has not registered
    # since): only the name servers' own deletion takes the topic out of the routes.
    ghosts = [await register_ghost(n.addr, "broker-ghost", cluster.brokers[0].broker_addr, "TestCluster", ("Gone",))
              for n in cluster.namesrvs]
    try:
        assert set(await queues(cluster.namesrvs[1].addr, "Gone")) == {*BROKERS, "broker-ghost"}
        await ok(ns, "deleteTopic", "-t", "Gone")
        await ok(ns, "deleteTopic", "-t", "AlsoGone", "-c", "TestCluster")
        for topic in ("Gone", "AlsoGone"):
            for n in cluster.namesrvs:  # at once: no broker's next registration is waited for
                with pytest.raises(TopicNotExistError):
                    await queues(n.addr, topic)
            for broker in cluster.brokers:  # a broker's own port answers for it alone
                with pytest.raises(TopicNotExistError):
                    await queues(broker.broker_addr, topic)
    finally:
        for ghost in ghosts:
            ghost.close()
    code, _out, err = await admin(ns, "deleteTopic", "-t", "Gone")
    assert code == 1 and len(err.splitlines()) == 1 and "TOPIC_NOT_EXIST" in err, err


class Undecided:
    async def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    async def check_local_transaction(self, msg):
        return LocalTransactionState.UNKNOW


async def test_per_broker_tables_cover_every_broker_or_the_one_named(cluster):
    ns = cluster.namesrv_addr
    await ok(ns, "updateTopic", "-t", "Work", "-r", "2", "-w", "2", "-c", "TestCluster")
    await routed_everywhere(cluster, "Work", dict.fromkeys(BROKERS, 2))
    async with Producer("PG_WORK", ns) as producer, PullConsumer("CG_WORK", ns) as consumer:
        sent = [await producer.send(Message("Work", b"%d" % i)) for i in range(12)]
        for result in sent:
            await consumer.update_offset(result.queue, 0)
    async with TransactionProducer("TX_WORK", Undecided(), ns) as tx:
        halves = [(await tx.send_message_in_transaction(Message("Work", b"pending"))).send_result for _ in range(6)]
    half_brokers = sorted(h.queue.broker_name for h in halves)
    assert set(half_brokers) == set(BROKERS) and {r.queue.broker_name for r in sent} == set(BROKERS)
    addr = {f"broker-{i}": b.broker_addr for i, b in enumerate(cluster.brokers)}

    (status, status_text, one_status, progress, one_progress, pending, one_pending, oldest, topic,
     one_topic) = await asyncio.gather(
        ok(ns, "brokerStatus"), ok(ns, "brokerStatus", as_json=False), ok(ns, "brokerStatus", "-b", "broker-1"),
        ok(ns, "consumerProgress", "-g", "CG_WORK"), ok(ns, "consumerProgress", "-g", "CG_WORK", "-b", "broker-2"),
        ok(ns, "halfStatus"), ok(ns, "halfStatus", "-b", addr["broker-0"]), ok(ns, "halfStatus", "--limit", "2"),
        ok(ns, "topicStatus", "-t", "Work"), ok(ns, "topicStatus", "-t", "Work", "-c", "TestCluster",
                                                 "-b", "broker-0"))

    assert [(s["brokerName"], s["brokerAddr"], int(s["pendingHalfMessages"])) for s in status] == \
        [(name, addr[name], half_brokers.count(name)) for name in BROKERS]
    blocks = [block.splitlines()[:2] for block in status_text.strip().split("\n\n")]
    assert [[line.split() for line in block] for block in blocks] == \
        [[["brokerName", name], ["brokerAddr", addr[name]]] for name in BROKERS]
    assert one_status["brokerName"] == "broker-1" and one_status["brokerAddr"] == addr["broker-1"]

    behind = {name: sum(r.queue.broker_name == name for r in sent) for name in BROKERS}
    assert {name: sum(r["diff"] for r in progress if r["brokerName"] == name) for name in BROKERS} == behind
    assert {r["brokerName"] for r in one_progress} == {"broker-2"} and \
        sum(r["diff"] for r in one_progress) == behind["broker-2"]

    assert sorted(r["brokerName"] for r in pending) == half_brokers
    assert sorted(r["transactionId"] for r in pending) == sorted(h.transaction_id for h in halves)
    assert [r["nextCheckInMillis"] for r in pending] == sorted(r["nextCheckInMillis"] for r in pending)
    assert {r["brokerName"] for r in one_pending} == {"broker-0"} and len(one_pending) == half_brokers.count("broker-0")
    assert len(oldest) == 2

    assert {(r["brokerName"], r["queueId"]) for r in topic} == {(name, q) for name in BROKERS for q in (0, 1)}
    assert sum(r["maxOffset"] for r in topic) == len(sent)
    assert {r["brokerName"] for r in one_topic} == {"broker-0"}


async def test_group_message_and_config_commands_cover_every_broker(cluster):
    ns = cluster.namesrv_addr
    await asyncio.gather(ok(ns, "updateTopic", "-t", "Keyed", "-r", "1", "-w", "1", "-c", "TestCluster"),
                         ok(ns, "updateSubGroup", "-g", "CG_KEYED", "-c", "TestCluster"))
    await routed_everywhere(cluster, "Keyed", dict.fromkeys(BROKERS, 1))
    await routed_everywhere(cluster, "%RETRY%CG_KEYED", dict.fromkeys(BROKERS, 1))
    async with Producer("PG_KEYED", ns) as producer, PullConsumer("CG_KEYED", ns) as consumer:
        sent = [await producer.send(Message("Keyed", b"%d" % i, keys="order-7")) for i in range(3)]
        for result in sent:
            await consumer.update_offset(result.queue, 0)
    async with TransactionProducer("TX_KEYED", Undecided(), ns) as tx:
        halves = [(await tx.send_message_in_transaction(Message("Keyed", b"pending"))).send_result for _ in range(3)]
    assert sorted(r.queue.broker_name for r in sent) == sorted(h.queue.broker_name for h in halves) == BROKERS
    (last,) = [h for h in halves if h.queue.broker_name == "broker-2"]  # not the first broker's

    by_key, configs, stats, swept, _resumed = await asyncio.gather(
        ok(ns, "queryMsgByKey", "-t", "Keyed", "-k", "order-7"), ok(ns, "getBrokerConfig"),
        ok(ns, "statsAll", "-t", "Keyed"), ok(ns, "deleteExpiredCommitLog"),
        ok(ns, "resumeHalf", "-i", last.offset_msg_id))
    assert sorted((r["brokerName"], r["offsetMsgId"]) for r in by_key) == \
        sorted((r.queue.broker_name, r.offset_msg_id) for r in sent)
    assert [(c["brokerName"], c["brokerAddr"], c["brokerClusterName"]) for c in configs] == \
        [(f"broker-{i}", b.broker_addr, "TestCluster") for i, b in enumerate(cluster.brokers)]
    assert [(r["topic"], r["consumerGroup"], r["accumulation"], r["messages"]) for r in stats] == \
        [("Keyed", "CG_KEYED", 3, 3)]
    assert [s["brokerName"] for s in swept] == BROKERS
    # Resumed on the broker its id names: checked now, not an hour after it was sent.
    (row,) = [r for r in await ok(ns, "halfStatus", "-b", "broker-2") if r["offsetMsgId"] == last.offset_msg_id]
    assert row["nextCheckInMillis"] < 600_000, row

    await ok(ns, "deleteSubGroup", "-g", "CG_KEYED")

    async def retry_topic_gone():
        for namesrv in cluster.namesrvs:
            async with Admin(namesrv.addr) as client:
                if "%RETRY%CG_KEYED" in await client.topic_list():
                    return False
        return True
    await until(retry_topic_gone, 10, "the group's retry topic leaves the routes once each broker re-registers")


async def test_bad_input_is_one_clear_line():
    namesrv = await NamesrvProcess().start()
    ghosts = []
    try:
        code, _out, err = await admin(namesrv.addr, "brokerStatus")
        failures = [(code, err, "the name servers know no broker")]
        # Two clusters of brokers nothing answers at.
        dead = {"ghost-a": unused_addr(), "ghost-b": unused_addr()}
        ghosts = [await register_ghost(namesrv.addr, "ghost-a", dead["ghost-a"], "ClusterA"),
                  await register_ghost(namesrv.addr, "ghost-b", dead["ghost-b"], "ClusterB")]
        for args, needle in [
                (("brokerStatus", "-c", "Nope"), "unknown cluster 'Nope' (-c/--cluster): the name servers know "
                                                 "ClusterA, ClusterB"),
                (("consumerProgress", "-g", "G", "-b", "broker-9"), "unknown broker 'broker-9' (-b/--broker)"),
                (("halfStatus", "-c", "ClusterA", "-b", "ghost-b"), "unknown broker 'ghost-b' (-b/--broker) in "
                                                                    "cluster ClusterA"),
                (("updateTopic", "-t", "T"), "the name servers know 2 clusters (ClusterA, ClusterB): name one with "
                                             "-c/--cluster"),
                (("brokerStatus",), f"no broker answered: ghost-a ({dead['ghost-a']}): cannot connect to "
                                    f"{dead['ghost-a']}: connection refused; ghost-b ({dead['ghost-b']})"),
                (("brokerStatus", "-b", "ghost-b"), f"cannot connect to {dead['ghost-b']}: connection refused"),
                (("-n", f"{namesrv.addr};nowhere", "clusterList"), "address 'nowhere' has no port")]:
            code, _out, err = await admin(namesrv.addr, *args, as_json=False)
            failures.append((code, err, needle))
        for code, err, needle in failures:
            assert code == 1 and len(err.splitlines()) == 1 and needle in err, (needle, err)
    finally:
        for ghost in ghosts:
            ghost.close()
        await namesrv.stop()
