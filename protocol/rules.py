"""The rules of names and topics that every side of the wire shares: the broker refuses what breaks them
(``broker/names.py`` words its refusals), the admin client and the dashboard refuse a bad name before asking.

Why each limit is what it is: ``broker/names.py``. Sans-IO like the rest of ``protocol/``: plain constants and
predicates, no error types of a side.
"""
from __future__ import annotations

import re
from functools import lru_cache

#: LMDB refuses a longer key; every store key built from a name stays within it.
LMDB_MAX_KEY_BYTES = 511
MAX_TOPIC_LENGTH = 127
#: a consumer group's retry and dead-letter topics: %RETRY%<group>, %DLQ%<group>
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
#: so that %RETRY%<group> is still a topic
MAX_GROUP_LENGTH = MAX_TOPIC_LENGTH - len(RETRY_PREFIX)
#: topic NUL key NUL + 8-byte offset: the key index's key around a message key.
_KEY_INDEX_OVERHEAD = 1 + 1 + 8
MAX_MESSAGE_KEY_BYTES = LMDB_MAX_KEY_BYTES - MAX_TOPIC_LENGTH - _KEY_INDEX_OVERHEAD
MAX_CLIENT_ID_BYTES = 255
#: the gRPC endpoint's transaction groups (broker/grpc/sessions.transaction_group): never a remoting client's
GRPC_GROUP_PREFIX = "%GRPC%"
#: read and write queues a topic may have (RocketMQ's own bound)
MAX_QUEUES = 1024

#: the characters of a topic or group name, as a pattern a remark can show
PATTERN_TEXT = "^[%|a-zA-Z0-9_-]+$"
NAME = re.compile(r"[%|a-zA-Z0-9_-]+")
#: a character a name may not hold (a refusal's remark shows the first)
NOT_NAME = re.compile(r"[^%|a-zA-Z0-9_-]")
#: A broker's or cluster's name (brokerName, brokerClusterName): every client, tool and page shows it, so nothing in
#: it may read as markup or as a separator; RocketMQ's topic bound.
BROKER_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,127}")


#: Unicode's control characters (C0 with NUL and the property separators, DEL, C1) and lone surrogates: no name or
#: key may hold one; a message key holds no whitespace either (KEYS are split on it).
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
CONTROL_OR_SPACE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\\s]")


@lru_cache(maxsize=4096)
def is_name(value: str) -> bool:
    """Whether ``value`` is made of name characters only. Cached: every request names a topic or a group, mostly
    the same few (0.44 -> 0.18 us a check); callers pass only strings within a name's length, so the cache is
    bounded in bytes as in entries."""
    return NAME.fullmatch(value) is not None


def is_topic(value: str) -> bool:
    """1-127 characters of [%|a-zA-Z0-9_-]."""
    return 0 < len(value) <= MAX_TOPIC_LENGTH and is_name(value)


def is_group(value: str) -> bool:
    """1-120 characters of [%|a-zA-Z0-9_-], so %RETRY%<group> is a topic."""
    return 0 < len(value) <= MAX_GROUP_LENGTH and is_name(value)


def is_message_key(value: str) -> bool:
    """A KEYS entry, a UNIQ_KEY or a key looked up: 1-374 UTF-8 bytes, no whitespace and no control character."""
    return (bool(value) and CONTROL_OR_SPACE.search(value) is None
            and len(value.encode("utf-8")) <= MAX_MESSAGE_KEY_BYTES)
