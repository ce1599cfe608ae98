"""A topic may declare its message type (RocketMQ 5's message.type attribute, issue 15 item 5): a declared topic
takes only that type, as the reference checks; undeclared topics take every type, so 4.x clients work unchanged."""
from __future__ import annotations

import pytest

from halfmq.client import LocalTransactionState, Message, Producer, TransactionProducer
from halfmq.client.admin import Admin
from halfmq.client.errors import BrokerError
from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.headers import CreateTopicRequestHeader


async def update_topic(admin: Admin, topic: str, attributes: str | None) -> None:
    await admin.call(await admin.broker_addr(), RequestCode.UPDATE_AND_CREATE_TOPIC, CreateTopicRequestHeader(
        topic=topic, readQueueNums=2, writeQueueNums=2, perm=6, attributes=attributes).to_ext())


class Commit:
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


async def test_a_declared_topic_takes_only_its_type(broker):
    async with Admin(broker.namesrv_addr) as admin, Producer("P", broker.namesrv_addr, retry_times=0) as producer, \
            TransactionProducer("TX", Commit(), broker.namesrv_addr) as tx:
        await update_topic(admin, "OnlyDelay", "+message.type=DELAY")
        await update_topic(admin, "Anything", None)
        await update_topic(admin, "Mixed", "+message.type=MIXED")
        await producer.send(Message("OnlyDelay", b"d", delay_level=1))
        await producer.send(Message("OnlyDelay", b"t", deliver_time_ms=2 ** 40))  # a timer is DELAY too
        with pytest.raises(BrokerError) as refused:
            await producer.send(Message("OnlyDelay", b"plain"))
        assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
        assert "expected type is DELAY, but actual type is NORMAL" in refused.value.remark
        with pytest.raises(BrokerError, match="actual type is TRANSACTION"):
            await tx.send_message_in_transaction(Message("OnlyDelay", b"tx"))
        with pytest.raises(BrokerError, match="actual type is NORMAL"):
            await producer.send_batch([Message("OnlyDelay", b"batch")])
        for topic in ("Anything", "Mixed"):
            await producer.send(Message(topic, b"plain"))
            await producer.send(Message(topic, b"d", delay_level=1))
            await tx.send_message_in_transaction(Message(topic, b"tx"))
        table = (await admin.json_call(await admin.broker_addr(), RequestCode.GET_ALL_TOPIC_CONFIG))["topicConfigTable"]
        assert table["OnlyDelay"]["attributes"] == {"message.type": "DELAY"} and table["Anything"]["attributes"] == {}
        await update_topic(admin, "OnlyDelay", None)  # an update without attributes keeps the type
        with pytest.raises(BrokerError, match="expected type is DELAY"):
            await producer.send(Message("OnlyDelay", b"plain"))
        await update_topic(admin, "OnlyDelay", "-message.type")
        await producer.send(Message("OnlyDelay", b"plain"))


async def test_unknown_attributes_and_types_are_refused(broker):
    async with Admin(broker.namesrv_addr) as admin:
        for attributes, remark in (("+message.type=SOMETIMES", "not one of NORMAL, FIFO"),
                                   ("+queue.type=BatchCQ", "not supported")):
            with pytest.raises(BrokerError, match=remark):
                await update_topic(admin, "Typed", attributes)
        assert "Typed" not in broker.ctx.topics.topics
