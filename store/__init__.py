"""The LMDB store: commit log, consume queues, consumer offsets, topics and transaction state."""
from .config import StoreConfig
from .errors import StoreClosedError, StoreError, StoreFullError
from .store import MessageStore, StoredEntry
from .writer import PutRequest, PutResult, WriteContext

__all__ = ["MessageStore", "StoreConfig", "PutRequest", "PutResult", "StoredEntry", "StoreError",
           "StoreFullError", "StoreClosedError", "WriteContext"]
