"""The rules for every client-supplied name that becomes a store key, a topic or a registry key.

This module owns what a valid topic, group, client id and message key is; processors call it at the request
boundary, so nothing that passes can later break a store key or the start-up that parses it back.

Why these limits (LMDB refuses a key longer than 511 bytes, and the offsets loader splits its keys on NUL):

- **topic**: at most 127 characters of ``[%|a-zA-Z0-9_-]`` (RocketMQ's ``TopicValidator``/``Validators``). The
  pattern is ASCII, so 127 characters are 127 bytes. Retry and DLQ topics obey the same rule.
- **group** (consumer or producer): the same characters, at most **120**. A consumer group becomes the topics
  ``%RETRY%<group>`` and ``%DLQ%<group>``, and 127 - len("%RETRY%") = 120 keeps them valid topics. RocketMQ's own
  broker settled on 120 too (``TopicValidator.GROUP_MAX_LENGTH``, apache/rocketmq #9563); the 4.9 Java client
  still allows 255, so a 4.9 client with a 121-255 character group is refused here with a remark saying why. A
  255-character group could not work anyway: its offset key ``group NUL %RETRY%group NUL queueId`` would pass
  511 bytes.
- **message key** (each KEYS entry, UNIQ_KEY): at most 374 UTF-8 bytes. The key index stores
  ``topic NUL key NUL <8-byte offset>``; with the longest topic that leaves 511 - 127 - 2 - 8 = 374. One limit for
  every topic, because a message keeps its KEYS when it moves to a retry, DLQ or schedule topic.
- **client id** (``ip@instanceName``, stored with each registration and each half message; a RocketMQ 5 client's
  ``x-mq-client-id``, which keys its gRPC session): at most 255 bytes.
- **internal groups**: a group starting with ``%GRPC%`` is the gRPC endpoint's transaction group of a topic
  (``%GRPC%<topic>``, broker/grpc/sessions.py), whose producers get that topic's gRPC halves' checks with their
  uncommitted bodies. A remoting request naming one is refused (``check_remoting_group``, called by the access
  check every remoting request passes, broker/acl.py), so no remoting client can register as its producer, end
  its transactions, or consume or send as it.
- **a half's group**: a transactional message is filed under the producer group its request names (and was
  authorised for); a PGROUP property naming another group is refused (``check_message``).
- No name may hold a control character (NUL, RocketMQ's property separators \\x01 and \\x02, the rest of C0, DEL,
  C1) or a lone surrogate (it cannot be encoded into a key); a message key holds no whitespace (KEYS are split
  on it).

Failures (rows of the error table, broker/errors.py): a bad topic, group or client id in a request is
ILLEGAL_TOPIC, ILLEGAL_GROUP or BAD_REQUEST, all answered SYSTEM_ERROR over remoting, which is what RocketMQ 4.9
answers for a bad topic (its broker checks no group names); a bad message property is BAD_MESSAGE, answered
MESSAGE_ILLEGAL, so a producer does not retry the same message on another broker.
"""
from __future__ import annotations

import re

from halfmq.protocol import properties as P
# The limits and the name pattern are protocol/rules.py's, which clients and the dashboard use too.
from halfmq.protocol.rules import (  # noqa: F401 (the limits and prefixes are imported from here too)
    BROKER_NAME, CONTROL, CONTROL_OR_SPACE, DLQ_PREFIX, GRPC_GROUP_PREFIX, LMDB_MAX_KEY_BYTES, MAX_CLIENT_ID_BYTES,
    MAX_GROUP_LENGTH, MAX_MESSAGE_KEY_BYTES, MAX_TOPIC_LENGTH, NAME, NOT_NAME, PATTERN_TEXT, RETRY_PREFIX, is_name)

from .errors import BrokerError, Failure

_SHOWN = 48


def _show(value: str) -> str:
    """The value for a remark: escaped (a remark never carries a control character) and cut short."""
    if len(value) <= _SHOWN:
        return repr(value)
    return f"{value[:_SHOWN]!r}... ({len(value)} characters)"


def _utf8_len(value: str) -> int:
    # surrogatepass: a lone surrogate must give a length, not an exception; it is refused by CONTROL anyway.
    return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))


def _text(value: object, field: str, failure: Failure) -> str:
    if not isinstance(value, str):
        raise BrokerError(failure, f"{field} must be a string, got {type(value).__name__}")
    if not value or value.isspace():
        raise BrokerError(failure, f"{field} is blank")
    return value


def _check_name(value: object, field: str, kind: str, max_length: int, failure: Failure) -> str:
    if type(value) is str and len(value) <= max_length and is_name(value):
        return value
    name = _text(value, field, failure)
    if len(name) <= max_length and NAME.fullmatch(name):
        return name  # a str of a subclass
    if len(name) > max_length:
        raise BrokerError(failure, f"{field} is {len(name)} characters, longer than the {kind} max length "
                                f"{max_length}: {_show(name)}")
    bad = NOT_NAME.search(name)
    raise BrokerError(failure, f"{field} {_show(name)} contains the illegal character {bad.group()!r} at index "
                            f"{bad.start()}; a {kind} allows only {PATTERN_TEXT}")


def check_topic(value: object, field: str = "topic", failure: Failure = Failure.ILLEGAL_TOPIC) -> str:
    """A topic name: 1-127 characters of [%|a-zA-Z0-9_-].

    Args:
        value: the name as the request carried it (any JSON value for a request body).
        field: the request field, named in the remark.
        failure: the error table's row of a refusal.
    Returns:
        The name.
    Raises:
        BrokerError: ``failure`` with a remark naming the field and the broken limit.
    """
    return _check_name(value, field, "topic", MAX_TOPIC_LENGTH, failure)


