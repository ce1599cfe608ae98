"""The transaction tables answer in pages (issue 12, item 5): halfStatus, the Admin API and the audit job's reader
see every transaction, however many; one request costs the broker at most a bounded page."""
from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest

from halfmq.broker.processors.inspect import MAX_PAGE
from halfmq.client.admin import Admin
from halfmq.pipeline import broker_io
from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.headers import HalfStatusRequestHeader
from halfmq.protocol.message import MessageRecord

from tests.support.raw import RawClient

HOUR_MS = 3_600_000


class GoneProducer:
    """The connection the halves came from, as the broker keeps it (weakly) after its producer left."""

    client_id = None


async def write_halves(broker, count: int, batch: int = 5_000) -> None:
    """``count`` pending halves, written through the broker's transaction service in batches (each batch is one
    store group): the fast way to a table larger than any page."""
    transactions, channel = broker.ctx.transactions, GoneProducer()
    for start in range(0, count, batch):
        completions = []
        for i in range(start, min(count, start + batch)):
            rec = MessageRecord("PagedT", b"x", properties={P.UNIQ_KEY: f"TX{i:08d}", P.PGROUP: "PG_PAGED",
                                                            P.TRAN_MSG: "true"})
            completions.append(transactions.prepare(rec, "PG_PAGED", channel))
        await asyncio.gather(*completions)


async def pages(broker, code: int, limit: int):
    """Every page, as the raw requests answer them."""
    out, after = [], None
    raw = await RawClient.connect(broker.addr)
    try:
        while True:
            r = await raw.request(code, HalfStatusRequestHeader(limit=limit, after=after).to_ext())
            assert r.code == ResponseCode.SUCCESS, r.remark
            data = json.loads(r.body)
            out.append(data)
            after = data["next"]
            if after is None:
                return out
    finally:
        raw.close()


async def test_half_status_and_records_page_through_every_transaction(broker_factory):
    broker = await broker_factory(transactionTimeOut=HOUR_MS)
    await write_halves(broker, 25)
    status = await pages(broker, RequestCode.HALFMQ_GET_HALF_STATUS, 10)
    assert [len(p["halves"]) for p in status] == [10, 10, 5]  # before: one answer of 10 rows, no continuation
    ids = [row["transactionId"] for p in status for row in p["halves"]]
    assert sorted(ids) == [f"TX{i:08d}" for i in range(25)]
    records = await pages(broker, RequestCode.HALFMQ_GET_TRANSACTION_RECORDS, 10)
    offsets = [row["offset"] for p in records for row in p["records"]]
    assert len(offsets) == 25 and offsets == sorted(set(offsets))  # each once, in store order

    async with Admin(broker.namesrv_addr) as admin:
        assert len([row async for row in admin.pending_halves(page_size=7)]) == 25
    # The audit job's reader (it runs its own loop, as in a Spark driver).
    rows = await asyncio.to_thread(lambda: list(broker_io.transaction_records(broker.namesrv_addr, page_size=4)))
    assert sorted(r["transactionId"] for r in rows) == ids and len(rows) == 25

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "halfmq.broker.cli", "admin", "halfStatus", "--page-size", "6", "--json",
        "-n", broker.namesrv_addr, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert sorted(row["transactionId"] for row in json.loads(out)) == sorted(ids)


async def test_a_page_is_bounded_by_the_broker_and_bad_cursors_are_refused(broker_factory):
    broker = await broker_factory(transactionTimeOut=HOUR_MS)
    await write_halves(broker, MAX_PAGE + 1)
    raw = await RawClient.connect(broker.addr)
    try:
        for code, key in ((RequestCode.HALFMQ_GET_HALF_STATUS, "halves"),
                          (RequestCode.HALFMQ_GET_TRANSACTION_RECORDS, "records")):
            r = await raw.request(code, HalfStatusRequestHeader(limit=10 ** 9).to_ext())
            data = json.loads(r.body)
            assert len(data[key]) == MAX_PAGE and data["next"], code
            last = await raw.request(code, HalfStatusRequestHeader(limit=10 ** 9, after=data["next"]).to_ext())
            assert len(json.loads(last.body)[key]) == 1 and json.loads(last.body)["next"] is None
            for bad in ("x", "1:2:3", "-1", "99999999999999999999999", "1:" + "9" * 30):
                r = await raw.request(code, {"after": bad})
                assert r.code == ResponseCode.SYSTEM_ERROR and "cursor" in r.remark, (bad, r.remark)
            r = await raw.request(code, {"limit": "-5"})
            assert r.code == ResponseCode.SYSTEM_ERROR and "negative" in r.remark
    finally:
        raw.close()


@pytest.mark.slow  # 100,000 halves stored first
async def test_more_than_100k_transactions_are_all_seen(broker_factory):
    """The old answers stopped at 100,000 rows, silently."""
    broker = await broker_factory(transactionTimeOut=HOUR_MS)
    count = 100_003
    started = time.monotonic()
    await write_halves(broker, count)
    written = time.monotonic()
    async with Admin(broker.namesrv_addr) as admin:
        pending = 0
        async for _row in admin.pending_halves():
            pending += 1
        records = 0
        async for page in admin.transaction_record_pages():
            records += len(page)
    print(f"wrote {count} halves in {written - started:.1f} s, read both tables in {time.monotonic() - written:.1f} s")
    assert pending == count and records == count
