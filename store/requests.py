"""What a stored message is made of: its record bytes and the index entries it gets, built in one place.

Every path that stores a message (send, batch, half, commit, discard, delayed delivery, retry and DLQ) builds
its ``PutRequest`` with ``message_request`` or ``record_request``, so the tags code and the KEYS index always
follow the record's own properties.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from halfmq.protocol.message import MessageRecord, encode_record, tags_hash

_TAGS, _KEYS = "TAGS", "KEYS"


@dataclass(slots=True)
class PutRequest:
    topic: str
    queue_id: int
    record: bytearray
    tags_code: int = 0
    index: bool = True              #: gets a consume-queue entry (False: stored, not consumable)
    keys: str | None = None         #: space-separated business keys, indexed for QUERY_MESSAGE

    def __reduce__(self):  # a plain tuple to the writer process: a third of the default's pickling cost
        return PutRequest, (self.topic, self.queue_id, self.record, self.tags_code, self.index, self.keys)


class PutResult(NamedTuple):
    physical_offset: int
    queue_offset: int
    store_timestamp: int
    size: int


def message_request(rec: MessageRecord, index: bool = True) -> PutRequest:
    """The request storing ``rec`` in its topic and queue.

    Raises:
        MessageFormatError: properties too long or a bad host (from encode_record).
    """
    return record_request(encode_record(rec), rec.topic, rec.queue_id, rec.properties, index)


def record_request(record: bytearray, topic: str, queue_id: int, properties: dict[str, str],
                   index: bool = True) -> PutRequest:
    """The request storing an already encoded record whose properties are ``properties``."""
    return PutRequest(topic, queue_id, record, tags_hash(properties.get(_TAGS)), index, properties.get(_KEYS) or None)
