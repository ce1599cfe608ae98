"""The Prometheus endpoint: scraped over HTTP from a real broker, values move with traffic."""
from __future__ import annotations

import asyncio
import re
import urllib.request

from halfmq.client import LocalTransactionState, Message, Producer, PullConsumer, TransactionProducer


async def scrape(broker) -> dict[str, float]:
    def get():
        return urllib.request.urlopen(f"http://{broker.metrics_addr}/metrics", timeout=5).read().decode()

    text = await asyncio.get_running_loop().run_in_executor(None, get)
    values = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$", line)
        if match:
            values[match.group(1)] = float(match.group(2))
    return values


class Unknown:
    async def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW if msg.keys == "u" else LocalTransactionState.COMMIT_MESSAGE

    async def check_local_transaction(self, msg):
        return LocalTransactionState.UNKNOW


async def test_metrics_move_with_traffic(broker_factory):
    broker = await broker_factory(metricsPromExporterPort=0, transactionTimeOut=60_000)
    before = await scrape(broker)
    assert 'rocketmq_messages_in_total{topic="M"}' not in before
    async with Producer("PGM", broker.namesrv_addr) as producer:
        result = await producer.send(Message("M", b"12345"))
        async with PullConsumer("CGM", broker.namesrv_addr) as consumer:
            await consumer.pull(result.queue, 0)
        after = await scrape(broker)
        assert after['rocketmq_messages_in_total{topic="M"}'] == 1
        assert after['rocketmq_throughput_in_total{topic="M"}'] == 5
        assert after['rocketmq_messages_out_total{consumer_group="CGM",topic="M"}'] == 1
        assert after['rocketmq_producer_connections{producer_group="PGM"}'] == 1
        assert after['rocketmq_rpc_latency_count{request_code="SEND_MESSAGE_V2",response_code="0"}'] >= 1
        assert after["halfmq_store_ops_total"] > before["halfmq_store_ops_total"]
        assert after["halfmq_store_map_size_bytes"] == 64 << 30  # maxMapSize, the default: what the map may grow to
    committed = asyncio.Event()
    broker.store.add_arrival_listener(lambda t, q, m: committed.set() if t == "MT" else None)
    async with TransactionProducer("TXM", Unknown(), broker.namesrv_addr) as tx:
        await tx.send_message_in_transaction(Message("MT", b"u", keys="u"))
        await tx.send_message_in_transaction(Message("MT", b"c", keys="c"))
        await asyncio.wait_for(committed.wait(), 5)
        values = await scrape(broker)
        assert values['rocketmq_commit_messages_total{topic="MT"}'] == 1
        assert values['rocketmq_half_messages{topic="MT"}'] == 1
        assert values['rocketmq_finish_message_latency_count{topic="MT"}'] == 1
