"""Standalone name servers and brokers that join them (issue 25 items 1, 2 and 7), all real processes on loopback."""
from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import zlib

import pytest

from halfmq.client import Message, Producer
from halfmq.client.admin import Admin
from halfmq.client.errors import NoPermissionError
from halfmq.client.remoting import Credentials
from halfmq.protocol.codes import RequestCode, ResponseCode

from tests.support.cluster import LocalCluster, NamesrvProcess, until
from tests.support.raw import RawClient

FAST = ("--registerNameServerPeriod=300", "--brokerNotActiveTimeoutMillis=2000")


async def brokers_known(namesrv: str, credentials=None) -> set[str]:
    async with Admin(namesrv, credentials=credentials) as admin:
        return {row["brokerName"] for row in await admin.cluster_list()}


@pytest.fixture
async def cluster(tmp_path):
    cluster = await LocalCluster(tmp_path, namesrvs=2, brokers=3, broker_flags=FAST,
                                 namesrv_flags=("--scanNotActiveBrokerInterval=200",)).start()
    yield cluster
    await cluster.stop()


async def test_brokers_join_every_name_server_and_new_topics_spread_over_them(cluster):
    for namesrv in cluster.namesrvs:
        assert await brokers_known(namesrv.addr) == {"broker-0", "broker-1", "broker-2"}
        async with Admin(namesrv.addr) as admin:
            info = await admin.cluster_info()
        assert info["clusterAddrTable"] == {"TestCluster": ["broker-0", "broker-1", "broker-2"]}
    sent = collections.Counter()
    async with Producer("PG_SPREAD", cluster.namesrv_addr) as producer:
        for i in range(60):
            sent[(await producer.send(Message("Spread", b"%d" % i))).queue.broker_name] += 1
    assert set(sent) == {"broker-0", "broker-1", "broker-2"}, sent

    async def merged():
        async with Admin(cluster.namesrvs[1].addr) as admin:
            route = await admin.topic_route("Spread")
        return sorted(q["brokerName"] for q in route["queueDatas"]) == ["broker-0", "broker-1", "broker-2"] and route
    route = await until(merged, 10, "the route of Spread lists every broker's queues")
    assert {b["brokerName"]: b["brokerAddrs"]["0"] for b in route["brokerDatas"]} == \
        {f"broker-{i}": b.broker_addr for i, b in enumerate(cluster.brokers)}


async def test_a_stopped_broker_leaves_at_once_and_rejoins_when_restarted(cluster):
    gone = cluster.brokers[1]
    await gone.stop()
    for namesrv in cluster.namesrvs:  # unregistered before its port closed: no timeout to wait for
        assert await brokers_known(namesrv.addr) == {"broker-0", "broker-2"}
    async with Producer("PG_CARRY_ON", cluster.namesrv_addr) as producer:
        for i in range(20):
            assert (await producer.send(Message("CarryOn", b"%d" % i))).queue.broker_name != "broker-1"
    cluster.brokers[1] = cluster.broker_process(1)
    await cluster.brokers[1].start()
    for namesrv in cluster.namesrvs:
        assert await brokers_known(namesrv.addr) == {"broker-0", "broker-1", "broker-2"}


async def test_a_killed_broker_leaves_when_its_connection_closes(cluster):
    await cluster.brokers[2].kill_group()
    for namesrv in cluster.namesrvs:
        await until(lambda: _without(namesrv.addr, "broker-2"), 5, "a killed broker leaves the routes")


async def test_a_broker_whose_registrations_stop_expires(cluster):
    broker = cluster.brokers[0]
    os.killpg(broker.pgid, signal.SIGSTOP)  # alive, connections open, but silent
    try:
        loop_start = asyncio.get_running_loop().time()
        await until(lambda: _without(cluster.namesrvs[0].addr, "broker-0"), 10, "a silent broker expires")
        waited = asyncio.get_running_loop().time() - loop_start
        assert waited >= 1.0, f"dropped after {waited:.2f} s, before brokerNotActiveTimeoutMillis (2 s)"
    finally:
        os.killpg(broker.pgid, signal.SIGCONT)
    await until(lambda: _with(cluster.namesrvs[0].addr, "broker-0"), 10, "the broker rejoins once it registers")


