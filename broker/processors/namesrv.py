"""The built-in name server (reference §3.13): routes to this broker for every topic it knows."""
from __future__ import annotations

import json

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import TopicRequestHeader

from ..context import BrokerContext
from ..errors import BrokerError


class NameServerProcessor:
    def __init__(self, ctx: BrokerContext):
        self.ctx = ctx

    def register(self, dispatcher) -> None:
        dispatcher.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.route)
        dispatcher.register(RequestCode.GET_BROKER_CLUSTER_INFO, self.cluster_info)
        dispatcher.register(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.topic_list)

    def _broker_data(self) -> dict:
        cfg = self.ctx.config
        return {"cluster": cfg.brokerClusterName, "brokerName": cfg.brokerName,
                "brokerAddrs": {"0": self.ctx.broker_addr}}

    def route(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        topic = TopicRequestHeader.from_ext(cmd.ext_fields).topic
        config = self.ctx.topics.get(topic)
        if config is None:
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST,
                              f"No topic route info in name server for the topic: {topic}")
        body = {
            "queueDatas": [{
                "brokerName": self.ctx.config.brokerName, "readQueueNums": config.read_queue_nums,
                "writeQueueNums": config.write_queue_nums, "perm": config.perm,
                "topicSysFlag": config.topic_sys_flag, "topicSynFlag": config.topic_sys_flag}],
            "brokerDatas": [self._broker_data()],
            "filterServerTable": {},
        }
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    def cluster_info(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        cfg = self.ctx.config
        body = {"brokerAddrTable": {cfg.brokerName: self._broker_data()},
                "clusterAddrTable": {cfg.brokerClusterName: [cfg.brokerName]}}
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    def topic_list(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        body = {"topicList": self.ctx.topics.user_topics()}
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())
