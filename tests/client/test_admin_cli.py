"""`halfmq admin` with mqadmin's habits (issue 14, item 2), run as an operator runs it (subprocesses of the entry
point) against a real broker."""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from halfmq.client import ConsumeFrom, ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.headers import DeleteSubscriptionGroupRequestHeader

from tests.support.raw import RawClient


async def halfmq(*args, env=None):
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "halfmq.broker.cli", *args,
                                                env={**os.environ, **(env or {})},
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def admin_json(broker, *args):
    # Options first, where the old parser took them too: each test fails on the habit it is about.
    code, out, err = await halfmq("admin", "-n", broker.namesrv_addr, "--json", *args)
    assert code == 0, err
    return json.loads(out)


async def test_options_after_the_command_name_server_from_the_environment_and_version(broker):
    after, env, version = await asyncio.gather(
        halfmq("admin", "clusterList", "-n", broker.namesrv_addr),
        halfmq("admin", "clusterList", env={"NAMESRV_ADDR": broker.namesrv_addr}),
        halfmq("--version"))
    for code, out, err in (after, env):
        assert code == 0 and "broker-a" in out, err
    assert version[0] == 0 and version[1].strip() == "halfmq 0.1.0"


async def test_every_option_of_every_command_has_help_with_its_default():
    from halfmq.client.admin_cli import COMMANDS, parser

    helps = await asyncio.gather(*(halfmq("admin", name, "-h") for name in ("sendMessage", "consumeMessage")))
    for code, out, _err in helps:
        assert code == 0 and "(required)" in out and "(default:" in out
    sub = next(a for a in parser()._actions if a.dest == "command")
    for name in COMMANDS:
        for action in sub.choices[name]._actions:
            if action.dest != "help":
                assert action.help and (action.required or "default" in action.help
                                        or action.default not in (None, "==SUPPRESS==")), (name, action.dest)


async def test_tables_show_names_not_reprs_or_codes(broker):
    async with Producer("PG_CLI", broker.namesrv_addr) as producer:
        await producer.send(Message("CliT", b"x"))
        (route, conns) = await asyncio.gather(halfmq("admin", "-n", broker.namesrv_addr, "topicRoute", "-t", "CliT"),
                                              halfmq("admin", "-n", broker.namesrv_addr, "producerConnection",
                                                     "-g", "PG_CLI"))
    consumer = PushConsumer("CG_CLI", broker.namesrv_addr, lambda msgs: ConsumeStatus.SUCCESS, ConsumeFrom.LAST_OFFSET)
    consumer.subscribe("CliT", "a || b")
    await consumer.start()
    try:
        code, consumers, err = await halfmq("admin", "-n", broker.namesrv_addr, "consumerConnection", "-g", "CG_CLI")
    finally:
        await consumer.close()
    assert code == 0 and "PYTHON" in consumers and "V4_9_8" in consumers and "a || b" in consumers, err
    assert "{" not in consumers and "CLUSTERING" in consumers, consumers
    assert route[0] == 0 and "{" not in route[1] and "'" not in route[1], route[1]
    assert "brokerName" in route[1] and "writeQueueNums" in route[1]
    assert conns[0] == 0 and "PYTHON" in conns[1] and "V4_9_8" in conns[1], conns[1]


async def test_query_msg_by_id_takes_either_id(broker):
    async with Producer("PG_IDS", broker.namesrv_addr) as producer:
        sent = await producer.send(Message("CliIds", b"either id", keys="k9"))
    by_msg_id, by_offset_id = await asyncio.gather(
        admin_json(broker, "queryMsgById", "-i", sent.msg_id),  # the id a send prints: refused before
        admin_json(broker, "queryMsgById", "-i", sent.offset_msg_id))
    assert by_msg_id == by_offset_id and [(r["msgId"], r["offsetMsgId"], r["body"]) for r in by_msg_id] == \
        [(sent.msg_id, sent.offset_msg_id, "either id")]


