"""DELETE_EXPIRED_COMMITLOG (329, mqadmin's deleteExpiredCommitLog): run a retention pass now and answer what it
deleted. Admin only (ADMIN_REQUEST_CODES); passes never overlap, so repeated requests queue behind one another."""
from __future__ import annotations

import json

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand

from .base import Processor, handles


class LifecycleProcessor(Processor):
    @handles(RequestCode.DELETE_EXPIRED_COMMITLOG)
    async def delete_expired(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        result = await self.ctx.retention.run_pass()
        status = self.ctx.retention.status()
        body = {"deleted": result.deleted, "purged": result.purged, "freedBytes": result.freed_bytes,
                "seconds": round(result.seconds, 3), "useRatio": round(status.use_ratio, 4),
                "oldestMessageAgeSeconds": round(status.oldest_age_seconds, 1)}
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())
