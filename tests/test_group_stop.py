"""A stop signal to the broker's whole process group (systemd's default stop, ``kill -- -PGID``, ``timeout``) ends it
as cleanly as one to the broker alone (issue 23): the writer process leaves stopping to its broker, so no ERROR is
logged, no writer is started during the shutdown, and every send in flight is either acknowledged or refused."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from halfmq.client import Message, Producer, PullConsumer

from tests.support.broker_process import BrokerProcess


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_stop_signal_to_the_process_group_stops_cleanly(tmp_path, sig):
    broker = await BrokerProcess(tmp_path / "store").start()
    acknowledged: list = []
    try:
        async with Producer("PG", broker.namesrv) as producer:
            for i in range(20):
                acknowledged.append(await producer.send(Message("Stopping", f"before {i}".encode())))

            async def keep_sending() -> None:
                i = 0
                while True:
                    try:
                        acknowledged.append(await producer.send(Message("Stopping", f"during {i}".encode())))
                    except Exception:  # refused or cut off by the stop: not acknowledged
                        return
                    i += 1

            sender = asyncio.ensure_future(keep_sending())
            await asyncio.sleep(0)
            os.killpg(broker.pgid, sig)
            status = await asyncio.wait_for(broker.proc.wait(), 30)
            await asyncio.wait_for(sender, 30)
        log = broker.output(200)
        assert status == 0, log
        assert " ERROR " not in log and "took over" not in log, log
    finally:
        await broker.kill_group()
    again = await BrokerProcess(tmp_path / "store").start()
    try:  # every acknowledged send is there after the restart
        async with PullConsumer("CG", again.namesrv) as consumer:
            stored = set()
            for queue in {r.queue for r in acknowledged}:
                offset = 0
                while (got := await consumer.pull(queue, offset)).messages:
                    stored.update(m.msg_id for m in got.messages)
                    offset = got.next_begin_offset
        assert {r.msg_id for r in acknowledged} <= stored
    finally:
        await again.stop()
