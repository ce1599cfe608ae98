"""What the store promises, seen by clients of a real broker: one owner per store, corrupted records never served
as SUCCESS, a full store answered with a clear code, delayed messages indexed by their KEYS."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.message import decode_offset_msg_id
from halfmq.store import StoreLockedError

from tests.support.damage import flip_body_byte
from tests.support.raw import RawClient


async def test_a_second_broker_on_a_store_in_use_refuses_to_start(broker_factory, tmp_path):
    first = await broker_factory()
    with pytest.raises(StoreLockedError, match=f"{tmp_path / 'store'}.*process {os.getpid()}"):
        await broker_factory()
    # As a user starts it: a refused start naming the folder and the holder, no traceback; the first still works.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "halfmq.broker.cli", "broker", "--bindAddress=127.0.0.1", "--listenPort=0",
        "--namesrvListenPort=-1", "--metricsPromExporterPort=-1", "--grpcListenPort=-1", "--dashboardPort=-1",
        f"--storePathRootDir={tmp_path / 'store'}",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, (out, err)
    assert f"in use by process {os.getpid()}".encode() in err and b"Traceback" not in err + out
    client = await RawClient.connect(first.addr)
    assert (await client.send("Owned", b"still served")).code == ResponseCode.SUCCESS
    client.close()


async def test_a_flipped_body_byte_is_never_served_as_success(broker_factory, tmp_path):
    broker = await broker_factory()
    client = await RawClient.connect(broker.addr)
    bad = await client.send("Crc", b"victim-body-0123456789", keys="victim")
    for i in range(100):  # newer records: the damage is older than what the start-up check reads
        assert (await client.send("Crc", b"later %d" % i)).code == ResponseCode.SUCCESS
    client.close()
    await broker.stop()
    flip_body_byte(tmp_path / "store", b"victim-body-0123456789")
    broker = await broker_factory()
    client = await RawClient.connect(broker.addr)
    pulled = await client.pull("Crc", 0, 0)
    assert pulled.code != ResponseCode.SUCCESS and "corrupted" in pulled.remark
    _host, offset = decode_offset_msg_id(bad.ext_fields["msgId"])
    viewed = await client.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
    assert viewed.code != ResponseCode.SUCCESS and "corrupted" in viewed.remark
    queried = await client.request(RequestCode.QUERY_MESSAGE, {"topic": "Crc", "key": "victim", "maxNum": 32,
                                                               "beginTimestamp": 0, "endTimestamp": 2 ** 62})
    assert queried.code != ResponseCode.SUCCESS
    after = await client.pull("Crc", 0, 1, max_nums=200)  # what follows it is served
    assert after.code == ResponseCode.SUCCESS and int(after.ext_fields["nextBeginOffset"]) == 101
    assert broker.store.stats()["corrupt_records"] == 3
    client.close()


async def test_a_full_store_answers_service_not_available_and_keeps_serving_reads(broker_factory):
    broker = await broker_factory(mapSize=2 << 20, maxMapSize=2 << 20)
    client = await RawClient.connect(broker.addr)
    first = await client.send("Full", b"early")
    assert first.code == ResponseCode.SUCCESS
    codes = set()
    for _ in range(200):
        response = await client.send("Full", bytes(64 << 10))
        codes.add(response.code)
        if response.code != ResponseCode.SUCCESS:
            assert response.code == ResponseCode.SERVICE_NOT_AVAILABLE and "mapSize" in response.remark
            break
    assert ResponseCode.SERVICE_NOT_AVAILABLE in codes
    pulled = await client.pull("Full", 0, 0, max_nums=1)
    assert pulled.code == ResponseCode.SUCCESS
    client.close()


async def test_a_delayed_message_is_found_by_its_keys_once_delivered(broker_factory):
    broker = await broker_factory(messageDelayLevel="100ms 1s")
    client = await RawClient.connect(broker.addr)
    sent = await client.send("Later", b"delayed", keys="order-7", props={"DELAY": "1"})
    assert sent.code == ResponseCode.SUCCESS
    arrived = asyncio.Event()
    broker.store.add_arrival_listener(lambda topic, _q, _m: arrived.set() if topic == "Later" else None)
    await asyncio.wait_for(arrived.wait(), 10)
    found = await client.request(RequestCode.QUERY_MESSAGE, {"topic": "Later", "key": "order-7", "maxNum": 32,
                                                             "beginTimestamp": 0, "endTimestamp": 2 ** 62})
    assert found.code == ResponseCode.SUCCESS and b"delayed" in found.body
    client.close()


async def test_shutdown_stores_nothing_it_does_not_answer(broker_factory, tmp_path):
    """Requests keep arriving while the broker stops: every stored message had its SUCCESS answer written."""
    broker = await broker_factory(shutdownGraceSeconds=10)
    client = await RawClient.connect(broker.addr)
    assert (await client.send("Stop", b"first")).code == ResponseCode.SUCCESS
    answered = asyncio.Event()
    successes = 1

    async def send(i: int) -> None:
        nonlocal successes
        if client.closed.is_set():
            return
        try:
            response = await client.send("Stop", b"m%d" % i, timeout=15)
        except (ConnectionError, asyncio.TimeoutError):
            return
        if response.code == ResponseCode.SUCCESS:
            successes += 1
            if successes > 200:
                answered.set()

    async def keep_sending() -> None:
        for i in range(20_000):
            if client.closed.is_set():  # the broker closed the connection: what was not answered is not stored
                return
            sends.add(asyncio.ensure_future(send(i)))
            if i % 64 == 63:
                await asyncio.sleep(0)  # let the answers in: a producer with a window of sends in flight

    sends: set = set()
    sender = asyncio.ensure_future(keep_sending())
    await asyncio.wait_for(answered.wait(), 30)
    await broker.stop()
    await sender
    await asyncio.wait(sends, timeout=20)
    assert all(s.done() for s in sends)
    client.close()
    broker = await broker_factory()
    assert broker.store.max_offset("Stop", 0) == successes
