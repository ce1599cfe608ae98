"""Consumer offsets (14, 15) and queue offset queries (29, 30, 31, 32) — reference §3.7, §3.9: the remoting adapter
of ``ConsumerService.query_offset`` / ``commit_offset`` / ``search_offset`` (the gRPC door serves no offset RPC)."""
from __future__ import annotations

import logging

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import (QueryConsumerOffsetRequestHeader, QueueRequestHeader,
                                     SearchOffsetRequestHeader, UpdateConsumerOffsetRequestHeader)

from ..context import BrokerContext
from ..errors import BrokerError
from ..messaging.consumer import ConsumerService, OffsetRequest, OffsetSearch
from .base import Processor, handles

log = logging.getLogger(__name__)


class OffsetProcessor(Processor):
    def __init__(self, ctx: BrokerContext, consumer: ConsumerService):
        self.ctx = ctx
        self.consumer = consumer

    @handles(RequestCode.QUERY_CONSUMER_OFFSET)
    def query_consumer_offset(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = QueryConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
        # A 5.x remoting client can opt out of starting a new group at the queue's start (setZeroIfNotFound=false).
        request = OffsetRequest(h.consumerGroup, h.topic, h.queueId, from_queue_start=h.setZeroIfNotFound is not False)
        return _offset(cmd, self.consumer.query_offset(request))

    @handles(RequestCode.UPDATE_CONSUMER_OFFSET)
    def update_consumer_offset(self, channel, cmd: RemotingCommand):
        h = UpdateConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
        request = OffsetRequest(h.consumerGroup, h.topic, h.queueId, h.commitOffset)
        try:
            committed = self.consumer.commit_offset(request, durable=not cmd.is_oneway)
        except BrokerError as exc:
            if cmd.is_oneway:  # nobody hears the answer: the dropped offset is at least in the log
                log.info("oneway UPDATE_CONSUMER_OFFSET from %s refused: %s", channel.remote, exc.remark)
            raise
        return None if committed is None else self._answer_when(cmd, committed)

    @staticmethod
    async def _answer_when(cmd, committed) -> RemotingCommand:
        await committed
        return cmd.response(ResponseCode.SUCCESS)

    @handles(RequestCode.GET_MAX_OFFSET)
    def max_offset(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = QueueRequestHeader.from_ext(cmd.ext_fields)
        return _offset(cmd, self.ctx.store.max_offset(h.topic, h.queueId))

    @handles(RequestCode.GET_MIN_OFFSET)
    def min_offset(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = QueueRequestHeader.from_ext(cmd.ext_fields)
        return _offset(cmd, self.ctx.store.min_offset(h.topic, h.queueId))

    @handles(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP)
    def search_offset(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = SearchOffsetRequestHeader.from_ext(cmd.ext_fields)
        return _offset(cmd, self.consumer.search_offset(OffsetSearch(h.topic, h.queueId, h.timestamp,
                                                                     h.boundaryType)))

    @handles(RequestCode.GET_EARLIEST_MSG_STORETIME)
    def earliest_store_time(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = QueueRequestHeader.from_ext(cmd.ext_fields)
        ts = self.ctx.store.earliest_store_time(h.topic, h.queueId)
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"timestamp": str(ts)})


def _offset(cmd: RemotingCommand, offset: int) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})
