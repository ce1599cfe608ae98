"""Exceptions raised by the codec; each carries the response code a server should answer with."""
from .codes import ResponseCode


class CodedError(Exception):
    """An error carrying a response code: its class's ``code``, or the one it is raised with."""

    code: int

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class ProtocolError(CodedError):
    """Base class; ``code`` is the response code that reports the error to a peer."""

    code: int = ResponseCode.SYSTEM_ERROR


class FrameError(ProtocolError):
    """The byte stream cannot be framed (bad length, oversized frame): the connection must be closed."""


class HeaderError(ProtocolError):
    """A header is undecodable, or a command's required field is missing or malformed."""


class MessageFormatError(ProtocolError):
    """A stored-message record, batch body or property string is malformed."""

    code = ResponseCode.MESSAGE_ILLEGAL
