"""A broker group's replication for operators (admin codes): HALFMQ_GET_REPLICATION, the member's role, sequence,
committed sequence, and as leader the in-sync set and each follower's acknowledged record and lag; and
HALFMQ_SWITCH_LEADER (``halfmq admin switchLeader``), sent to the leader, naming the follower to take over."""
from __future__ import annotations

import json

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand

from ..errors import BrokerError, Failure


class ReplicationProcessor:
    def __init__(self, member):
        self.member = member

    def register(self, dispatcher) -> None:
        dispatcher.register(RequestCode.HALFMQ_GET_REPLICATION, self.status)
        dispatcher.register(RequestCode.HALFMQ_SWITCH_LEADER, self.switch)

    def status(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(self.member.status()).encode())

    async def switch(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        raw = cmd.ext_fields.get("brokerId", "")
        if not raw.isdigit() or int(raw) <= 0:
            raise BrokerError(Failure.BAD_REQUEST, f"HALFMQ_SWITCH_LEADER: brokerId {raw!r} is not a follower's id")
        result = await self.member.switch(int(raw))
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(result).encode())
