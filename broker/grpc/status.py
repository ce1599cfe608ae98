"""gRPC answers' ``Status``: the reference's Code for every failure, built in one place.

A handler raises ``GrpcError(code, message)`` for what it refuses itself; a failure of the shared broker code
(BrokerError, store errors) is mapped from its remoting response code by ``status_for``, the same mapping the
reference proxy makes (its ``ResponseCode`` → ``Code`` table).
"""
from __future__ import annotations

import logging

from halfmq.protocol.codes import ResponseCode

from ..errors import error_answer
from .schema import Code, pb

log = logging.getLogger(__name__)

_FROM_REMOTING = {
    ResponseCode.SYSTEM_ERROR: Code["INTERNAL_SERVER_ERROR"],
    ResponseCode.SYSTEM_BUSY: Code["TOO_MANY_REQUESTS"],
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: Code["NOT_IMPLEMENTED"],
    ResponseCode.MESSAGE_ILLEGAL: Code["BAD_REQUEST"],
    ResponseCode.SERVICE_NOT_AVAILABLE: Code["INTERNAL_SERVER_ERROR"],
    ResponseCode.NO_PERMISSION: Code["FORBIDDEN"],
    ResponseCode.TOPIC_NOT_EXIST: Code["TOPIC_NOT_FOUND"],
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: Code["CONSUMER_GROUP_NOT_FOUND"],
    ResponseCode.ILLEGAL_OPERATION: Code["BAD_REQUEST"],
    ResponseCode.FLOW_CONTROL: Code["TOO_MANY_REQUESTS"],
}


class GrpcError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def ok(message: str = "OK"):
    return pb.Status(code=Code["OK"], message=message)


def status(code: int, message: str):
    return pb.Status(code=code, message=message)


def status_for(exc: BaseException):
    """The Status answering ``exc``; an unexpected failure is logged and answered INTERNAL_SERVER_ERROR."""
    if isinstance(exc, GrpcError):
        return status(exc.code, exc.message)
    answer = error_answer(exc)
    if answer is None:
        log.exception("gRPC request failed", exc_info=exc)
        return status(Code["INTERNAL_SERVER_ERROR"], f"{type(exc).__name__}: {exc}")
    code, remark = answer
    return status(_FROM_REMOTING.get(code, Code["INTERNAL_SERVER_ERROR"]), remark)
