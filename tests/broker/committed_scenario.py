"""The records a committed half is read as, by a check-back, a pull, a view by id and a query by key.

``tests/broker/test_committed_records.py`` compares what this broker serves with ``golden/committed_records.json``,
written by running this file with d4f4493, the last release that stored a committed half as a copy:

    cd <a checkout of d4f4493> && .venv/bin/python <this repo>/tests/broker/committed_scenario.py <json path>

It starts the checkout's broker (the ``halfmq`` its Python imports) and uses that checkout's client; only what
both releases have is used. Each record is kept as its decoded fields (decoding is lossless: the test
re-encodes each record it reads and gets the bytes it read), with the fields that differ run to run masked:
offsets, ids, timestamps and hosts.
"""
from __future__ import annotations

import asyncio
import json
import re
import sys
import tempfile
from dataclasses import asdict

from halfmq.client import LocalTransactionState, Message, PullConsumer, TransactionProducer
from halfmq.client.admin import Admin
from halfmq.protocol.codes import RequestCode
from halfmq.protocol.message import decode_record, decode_records, encode_record

READY = re.compile(rb"halfmq ready: broker (\S+) namesrv (\S+)")
TOPIC = "CommittedRecords"
MASKED_FIELDS = ("queue_offset", "physical_offset", "born_timestamp", "store_timestamp", "born_host", "store_host",
                 "prepared_transaction_offset")
MASKED_PROPERTIES = ("UNIQ_KEY", "__transactionId__", "TRAN_MSG_ID")


def masked(raw: bytes) -> dict:
    fields = asdict(decode_record(raw))
    for name in MASKED_FIELDS:
        fields[name] = "*"
    fields["properties"] = {k: ("*" if k in MASKED_PROPERTIES else v) for k, v in sorted(fields["properties"].items())}
    fields["body"] = fields["body"].hex()
    return fields


class Listener:
    """The first half's local transaction is UNKNOWN; its check-back commits it."""

    def __init__(self):
        self.checked = asyncio.Event()

    async def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    async def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


class CapturingProducer(TransactionProducer):
    """Keeps the raw body of each CHECK_TRANSACTION_STATE it gets."""

    checks: list[bytes]

    def _on_check(self, conn, cmd) -> None:
        self.checks.append(bytes(cmd.body))
        self.listener.checked.set()
        super()._on_check(conn, cmd)


async def wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)  # polling a broker for a visible outcome, bounded by the timeout


async def scenario(namesrv: str) -> dict:
    async with Admin(namesrv) as admin:
        await admin.update_topic(TOPIC, 1, 1)
        listener = Listener()
        async with CapturingProducer("PG_COMMITTED", listener, namesrv) as producer, \
                PullConsumer("CG_COMMITTED", namesrv) as consumer:
            producer.checks = []
            (queue,) = await consumer.fetch_subscribe_queues(TOPIC)

            async def visible(count: int):
                async def check():
                    return len((await consumer.pull(queue, 0, 32)).messages) >= count
                return check

            # 1: committed by its check-back
            first = Message(TOPIC, b"committed by a check", tags="TagA", keys="key-a key-shared",
                            properties={"color": "red"})
            await producer.send_half(first, queue)
            await asyncio.wait_for(listener.checked.wait(), 20)
            await wait_for(await visible(1), "the checked half")
            # 2: committed by its producer
            second = Message(TOPIC, b"committed by its producer" * 40, tags="TagB", keys="key-b key-shared")
            result = await producer.send_half(second, queue)
            await producer.end_transaction(result, LocalTransactionState.COMMIT_MESSAGE)
            await wait_for(await visible(2), "the committed half")
            # 3, 4: a batch half (halfmq's extension), committed with the acknowledged decision
            batch = [Message(TOPIC, b"batch one", tags="TagC", keys="key-c1"),
                     Message(TOPIC, b"batch two", keys="key-shared", properties={"n": "2"})]
            result = await producer.send_half_batch(batch, queue, properties={"origin": "batch"})
            await producer.decide(result.queue, result.queue_offset, result.offset_msg_id, result.msg_id,
                                  LocalTransactionState.COMMIT_MESSAGE, result.transaction_id)
            await wait_for(await visible(4), "the batch half")

            _status, _next, _low, _high, body = await consumer.pull_raw(queue, 0, 32)
            pulled = split(body)
            broker = await admin.broker_addr()
            viewed = []
            for raw in pulled:
                rec = decode_record(raw)
                resp = await admin.call(broker, RequestCode.VIEW_MESSAGE_BY_ID,
                                        {"offset": str(rec.physical_offset)})
                viewed.append(resp.body)
            queried = []
            for key in ("key-a", "key-b", "key-c1", "key-shared"):
                resp = await admin.call(broker, RequestCode.QUERY_MESSAGE, {
                    "topic": TOPIC, "key": key, "maxNum": "32", "beginTimestamp": "0",
                    "endTimestamp": str(2 ** 62)})
                queried.append([masked(raw) for raw in split(resp.body)])
            return {"check": [masked(raw) for raw in producer.checks[:1]],
                    "pull": [masked(raw) for raw in pulled],
                    "view": [masked(raw) for raw in viewed],
                    "query": queried,
                    "lossless": all(bytes(encode(raw)) == raw for raw in [*pulled, *viewed, *producer.checks[:1]])}


def split(body: bytes) -> list[bytes]:
    out, pos = [], 0
    for rec in decode_records(body):
        out.append(body[pos:pos + rec.store_size])
        pos += rec.store_size
    return out


def encode(raw: bytes) -> bytes:
    return encode_record(decode_record(raw))


async def with_broker(run) -> dict:
    """``run(namesrv)`` against a broker subprocess of the halfmq this Python imports, on a temporary store."""
    with tempfile.TemporaryDirectory(prefix="halfmq-committed-") as store:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "halfmq.broker.cli", "broker", "--bindAddress=127.0.0.1", "--listenPort=0",
            "--namesrvListenPort=0", "--grpcListenPort=-1", "--dashboardPort=-1", "--metricsPromExporterPort=-1",
            f"--storePathRootDir={store}", "--transactionTimeOut=300", "--transactionCheckInterval=300",
            "--logLevel=WARNING", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            async with asyncio.timeout(30):
                match = None
                while match is None:
                    line = await proc.stdout.readline()
                    if not line:
                        raise RuntimeError("the broker exited before it was ready")
                    match = READY.search(line)
            return await run(match.group(2).decode())
        finally:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()


if __name__ == "__main__":
    records = asyncio.run(with_broker(scenario))
    with open(sys.argv[1], "w") as fh:
        json.dump(records, fh, indent=1, sort_keys=True)
        fh.write("\n")
