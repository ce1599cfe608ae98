"""Stored-message records (reference §4.4), batch bodies (§4.5), identifiers (§4.6) and tag hashes (§4.7).

The broker writes these records to its commit log byte for byte as they go on the wire, so a pull
response is a concatenation of stored records.
"""
from __future__ import annotations

import ipaddress
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate, repeat
from typing import NamedTuple

from .codes import SysFlag
from .errors import MessageFormatError
from .properties import KEYS as P_KEYS
from .properties import NAME_VALUE_SEPARATOR
from .properties import TAGS as P_TAGS
from .properties import UNIQ_KEY, check_properties_size, decode_properties, encode_properties

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
QUEUE_OFFSET_POS = 20
PHYSICAL_OFFSET_POS = 28
SYSFLAG_POS = 36
BORN_HOST_POS = 48

_HEAD = struct.Struct(">iIiiiqqiq")  # totalSize .. bornTimestamp: 48 bytes
#: The sys flag bits that say which host is IPv6 (20 bytes: address + port) rather than IPv4 (8).
HOST_FLAGS = SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6


def _record_head(host_flags: int) -> struct.Struct:
    born = 20 if host_flags & SysFlag.BORNHOST_V6 else 8
    store = 20 if host_flags & SysFlag.STOREHOST_V6 else 8
    return struct.Struct(f">iIiiiqqiq{born}sq{store}siqi")


#: A stored record's fields before its body, by ``sys_flag & HOST_FLAGS``: totalSize, magicCode, bodyCRC, queueId,
#: flag, queueOffset, physicalOffset, sysFlag, bornTimestamp, bornHost (packed), storeTimestamp, storeHost
#: (packed), reconsumeTimes, preparedTransactionOffset, bodyLength. The body follows, then the topic length (one
#: byte, two under MAGIC_V2), the topic, the properties length (two bytes) and the properties.
RECORD_HEADS = {flags: _record_head(flags) for flags in (0, SysFlag.BORNHOST_V6, SysFlag.STOREHOST_V6, HOST_FLAGS)}
_HEAD_SIZES = {flags: head.size for flags, head in RECORD_HEADS.items()}
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")
_BATCH_ENTRY = struct.Struct(">iiiii")  # a batch entry's totalSize, magic, bodyCRC, flag, bodyLength
_HEAD_MAGIC = struct.Struct(">I")
_TAIL_BODY = struct.Struct(">iqi")  # reconsumeTimes, preparedTransactionOffset, bodyLength
_TOPIC_LEN = [bytes((n,)) for n in range(128)]
_TAGS_NAME, _KEYS_NAME = P_TAGS + NAME_VALUE_SEPARATOR, P_KEYS + NAME_VALUE_SEPARATOR
_EMPTY = bytearray()  # bytearray.join: the record comes out mutable (the store stamps it) in one copy


@lru_cache(maxsize=4096)
def pack_host(host: str) -> bytes:
    """'ip:port' (IPv6 as '[ip]:port' or 'ip:port' with colons) → 8 or 20 packed bytes."""
    addr, _, port = host.rpartition(":")
    addr = addr.strip("[]")
    try:
        ip = ipaddress.ip_address(addr)
        return ip.packed + _I32.pack(int(port))
    except ValueError:
        raise MessageFormatError(f"bad host address {host!r}") from None


@lru_cache(maxsize=4096)
def unpack_host(packed: bytes) -> str:
    ip = ipaddress.ip_address(packed[:-4])
    (port,) = _I32.unpack(packed[-4:])
    return f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}"


def body_crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


@dataclass(slots=True)
class MessageRecord:
    """One stored message, decoded."""

    topic: str
    body: bytes = b""
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    store_timestamp: int = 0
    store_host: str = "127.0.0.1:10911"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    body_crc: int = 0
    store_size: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> str | None:
        return self.properties.get("KEYS")

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(UNIQ_KEY)

    @property
    def offset_msg_id(self) -> str:
        return create_offset_msg_id(self.store_host, self.physical_offset)

    @property
    def msg_id(self) -> str:
        """What users see as the message id: UNIQ_KEY when present, else the offsetMsgId."""
        return self.properties.get(UNIQ_KEY) or self.offset_msg_id


