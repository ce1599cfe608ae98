"""The broker's failures, and the one table that turns any of them into a remoting answer or a gRPC status.

The messaging service (broker/messaging/) and the components under it raise ``BrokerError`` with a ``Failure`` —
what went wrong in the broker's own terms — or, for failures the remoting protocol names by itself, a remoting
response code. The store raises only its own exception types (store/errors.py), mapped here too. Each door asks
this module how to answer:

- remoting: ``error_answer(exc)`` → (response code, remark);
- gRPC: ``grpc_code_name(exc)`` → the name of apache.rocketmq.v2's ``Code`` (the name, so this module needs no
  protobuf: the grpc extra is optional), with the same remark.

A protocol adapter never maps an error itself; a new failure is one row of ``Failure``.
"""
from __future__ import annotations

import enum

from halfmq.protocol.codes import ResponseCode
from halfmq.protocol.errors import ProtocolError
from halfmq.store import errors as store_errors
from halfmq.store.receipts import ReceiptError

R = ResponseCode


@enum.unique
class Failure(enum.Enum):
    """A refusal in the broker's terms: (remoting response code, gRPC Code name). The remoting codes are what a
    RocketMQ 4.x broker answers for it, the gRPC ones what the reference proxy answers."""

    TOPIC_NOT_FOUND = (R.TOPIC_NOT_EXIST, "TOPIC_NOT_FOUND")
    ILLEGAL_TOPIC = (R.SYSTEM_ERROR, "ILLEGAL_TOPIC")
    ILLEGAL_GROUP = (R.SYSTEM_ERROR, "ILLEGAL_CONSUMER_GROUP")
    GROUP_NOT_FOUND = (R.SUBSCRIPTION_GROUP_NOT_EXIST, "CONSUMER_GROUP_NOT_FOUND")
    FORBIDDEN = (R.NO_PERMISSION, "FORBIDDEN")
    BODY_EMPTY = (R.MESSAGE_ILLEGAL, "MESSAGE_BODY_EMPTY")
    BODY_TOO_LARGE = (R.MESSAGE_ILLEGAL, "MESSAGE_BODY_TOO_LARGE")
    BAD_MESSAGE = (R.MESSAGE_ILLEGAL, "BAD_REQUEST")
    TYPE_CONFLICT = (R.MESSAGE_ILLEGAL, "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE")
    ILLEGAL_DELIVERY_TIME = (R.MESSAGE_ILLEGAL, "ILLEGAL_DELIVERY_TIME")
    BUSY = (R.SYSTEM_BUSY, "TOO_MANY_REQUESTS")
    BAD_REQUEST = (R.SYSTEM_ERROR, "BAD_REQUEST")
    UNKNOWN_TRANSACTION = (R.SYSTEM_ERROR, "INVALID_TRANSACTION_ID")
    SIGNATURE_EXPIRED = (R.NO_PERMISSION, "UNAUTHORIZED")
    #: a broker group cannot take a write here: this member follows (a RocketMQ slave's answer), or too few copies
    #: are in sync. Code 14, which producers retry elsewhere; never "stored on one copy" (10, 11, 12 read as sent)
    NOT_REPLICATED = (R.SERVICE_NOT_AVAILABLE, "HA_NOT_AVAILABLE")
    #: a leadership hand-over refused because its target follower did not catch up in time
    FOLLOWER_BEHIND = (R.SYSTEM_ERROR, "HA_NOT_AVAILABLE")
    #: the remoting door's own refusals, with the codes a RocketMQ 4.x broker answers them with
    MESSAGE_MISSING = (R.SYSTEM_ERROR, "MESSAGE_NOT_FOUND")  #: no message at the offset a request names
    NOT_ONLINE = (R.SYSTEM_ERROR, "NOT_FOUND")  #: a group with no producer or consumer connected
    CONSUMERS_OFFLINE = (R.CONSUMER_NOT_ONLINE, "CONSUMER_GROUP_NOT_FOUND")
    KEY_NOT_FOUND = (R.QUERY_NOT_FOUND, "MESSAGE_NOT_FOUND")  #: no message with the key looked up
    OFFSET_NOT_FOUND = (R.QUERY_NOT_FOUND, "OFFSET_NOT_FOUND")  #: no committed offset of the group
    UNSUPPORTED_FILTER = (R.SYSTEM_ERROR, "ILLEGAL_FILTER_EXPRESSION")  #: a filter type other than tags
    NO_SUBSCRIPTION = (R.SUBSCRIPTION_NOT_EXIST, "BAD_REQUEST")  #: a pull of a topic the group did not subscribe to
    STALE_SUBSCRIPTION = (R.SUBSCRIPTION_NOT_LATEST, "BAD_REQUEST")  #: a pull naming an older subscription
    #: a receive's or invisibility change's duration outside what the receipt model takes (no remoting door has them)
    ILLEGAL_INVISIBLE_TIME = (R.SYSTEM_ERROR, "ILLEGAL_INVISIBLE_TIME")
    ILLEGAL_POLLING_TIME = (R.SYSTEM_ERROR, "ILLEGAL_POLLING_TIME")
    #: a receipt handle that names no receipt held now (acknowledged, handed out again, another broker's, garbled)
    INVALID_RECEIPT = (R.SYSTEM_ERROR, "INVALID_RECEIPT_HANDLE")

    def __init__(self, remoting: int, grpc: str):
        self.remoting = remoting
        self.grpc = grpc