async def test_clients_and_brokers_carry_on_when_a_name_server_dies(cluster, tmp_path):
    await cluster.namesrvs[0].kill()
    async with Producer("PG_NS_DOWN", cluster.namesrv_addr) as producer:
        for i in range(10):
            await producer.send(Message("NsDown", b"%d" % i))
    # A name server started empty learns every broker from their next registrations.
    fresh = await NamesrvProcess().start()
    try:
        assert await brokers_known(cluster.namesrvs[1].addr) == {"broker-0", "broker-1", "broker-2"}
    finally:
        await fresh.stop()


async def _without(namesrv: str, name: str) -> bool:
    return name not in await brokers_known(namesrv)


async def _with(namesrv: str, name: str) -> bool:
    return name in await brokers_known(namesrv)


def _registration(name="b-x", broker_id=0, body: bytes | None = None, **extra) -> tuple[dict, bytes]:
    if body is None:
        body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {
            "T1": {"topicName": "T1", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}}}}).encode()
    ext = {"brokerName": name, "brokerAddr": "127.0.0.1:1", "clusterName": "C", "haServerAddr": "",
           "brokerId": broker_id, "compressed": "false", "bodyCrc32": zlib.crc32(body) & 0x7FFFFFFF, **extra}
    return ext, body


@pytest.mark.parametrize("case, needle", [
    ("malformed", "malformed body"),
    ("bad_id", "brokerId 1024"),
    ("compressed", "compressed"),
    ("too_many_topics", "namesrvMaxTopicsPerBroker"),
    ("bad_crc", "bodyCrc32"),
    ("bad_topic", "topic"),
    ("bad_name", "brokerName"),
    ("markup_name", "brokerName"),
    ("bad_addr", "brokerAddr"),
])
async def test_bad_registrations_are_refused_with_a_reason(case, needle):
    namesrv = await NamesrvProcess("--namesrvMaxTopicsPerBroker=3").start()
    try:
        client = await RawClient.connect(namesrv.addr)
        table = {f"T{i}": {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6} for i in range(4)}
        ext, body = {
            "malformed": lambda: _registration(body=b"{not json"),
            "bad_id": lambda: _registration(broker_id=1024),
            "compressed": lambda: _registration(compressed="true"),
            "too_many_topics": lambda: _registration(body=json.dumps(
                {"topicConfigSerializeWrapper": {"topicConfigTable": table}}).encode()),
            "bad_crc": lambda: (_registration()[0] | {"bodyCrc32": "12345"}, _registration()[1]),
            "bad_topic": lambda: _registration(body=json.dumps({"topicConfigSerializeWrapper": {
                "topicConfigTable": {"bad topic!": {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6}}}}).encode()),
            "bad_name": lambda: _registration(name="a\nb"),
            "markup_name": lambda: _registration(name="<img src=x onerror=alert(1)>"),
            "bad_addr": lambda: (_registration()[0] | {"brokerAddr": "evil host:80"}, _registration()[1]),
        }[case]()
        answer = await client.request(RequestCode.REGISTER_BROKER, ext, body)
        assert answer.code == ResponseCode.SYSTEM_ERROR and needle in answer.remark, (answer.code, answer.remark)
        assert await brokers_known(namesrv.addr) == set()
        good_ext, good_body = _registration()
        assert (await client.request(RequestCode.REGISTER_BROKER, good_ext, good_body)).code == ResponseCode.SUCCESS
        assert await brokers_known(namesrv.addr) == {"b-x"}
        client.transport.close()
    finally:
        await namesrv.stop()


