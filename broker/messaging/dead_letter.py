"""The copy of a consumed message that goes back to its group: to the group's %RETRY% topic (a remoting consumer's
send-back) or to its %DLQ% topic (too many deliveries, over either protocol). One builder for both doors.

A copy carries where it came from (RETRY_TOPIC, ORIGIN_MESSAGE_ID) and drops where the original was going (delay
level, timer properties, the schedule topic's real topic and queue): it is delivered where it is sent. Those
added properties can push a message whose properties were just under the record's 32 KiB limit over it; such a
copy is made with the original's properties alone, and a message that cannot be copied even so is refused with
``Failure.BAD_MESSAGE`` for the caller to deal with on its own (a gRPC receive drops that one receipt, and counts
it), never failing anything else.
"""
from __future__ import annotations

import logging

from halfmq.protocol import properties as P
from halfmq.protocol.codes import SysFlag
from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import MessageRecord
from halfmq.protocol.properties import check_properties_size, encode_properties

from ..errors import BrokerError, Failure
from ..services.timers import TIMER_KEYS

log = logging.getLogger(__name__)
#: where the original was going, which a copy does not keep
_ROUTING_KEYS = frozenset((*TIMER_KEYS, P.TIMER_OUT_MS, P.DELAY, P.REAL_TOPIC, P.REAL_QID))
#: what a send-back to the schedule topic adds (store_op): reserved when fitting a retry copy's properties
_SCHEDULE_ROOM = len(f"{P.DELAY}\x0118\x02{P.REAL_TOPIC}\x01\x02{P.REAL_QID}\x0199999\x02".encode())


def consumer_copy(rec: MessageRecord, topic: str, queue_id: int, origin_topic: str, origin_msg_id: str,
                  attempts: int, store_host: str, delay_level: int = 0) -> MessageRecord:
    """The copy of ``rec`` to store in ``topic`` (a group's retry or DLQ topic), its ``attempts``-th delivery.

    Raises:
        BrokerError: BAD_MESSAGE when no copy of ``rec`` fits a record.
    """
    kept = {k: v for k, v in rec.properties.items() if k not in _ROUTING_KEYS}
    props = dict(kept)
    props.setdefault(P.RETRY_TOPIC, origin_topic)
    props.setdefault(P.ORIGIN_MESSAGE_ID, origin_msg_id)
    room = len(topic) + _SCHEDULE_ROOM if delay_level else 0
    if not _fits(props, room):
        log.warning("the copy of message %s of %s to %s is made without RETRY_TOPIC and ORIGIN_MESSAGE_ID: its "
                    "properties are too long for them", rec.properties.get(P.UNIQ_KEY, ""), origin_topic, topic)
        props = kept
        if not _fits(props, room):
            raise BrokerError(Failure.BAD_MESSAGE, f"message {rec.properties.get(P.UNIQ_KEY, '')} of {origin_topic} "
                                                   f"cannot be copied to {topic}: its properties are too long")
    if delay_level:
        props[P.DELAY] = str(delay_level)
    return MessageRecord(topic=topic, body=rec.body, queue_id=queue_id, flag=rec.flag,
                         sys_flag=rec.sys_flag & ~SysFlag.TRANSACTION_MASK, born_timestamp=rec.born_timestamp,
                         born_host=rec.born_host, store_host=store_host, reconsume_times=attempts,
                         properties=props)


def _fits(props: dict[str, str], room: int) -> bool:
    try:
        check_properties_size(encode_properties(props).encode() + b"\0" * room)
    except MessageFormatError:
        return False
    return True
