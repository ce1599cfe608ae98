"""Half-message state: one typed record per half, keyed by the half record's commit-log offset.

The row is a msgpack array: the status, then the fields below in their order (a field added later goes last, so
older rows read with its default). Rows of earlier versions, a msgpack map by field name, still read as they are.
Only the transaction ops (txops.py) change it, inside the writer's transaction, each as the transaction state
machine (halfmq.transactions) allows.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from operator import attrgetter

import msgpack

from halfmq.transactions import HalfStatus


@dataclass(slots=True)
class HalfState:
    status: HalfStatus
    group: str                      #: producer group that sent the half
    topic: str                      #: real topic and queue the commit goes to
    queue_id: int
    uniq: str                       #: UNIQ_KEY, the transaction id clients see
    queue_offset: int               #: the half's offset in the half topic (tranStateTableOffset)
    store_ts: int
    due: int                        #: next check, broker clock ms (its entry in the due index while PREPARED)
    checks: int = 0
    client_id: str | None = None    #: client that sent it, to check it back there first
    size: int = 0
    tags_code: int = 0
    keys: str | None = None
    waiting: bool = False           #: no live producer at the last check: waits for one to register
    last_check_ts: int | None = None
    decided_ts: int | None = None
    decided_by: str | None = None   #: a transactions.Decider value
    committed_offset: int | None = None
    discarded_offset: int | None = None
    batch: int | None = None        #: a batch half: how many messages its body holds (records, committed together)
    committed_last: int | None = None  #: a committed batch half: its last message's commit-log offset
    #: a pending batch half none of whose messages has KEYS: each record's size and tags code (pack_parts), so its
    #: commit indexes the body without parsing it; dropped once it is decided
    parts: bytes | None = None

    @property
    def pending(self) -> bool:
        return self.status is HalfStatus.PREPARED

    def to_bytes(self) -> bytes:
        # A msgpack array, status first, then the stored fields in declaration order: a commit and a prepare each
        # write a row, and an array costs a third of the named map earlier versions wrote (still read below).
        return _pack_row(_row_fields(self))

    def __reduce__(self):
        # To and from the writer process as a plain tuple: by default a slotted dataclass pickles slot by slot and
        # its status through the enum's own reduce (9.6 us to pickle a PrepareHalf and 7.5 us to unpickle it).
        return _half_state, (self.status.value, stored_fields(self))

    @classmethod
    def from_bytes(cls, raw: bytes) -> "HalfState":
        row = msgpack.unpackb(raw)
        if type(row) is list:  # fields missing from a row written before they existed take their defaults
            return cls(STATUSES[row[0]], *row[1:_ROW_LENGTH])
        row["status"] = HalfStatus(row.pop("state"))  # the named map earlier versions wrote
        row.setdefault("due", 0)
        return cls(**{k: v for k, v in row.items() if k in _FIELDS})


_FIELDS = frozenset(HalfState.__dataclass_fields__)
_STORED = tuple(name for name in HalfState.__dataclass_fields__ if name != "status")
stored_fields = attrgetter(*_STORED)  #: a state's fields but the status, in row order
_ROW_LENGTH = 1 + len(_STORED)
#: rows are written only by the writer process's one thread: one Packer for all of them (packb makes a Packer per
#: call, half of a row's encoding time)
_pack_row = msgpack.Packer().pack
#: a row's values: the status (a str enum, which msgpack packs as its value) and the stored fields
_row_fields = attrgetter("status", *_STORED)
STATUSES = {status.value: status for status in HalfStatus}  #: each status by its value (an enum call runs Python)


def _half_state(status: str, stored: tuple) -> HalfState:
    """A HalfState from its pickled form (``HalfState.__reduce__``); status comes first, the stored fields follow."""
    return HalfState(STATUSES[status], *stored)


def pack_parts(sizes: list[int], tags_codes: list[int]) -> bytes:
    """HalfState.parts of a batch half's records: their sizes, then their tags codes, little-endian."""
    return struct.pack(f"<{len(sizes)}I{len(tags_codes)}q", *sizes, *tags_codes)


def unpack_parts(parts: bytes, count: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sizes and tags codes ``pack_parts`` packed for ``count`` records.

    Raises:
        struct.error: ``parts`` is not the packing of ``count`` records.
    """
    fields = struct.unpack(f"<{count}I{count}q", parts)
    return fields[:count], fields[count:]