def validate_topic_name(name: object) -> None:
    """``check_topic`` under the name the send and admin processors import; raises BrokerError(ILLEGAL_TOPIC)."""
    check_topic(name)


def check_broker_name(value: str, field: str) -> str:
    """Raises BrokerError (BAD_REQUEST) naming ``field`` when ``value`` is not a broker or cluster name."""
    if not BROKER_NAME.fullmatch(value):
        raise BrokerError(Failure.BAD_REQUEST, f"{field} {_show(value[:64])} is not a name (1..127 of "
                                               f"A-Z a-z 0-9 _ - .)")
    return value


def check_group(value: object, field: str = "group", failure: Failure = Failure.ILLEGAL_GROUP) -> str:
    """A consumer or producer group: 1-120 characters of [%|a-zA-Z0-9_-], so %RETRY%<group> is a valid topic.

    Args:
        value: the name as the request carried it.
        field: the request field (``consumerGroup``, ``producerGroup``, ...), named in the remark.
        failure: the error table's row of a refusal.
    Returns:
        The name.
    Raises:
        BrokerError: ``failure`` with a remark naming the field and the broken limit.
    """
    return _check_name(value, field, "group", MAX_GROUP_LENGTH, failure)


def check_remoting_group(value: str, field: str = "group") -> str:
    """A group a remoting request names must not be one of the gRPC endpoint's internal groups.

    Raises:
        BrokerError: FORBIDDEN naming the field.
    """
    if value.startswith(GRPC_GROUP_PREFIX):
        raise BrokerError(Failure.FORBIDDEN,
                          f"{field} {_show(value)} is an internal group of the gRPC endpoint (prefix "
                          f"{GRPC_GROUP_PREFIX}): remoting clients may not name it")
    return value


def check_client_id(value: object, field: str = "clientID", failure: Failure = Failure.BAD_REQUEST) -> str:
    """A client id or instance name: 1-255 UTF-8 bytes without control characters.

    Raises:
        BrokerError: ``failure`` with a remark naming the field and the broken limit.
    """
    client_id = _text(value, field, failure)
    _check_bytes(client_id, field, MAX_CLIENT_ID_BYTES, CONTROL, "a control character", failure)
    return client_id


def check_message_key(value: object, field: str = "key", failure: Failure = Failure.BAD_MESSAGE) -> str:
    """One message key (a KEYS entry, a UNIQ_KEY, a QUERY_MESSAGE key): 1-374 UTF-8 bytes, no whitespace and
    no control characters.

    Raises:
        BrokerError: ``failure`` with a remark naming the field and the broken limit.
    """
    key = _text(value, field, failure)
    _check_bytes(key, field, MAX_MESSAGE_KEY_BYTES, CONTROL_OR_SPACE, "whitespace or a control character", failure)
    return key


def _check_bytes(value: str, field: str, max_bytes: int, forbidden: re.Pattern, what: str,
                 failure: Failure) -> None:
    # The common case first: printable ASCII is one byte a character, holds no control character and no
    # whitespace but the space.
    if (len(value) <= max_bytes and value.isascii() and value.isprintable()
            and (forbidden is CONTROL or " " not in value)):
        return
    bad = forbidden.search(value)
    if bad is not None:
        raise BrokerError(failure, f"{field} {_show(value)} contains {what} ({bad.group()!r} at index {bad.start()})")
    size = _utf8_len(value)
    if size > max_bytes:
        raise BrokerError(failure, f"{field} is {size} bytes, longer than the {max_bytes}-byte limit: {_show(value)}")


def _where(topic) -> str:
    """A message's topic as a remark names it (made only for a remark: every send is checked here)."""
    return topic if isinstance(topic, str) and topic.isprintable() else _show(str(topic))


def check_message(topic: str, properties: dict[str, str], producer_group: str | None = None) -> None:
    """The properties of a message to store that become keys: each KEYS entry and UNIQ_KEY (the key index), and
    for a transactional message the group its half is filed under (PGROUP, else ``producer_group``), which must be
    ``producer_group`` when both are given: access control authorised the request's group, so a PGROUP naming
    another would file the half, and send its checks, to a group the sender may not publish for.

    Args:
        topic: the topic the message is sent to (named in the remark; the topic itself is checked by
            ``validate_topic_name``).
        properties: the decoded message properties.
        producer_group: the request header's producerGroup (None for a batch's messages, whose batch was checked).
    Raises:
        BrokerError: BAD_MESSAGE with a remark naming the property and the broken limit.
    """
    keys = properties.get(P.KEYS)
    if keys:
        for entry in keys.split():  # split as the store's key index splits them
            # printable ASCII within the limit needs no closer look (the common case, once per send)
            if len(entry) > MAX_MESSAGE_KEY_BYTES or not entry.isascii() or not entry.isprintable():
                check_message_key(entry, f"a KEYS entry of a message to {_where(topic)}")
    uniq = properties.get(P.UNIQ_KEY)
    if uniq is not None and not (len(uniq) <= MAX_MESSAGE_KEY_BYTES and uniq.isascii() and uniq.isprintable()
                                 and " " not in uniq):
        check_message_key(uniq, f"the UNIQ_KEY of a message to {_where(topic)}")
    if properties.get(P.TRAN_MSG) == "true":
        named = properties.get(P.PGROUP)
        if named and producer_group is not None and named != producer_group:
            raise BrokerError(Failure.BAD_MESSAGE,
                              f"the producer group (PGROUP) {_show(named)} of a transactional message to "
                              f"{_where(topic)} is not the request's producerGroup {_show(str(producer_group))}: a "
                              f"half is filed under the group the request names")
        group = named or producer_group
        check_group(group, "the producer group (PGROUP) of a transactional message", Failure.BAD_MESSAGE)
