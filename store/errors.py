"""Store errors. They name what went wrong; the broker's error table (broker/errors.py) turns them into
response codes, so the store knows nothing of the wire."""


class StoreError(Exception):
    """A write or read the store could not carry out."""


class StoreFullError(StoreError):
    """The LMDB map is full: nothing of the failed group was written."""


class StoreClosedError(StoreError):
    """The store is closed (shutting down): the write was not taken."""


class StoreUnavailableError(StoreError):
    """The write is not known to be durable (the writer process failed, or the disk is not keeping up): it is not
    acknowledged."""


class InvalidWriteError(StoreError):
    """An op was refused by its validation: nothing of it was written (a key too long for LMDB, say)."""


class CorruptRecordError(StoreError):
    """A stored record failed its integrity check (body CRC, layout)."""

    def __init__(self, physical_offset: int, reason: str):
        super().__init__(f"the stored message at commit-log offset {physical_offset} is corrupted ({reason}); "
                         "it is not served")
        self.physical_offset = physical_offset
        self.reason = reason

    def __reduce__(self):  # it crosses from the writer process pickled
        return CorruptRecordError, (self.physical_offset, self.reason)


class StoreLockedError(StoreError):
    """Another process owns the store folder."""


class CorruptStoreError(StoreError):
    """The store failed its start-up check."""


class HalfNotFoundError(StoreError):
    """No half message at that offset."""


class HalfMismatchError(StoreError):
    """A decision names a half with another producer group or transaction-table offset."""


class HalfConflictError(StoreError):
    """A decision conflicts with the half's earlier one (commit after rollback or discard)."""


class NotLeaderError(StoreError):
    """This store follows its group's leader: only the leader's records are written to it."""


class ReplicationError(StoreError):
    """A write is not known to be on every in-sync copy of its group (too few in-sync replicas, or they did not
    acknowledge it): it is not acknowledged. Refused before it was stored when the in-sync set was already too
    small; otherwise it may be stored, like a write whose answer was lost."""
