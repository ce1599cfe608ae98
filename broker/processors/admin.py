"""Topic and group administration and message lookup: UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215),
GET_ALL_TOPIC_CONFIG (21), VIEW_MESSAGE_BY_ID (33), UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200),
DELETE_SUBSCRIPTIONGROUP (207) and GET_BROKER_CONFIG (26)."""
from __future__ import annotations

import json
from dataclasses import asdict

from halfmq.protocol.codes import Perm, RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import (CreateTopicRequestHeader, DeleteSubscriptionGroupRequestHeader,
                                     TopicRequestHeader, ViewMessageRequestHeader)
from halfmq.protocol.message import decode_record
from halfmq.protocol.rules import MAX_QUEUES

from ..errors import BrokerError, Failure
from ..names import DLQ_PREFIX, RETRY_PREFIX, check_group, validate_topic_name
from ..topics import HALF_TOPIC, SYSTEM_TOPICS, TopicConfig, apply_attributes
from .base import Processor, handles

#: RocketMQ's SubscriptionGroupConfig fields and defaults. halfmq keeps no per-group settings (a group is its
#: retry topic, see topics.py): a request asking for anything but these defaults is refused, naming the field.
SUBSCRIPTION_GROUP_DEFAULTS = {"consumeEnable": True, "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
                               "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0,
                               "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True}


class AdminProcessor(Processor):
    @handles(RequestCode.UPDATE_AND_CREATE_TOPIC)
    async def create_topic(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = CreateTopicRequestHeader.from_ext(cmd.ext_fields)
        validate_topic_name(h.topic)
        if h.topic in SYSTEM_TOPICS:
            raise BrokerError(Failure.ILLEGAL_TOPIC, f"The topic[{h.topic}] is conflict with system topic.")
        for name, value in (("readQueueNums", h.readQueueNums), ("writeQueueNums", h.writeQueueNums)):
            if not 1 <= value <= MAX_QUEUES:
                raise BrokerError(Failure.BAD_REQUEST, f"{name} {value} is outside 1..{MAX_QUEUES}")
        if not 0 <= h.perm <= (Perm.PRIORITY | Perm.READ | Perm.WRITE | Perm.INHERIT):
            raise BrokerError(Failure.BAD_REQUEST, f"perm {h.perm} is not a permission mask")
        if h.topicFilterType not in ("SINGLE_TAG", "MULTI_TAG"):
            raise BrokerError(Failure.BAD_REQUEST, f"topicFilterType {h.topicFilterType!r} is unknown")
        current = self.ctx.topics.get(h.topic)
        kind = apply_attributes(h.attributes, current.message_type if current is not None else None)
        await self.ctx.topics.put(TopicConfig(h.topic, h.readQueueNums, h.writeQueueNums, h.perm,
                                              h.topicFilterType, h.topicSysFlag or 0, bool(h.order), kind))
        return cmd.response(ResponseCode.SUCCESS)

    @handles(RequestCode.DELETE_TOPIC_IN_BROKER)
    async def delete_topic(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        topic = TopicRequestHeader.from_ext(cmd.ext_fields).topic
        if not await self.ctx.topics.delete(topic):
            raise BrokerError(Failure.TOPIC_NOT_FOUND, f"topic[{topic}] not exist")
        self.ctx.offsets.forget_topic(topic)
        self.ctx.retention.kick()  # its messages go in the background, in slices
        return cmd.response(ResponseCode.SUCCESS)

    @handles(RequestCode.GET_ALL_TOPIC_CONFIG)
    def all_topic_config(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        table = {}
        for name, config in self.ctx.topics.topics.items():
            raw = asdict(config)
            table[name] = {"topicName": name, "readQueueNums": raw["read_queue_nums"],
                           "writeQueueNums": raw["write_queue_nums"], "perm": raw["perm"],
                           "topicFilterType": raw["topic_filter_type"], "topicSysFlag": raw["topic_sys_flag"],
                           "order": raw["order"],
                           "attributes": {"message.type": raw["message_type"]} if raw["message_type"] else {}}
        body = {"topicConfigTable": table, "dataVersion": {"timestamp": 0, "counter": 0}}
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    @handles(RequestCode.VIEW_MESSAGE_BY_ID)
    def view_message(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        offset = ViewMessageRequestHeader.from_ext(cmd.ext_fields).offset
        raw = self.ctx.store.read_record(offset) if offset >= 0 else None
        # A half message is not a message of its real topic until it is committed: never show it here.
        topic = decode_record(raw).topic if raw is not None else None
        if topic is None or topic == HALF_TOPIC:
            raise BrokerError(Failure.MESSAGE_MISSING, f"can not find message by the offset, {offset}")
        self.ctx.acl.check_record(channel, cmd, topic)
        return cmd.response(ResponseCode.SUCCESS, body=raw)

    @handles(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP)
    async def create_group(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        """Creates the group's retry topic, beyond maxAutoCreatedSubscriptionGroups (an admin's choice, as for
        topics); an existing group is left as it is."""
        try:
            config = json.loads(cmd.body or b"")
        except ValueError:
            config = None
        if not isinstance(config, dict):
            raise BrokerError(Failure.BAD_REQUEST, "the body is not a SubscriptionGroupConfig JSON object")
        group = check_group(config.get("groupName"), "groupName")
        for name, default in SUBSCRIPTION_GROUP_DEFAULTS.items():
            if name in config and config[name] != default:
                raise BrokerError(Failure.BAD_REQUEST,
                                  f"{name}={json.dumps(config[name])} is not supported: halfmq keeps no per-group "
                                  f"settings (only the default, {json.dumps(default)})")
        if self.ctx.topics.get(RETRY_PREFIX + group) is None:
            await self.ctx.topics.put(TopicConfig(RETRY_PREFIX + group, 1, 1))
        return cmd.response(ResponseCode.SUCCESS)

    @handles(RequestCode.DELETE_SUBSCRIPTIONGROUP)
    async def delete_group(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        """Deletes the group's retry and dead-letter topics (its consumer offsets stay, as RocketMQ keeps them
        unless asked)."""
        h = DeleteSubscriptionGroupRequestHeader.from_ext(cmd.ext_fields)
        group = check_group(h.groupName, "groupName")
        if h.removeOffset:
            raise BrokerError(Failure.BAD_REQUEST, "removeOffset=true is not supported: offsets are kept")
        deleted = [await self.ctx.topics.delete(prefix + group) for prefix in (RETRY_PREFIX, DLQ_PREFIX)]
        if not any(deleted):
            raise BrokerError(Failure.GROUP_NOT_FOUND, f"subscription group[{group}] not exist")
        return cmd.response(ResponseCode.SUCCESS)

    @handles(RequestCode.GET_BROKER_CONFIG)
    def broker_config(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        """The configuration in effect, as RocketMQ answers it: Java properties text."""
        lines = [f"{key}={_property(value)}" for key, value in sorted(self.ctx.config.as_dict().items())]
        return cmd.response(ResponseCode.SUCCESS, body="\n".join(lines).encode())


def _property(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
