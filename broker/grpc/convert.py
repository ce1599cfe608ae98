"""The one place a gRPC ``Message`` becomes a stored record and a stored record becomes a gRPC ``Message``.

The record is the remoting one (protocol/message.py): RocketMQ 5's system properties map onto the reserved
properties the 4.x clients read (tag → TAGS, keys → KEYS, message id → UNIQ_KEY, message group → __SHARDINGKEY,
delivery timestamp → TIMER_DELIVER_MS, transaction → TRAN_MSG), so a message sent over either protocol is read
over the other unchanged.

A body is inflated (a gRPC gzip body on the way in, a remoting zlib body on the way out) into at most
maxMessageSize bytes: a small compressed body never becomes a large one in memory.
"""
from __future__ import annotations

import hashlib
import zlib

from halfmq.protocol import properties as P
from halfmq.protocol.codes import SysFlag
from halfmq.protocol.message import MessageRecord, create_offset_msg_id

from ..errors import BrokerError, Failure
from ..topics import message_type
from .schema import Code, DigestType, Encoding, MessageType, pb
from .status import GrpcError

_TYPES_BY_NAME = {"NORMAL": MessageType["NORMAL"], "FIFO": MessageType["FIFO"], "DELAY": MessageType["DELAY"],
                  "TRANSACTION": MessageType["TRANSACTION"]}
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_ZLIB_WBITS = zlib.MAX_WBITS

class BodyError(ValueError):
    """A compressed body that does not inflate, or inflates to more than the limit (``too_large``)."""

    def __init__(self, message: str, too_large: bool):
        super().__init__(message)
        self.too_large = too_large


def inflate(data: bytes, wbits: int, limit: int) -> bytes:
    """``data`` decompressed, never holding more than ``limit`` + 1 bytes of output.

    Raises:
        BodyError: it does not decompress, is truncated, or its output is larger than ``limit``.
    """
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise BodyError(f"the compressed body does not decompress: {exc}", too_large=False) from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise BodyError(f"the body decompresses to more than maxMessageSize {limit} bytes", too_large=True)
    if not inflater.eof:
        raise BodyError("the compressed body is truncated", too_large=False)
    return out


def _timestamp_ms(timestamp, what: str, code: str) -> int:
    """A Timestamp as ms since the epoch.

    Raises:
        GrpcError: ``code``, the timestamp is outside the years 1..9999 protobuf allows.
    """
    try:
        return timestamp.ToMilliseconds()
    except ValueError:
        raise GrpcError(Code[code], f"the {what} ({timestamp.seconds} s) is not a valid time") from None


def _set_ms(timestamp, ms: int) -> None:
    """Set a Timestamp of an outgoing message; a stored time protobuf cannot show (a remoting client may store
    any number) leaves it unset rather than making the message undeliverable."""
    try:
        timestamp.FromMilliseconds(ms)
    except (ValueError, OverflowError):
        timestamp.Clear()


