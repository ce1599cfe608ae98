"""PULL_MESSAGE (11) with tag filtering and long polling (reference §3.6): the remoting adapter of
``ConsumerService.pull`` (a ``PullRequest`` decoded from the header, its ``Pulled`` encoded as the answer).

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
from ..messaging.consumer import ConsumerService, PullRequest, PullStatus
from ..names import check_group, check_topic
from ..services.long_poll import HeldPull


#: Stock clients hold for 15 s (Java) or 20 s (Go); anything longer is capped.
MAX_SUSPEND_MS = 60_000
#: the service's outcome of a pull → its remoting code
_CODES = {PullStatus.FOUND: ResponseCode.SUCCESS, PullStatus.NOT_FOUND: ResponseCode.PULL_NOT_FOUND,
          PullStatus.NO_MATCH: ResponseCode.PULL_RETRY_IMMEDIATELY,
          PullStatus.OFFSET_MOVED: ResponseCode.PULL_OFFSET_MOVED}


class PullProcessor:
    def __init__(self, ctx: BrokerContext, consumer: ConsumerService):
        self.ctx = ctx
        self.consumer = consumer
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

    def process(self, channel, cmd: RemotingCommand, header: PullMessageRequestHeader,
                first: bool) -> RemotingCommand | None:
        subscribed = header.sysFlag & PullSysFlag.SUBSCRIPTION
        request = PullRequest(header.consumerGroup, header.topic, header.queueId, header.queueOffset,
                              header.maxMsgNums,
                              (header.expressionType, header.subscription) if subscribed else None,
                              header.subVersion,
                              header.commitOffset if first and header.sysFlag & PullSysFlag.COMMIT_OFFSET else None)
        pulled = self.consumer.pull(request)
        code = _CODES[pulled.status]
        if (code == ResponseCode.PULL_NOT_FOUND and first and header.sysFlag & PullSysFlag.SUSPEND
                and self.ctx.config.longPollingEnable and header.suspendTimeoutMillis > 0):
            hold_s = min(header.suspendTimeoutMillis, MAX_SUSPEND_MS) / 1000
            pull = HeldPull(header.topic, header.queueId, header.queueOffset, channel)
            self.ctx.long_poll.hold(pull, hold_s)
            return Deferred(pull.future, lambda _woken: self.resume(channel, cmd, header))
        return cmd.response(code, pulled.remark, {
            "suggestWhichBrokerId": "0", "nextBeginOffset": str(pulled.next_offset),
            "minOffset": str(pulled.min_offset), "maxOffset": str(pulled.max_offset)},
            b"".join(pulled.records) if pulled.records else b"")

    def resume(self, channel, cmd: RemotingCommand, header: PullMessageRequestHeader) -> RemotingCommand:
        """A held pull woke up: run it once more, without holding, unless its reader is behind."""
        if channel.unread_bytes > self.max_unread:
            min_offset, max_offset = self.consumer.queue_bounds(header.topic, header.queueId)
            return cmd.response(ResponseCode.PULL_RETRY_IMMEDIATELY, "the connection's answers are not being read", {
                "suggestWhichBrokerId": "0", "nextBeginOffset": str(header.queueOffset),
                "minOffset": str(min_offset), "maxOffset": str(max_offset)})
        return self.process(channel, cmd, header, first=False)
