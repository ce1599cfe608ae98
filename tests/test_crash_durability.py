"""SIGKILL right after a SEND_OK: every acknowledged message is there after a restart."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import pytest

from halfmq.client import Message, Producer, PullConsumer

pytestmark = pytest.mark.slow  # the broker killed with SIGKILL and restarted, as a process

READY = re.compile(rb"halfmq ready: broker (\S+) namesrv (\S+)")


async def start_broker_process(store_dir) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "halfmq.broker.cli", "broker", "--bindAddress=127.0.0.1", "--listenPort=0",
        "--namesrvListenPort=0", "--metricsPromExporterPort=-1", "--grpcListenPort=-1", "--dashboardPort=-1",
        f"--storePathRootDir={store_dir}", "--mapSize=268435456",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    seen = b""
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        seen += line
        assert line, f"broker exited before it was ready: {seen.decode()}"
        match = READY.search(line)
        if match:
            return proc, match.group(2).decode()


async def test_sigkill_after_send_ok_loses_nothing(tmp_path):
    proc, namesrv = await start_broker_process(tmp_path)
    acked: list[tuple[int, bytes]] = []
    try:
        async with Producer("PG_CRASH", namesrv, retry_times=0) as producer:
            for i in range(300):
                result = await producer.send(Message("Durable", f"message-{i}".encode() * 20))
                acked.append((result.queue.queue_id, f"message-{i}".encode() * 20))
            # Kill at once after the last SEND_OK: no graceful shutdown, no chance to flush anything more.
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    proc, namesrv = await start_broker_process(tmp_path)
    try:
        async with PullConsumer("CG_CRASH", namesrv) as consumer:
            stored: dict[int, list[bytes]] = {}
            for queue in await consumer.fetch_subscribe_queues("Durable"):
                result = await consumer.pull(queue, 0, max_nums=1000)
                stored[queue.queue_id] = [m.body for m in result.messages]
        for queue_id in {q for q, _ in acked}:
            assert stored.get(queue_id) == [body for q, body in acked if q == queue_id]
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