def encode_record(rec: MessageRecord, properties_text: str | None = None) -> bytearray:
    """Serialise a record (v1 magic unless the topic needs v2). Host flags follow the host addresses.

    Args:
        properties_text: an already rendered property string, used instead of ``rec.properties``.

    Raises:
        MessageFormatError: properties too long or a bad host.
    """
    born, store, host_flags = _hosts(rec.born_host, rec.store_host)
    name = rec.topic
    magic, topic = _topic_part(name)
    props = (properties_text if properties_text is not None else encode_properties(rec.properties)).encode()
    check_properties_size(props)
    body = rec.body
    size = 48 + len(born) + 8 + len(store) + 12 + 4 + len(body) + len(topic) + 2 + len(props)
    return _EMPTY.join((
        _HEAD.pack(size, magic, body_crc(body), rec.queue_id, rec.flag, rec.queue_offset, rec.physical_offset,
                   (rec.sys_flag & ~HOST_FLAGS) | host_flags, rec.born_timestamp),
        born, _I64.pack(rec.store_timestamp), store,
        _TAIL_BODY.pack(rec.reconsume_times, rec.prepared_transaction_offset, len(body)), body,
        topic, _U16.pack(len(props)), props))


@lru_cache(maxsize=4096)
def _hosts(born_host: str, store_host: str) -> tuple[bytes, bytes, int]:
    """The packed born and store hosts of a record and the host flags they take (a sender's and the broker's
    addresses: few, and every record encodes them)."""
    born, store = pack_host(born_host), pack_host(store_host)
    return born, store, (SysFlag.BORNHOST_V6 if len(born) == 20 else 0) | (
        SysFlag.STOREHOST_V6 if len(store) == 20 else 0)


#: topic names up to this long (every valid name, retry and DLQ topics too) have their field cached
_CACHED_TOPIC_CHARS = 255


def _topic_part(topic: str) -> tuple[int, bytes]:
    """A record's magic code and its topic field (length and name): v2 for a name longer than 127 bytes. The one
    builder of the field (encode_record, rewrite_record, rewritten_size)."""
    return _cached_topic_part(topic) if len(topic) <= _CACHED_TOPIC_CHARS else _build_topic_part(topic)


def _build_topic_part(topic: str) -> tuple[int, bytes]:
    name = topic.encode()
    if len(name) > 127:
        return MAGIC_V2, _U16.pack(len(name)) + name
    return MAGIC_V1, _TOPIC_LEN[len(name)] + name


_cached_topic_part = lru_cache(maxsize=4096)(_build_topic_part)


def store_timestamp_pos(buf, start: int = 0) -> int:
    (sys_flag,) = _I32.unpack_from(buf, start + SYSFLAG_POS)
    return start + BORN_HOST_POS + (20 if sys_flag & SysFlag.BORNHOST_V6 else 8)


def stamp_record(buf: bytearray, queue_offset: int, physical_offset: int, store_timestamp: int) -> None:
    """Write the fields only the store knows into an encoded record, in place."""
    _I64.pack_into(buf, QUEUE_OFFSET_POS, queue_offset)
    _I64.pack_into(buf, PHYSICAL_OFFSET_POS, physical_offset)
    _I64.pack_into(buf, store_timestamp_pos(buf), store_timestamp)


