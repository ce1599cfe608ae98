"""Store configuration (a subset of the broker's, under the store's own names)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class StoreConfig:
    root: str                             #: storePathRootDir; LMDB lives in <root>/lmdb
    map_size: int = 8 << 30               #: mapSize, bytes
    flush_disk_type: str = "SYNC_FLUSH"   #: or "ASYNC_FLUSH"
    flush_interval_ms: int = 500          #: flushIntervalCommitLog, ASYNC_FLUSH only
