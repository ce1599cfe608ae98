"""Cost of one check-back scheduler pass with a long transaction history.

Fills a store with N decided transactions (half record + ROLLED_BACK state, as END_TRANSACTION leaves them) and
P pending halves that are all due, starts a real broker on it with a real producer connection registered for
the group, and times one pass of the scheduler (reads the due halves, writes P checks to the producer's socket,
persists the new check counts).

    scripts/bench.py check-pass --decided 1000000 --pending 1000

The fill prints its progress every second. Without --store the store is a temporary folder, removed at the end
(also on an error or Ctrl-C).
"""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from halfmq.broker.config import build_config
from halfmq.broker.server import Broker
from halfmq.protocol import properties as P
from halfmq.protocol.message import MessageRecord
from halfmq.store import HalfState, HalfStatus, MessageStore, PutRequest, StoreConfig, message_request
from halfmq.store.ops import PutMeta
from halfmq.store.txops import DecideHalf, PrepareHalf

from .harness import REPO, run_main, temp_store
from .load import Progress
from .results import Results

GROUP = "PG_BENCH"
BATCH = 5000


def half_request(i: int) -> PutRequest:
    rec = MessageRecord(topic="RMQ_SYS_TRANS_HALF_TOPIC", body=b"x" * 100, born_host="127.0.0.1:1",
                        properties={P.TRAN_MSG: "true", P.PGROUP: GROUP, P.UNIQ_KEY: f"{i:032X}",
                                    P.REAL_TOPIC: "BenchTx", P.REAL_QID: "0"})
    return message_request(rec)


async def fill(root: str, decided: int, pending: int) -> None:
    """Halves through the store's own transaction ops: the first ``decided`` are rolled back, the rest due now."""
    store = MessageStore(StoreConfig(root=root, map_size=16 << 30, flush_disk_type="ASYNC_FLUSH"))
    await store.open()
    started = time.perf_counter()
    total = decided + pending
    done = 0
    try:
        async with Progress("fill", lambda: done, total):
            for start in range(0, total, BATCH):
                await fill_batch(store, start, min(start + BATCH, total), decided)
                done = min(start + BATCH, total)
    finally:
        await store.close()
    print(f"filled {decided} decided + {pending} pending in {time.perf_counter() - started:.1f} s", flush=True)


async def fill_batch(store: MessageStore, start: int, end: int, decided: int) -> None:
    """Halves ``start..end-1``, those below ``decided`` rolled back."""
    prepared = [store.submit(PrepareHalf(half_request(i), HalfState(HalfStatus.PREPARED, GROUP, "BenchTx", 0,
                                                                    f"{i:032X}", 0, 0, 0), 0))
                for i in range(start, end)]
    results = [await c for c in prepared]
    decisions = [store.submit(DecideHalf(result.physical_offset, GROUP, result.queue_offset, False, False))
                 for i, (result, _state) in enumerate(results, start) if i < decided]
    for completion in decisions:
        await completion


PRODUCER = """
import asyncio, sys
sys.path.insert(0, sys.argv[3])
from tests.support.raw import RawClient
async def main():
    producer = await RawClient.connect(sys.argv[1])
    await producer.heartbeat("bench-producer", producer_groups=[sys.argv[2]])
    print("registered", flush=True)
    expected = int(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
    received = 0
    while received < expected:
        await asyncio.wait_for(producer.incoming.get(), 60)
        received += 1
    print(received, flush=True)
asyncio.run(main())
"""


async def measure(root: str, pending: int) -> float:
    broker = Broker(build_config({"bindAddress": "127.0.0.1", "listenPort": 0, "namesrvListenPort": -1,
                                  "metricsPromExporterPort": -1, "grpcListenPort": -1, "dashboardPort": -1, "storePathRootDir": root,
                                  "mapSize": 16 << 30,
                                  "transactionCheckInterval": 3_600_000, "transactionTimeOut": 3_600_000}))
    await broker.start()
    try:
        return await time_pass(broker, pending)
    finally:
        await broker.stop()


async def time_pass(broker: Broker, pending: int) -> float:
    service = broker.ctx.check_back
    await service.stop()  # time the pass by hand, not from the service's timer
    # The service may have started a pass of its own at start-up (every half is due); stop() cancels it, but its
    # write may still be in the writer: wait for it, so the timed pass does not queue behind it.
    await broker.store.submit(PutMeta("bench.barrier", 0))
    # The producer is another process, as in production: its decoding of the checks is not the broker's cost.
    producer = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PRODUCER, broker.addr, GROUP, str(REPO),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert (await asyncio.wait_for(producer.stdout.readline(), 30)).strip() == b"registered"
    started = time.perf_counter()
    handled = await service.run_pass()
    elapsed = time.perf_counter() - started
    # A pass sends a producer at most as many checks as it may have unread (the rest wait for the next pass):
    # the producer waits for the checks this pass sent.
    producer.stdin.write(f"{service.checks_sent}\n".encode())
    await producer.stdin.drain()
    received = int((await asyncio.wait_for(producer.stdout.readline(), 60)).strip())
    await producer.wait()
    print(f"pass handled {handled} due halves, sent {service.checks_sent} checks (the producer received "
          f"{received}), {service.checks_undeliverable} left for the next pass (the producer's unread limit)")
    return elapsed


def add_arguments(parser) -> None:
    parser.add_argument("--decided", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=1_000)
    parser.add_argument("--store", help="reuse (or create) this store folder")


def run(args, results: Results) -> None:
    run_main(main_async(args, results))


async def main_async(args, results: Results) -> None:
    root = args.store or temp_store()
    if not (Path(root) / "lmdb").exists():
        await fill(root, args.decided, args.pending)
    elapsed = await measure(root, args.pending)
    results.add("pass_ms", elapsed * 1000, "ms", decided=args.decided, pending=args.pending)