async def test_message_commands(broker):
    sent = await admin_json(broker, "sendMessage", "-t", "CliMsg", "-p", "hello cli", "-k", "k1", "-c", "tagA")
    assert sent["sendStatus"] == "SEND_OK"
    async with Producer("PG_CLI2", broker.namesrv_addr) as producer:
        other = await producer.send(Message("CliMsg", b"second", tags="tagB"))
    by_uniq, by_offset_id, by_unique_key, by_offset, consumed, printed = await asyncio.gather(
        admin_json(broker, "queryMsgById", "-i", sent["msgId"]),  # the id a send prints: refused before
        admin_json(broker, "queryMsgById", "-i", sent["offsetMsgId"]),
        admin_json(broker, "queryMsgByUniqueKey", "-i", other.msg_id, "-t", "CliMsg"),
        admin_json(broker, "queryMsgByOffset", "-t", "CliMsg", "-b", "broker-a", "-i", str(sent["queueId"]),
                   "-o", str(sent["queueOffset"])),
        admin_json(broker, "consumeMessage", "-t", "CliMsg", "-c", "10"),
        halfmq("admin", "printMsg", "-t", "CliMsg", "-s", "tagB", "-n", broker.namesrv_addr))
    for rows in (by_uniq, by_offset_id, by_offset):
        assert [(r["msgId"], r["body"], r["tags"], r["keys"]) for r in rows] == [(sent["msgId"], "hello cli",
                                                                                   "tagA", "k1")]
    assert [r["body"] for r in by_unique_key] == ["second"]
    assert sorted(r["body"] for r in consumed) == ["hello cli", "second"]
    assert printed[0] == 0 and "BODY: second" in printed[1] and "hello cli" not in printed[1], printed
    code, _out, err = await halfmq("admin", "queryMsgByUniqueKey", "-i", "0" * 32, "-t", "CliMsg",
                                   "-n", broker.namesrv_addr)
    assert code == 1 and len(err.splitlines()) == 1 and "no message with id" in err


async def test_reset_offset_by_time_stats_and_groups(broker):
    async with Producer("PG_RESET", broker.namesrv_addr) as producer:
        for i in range(3):
            await producer.send(Message("ResetT", f"m{i}".encode()))
    async with PullConsumer("CG_PEEK", broker.namesrv_addr) as peek:
        stored = [m for q in await peek.fetch_subscribe_queues("ResetT") for m in (await peek.pull(q, 0)).messages]
    cut = 1 + max(m.store_timestamp for m in stored)
    while time.time() * 1000 < cut:  # the late message is stored after the cut (the clock has ms resolution)
        await asyncio.sleep(0.001)
    async with Producer("PG_RESET", broker.namesrv_addr) as producer:
        await producer.send(Message("ResetT", b"late"))
    assert await admin_json(broker, "updateSubGroup", "-g", "CG_RESET") == {"updated": "CG_RESET"}
    rows = await admin_json(broker, "resetOffsetByTime", "-g", "CG_RESET", "-t", "ResetT", "-s", str(cut))
    async with PullConsumer("CG_RESET", broker.namesrv_addr) as consumer:
        stored = {q.queue_id: await consumer.query_offset(q) for q in await consumer.fetch_subscribe_queues("ResetT")}
        maxes = {q.queue_id: await consumer.max_offset(q) for q in await consumer.fetch_subscribe_queues("ResetT")}
    assert {r["queueId"]: r["offset"] for r in rows} == stored
    assert sum(maxes.values()) - sum(stored.values()) == 1  # only the late message is left to consume
    stats = await admin_json(broker, "statsAll", "-t", "ResetT")
    assert [(r["topic"], r["consumerGroup"], r["accumulation"], r["messages"]) for r in stats] == \
        [("ResetT", "CG_RESET", 1, 4)]

    # While consumers are online their offsets would overwrite a reset: refused unless forced.
    online = PushConsumer("CG_RESET", broker.namesrv_addr, lambda msgs: ConsumeStatus.SUCCESS, ConsumeFrom.LAST_OFFSET)
    online.subscribe("ResetT", "*")
    await online.start()
    try:
        code, _out, err = await halfmq("admin", "resetOffsetByTime", "-g", "CG_RESET", "-t", "ResetT", "-s", "now",
                                       "-n", broker.namesrv_addr)
        assert code == 1 and "online" in err and "-f" in err
    finally:
        await online.close()
    assert await admin_json(broker, "deleteSubGroup", "-g", "CG_RESET") == {"deleted": "CG_RESET"}
    assert "%RETRY%CG_RESET" not in broker.ctx.topics.topics
    config = await admin_json(broker, "getBrokerConfig")
    assert config["brokerName"] == "broker-a" and config["listenPort"] == "0"


