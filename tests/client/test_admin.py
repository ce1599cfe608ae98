"""`halfmq admin` against a real broker, as an operator runs it (a subprocess of the console entry point)."""
from __future__ import annotations

import asyncio
import json
import sys

import pytest

from halfmq.client import LocalTransactionState, Message, Producer, PullConsumer, TransactionProducer


async def admin(broker, *args, as_json=True):
    cmd = [sys.executable, "-m", "halfmq.broker.cli", "admin", "-n", broker.namesrv_addr]
    proc = await asyncio.create_subprocess_exec(*cmd, *(["--json"] if as_json else []), *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode, (json.loads(out) if as_json and proc.returncode == 0 else out.decode()), err.decode()


class Undecided:
    async def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    async def check_local_transaction(self, msg):
        return LocalTransactionState.UNKNOW


@pytest.mark.slow  # each command a `halfmq admin` process of its own
async def test_admin_commands(broker_factory):
    broker = await broker_factory(transactionTimeOut=3_600_000)
    code, out, err = await admin(broker, "updateTopic", "-t", "Adm", "-r", "2", "-w", "2")
    assert code == 0, err
    assert (await admin(broker, "clusterList"))[1][0]["brokerName"] == "broker-a"
    assert {"topic": "Adm"} in (await admin(broker, "topicList"))[1]
    assert (await admin(broker, "topicRoute", "-t", "Adm"))[1]["queueDatas"][0]["writeQueueNums"] == 2
    async with Producer("PGA", broker.namesrv_addr) as producer, PullConsumer("CGA", broker.namesrv_addr) as consumer:
        sent = await producer.send(Message("Adm", b"hello", keys="order-9"))
        await consumer.update_offset(sent.queue, 0)
        status = (await admin(broker, "topicStatus", "-t", "Adm"))[1]
        assert sum(row["maxOffset"] for row in status) == 1
        progress = (await admin(broker, "consumerProgress", "-g", "CGA"))[1]
        assert [(r["queueId"], r["brokerOffset"], r["consumerOffset"], r["diff"]) for r in progress
                if r["queueId"] == sent.queue.queue_id] == [(sent.queue.queue_id, 1, 0, 1)]
        assert (await admin(broker, "producerConnection", "-g", "PGA"))[1][0]["clientId"]
        (by_id,) = (await admin(broker, "queryMsgById", "-i", sent.offset_msg_id))[1]
        assert by_id["body"] == "hello" and by_id["msgId"] == sent.msg_id
        (by_key,) = (await admin(broker, "queryMsgByKey", "-t", "Adm", "-k", "order-9"))[1]
        assert by_key["offsetMsgId"] == sent.offset_msg_id
    async with TransactionProducer("TXA", Undecided(), broker.namesrv_addr) as tx:
        half = await tx.send_message_in_transaction(Message("AdmTx", b"pending"))
    (row,) = (await admin(broker, "halfStatus"))[1]
    assert row["producerGroup"] == "TXA" and row["checks"] == 0 and row["transactionId"] == half.transaction_id
    assert (await admin(broker, "resumeHalf", "-i", half.send_result.offset_msg_id))[0] == 0
    assert int((await admin(broker, "brokerStatus"))[1]["pendingHalfMessages"]) == 1
    code, table, _ = await admin(broker, "topicStatus", "-t", "Adm", as_json=False)
    assert code == 0 and table.splitlines()[0].split() == ["brokerName", "queueId", "minOffset", "maxOffset"]
    code, _, err = await admin(broker, "deleteTopic", "-t", "Nope")
    assert code == 1 and "TOPIC_NOT_EXIST" in err
    assert (await admin(broker, "deleteTopic", "-t", "Adm"))[0] == 0


async def run_admin(*args):
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "halfmq.broker.cli", "admin", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode, out.decode(), err.decode()


async def test_admin_bad_or_unreachable_name_server_is_one_clear_line():
    import socket

    code, out, err = await run_admin("-n", "localhost", "topicList")
    assert code == 1 and out == ""
    assert err.splitlines() == ["halfmq admin: address 'localhost' has no port: write HOST:PORT, e.g. localhost:9876"]
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = await run_admin("-n", f"127.0.0.1:{port}", "clusterList")
    assert code == 1 and out == ""
    assert len(err.splitlines()) == 1, err
    assert "cannot reach the name server (-n/--namesrv)" in err and f"127.0.0.1:{port}" in err
    assert "connection refused" in err
