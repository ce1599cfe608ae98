"""Consumer offsets (14, 15) and queue offset queries (29, 30, 31, 32) — reference §3.7, §3.9."""
from __future__ import annotations

import logging

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import (QueryConsumerOffsetRequestHeader, QueueRequestHeader,
                                     SearchOffsetRequestHeader, UpdateConsumerOffsetRequestHeader)

from ..context import BrokerContext
from ..errors import BrokerError, Failure
from ..messaging.consumer import ConsumerService
from ..names import check_group, check_topic

log = logging.getLogger(__name__)


def _check_names(h) -> None:
    """The group and topic of a consumer offset: they are its store key (group NUL topic NUL queueId)."""
    check_group(h.consumerGroup, "consumerGroup")
    check_topic(h.topic, "topic")


class OffsetProcessor:
    def __init__(self, ctx: BrokerContext, consumer: ConsumerService):
        self.ctx = ctx
        self.consumer = consumer

    def register(self, dispatcher) -> None:
        dispatcher.register(RequestCode.QUERY_CONSUMER_OFFSET, self.query_consumer_offset)
        dispatcher.register(RequestCode.UPDATE_CONSUMER_OFFSET, self.update_consumer_offset)
        dispatcher.register(RequestCode.GET_MAX_OFFSET, self.max_offset)
        dispatcher.register(RequestCode.GET_MIN_OFFSET, self.min_offset)
        dispatcher.register(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, self.search_offset)
        dispatcher.register(RequestCode.GET_EARLIEST_MSG_STORETIME, self.earliest_store_time)

    def query_consumer_offset(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = QueryConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
        _check_names(h)
        # A 5.x remoting client can opt out of starting a new group at the queue's start (setZeroIfNotFound=false).
        offset = self.consumer.start_offset(h.consumerGroup, h.topic, h.queueId,
                                            from_queue_start=h.setZeroIfNotFound is not False)
        if offset is not None:
            return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})
        raise BrokerError(Failure.OFFSET_NOT_FOUND,
                          "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")

    def update_consumer_offset(self, channel, cmd: RemotingCommand):
        h = UpdateConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
        try:
            _check_names(h)
        except BrokerError as exc:
            if cmd.is_oneway:  # nobody hears the answer: the dropped offset is at least in the log
                log.info("oneway UPDATE_CONSUMER_OFFSET from %s refused: %s", channel.remote, exc.remark)
            raise
        if cmd.is_oneway:
            self.ctx.offsets.commit(h.consumerGroup, h.topic, h.queueId, h.commitOffset)
            return None
        return self._update_durable(cmd, h)

    async def _update_durable(self, cmd, h) -> RemotingCommand:
        await self.ctx.offsets.commit_durable(h.consumerGroup, h.topic, h.queueId, h.commitOffset)
        return cmd.response(ResponseCode.SUCCESS)

    def max_offset(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = QueueRequestHeader.from_ext(cmd.ext_fields)
        return cmd.response(ResponseCode.SUCCESS,
                            ext_fields={"offset": str(self.ctx.store.max_offset(h.topic, h.queueId))})

    def min_offset(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = QueueRequestHeader.from_ext(cmd.ext_fields)
        return cmd.response(ResponseCode.SUCCESS,
                            ext_fields={"offset": str(self.ctx.store.min_offset(h.topic, h.queueId))})

    def search_offset(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = SearchOffsetRequestHeader.from_ext(cmd.ext_fields)
        boundary = (h.boundaryType or "lower").lower()
        if boundary not in ("lower", "upper"):
            raise BrokerError(Failure.BAD_REQUEST, f"boundaryType {h.boundaryType!r} is not lower or upper")
        offset = self.ctx.store.offset_for_timestamp(h.topic, h.queueId, h.timestamp, boundary)
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

    def earliest_store_time(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = QueueRequestHeader.from_ext(cmd.ext_fields)
        ts = self.ctx.store.earliest_store_time(h.topic, h.queueId)
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"timestamp": str(ts)})