async def test_group_requests_refuse_what_they_cannot_do(broker):
    raw = await RawClient.connect(broker.addr)
    try:
        create = RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
        for body, remark in ((b"[1]", "SubscriptionGroupConfig"), (b"{", "SubscriptionGroupConfig"),
                             (b'{"groupName": "a b"}', "groupName"),
                             (b'{"groupName": "G", "retryMaxTimes": 3}', "retryMaxTimes=3 is not supported")):
            r = await raw.request(create, body=body)
            assert r.code == ResponseCode.SYSTEM_ERROR and remark in r.remark, (body, r.remark)
        r = await raw.request(create, body=b'{"groupName": "G", "retryMaxTimes": 16, "consumeEnable": true}')
        assert r.code == ResponseCode.SUCCESS, r.remark
        delete = RequestCode.DELETE_SUBSCRIPTIONGROUP
        r = await raw.request(delete, DeleteSubscriptionGroupRequestHeader(groupName="G", removeOffset=True).to_ext())
        assert r.code == ResponseCode.SYSTEM_ERROR and "removeOffset" in r.remark
        r = await raw.request(delete, DeleteSubscriptionGroupRequestHeader(groupName="G").to_ext())
        assert r.code == ResponseCode.SUCCESS
        r = await raw.request(delete, DeleteSubscriptionGroupRequestHeader(groupName="G").to_ext())
        assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        # Not system topics: a group name cannot reach them (names.py refuses what %RETRY%<name> cannot be).
        r = await raw.request(delete, {"groupName": "../RMQ_SYS_TRANS_HALF_TOPIC"})
        assert r.code == ResponseCode.SYSTEM_ERROR
    finally:
        raw.close()


async def test_new_admin_requests_need_an_admin_account(broker_factory, tmp_path):
    from halfmq.client import Credentials

    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: app\n    secretKey: app-secret\n    defaultTopicPerm: PUB|SUB\n"
                   "    defaultGroupPerm: DENY\n    groupPerms:\n      - CG_APP=SUB\n      - PID_SMSC=PUB\n"
                   "  - accessKey: admin\n    secretKey: admin-secret\n    admin: true\n")
    broker = await broker_factory(aclEnable=True, aclConfigFile=str(acl))
    requests = ((RequestCode.GET_BROKER_CONFIG, {}, b""),
                (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b'{"groupName": "G"}'),
                (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "G"}, b""))
    raw = await RawClient.connect(broker.addr)
    try:
        for creds, expected in ((Credentials("app", "app-secret"), ResponseCode.NO_PERMISSION),
                                (Credentials("admin", "admin-secret"), ResponseCode.SUCCESS)):
            for code, ext, body in requests:
                r = await raw.request(code, creds.sign(dict(ext), body), body)
                assert r.code == expected, (creds.access_key, code, r.remark)
    finally:
        raw.close()
    # The message commands make a client's requests, signed, as the groups they name.
    app = ("-n", broker.namesrv_addr, "--access-key", "app", "--secret-key", "app-secret")
    code, _out, err = await halfmq("admin", *app, "sendMessage", "-t", "AclT", "-p", "x")
    assert code == 0, err
    (as_group, as_tools) = await asyncio.gather(
        halfmq("admin", *app, "--json", "consumeMessage", "-t", "AclT", "-g", "CG_APP"),
        halfmq("admin", *app, "consumeMessage", "-t", "AclT"))
    assert as_group[0] == 0 and [m["body"] for m in json.loads(as_group[1])] == ["x"], as_group[2]
    assert as_tools[0] == 1 and "NO_PERMISSION" in as_tools[2] and "TOOLS_CONSUMER" in as_tools[2]


def test_times_and_message_id_dates():
    import argparse

    import pytest

    from halfmq.client.admin_cli import parse_time
    from halfmq.client.admin_messages import born_time
    from halfmq.protocol.message import UniqKeyGenerator

    assert parse_time("now") is None and parse_time("1700000000123") == 1700000000123
    local = int(time.mktime(time.strptime("2026-01-02#03:04:05", "%Y-%m-%d#%H:%M:%S"))) * 1000
    assert parse_time("2026-01-02#03:04:05:678") == local + 678 and parse_time("2026-01-02#03:04:05") == local
    for bad in ("yesterday", "2026-01-02 03:04:05", "2026-01-02#03:04:05:x"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a time"):
            parse_time(bad)
    now = int(time.time() * 1000)
    assert abs(born_time(UniqKeyGenerator().next()) - now) < 5_000
    # Made just before a month ended, read just after: dated in the month before.
    t = time.gmtime(now / 1000)
    month_start = int(time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1)) * 1000)
    made = month_start - 1_000
    previous = time.gmtime(made / 1000)
    since = made - int(time.mktime((previous.tm_year, previous.tm_mon, 1, 0, 0, 0, 0, 0, -1)) * 1000)
    assert born_time("7F0000010000000000AB" + f"{since:08X}" + "0001", month_start + 60_000) == made
    assert born_time("not hex" * 4 + "abcd") is None and born_time("ABC") is None
