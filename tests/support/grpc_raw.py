"""A raw RocketMQ 5 gRPC peer (grpc.aio and the broker's own schema): any request, well formed or not, signed as
any account with any client id, and the broker's answers exactly as sent (the official client folds status codes
into a few exception types and never sends a malformed request)."""
from __future__ import annotations

import hashlib
import hmac
import time

import grpc

from halfmq.broker.grpc.schema import SERVICE, rpc_types

#: the broker accepts 64 MiB messages; the client must not refuse its answers or an oversized request first
_OPTIONS = [("grpc.max_receive_message_length", 128 << 20), ("grpc.max_send_message_length", 128 << 20)]


def signed_metadata(client_id: str, access_key: str | None = None, secret_key: str = "") -> tuple:
    """The metadata a 5.x client sends: its client id and, with an account, the MQv2-HMAC-SHA1 signature of
    x-mq-date-time (broker/grpc/auth.py)."""
    now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    meta = [("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"),
            ("x-mq-date-time", now)]
    if access_key is not None:
        signature = hmac.new(secret_key.encode(), now.encode(), hashlib.sha1).hexdigest()
        meta.append(("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, "
                                      f"Signature={signature}"))
    return tuple(meta)


class GrpcRaw:
    """One grpc.aio channel (one HTTP/2 connection) to a gRPC endpoint; ``stub(name)`` is the multi-callable of a
    MessagingService method, with the broker's request and response classes."""

    def __init__(self, endpoint: str):
        self.channel = grpc.aio.insecure_channel(endpoint, options=_OPTIONS)
        self._stubs: dict[str, object] = {}

    def stub(self, name: str):
        stub = self._stubs.get(name)
        if stub is None:
            request_cls, response_cls, client_streams, server_streams = rpc_types(name)
            kind = {(False, False): self.channel.unary_unary, (False, True): self.channel.unary_stream,
                    (True, True): self.channel.stream_stream}[(client_streams, server_streams)]
            stub = self._stubs[name] = kind(f"/{SERVICE}/{name}", request_serializer=request_cls.SerializeToString,
                                            response_deserializer=response_cls.FromString)
        return stub

    async def close(self) -> None:
        await self.channel.close()
