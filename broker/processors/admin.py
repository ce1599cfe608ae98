"""Topic administration and message lookup: UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215),
GET_ALL_TOPIC_CONFIG (21), VIEW_MESSAGE_BY_ID (33)."""
from __future__ import annotations

import json
from dataclasses import asdict

from halfmq.protocol.codes import Perm, RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import CreateTopicRequestHeader, TopicRequestHeader, ViewMessageRequestHeader
from halfmq.protocol.message import decode_record

from ..context import BrokerContext
from ..errors import BrokerError
from ..names import validate_topic_name
from ..topics import HALF_TOPIC, SYSTEM_TOPICS, TopicConfig

MAX_QUEUES = 1024


class AdminProcessor:
    def __init__(self, ctx: BrokerContext):
        self.ctx = ctx

    def register(self, dispatcher) -> None:
        dispatcher.register(RequestCode.UPDATE_AND_CREATE_TOPIC, self.create_topic)
        dispatcher.register(RequestCode.DELETE_TOPIC_IN_BROKER, self.delete_topic)
        dispatcher.register(RequestCode.GET_ALL_TOPIC_CONFIG, self.all_topic_config)
        dispatcher.register(RequestCode.VIEW_MESSAGE_BY_ID, self.view_message)

    async def create_topic(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = CreateTopicRequestHeader.from_ext(cmd.ext_fields)
        validate_topic_name(h.topic)
        if h.topic in SYSTEM_TOPICS:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"The topic[{h.topic}] is conflict with system topic.")
        for name, value in (("readQueueNums", h.readQueueNums), ("writeQueueNums", h.writeQueueNums)):
            if not 1 <= value <= MAX_QUEUES:
                raise BrokerError(ResponseCode.SYSTEM_ERROR, f"{name} {value} is outside 1..{MAX_QUEUES}")
        if not 0 <= h.perm <= (Perm.PRIORITY | Perm.READ | Perm.WRITE | Perm.INHERIT):
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"perm {h.perm} is not a permission mask")
        if h.topicFilterType not in ("SINGLE_TAG", "MULTI_TAG"):
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"topicFilterType {h.topicFilterType!r} is unknown")
        await self.ctx.topics.put(TopicConfig(h.topic, h.readQueueNums, h.writeQueueNums, h.perm,
                                              h.topicFilterType, h.topicSysFlag or 0, bool(h.order)))
        return cmd.response(ResponseCode.SUCCESS)

    async def delete_topic(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        topic = TopicRequestHeader.from_ext(cmd.ext_fields).topic
        if not await self.ctx.topics.delete(topic):
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        self.ctx.offsets.forget_topic(topic)
        self.ctx.retention.kick()  # its messages go in the background, in slices
        return cmd.response(ResponseCode.SUCCESS)

    def all_topic_config(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        table = {}
        for name, config in self.ctx.topics.topics.items():
            raw = asdict(config)
            table[name] = {"topicName": name, "readQueueNums": raw["read_queue_nums"],
                           "writeQueueNums": raw["write_queue_nums"], "perm": raw["perm"],
                           "topicFilterType": raw["topic_filter_type"], "topicSysFlag": raw["topic_sys_flag"],
                           "order": raw["order"]}
        body = {"topicConfigTable": table, "dataVersion": {"timestamp": 0, "counter": 0}}
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    def view_message(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        offset = ViewMessageRequestHeader.from_ext(cmd.ext_fields).offset
        raw = self.ctx.store.read_record(offset) if offset >= 0 else None
        # A half message is not a message of its real topic until it is committed: never show it here.
        topic = decode_record(raw).topic if raw is not None else None
        if topic is None or topic == HALF_TOPIC:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        self.ctx.acl.check_record(channel, cmd, topic)
        return cmd.response(ResponseCode.SUCCESS, body=raw)
