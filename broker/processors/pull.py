"""PULL_MESSAGE (11) with tag filtering and long polling (reference §3.6).

A held pull is answered through the dispatcher like any request in progress (a Deferred on its wake-up future).
When it wakes while its connection's reader is behind (``Channel.unread_bytes`` over
``serverMaxUnreadBytesPerConnection``), it is answered without records (PULL_RETRY_IMMEDIATELY at the same offset):
a connection that does not read its answers never gets more than one read's worth of them built.
"""
from __future__ import annotations

from halfmq.protocol.codes import PullSysFlag, RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import PullMessageRequestHeader

from ..context import BrokerContext
from ..dispatch import Deferred
from ..errors import BrokerError, Failure
from ..messaging.consumer import ConsumerService
from ..names import check_group, check_topic
from ..services.clients import parse_subscription
from ..services.long_poll import HeldPull


#: Stock clients hold for 15 s (Java) or 20 s (Go); anything longer is capped.
MAX_SUSPEND_MS = 60_000


class PullProcessor:
    def __init__(self, ctx: BrokerContext, consumer: ConsumerService):
        self.ctx = ctx
        self.consumer = consumer
        self.max_count = ctx.config.maxTransferCountOnMessageInMemory
        self.max_bytes = ctx.config.maxTransferBytesOnMessageInMemory
        self.max_unread = ctx.config.serverMaxUnreadBytesPerConnection
        ctx.long_poll.configure(ctx.config.longPollingMaxHeldPerConnection, ctx.config.longPollingMaxHeld)

    def register(self, dispatcher) -> None:
        dispatcher.register(RequestCode.PULL_MESSAGE, self.pull)
        dispatcher.on_channel_closed(self.ctx.long_poll.channel_closed)

    def pull(self, channel, cmd: RemotingCommand) -> RemotingCommand | None:
        header = PullMessageRequestHeader.from_ext(cmd.ext_fields)
        # Checked on every pull, not only one that commits an offset: the group also keys the subscription and
        # the metrics, and a refused name is then refused the same way whatever the flags.
        check_group(header.consumerGroup, "consumerGroup")
        check_topic(header.topic, "topic")
        return self.process(channel, cmd, header, first=True)

    def _filter(self, header: PullMessageRequestHeader):
        if header.sysFlag & PullSysFlag.SUBSCRIPTION:
            if (header.expressionType or "TAG") != "TAG":
                raise BrokerError(Failure.UNSUPPORTED_FILTER,
                                  "The broker does not support consumer to filter message by "
                                  f"{header.expressionType}")
            return parse_subscription(header.topic, header.subscription).tag_codes
        sub = self.ctx.consumers.subscription(header.consumerGroup, header.topic)
        if sub is None:
            raise BrokerError(Failure.NO_SUBSCRIPTION,
                              f"the consumer's subscription not exist, group: {header.consumerGroup}")
        if sub.sub_version < header.subVersion:
            raise BrokerError(Failure.STALE_SUBSCRIPTION, "the consumer's subscription not latest")
        return sub.tag_codes

    def process(self, channel, cmd: RemotingCommand, header: PullMessageRequestHeader,
                first: bool) -> RemotingCommand | None:
        ctx = self.ctx
        topic, queue_id, offset = header.topic, header.queueId, header.queueOffset
        config = self.consumer.readable_topic(topic)
        self.consumer.check_queue(config, queue_id)
        tag_codes = self._filter(header)
        if first and header.sysFlag & PullSysFlag.COMMIT_OFFSET:
            ctx.offsets.commit(header.consumerGroup, topic, queue_id, header.commitOffset)
        store = ctx.store
        min_offset = store.min_offset(topic, queue_id)
        max_offset = store.max_offset(topic, queue_id)
        body = b""
        if max_offset == 0:
            code = ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
            next_offset, remark = 0, "NO_MESSAGE_IN_QUEUE"
        elif offset < min_offset:
            code, next_offset, remark = ResponseCode.PULL_OFFSET_MOVED, min_offset, "OFFSET_TOO_SMALL"
        elif offset == max_offset:
            code, next_offset, remark = ResponseCode.PULL_NOT_FOUND, offset, "OFFSET_OVERFLOW_ONE"
        elif offset > max_offset:
            code, next_offset, remark = ResponseCode.PULL_OFFSET_MOVED, max_offset, "OFFSET_OVERFLOW_BADLY"
        else:
            wanted = max(1, min(header.maxMsgNums, self.max_count))
            records, next_offset = store.read_queue(topic, queue_id, offset, wanted, tag_codes, self.max_bytes)
            if records:
                code, remark, body = ResponseCode.SUCCESS, "FOUND", b"".join(records)
                if ctx.metrics is not None:
                    ctx.metrics.message_out(topic, header.consumerGroup, len(records), len(body))
            else:
                code, remark = ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE"
        if (code == ResponseCode.PULL_NOT_FOUND and first and header.sysFlag & PullSysFlag.SUSPEND
                and ctx.config.longPollingEnable and header.suspendTimeoutMillis > 0):
            hold_s = min(header.suspendTimeoutMillis, MAX_SUSPEND_MS) / 1000
            pull = HeldPull(topic, queue_id, offset, channel)
            ctx.long_poll.hold(pull, hold_s)
            return Deferred(pull.future, lambda _woken: self.resume(channel, cmd, header))
        return cmd.response(code, remark, {
            "suggestWhichBrokerId": "0", "nextBeginOffset": str(next_offset),
            "minOffset": str(min_offset), "maxOffset": str(max_offset)}, body)

    def resume(self, channel, cmd: RemotingCommand, header: PullMessageRequestHeader) -> RemotingCommand:
        """A held pull woke up: run it once more, without holding, unless its reader is behind."""
        if channel.unread_bytes > self.max_unread:
            store = self.ctx.store
            return cmd.response(ResponseCode.PULL_RETRY_IMMEDIATELY, "the connection's answers are not being read", {
                "suggestWhichBrokerId": "0", "nextBeginOffset": str(header.queueOffset),
                "minOffset": str(store.min_offset(header.topic, header.queueId)),
                "maxOffset": str(store.max_offset(header.topic, header.queueId))})
        return self.process(channel, cmd, header, first=False)