#: The gRPC Code of a failure known only by its remoting response code (the reference proxy's ResponseCode →
#: Code table); a code not listed is INTERNAL_SERVER_ERROR.
_GRPC_BY_REMOTING = {
    R.SYSTEM_ERROR: "INTERNAL_SERVER_ERROR",
    R.SYSTEM_BUSY: "TOO_MANY_REQUESTS",
    R.REQUEST_CODE_NOT_SUPPORTED: "NOT_IMPLEMENTED",
    R.MESSAGE_ILLEGAL: "BAD_REQUEST",
    R.SERVICE_NOT_AVAILABLE: "INTERNAL_SERVER_ERROR",
    R.NO_PERMISSION: "FORBIDDEN",
    R.TOPIC_NOT_EXIST: "TOPIC_NOT_FOUND",
    R.SUBSCRIPTION_GROUP_NOT_EXIST: "CONSUMER_GROUP_NOT_FOUND",
    R.ILLEGAL_OPERATION: "BAD_REQUEST",
    R.FLOW_CONTROL: "TOO_MANY_REQUESTS",
}


class BrokerError(Exception):
    """A refusal: ``BrokerError(Failure.X, remark)``, or ``BrokerError(response_code, remark)`` for one the
    remoting protocol names itself. ``code`` is the remoting response code either way."""

    def __init__(self, failure: Failure | int, remark: str):
        super().__init__(remark)
        if isinstance(failure, Failure):
            self.failure: Failure | None = failure
            self.code = failure.remoting
        else:
            self.failure = None
            self.code = failure
        self.remark = remark


#: Store exception → failure, most specific first.
_STORE_FAILURES: tuple[tuple[type, Failure | int], ...] = (
    (store_errors.StoreFullError, R.SERVICE_NOT_AVAILABLE),
    (store_errors.StoreClosedError, R.SERVICE_NOT_AVAILABLE),
    (store_errors.StoreUnavailableError, R.SERVICE_NOT_AVAILABLE),
    (store_errors.NotLeaderError, Failure.NOT_REPLICATED),
    (store_errors.ReplicationError, Failure.NOT_REPLICATED),
    (store_errors.InvalidWriteError, Failure.BAD_MESSAGE),
    (store_errors.HalfNotFoundError, Failure.UNKNOWN_TRANSACTION),
    (store_errors.HalfMismatchError, Failure.UNKNOWN_TRANSACTION),
    (store_errors.HalfConflictError, R.ILLEGAL_OPERATION),
    (ReceiptError, Failure.INVALID_RECEIPT),
    (store_errors.StoreError, R.SYSTEM_ERROR),  # corrupt record, other store failures
)


def as_broker_error(exc: BaseException) -> BrokerError | None:
    """``exc`` as the BrokerError it answers as; None for an unexpected failure (a bug: log it)."""
    if isinstance(exc, BrokerError):
        return exc
    if isinstance(exc, ProtocolError):
        return BrokerError(exc.code, str(exc))
    for kind, failure in _STORE_FAILURES:
        if isinstance(exc, kind):
            return BrokerError(failure, str(exc))
    return None


def error_answer(exc: BaseException) -> tuple[int, str] | None:
    """(remoting response code, remark) for an expected failure; None for an unexpected one (a bug: log it)."""
    error = as_broker_error(exc)
    return None if error is None else (error.code, error.remark)


def grpc_code_name(error: BrokerError) -> str:
    """The name of the gRPC Code answering ``error``."""
    if error.failure is not None:
        return error.failure.grpc
    return _GRPC_BY_REMOTING.get(error.code, "INTERNAL_SERVER_ERROR")