def decode_record(buf, pos: int = 0) -> MessageRecord:
    """Decode the record starting at ``pos``.

    Raises:
        MessageFormatError: truncated or with a bad magic code.
    """
    try:
        (size, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
         born_ts) = _HEAD.unpack_from(buf, pos)
        if magic not in (MAGIC_V1, MAGIC_V2):
            raise MessageFormatError(f"bad magic code {magic:#x} at {pos}")
        if size < _HEAD.size or pos + size > len(buf):
            raise MessageFormatError(f"record size {size} at {pos} exceeds the buffer")
        head = RECORD_HEADS[sys_flag & HOST_FLAGS]
        *_, born, store_ts, store, reconsume, prepared, body_len = head.unpack_from(buf, pos)
        born_host, store_host = unpack_host(born), unpack_host(store)
        p = pos + head.size
        if body_len < 0 or p + body_len > pos + size:
            raise MessageFormatError(f"body length {body_len} out of range")
        body = bytes(buf[p:p + body_len])
        topic, props_text, end = _after_body(buf, p + body_len, magic)
        if end > pos + size:
            raise MessageFormatError("properties run past the record")
        props = decode_properties(props_text)
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, MessageFormatError):
            raise
        raise MessageFormatError(f"truncated or malformed record at {pos}: {exc}") from None
    return MessageRecord(topic=topic, body=body, queue_id=queue_id, flag=flag, queue_offset=queue_offset,
                         physical_offset=physical_offset, sys_flag=sys_flag, born_timestamp=born_ts,
                         born_host=born_host, store_timestamp=store_ts, store_host=store_host,
                         reconsume_times=reconsume, prepared_transaction_offset=prepared,
                         properties=props, body_crc=crc, store_size=size)


def _after_body(buf, p: int, magic: int) -> tuple[str, str, int]:
    """The topic and the raw property string that follow a record's body at ``p``, and where they end.

    Raises:
        struct.error, IndexError, UnicodeDecodeError: truncated or not UTF-8.
    """
    if magic == MAGIC_V2:
        (topic_len,) = _U16.unpack_from(buf, p)
        p += 2
    else:
        topic_len = buf[p]
        p += 1
    topic = bytes(buf[p:p + topic_len]).decode()
    p += topic_len
    (props_len,) = _U16.unpack_from(buf, p)
    p += 2
    return topic, bytes(buf[p:p + props_len]).decode(), p + props_len


def _body_length_pos(buf) -> int:
    """Where the body length of an encoded record is (after the hosts, which are 8 or 20 bytes each).

    Raises:
        struct.error: the record is too short to say.
    """
    (sys_flag,) = _I32.unpack_from(buf, SYSFLAG_POS)
    return RECORD_HEADS[sys_flag & HOST_FLAGS].size - 4


def rewrite_record(buf: bytes, topic: str, queue_id: int, properties_text: str,
                   without_body: bool = False) -> bytearray:
    """A copy of the record ``buf`` with another topic, queue id and property string, everything else kept; with
    ``without_body``, with an empty body too (a batch half's check-back: not the messages it holds).

    Cheaper than decode_record + encode_record where only these fields change (check-back bodies).

    Raises:
        MessageFormatError: ``buf`` is not a well-formed record.
    """
    body = record_body(buf)
    p = _body_length_pos(buf)
    body_end = p + 4 + len(body)
    magic, topic_field = _topic_part(topic)
    props = properties_text.encode()
    check_properties_size(props)
    if without_body:
        out = bytearray(buf[:p])
        out += _I32.pack(0)
        _I32.pack_into(out, 8, body_crc(b""))
    else:
        out = bytearray(buf[:body_end])
    out += topic_field
    out += _U16.pack(len(props))
    out += props
    _I32.pack_into(out, 0, len(out))
    _HEAD_MAGIC.pack_into(out, 4, magic)
    _I32.pack_into(out, 12, queue_id)
    return out


def rewritten_size(buf, topic: str) -> int:
    """The size of ``rewrite_record(buf, topic, ...)`` with ``buf``'s own property string, computed without
    building it (or decoding the record's topic and property string: every commit asks).

    Raises:
        MessageFormatError: ``buf`` is not a well-formed record.
    """
    try:
        start, end = _topic_field(buf)
        (props_len,) = _U16.unpack_from(buf, end)
    except (struct.error, IndexError):
        raise MessageFormatError("truncated or malformed record") from None
    if end + 2 + props_len > len(buf):
        raise MessageFormatError("truncated or malformed record")
    return len(buf) - (end - start) + len(_topic_part(topic)[1])