async def test_topics_kept_over_all_brokers_are_bounded():
    """Many brokers each at the per-registration bound would not fit in memory: the table's total is bounded too,
    and a broker already registered may still re-register what it holds."""
    namesrv = await NamesrvProcess("--namesrvMaxTopicEntries=5").start()
    try:
        client = await RawClient.connect(namesrv.addr)

        def body(count: int) -> bytes:
            return json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {
                f"T{i}": {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6} for i in range(count)}}}).encode()
        for name, count, code in (("b-1", 3, ResponseCode.SUCCESS), ("b-2", 3, ResponseCode.SYSTEM_ERROR),
                                  ("b-2", 2, ResponseCode.SUCCESS), ("b-1", 3, ResponseCode.SUCCESS)):
            ext, data = _registration(name=name, body=body(count))
            answer = await client.request(RequestCode.REGISTER_BROKER, ext, data)
            assert answer.code == code, (name, count, answer.remark)
            if code != ResponseCode.SUCCESS:
                assert "namesrvMaxTopicEntries" in answer.remark
        assert await brokers_known(namesrv.addr) == {"b-1", "b-2"}
        client.transport.close()
    finally:
        await namesrv.stop()


async def test_with_acl_only_an_admin_account_registers(tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: ops\n    secretKey: ops-secret-1\n    admin: true\n"
                   "  - accessKey: app\n    secretKey: app-secret-1\n    defaultTopicPerm: PUB|SUB\n")
    namesrv = await NamesrvProcess("--aclEnable=true", f"--aclConfigFile={acl}").start()
    try:
        client = await RawClient.connect(namesrv.addr)
        ext, body = _registration()
        answer = await client.request(RequestCode.REGISTER_BROKER, ext, body)
        assert answer.code == ResponseCode.NO_PERMISSION
        from halfmq.broker.acl import signature
        for key, secret, code in (("app", "app-secret-1", ResponseCode.NO_PERMISSION),
                                  ("ops", "ops-secret-1", ResponseCode.SUCCESS)):
            signed = {k: str(v) for k, v in ext.items()} | {"AccessKey": key}
            signed["Signature"] = signature(secret, signed, body)
            assert (await client.request(RequestCode.REGISTER_BROKER, signed, body)).code == code
        client.transport.close()
        # A broker signs its registrations with namesrvAccessKey / namesrvSecretKey.
        cluster = await LocalCluster(tmp_path, namesrvs=0, brokers=0).start()
        cluster.namesrvs = [namesrv]
        broker = cluster.broker_process(7, "--namesrvAccessKey=ops", "--namesrvSecretKey=ops-secret-1")
        await broker.start()
        try:
            # Every request to a name server with ACL is signed, reads too (as 4.x clients sign them all).
            with pytest.raises(NoPermissionError):
                await brokers_known(namesrv.addr)
            assert "broker-7" in await brokers_known(namesrv.addr, Credentials("app", "app-secret-1"))
        finally:
            await broker.stop()
    finally:
        await namesrv.stop()