def peer_host(peer: str) -> str:
    """grpc's peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``) as the record's ``ip:port``."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and rest:
        return rest
    return "127.0.0.1:0"  # a unix socket or an unknown transport: the record needs some host


def to_record(msg, born_host: str, store_host: str, max_body: int) -> MessageRecord:
    """The record storing ``msg`` (its topic and queue are set by the caller).

    Raises:
        GrpcError: a user property with a reserved name, a type its properties contradict, a time protobuf
            cannot hold, or a gzip body that does not inflate (MESSAGE_CORRUPTED).
        BrokerError: BODY_TOO_LARGE, a gzip body that inflates to more than ``max_body`` bytes.
    """
    sp = msg.system_properties
    props: dict[str, str] = {}
    for key, value in msg.user_properties.items():
        if key in P.RESERVED_KEYS:
            raise GrpcError(Code["ILLEGAL_MESSAGE_PROPERTY_KEY"], f"the property name {key!r} is reserved")
        props[key] = value
    if sp.HasField("tag"):
        props[P.TAGS] = sp.tag
    if sp.keys:
        props[P.KEYS] = " ".join(sp.keys)
    if sp.message_id:
        props[P.UNIQ_KEY] = sp.message_id
    kind = sp.message_type
    if sp.HasField("message_group"):
        if kind != MessageType["FIFO"]:
            raise GrpcError(Code["MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"], "only a FIFO message has a message group")
        props[P.SHARDING_KEY] = sp.message_group
    elif kind == MessageType["FIFO"]:
        raise GrpcError(Code["ILLEGAL_MESSAGE_GROUP"], "a FIFO message needs a message group")
    if sp.HasField("delivery_timestamp"):
        if kind != MessageType["DELAY"]:
            raise GrpcError(Code["MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"],
                            "only a DELAY message has a delivery timestamp")
        props[P.TIMER_DELIVER_MS] = str(_timestamp_ms(sp.delivery_timestamp, "delivery timestamp",
                                                      "ILLEGAL_DELIVERY_TIME"))
    elif kind == MessageType["DELAY"]:
        raise GrpcError(Code["ILLEGAL_DELIVERY_TIME"], "a DELAY message needs a delivery timestamp")
    if kind == MessageType["TRANSACTION"]:
        props[P.TRAN_MSG] = "true"
        if sp.HasField("orphaned_transaction_recovery_duration"):
            props[P.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(
                max(1, sp.orphaned_transaction_recovery_duration.ToSeconds()))
    elif kind not in (MessageType["NORMAL"], MessageType["FIFO"], MessageType["DELAY"]):
        raise GrpcError(Code["UNSUPPORTED"], f"message type {kind} is not served (NORMAL, FIFO, DELAY and "
                                             f"TRANSACTION are)")
    body = msg.body
    if sp.body_encoding == Encoding["GZIP"]:
        try:
            body = inflate(body, _GZIP_WBITS, max_body)
        except BodyError as exc:
            if exc.too_large:
                raise BrokerError(Failure.BODY_TOO_LARGE, f"gzip body: {exc}") from None
            raise GrpcError(Code["MESSAGE_CORRUPTED"], f"gzip body: {exc}") from None
    born_ms = 0
    if sp.HasField("born_timestamp"):
        born_ms = _timestamp_ms(sp.born_timestamp, "born timestamp", "BAD_REQUEST")
    return MessageRecord(topic=msg.topic.name, body=body, born_timestamp=born_ms, born_host=born_host,
                         store_host=store_host, properties=props)


def to_message(rec: MessageRecord, namespace: str = "", receipt_handle: str | None = None,
               attempts: int | None = None, invisible_ms: int | None = None, *, max_body: int):
    """The gRPC Message showing ``rec`` (decoded, with its topic as the consumer should see it).

    Raises:
        BodyError: a remoting-compressed body that does not inflate into ``max_body`` bytes.
    """
    props = rec.properties
    msg = pb.Message()
    msg.topic.name = rec.topic
    msg.topic.resource_namespace = namespace
    for key, value in props.items():
        if key not in P.RESERVED_KEYS:
            msg.user_properties[key] = value
    body = rec.body
    if rec.sys_flag & SysFlag.COMPRESSED:
        # remoting compresses with zlib, gRPC with gzip: it is sent plain
        body = inflate(body, _ZLIB_WBITS, max_body)
    msg.body = body
    sp = msg.system_properties
    if P.TAGS in props:
        sp.tag = props[P.TAGS]
    if props.get(P.KEYS):
        sp.keys.extend(props[P.KEYS].split())
    sp.message_id = props.get(P.UNIQ_KEY) or create_offset_msg_id(rec.store_host, rec.physical_offset)
    # MD5 in upper-case hex, as the reference proxy sends: every official client checks it the same way (they read
    # a CRC32 checksum differently, and some flagged good messages as corrupted)
    sp.body_digest.type = DigestType["MD5"]
    sp.body_digest.checksum = hashlib.md5(body).hexdigest().upper()
    sp.body_encoding = Encoding["IDENTITY"]
    sp.message_type = _TYPES_BY_NAME[message_type(props)]
    _set_ms(sp.born_timestamp, rec.born_timestamp)
    sp.born_host = rec.born_host.rsplit(":", 1)[0].strip("[]")
    _set_ms(sp.store_timestamp, rec.store_timestamp)
    sp.store_host = rec.store_host
    deliver = props.get(P.TIMER_DELIVER_MS) or props.get(P.TIMER_OUT_MS)
    if deliver and deliver.isdigit():
        _set_ms(sp.delivery_timestamp, int(deliver))
    sp.queue_id = rec.queue_id
    sp.queue_offset = rec.queue_offset
    if P.SHARDING_KEY in props:
        sp.message_group = props[P.SHARDING_KEY]
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if attempts is not None:
        sp.delivery_attempt = attempts
    if invisible_ms is not None:
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    return msg
