"""Client exceptions. Broker errors carry the response code and remark; ``error_for`` picks the class."""
from __future__ import annotations

from halfmq.protocol.codes import ResponseCode
from halfmq.protocol.errors import CodedError


class ClientError(CodedError):
    """Base class. ``code`` is the broker's response code, or -1 for a local failure."""

    code: int = -1


class RequestTimeoutError(ClientError):
    """No response within the request's timeout."""


class ConnectionClosedError(ClientError):
    """The connection closed before the response arrived."""


class AddressError(ClientError, ValueError):
    """An address that is not HOST:PORT."""


class MessageTooLargeError(ClientError):
    """A message body larger than the producer's ``max_message_size``: refused before it is sent."""

    code = ResponseCode.MESSAGE_ILLEGAL


class BrokerError(ClientError):
    """The broker answered with an error code."""

    def __init__(self, code: int, remark: str | None):
        super().__init__(f"broker error {code} ({_name(code)}): {remark or ''}", code)
        self.remark = remark


class TopicNotExistError(BrokerError):
    pass


class NoPermissionError(BrokerError):
    pass


class MessageIllegalError(BrokerError):
    pass


class IllegalOperationError(BrokerError):
    pass


_BY_CODE = {ResponseCode.TOPIC_NOT_EXIST: TopicNotExistError, ResponseCode.NO_PERMISSION: NoPermissionError,
            ResponseCode.MESSAGE_ILLEGAL: MessageIllegalError, ResponseCode.ILLEGAL_OPERATION: IllegalOperationError}


def _name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return "UNKNOWN"


def error_for(code: int, remark: str | None) -> BrokerError:
    return _BY_CODE.get(code, BrokerError)(code, remark)
