"""Store configuration (a subset of the broker's, under the store's own names)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class StoreConfig:
    root: str                             #: storePathRootDir; LMDB lives in <root>/lmdb
    map_size: int = 1 << 30               #: mapSize: the map's starting size, bytes
    max_map_size: int = 64 << 30          #: maxMapSize: the most the map grows to when it fills, bytes
    flush_disk_type: str = "SYNC_FLUSH"   #: or "ASYNC_FLUSH"
    flush_interval_ms: int = 500          #: flushIntervalCommitLog, ASYNC_FLUSH only
