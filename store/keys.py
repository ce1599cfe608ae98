"""Key and value layouts of the LMDB tables. Integers are big-endian so keys sort numerically."""
from __future__ import annotations

import struct

U64 = struct.Struct(">Q")
QUEUE_KEY = struct.Struct(">IIQ")       # topic id, queue id, queue offset
QUEUE_PREFIX = struct.Struct(">II")
CQ_VALUE = struct.Struct(">QIqq")       # physical offset, size, tags code, store timestamp
DUE_KEY = struct.Struct(">QQ")          # due ms, half offset
TOPIC_ID = struct.Struct(">I")
#: meta key: topic name → the commit-log offset when the topic was last deleted. A timer or delayed message stored
#: before it (below that offset) was for the deleted topic and is not delivered into one created again with the name.
DELETED_TOPICS_KEY = "lifecycle.deleted_topics"


def offset_key(group: str, topic: str, queue_id: int) -> bytes:
    return f"{group}\x00{topic}\x00{queue_id}".encode()


def parse_offset_key(key: bytes) -> tuple[str, str, int]:
    group, topic, queue_id = key.decode().split("\x00")
    return group, topic, int(queue_id)
