"""HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38), LOCK/UNLOCK_BATCH_MQ (41, 42)."""
from __future__ import annotations

import json
import time

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import GroupRequestHeader, UnregisterClientRequestHeader

from ..context import BrokerContext
from ..errors import BrokerError, Failure
from ..names import check_client_id, check_group, check_topic
from ..services.clients import ClientInfo, parse_subscription
from .base import Processor, handles

LOCK_LEASE_S = 60.0


def parse_json_body(cmd: RemotingCommand) -> dict:
    try:
        data = json.loads(cmd.body or b"{}")
    except (UnicodeDecodeError, ValueError) as exc:
        raise BrokerError(Failure.BAD_REQUEST, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BrokerError(Failure.BAD_REQUEST, "the request body is JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise BrokerError(Failure.BAD_REQUEST, "the request body is not a JSON object")
    return data


def _list_of_dicts(data: dict, key: str) -> list[dict]:
    value = data.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise BrokerError(Failure.BAD_REQUEST, f"{key} must be a list of objects")
    return value


class ClientManageProcessor(Processor):
    def __init__(self, ctx: BrokerContext):
        self.ctx = ctx
        self.locks: dict[tuple[str, str, int], tuple[str, float]] = {}

    @handles(RequestCode.HEART_BEAT)
    async def heartbeat(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        """Registers the client's consumer and producer groups, or nothing: every name is checked before the
        first registration or retry topic, so a refused heartbeat leaves no trace."""
        data = parse_json_body(cmd)
        client_id = check_client_id(data.get("clientID"), "clientID")
        consumers = []
        for item in _list_of_dicts(data, "consumerDataSet"):
            group = check_group(item.get("groupName"), "consumerDataSet.groupName")
            subs = []
            for sub in _list_of_dicts(item, "subscriptionDataSet"):
                topic = check_topic(sub.get("topic"), f"subscriptionDataSet.topic of group {group}")
                try:
                    version = int(sub.get("subVersion") or 0)
                except (TypeError, ValueError):
                    raise BrokerError(Failure.BAD_REQUEST, "subVersion is not an integer") from None
                subs.append(parse_subscription(topic, sub.get("subString"), version, sub.get("expressionType")))
            consumers.append((group, item, subs))
        producers = [check_group(item.get("groupName"), "producerDataSet.groupName")
                     for item in _list_of_dicts(data, "producerDataSet")]
        channel.client_id = client_id
        topics = self.ctx.topics
        for group, _item, _subs in consumers:
            # The group's retry topic is the group (topics.py): created while the group quota allows, else the
            # consumer is registered all the same, as RocketMQ's heartbeat does for an unknown group.
            if not topics.group_exists(group) and topics.may_create_group():
                await topics.ensure_group(group)
        now = time.monotonic()
        for group, item, subs in consumers:
            info = ClientInfo(client_id, channel, cmd.language, cmd.version, now)
            self.ctx.consumers.register(group, info, str(item.get("consumeType") or "CONSUME_PASSIVELY"),
                                        str(item.get("messageModel") or "CLUSTERING"),
                                        str(item.get("consumeFromWhere") or "CONSUME_FROM_LAST_OFFSET"), subs)
        for group in producers:
            self.ctx.producers.register(group, ClientInfo(client_id, channel, cmd.language, cmd.version, now))
        return cmd.response(ResponseCode.SUCCESS)

    @handles(RequestCode.UNREGISTER_CLIENT)
    def unregister(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = UnregisterClientRequestHeader.from_ext(cmd.ext_fields)
        # Some clients send an absent group as an empty string: only a named group is checked and unregistered.
        producer_group = h.producerGroup and check_group(h.producerGroup, "producerGroup")
        consumer_group = h.consumerGroup and check_group(h.consumerGroup, "consumerGroup")
        if producer_group:
            self.ctx.producers.unregister(producer_group, channel)
        if consumer_group:
            self.ctx.consumers.unregister(consumer_group, channel)
        return cmd.response(ResponseCode.SUCCESS)

    @handles(RequestCode.GET_CONSUMER_LIST_BY_GROUP)
    def consumer_list(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = GroupRequestHeader.from_ext(cmd.ext_fields)
        ids = self.ctx.consumers.client_ids(h.consumerGroup)
        if not ids:
            raise BrokerError(Failure.NOT_ONLINE, f"no consumer for this group, {h.consumerGroup}")
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps({"consumerIdList": ids}).encode())

    def _mq_request(self, channel, cmd: RemotingCommand) -> tuple[str, str, list[dict]]:
        data = parse_json_body(cmd)
        group = check_group(data.get("consumerGroup"), "consumerGroup")
        client_id = check_client_id(data.get("clientId"), "clientId")
        mqs = _list_of_dicts(data, "mqSet")
        for mq in mqs:
            check_topic(mq.get("topic"), "mqSet.topic")
            if not isinstance(mq.get("queueId"), int):
                raise BrokerError(Failure.BAD_REQUEST, "each mqSet entry needs a topic and a queueId")
        # A lock is held for a client id, and the body names it: only the id this connection's own heartbeat
        # registered may be used, or one client could take or release another's queues (orderly consumption).
        if client_id != channel.client_id:
            raise BrokerError(Failure.FORBIDDEN,
                              f"clientId {client_id} is not the client of this connection "
                              f"({channel.client_id or 'no heartbeat yet'}): queues are locked for oneself only")
        return group, client_id, mqs

    @handles(RequestCode.LOCK_BATCH_MQ)
    def lock(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        group, client_id, mqs = self._mq_request(channel, cmd)
        now = time.monotonic()
        granted = []
        for mq in mqs:
            key = (group, mq["topic"], mq["queueId"])
            holder = self.locks.get(key)
            if holder is None or holder[0] == client_id or now - holder[1] > LOCK_LEASE_S:
                self.locks[key] = (client_id, now)
                granted.append(mq)
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps({"lockOKMQSet": granted}).encode())

    @handles(RequestCode.UNLOCK_BATCH_MQ)
    def unlock(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        group, client_id, mqs = self._mq_request(channel, cmd)
        for mq in mqs:
            key = (group, mq["topic"], mq["queueId"])
            if self.locks.get(key, ("",))[0] == client_id:
                del self.locks[key]
        return cmd.response(ResponseCode.SUCCESS)

    @handles(RequestCode.CHECK_CLIENT_CONFIG)
    def check_client_config(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        data = parse_json_body(cmd)
        expression_type = data.get("expressionType") or "TAG"
        if expression_type != "TAG":
            raise BrokerError(Failure.UNSUPPORTED_FILTER,
                              f"The broker does not support consumer to filter message by {expression_type}")
        return cmd.response(ResponseCode.SUCCESS)
