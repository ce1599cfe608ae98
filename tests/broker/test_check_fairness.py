"""Fair check-back (issue 11): a producer stalled with its connection open (a real child process, SIGSTOPped) does
not take its group's checks, and a second live producer of the group gets them: no half is discarded."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.store import HalfStatus

from tests.support.raw import RawClient

ROOT = Path(__file__).resolve().parents[2]
GROUP = "PG_FAIR"
HALVES = 40

# The stalled producer: registers the group, stores HALVES half messages, says so, then waits with the connection
# open (it is SIGSTOPped right after, so it reads nothing).
CHILD = f"""
import asyncio, sys
from halfmq.protocol import properties as P
from halfmq.protocol.codes import SysFlag
from tests.support.raw import RawClient

async def main(addr):
    c = await RawClient.connect(addr)
    await c.heartbeat("stalled-producer", producer_groups=[{GROUP!r}])
    for i in range({HALVES}):
        r = await c.send("FairTx", b"half-%d" % i, group={GROUP!r}, props={{P.TRAN_MSG: "true", P.PGROUP: {GROUP!r}}},
                         sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)
        assert r.code == 0, r.remark
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main(sys.argv[1]))
"""


async def test_a_stalled_producer_does_not_take_the_checks_of_its_group(broker_factory):
    # No half is checked before the child is stopped: a check it reads while still running (and leaves unanswered)
    # counts, and two of them discard the half (a CI run on a loaded machine timed out so with transactionTimeOut
    # 100 ms, the child's first halves being older than that before it was stopped).
    broker = await broker_factory(transactionTimeOut=3000, transactionCheckInterval=200, transactionCheckMax=2)
    live = await RawClient.connect(broker.addr)
    await live.heartbeat("live-producer", producer_groups=[GROUP])
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, broker.addr, cwd=str(ROOT),
                                                 stdout=asyncio.subprocess.PIPE)
    committed: set[int] = set()
    all_committed = asyncio.Event()

    async def answer_checks() -> None:  # the live producer commits every half it is asked about
        while True:
            check = await live.incoming.get()
            ext = check.ext_fields
            r = await live.request(RequestCode.END_TRANSACTION, {
                "producerGroup": GROUP, "tranStateTableOffset": ext["tranStateTableOffset"],
                "commitLogOffset": ext["commitLogOffset"], "commitOrRollback": 8, "msgId": ext["msgId"],
                "transactionId": ext["transactionId"], "fromTransactionCheck": "true"})
            assert r.code == ResponseCode.SUCCESS, r.remark
            committed.add(int(ext["commitLogOffset"]))
            if len(committed) == HALVES:
                all_committed.set()

    answering = asyncio.ensure_future(answer_checks())
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 30)
        assert line.strip() == b"ready", line
        os.kill(child.pid, signal.SIGSTOP)  # its connection stays open; it reads nothing from now on
        try:
            await asyncio.wait_for(all_committed.wait(), 60)  # a bound, not a pace: a loaded machine is slow
        finally:
            os.kill(child.pid, signal.SIGCONT)
        halves = [broker.store.get_half(offset) for offset in committed]
        assert [h.status for h in halves] == [HalfStatus.COMMITTED] * HALVES
        assert broker.ctx.check_back.discarded == 0
        # Nothing reached the topic of discarded halves.
        r = await live.request(RequestCode.GET_MAX_OFFSET, {"topic": "TRANS_CHECK_MAX_TIME_TOPIC", "queueId": 0})
        assert r.code != ResponseCode.SUCCESS or r.ext_fields["offset"] == "0"
    finally:
        answering.cancel()
        child.kill()
        await child.wait()
        live.close()


async def test_checks_left_unread_do_not_count(broker_factory):
    """A producer that receives checks and sends nothing back did not read them: its halves are not discarded
    (with no other producer they keep waiting), and once it answers, its answer decides."""
    broker = await broker_factory(transactionTimeOut=10, transactionCheckInterval=10, transactionCheckMax=1)
    c = await RawClient.connect(broker.addr)
    await c.heartbeat("p", producer_groups=[GROUP])
    r = await c.send("FairTx", b"quiet", group=GROUP, props={P.TRAN_MSG: "true", P.PGROUP: GROUP}, sys_flag=4)
    assert r.code == ResponseCode.SUCCESS
    checks = [await asyncio.wait_for(c.incoming.get(), 5) for _ in range(3)]  # more checks than transactionCheckMax
    assert broker.ctx.check_back.discarded == 0
    assert broker.ctx.check_back.checks_taken_back >= 2  # and the operator can see why (runtime info, metrics)
    ext = checks[-1].ext_fields
    done = await c.request(RequestCode.END_TRANSACTION, {
        "producerGroup": GROUP, "tranStateTableOffset": ext["tranStateTableOffset"],
        "commitLogOffset": ext["commitLogOffset"], "commitOrRollback": 8, "msgId": ext["msgId"],
        "transactionId": ext["transactionId"], "fromTransactionCheck": "true"})
    assert done.code == ResponseCode.SUCCESS, done.remark
    assert broker.store.get_half(int(ext["commitLogOffset"])).status is HalfStatus.COMMITTED
    c.close()