async def test_a_groups_route_follows_its_newest_leader_and_lists_each_member_once():
    namesrv = await NamesrvProcess().start()
    try:
        client = await RawClient.connect(namesrv.addr)
        ext, body = _registration(name="grp", epoch=2, brokerAddr="127.0.0.1:2", haServerAddr="127.0.0.1:12")
        assert (await client.request(RequestCode.REGISTER_BROKER, ext, body)).code == ResponseCode.SUCCESS
        ext, body = _registration(name="grp", epoch=1, brokerAddr="127.0.0.1:3")
        stale = await client.request(RequestCode.REGISTER_BROKER, ext, body)
        assert stale.code == ResponseCode.SYSTEM_ERROR and "127.0.0.1:2 at epoch 2" in stale.remark
        # A follower learns its leader from its registration's answer.
        ext, body = _registration(name="grp", broker_id=1, brokerAddr="127.0.0.1:4")
        answer = await client.request(RequestCode.REGISTER_BROKER, ext, body)
        assert answer.ext_fields == {"haServerAddr": "127.0.0.1:12", "masterAddr": "127.0.0.1:2"}
        ext, body = _registration(name="grp", epoch=3, brokerAddr="127.0.0.1:3")
        assert (await client.request(RequestCode.REGISTER_BROKER, ext, body)).code == ResponseCode.SUCCESS
        route = json.loads((await client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"})).body)
        assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:3", "1": "127.0.0.1:4"}
        # Members that swap roles are each listed once, under their new brokerId.
        for broker_id, addr, listed in ((0, "127.0.0.1:4", {"0": "127.0.0.1:4"}),
                                        (1, "127.0.0.1:3", {"0": "127.0.0.1:4", "1": "127.0.0.1:3"})):
            ext, body = _registration(name="grp", broker_id=broker_id, epoch=4, brokerAddr=addr)
            assert (await client.request(RequestCode.REGISTER_BROKER, ext, body)).code == ResponseCode.SUCCESS
            route = json.loads((await client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"})).body)
            assert route["brokerDatas"][0]["brokerAddrs"] == listed
        client.close()
    finally:
        await namesrv.stop()


async def test_registrations_are_bounded_in_rate_per_connection_and_a_flood_harms_no_other_broker():
    """A registration is parsed in full (the whole topic table): one connection sending them as fast as it can is
    refused (SYSTEM_BUSY, the body not parsed) past its bucket, while another connection is still heard."""
    from halfmq.broker.namesrv.pacing import BURST
    namesrv = await NamesrvProcess().start()
    try:
        flooder, other = await RawClient.connect(namesrv.addr), await RawClient.connect(namesrv.addr)
        ext, body = _registration(name="flood")
        answers = await asyncio.gather(*(flooder.request(RequestCode.REGISTER_BROKER, ext, body)
                                         for _ in range(BURST * 3)))
        codes = collections.Counter(answer.code for answer in answers)
        assert codes[ResponseCode.SUCCESS] >= BURST and codes[ResponseCode.SYSTEM_BUSY] > 0, codes
        assert set(codes) == {ResponseCode.SUCCESS, ResponseCode.SYSTEM_BUSY}, codes
        busy = next(answer for answer in answers if answer.code == ResponseCode.SYSTEM_BUSY)
        assert "registrations a second on this connection" in busy.remark
        ext, body = _registration(name="calm")
        assert (await other.request(RequestCode.REGISTER_BROKER, ext, body)).code == ResponseCode.SUCCESS
        assert await brokers_known(namesrv.addr) == {"flood", "calm"}
        flooder.close()
        other.close()
    finally:
        await namesrv.stop()


async def test_a_broker_creating_topics_in_a_burst_is_never_refused_by_its_name_servers(cluster):
    async with Admin(cluster.namesrv_addr) as admin:
        for i in range(100):  # each change makes every broker register again
            await admin.update_topic(f"Burst{i}", read_queues=1, write_queues=1)

        async def last_routed():
            return (await admin.topic_route("Burst99"))["brokerDatas"]
        await until(last_routed, 10, "the burst's last topic routed")
    assert not any("refused this broker's registration" in line for line in cluster.brokers[0].lines)


async def test_a_send_that_creates_a_topic_is_answered_once_the_name_servers_route_it(tmp_path):
    """As RocketMQ registers a topic a send created before it answers the send: a consumer started once the first
    send was acknowledged finds the route, even over a slow link from the broker to its name server (CI: a pull
    consumer asking right after a producer's sends was told TOPIC_NOT_EXIST)."""
    from tests.support.broker_process import BrokerProcess
    from tests.support.proxy import Proxy

    namesrv = await NamesrvProcess().start()
    slow = await Proxy(namesrv.addr, delay=0.2).start()
    broker = BrokerProcess(tmp_path / "broker", "--brokerName=slow-link", f"--namesrvAddr={slow.addr}")
    try:
        await broker.start()
        await until(lambda: _knows(namesrv.addr, "slow-link"), 10, "the broker registered")
        async with Producer("PG_NEW_TOPIC", namesrv.addr) as producer:
            await producer.send(Message("CreatedBySend", b"first"))
        async with Admin(namesrv.addr) as admin:
            route = await admin.topic_route("CreatedBySend")
        assert [b["brokerName"] for b in route["brokerDatas"]] == ["slow-link"]
    finally:
        await broker.stop()
        await slow.stop()
        await namesrv.stop()


async def _knows(namesrv: str, broker: str) -> bool:
    return broker in await brokers_known(namesrv)
