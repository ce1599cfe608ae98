"""The LMDB store: commit log, consume queues, consumer offsets, topics and transaction state."""
from .config import StoreConfig
from .errors import (CorruptRecordError, CorruptStoreError, HalfConflictError, HalfMismatchError, HalfNotFoundError,
                     InvalidWriteError, NotLeaderError, ReplicationError, StoreClosedError, StoreError, StoreFullError, StoreLockedError,
                     StoreUnavailableError)
from .halfs import HalfState, HalfStatus
from .requests import PutRequest, PutResult, message_request, record_request
from .store import MessageStore, StoredEntry

__all__ = ["MessageStore", "StoreConfig", "PutRequest", "PutResult", "StoredEntry", "message_request",
           "record_request", "HalfState", "HalfStatus", "StoreError", "StoreFullError", "StoreClosedError",
           "StoreUnavailableError", "InvalidWriteError", "CorruptRecordError", "CorruptStoreError",
           "StoreLockedError", "NotLeaderError", "ReplicationError", "HalfNotFoundError", "HalfMismatchError", "HalfConflictError"]