def _topic_field(buf) -> tuple[int, int]:
    """Where an encoded record's topic field (the name's length, then the name) starts and ends: its property
    string's length follows.

    Raises:
        struct.error, IndexError: the record is too short to say.
    """
    (sys_flag,) = _I32.unpack_from(buf, SYSFLAG_POS)
    p = RECORD_HEADS[sys_flag & HOST_FLAGS].size  # just after the body length
    (body_len,) = _I32.unpack_from(buf, p - 4)
    p += body_len
    if _HEAD_MAGIC.unpack_from(buf, 4)[0] == MAGIC_V2:
        return p, p + 2 + _U16.unpack_from(buf, p)[0]
    return p, p + 1 + buf[p]


def batch_index(buf) -> list[tuple[int, int, int, str | None]]:
    """(start, size, tags code, KEYS) of each record a record's body holds (a batch half's body): where it is in
    ``buf``, and its tags code and KEYS as ``decode_properties`` of its property string gives them. The string is
    parsed only when it names TAGS or KEYS at all: most batch messages (a Spark sink's rows) have neither. One pass
    over ``buf`` by position: a view sliced per record, and a function call per field, were most of committing a
    batch half.

    Raises:
        MessageFormatError: the body is not a concatenation of whole, well-formed records.
    """
    body_len = len(record_body(buf))
    if type(buf) is not bytes:
        buf = bytes(buf)
    pos = base = _body_length_pos(buf) + 4
    end = base + body_len
    unpack_i32, unpack_u16, unpack_magic = _I32.unpack_from, _U16.unpack_from, _HEAD_MAGIC.unpack_from
    heads = _HEAD_SIZES
    index = []
    while pos < end:
        if end - pos < 4:
            raise MessageFormatError(f"{end - pos} bytes after the last record at {pos - base}")
        (size,) = unpack_i32(buf, pos)
        stop = pos + size
        if size < BORN_HOST_POS or stop > end:
            raise MessageFormatError(f"the record at {pos - base} claims {size} bytes; {end - pos} remain")
        try:
            p = pos + heads[unpack_i32(buf, pos + SYSFLAG_POS)[0] & HOST_FLAGS]  # just after the body length
            (own_body,) = unpack_i32(buf, p - 4)
            p += own_body
            p += 2 + unpack_u16(buf, p)[0] if unpack_magic(buf, pos + 4)[0] == MAGIC_V2 else 1 + buf[p]
            props_end = p + 2 + unpack_u16(buf, p)[0]
            # every field read lies before the property string's end: within the record when that end is
            if own_body < 0 or props_end > stop:
                raise IndexError
            text = buf[p + 2:props_end].decode()
        except (struct.error, IndexError, UnicodeDecodeError):
            raise MessageFormatError(f"the record at {pos - base} is truncated or malformed") from None
        # A TAGS or KEYS property is a segment starting "TAGS\x01" or "KEYS\x01": without either, decode_properties
        # cannot find one.
        if _TAGS_NAME not in text and _KEYS_NAME not in text:
            index.append((pos, size, 0, None))
        else:
            props = decode_properties(text)
            index.append((pos, size, tags_hash(props.get(P_TAGS)), props.get(P_KEYS) or None))
        pos = stop
    return index


def batch_spans(buf, sizes, tags_codes) -> list[tuple[int, int, int, None]]:
    """``batch_index`` of a batch half's body whose records' sizes and tags codes are known (recorded when it was
    prepared, none of them with KEYS), without parsing the body: a start per record from the sizes alone.

    Raises:
        MessageFormatError: the sizes do not add up to the body.
    """
    body_len = len(record_body(buf))
    base = _body_length_pos(buf) + 4
    starts = list(accumulate(sizes, initial=base))
    if starts[-1] != base + body_len:
        raise MessageFormatError(f"the records' sizes add up to {starts[-1] - base} bytes, the body holds {body_len}")
    return list(zip(starts, sizes, tags_codes, repeat(None)))


