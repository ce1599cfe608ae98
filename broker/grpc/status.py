"""gRPC answers' ``Status``, built in one place.

A handler raises ``GrpcError(code, message)`` only for what the gRPC form of a request gets wrong (a missing field,
a handle that does not parse); every other refusal is a ``BrokerError`` (or a store error) whose gRPC Code comes
from the broker's one error table (broker/errors.py), the table the remoting door answers from too.
"""
from __future__ import annotations

import logging

from ..errors import as_broker_error, grpc_code_name
from .schema import Code, pb

log = logging.getLogger(__name__)


class GrpcError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def ok(message: str = "OK"):
    return pb.Status(code=Code["OK"], message=message)


#: ``ok()`` made once, to copy into answers (``CopyFrom``, a constructor's argument): never changed itself
OK = ok()


def status(code: int, message: str):
    return pb.Status(code=code, message=message)


def status_for(exc: BaseException):
    """The Status answering ``exc``; an unexpected failure is logged and answered INTERNAL_SERVER_ERROR."""
    if isinstance(exc, GrpcError):
        return status(exc.code, exc.message)
    error = as_broker_error(exc)
    if error is None:
        log.exception("gRPC request failed", exc_info=exc)
        return status(Code["INTERNAL_SERVER_ERROR"], f"{type(exc).__name__}: {exc}")
    return status(Code[grpc_code_name(error)], error.remark)
