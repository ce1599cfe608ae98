"""Errors a processor raises, and the one table that turns any failure into a response code and remark.

The dispatcher and held pulls answer every failure through ``error_answer``; the store raises only its own
exception types (store/errors.py), which are mapped here.
"""
from __future__ import annotations

from halfmq.protocol.codes import ResponseCode
from halfmq.protocol.errors import ProtocolError
from halfmq.store import errors as store_errors


class BrokerError(Exception):
    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code = code
        self.remark = remark


def system_error(remark: str) -> BrokerError:
    return BrokerError(ResponseCode.SYSTEM_ERROR, remark)


#: Store exception → response code, most specific first.
_STORE_CODES: tuple[tuple[type, int], ...] = (
    (store_errors.StoreFullError, ResponseCode.SERVICE_NOT_AVAILABLE),
    (store_errors.StoreClosedError, ResponseCode.SERVICE_NOT_AVAILABLE),
    (store_errors.StoreUnavailableError, ResponseCode.SERVICE_NOT_AVAILABLE),
    (store_errors.InvalidWriteError, ResponseCode.MESSAGE_ILLEGAL),
    (store_errors.HalfConflictError, ResponseCode.ILLEGAL_OPERATION),
    (store_errors.StoreError, ResponseCode.SYSTEM_ERROR),  # corrupt record, unknown half, other store failures
)


def error_answer(exc: BaseException) -> tuple[int, str] | None:
    """(response code, remark) for an expected failure; None for an unexpected one (a bug: log it)."""
    if isinstance(exc, BrokerError):
        return exc.code, exc.remark
    if isinstance(exc, ProtocolError):
        return exc.code, str(exc)
    for kind, code in _STORE_CODES:
        if isinstance(exc, kind):
            return code, str(exc)
    return None