def body_crc_matches(buf) -> bool:
    """Whether the record's stored body CRC matches its body (False too for a record too short to hold one)."""
    try:
        (crc,) = _I32.unpack_from(buf, 8)
        p = _body_length_pos(buf)
        (body_len,) = _I32.unpack_from(buf, p)
    except struct.error:
        return False
    p += 4
    if body_len < 0 or p + body_len > len(buf):
        return False
    return zlib.crc32(memoryview(buf)[p:p + body_len]) & 0x7FFFFFFF == crc


def mark_committed(buf: bytearray, prepared_offset: int) -> None:
    """In place: transaction type := COMMIT and preparedTransactionOffset := ``prepared_offset``."""
    (sys_flag,) = _I32.unpack_from(buf, SYSFLAG_POS)
    _I32.pack_into(buf, SYSFLAG_POS, (sys_flag & ~SysFlag.TRANSACTION_MASK) | SysFlag.TRANSACTION_COMMIT_TYPE)
    _I64.pack_into(buf, _body_length_pos(buf) - 8, prepared_offset)


def record_properties_text(buf) -> str:
    """The raw property string of an encoded record (no other field is decoded)."""
    return record_place(buf).properties_text


def decode_records(buf) -> list[MessageRecord]:
    """Decode a concatenation of records (a pull response body)."""
    out = []
    pos = 0
    end = len(buf)
    while pos < end:
        rec = decode_record(buf, pos)
        out.append(rec)
        pos += rec.store_size
    return out


def record_body(buf) -> memoryview:
    """The body of an encoded record, as a view (no copy, nothing else decoded).

    Raises:
        MessageFormatError: ``buf`` is too short, or its body length runs past it.
    """
    try:
        p = _body_length_pos(buf)
        (body_len,) = _I32.unpack_from(buf, p)
    except struct.error:
        raise MessageFormatError("truncated record") from None
    p += 4
    if body_len < 0 or p + body_len > len(buf):
        raise MessageFormatError("body length out of range")
    return memoryview(buf)[p:p + body_len]


# --- batch bodies (SEND_BATCH_MESSAGE) ---

@dataclass(slots=True)
class BatchItem:
    body: bytes | memoryview  #: a view of the batch body when decoded (decode_batch)
    properties: str
    flag: int = 0


def encode_batch(items: list[BatchItem]) -> bytes:
    parts = []
    append, entry, u16 = parts.append, _BATCH_ENTRY.pack, _U16.pack
    for item in items:
        props = item.properties.encode()
        check_properties_size(props)
        body = item.body
        append(entry(_BATCH_ENTRY.size + len(body) + 2 + len(props), 0, 0, item.flag, len(body)))
        append(body)
        append(u16(len(props)))
        append(props)
    return b"".join(parts)


def decode_batch(body: bytes) -> list[BatchItem]:
    """Split a batch body into its messages; their bodies are views of ``body``, not copies (each is copied once,
    into its record).

    Raises:
        MessageFormatError: a length points outside the body.
    """
    items = []
    pos = 0
    end = len(body)
    view = memoryview(body)
    try:
        while pos < end:
            size, _magic, _crc, flag, body_len = _BATCH_ENTRY.unpack_from(body, pos)
            if size < 22 or pos + size > end or body_len < 0 or 20 + body_len + 2 > size:
                raise MessageFormatError(f"batch entry at {pos} has inconsistent lengths")
            p = pos + 20
            item_body = view[p:p + body_len]
            p += body_len
            (props_len,) = _U16.unpack_from(body, p)
            p += 2
            if p + props_len > pos + size:
                raise MessageFormatError(f"batch entry at {pos} has properties past its end")
            items.append(BatchItem(item_body, body[p:p + props_len].decode(), flag))
            pos += size
    except struct.error:
        raise MessageFormatError("truncated batch body") from None
    except UnicodeDecodeError:
        raise MessageFormatError("batch properties are not UTF-8") from None
    return items


# --- identifiers ---

def create_offset_msg_id(store_host: str, physical_offset: int) -> str:
    return (pack_host(store_host) + _I64.pack(physical_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """offsetMsgId → (store host, commit-log offset).

    Raises:
        MessageFormatError: not 32 or 56 hex digits.
    """
    if len(msg_id) not in (32, 56):
        raise MessageFormatError(f"offsetMsgId {msg_id!r} is not 32 or 56 hex digits")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise MessageFormatError(f"offsetMsgId {msg_id!r} is not hex") from None
    (offset,) = _I64.unpack_from(raw, len(raw) - 8)
    return unpack_host(raw[:-8]), offset


class UniqKeyGenerator:
    """Client message ids: ip(4) + pid(2) + instance hash(4) + ms since month start(4) + counter(2)."""

    def __init__(self, ip: str = "127.0.0.1"):
        try:
            packed_ip = ipaddress.ip_address(ip).packed
        except ValueError:
            packed_ip = bytes(4)
        self._prefix = (packed_ip + struct.pack(">H", os.getpid() & 0xFFFF)
                        + struct.pack(">I", id(self) & 0xFFFFFFFF)).hex().upper()
        self._lock = threading.Lock()
        self._counter = 0
        self._month_start = 0
        self._next_month = 0

    def _roll_month(self, now_ms: int) -> None:
        t = time.gmtime(now_ms / 1000)
        start = int(time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1)) * 1000)
        year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        self._month_start = start
        self._next_month = int(time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1)) * 1000)

    def next(self) -> str:
        head, counter = self._take(1)
        return f"{head}{counter:04X}"

    def next_many(self, count: int) -> list[str]:
        """``count`` keys, as many calls of ``next`` in a row give them, for one clock read (a batch's messages: a
        key each cost a Spark sink task a tenth of its time)."""
        head, first = self._take(count)
        return [f"{head}{counter & 0xFFFF:04X}" for counter in range(first, first + count)]

    def _take(self, count: int) -> tuple[str, int]:
        """The keys' common head (prefix and time) and the first of ``count`` counters taken."""
        now = int(time.time() * 1000)
        with self._lock:
            if now >= self._next_month:
                self._roll_month(now)
            first = (self._counter + 1) & 0xFFFF
            self._counter = (self._counter + count) & 0xFFFF
        return f"{self._prefix}{(now - self._month_start) & 0xFFFFFFFF:08X}", first


@lru_cache(maxsize=65536)
def tags_hash(tag: str | None) -> int:
    """Java ``String.hashCode`` of a tag (0 for none), sign-extended."""
    if not tag:
        return 0
    h = 0
    for unit in _utf16_units(tag):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _utf16_units(text: str):
    raw = text.encode("utf-16-be")
    return struct.unpack(f">{len(raw) // 2}H", raw)


class RecordPlace(NamedTuple):
    """Where a stored record belongs and when it was stored (what retention needs to delete it everywhere)."""

    topic: str
    queue_id: int
    queue_offset: int
    store_timestamp: int
    properties_text: str


def record_place(buf) -> RecordPlace:
    """The topic, queue id, queue offset, store timestamp and raw property string of an encoded record, decoding
    no other field (no body copy, no property parsing).

    Raises:
        MessageFormatError: ``buf`` is not a well-formed record.
    """
    try:
        (sys_flag,) = _I32.unpack_from(buf, SYSFLAG_POS)
        head = RECORD_HEADS[sys_flag & HOST_FLAGS]
        _size, magic, _crc, queue_id, _flag, queue_offset, *_, store_ts, _store, _re, _prep, body_len = \
            head.unpack_from(buf)
        topic, props, _end = _after_body(buf, head.size + body_len, magic)
    except (struct.error, IndexError, UnicodeDecodeError):
        raise MessageFormatError("truncated or malformed record") from None
    return RecordPlace(topic, queue_id, queue_offset, store_ts, props)
