"""Consumer offsets: authoritative in memory, persisted through the store's writer.

Offsets committed by pulls and oneway updates are written every ``flushConsumerOffsetInterval`` (RocketMQ does
the same every 5 s: a crash re-delivers, it never loses). A two-way UPDATE_CONSUMER_OFFSET is answered only after
its offset is durable.

On a follower of a broker group (broker/replication/follower.py) the store takes no writes: offsets committed
there are handed to ``forward`` (to the leader, which stores them) and kept until it takes them; the offsets the
leader stores come back in the replication stream (``replicated``).
"""
from __future__ import annotations

from typing import Callable

from halfmq.store.ops import SetConsumerOffsets

OffsetKey = tuple[str, str, int]  # (group, topic, queue id)


class ConsumerOffsetManager:
    def __init__(self, store):
        self.store = store
        self.table: dict[OffsetKey, int] = {}
        self.dirty: dict[OffsetKey, int] = {}
        #: a follower's way to the leader: takes a batch of offsets, False when it could not
        self.forward: Callable[[dict], bool] | None = None

    def load(self) -> None:
        for group, topic, queue_id, offset in self.store.consumer_offsets():
            self.table[(group, topic, queue_id)] = offset

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.table.get((group, topic, queue_id))

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = (group, topic, queue_id)
        self.table[key] = offset
        self.dirty[key] = offset

    async def commit_durable(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if self.forward is not None:  # a follower: durable once the leader stored it (best effort, as a pull's)
            self.commit(group, topic, queue_id, offset)
            await self.flush()
            return
        key = (group, topic, queue_id)
        await self.store.submit(SetConsumerOffsets({key: offset}))
        self.table[key] = offset
        self.dirty.pop(key, None)

    async def flush(self) -> None:
        if not self.dirty:
            return
        batch, self.dirty = self.dirty, {}
        if self.forward is not None:
            if not self.forward(batch):
                for key, offset in batch.items():
                    self.dirty.setdefault(key, offset)
            return
        try:
            await self.store.submit(SetConsumerOffsets(batch))
        except Exception:
            for key, offset in batch.items():  # keep them for the next flush
                self.dirty.setdefault(key, offset)
            raise

    def replicated(self, offsets: dict[OffsetKey, int | None]) -> None:
        """Offsets the leader stored (None: deleted); one committed here and not yet taken by the leader stays."""
        for key, offset in offsets.items():
            if key in self.dirty:
                continue
            if offset is None:
                self.table.pop(key, None)
            else:
                self.table[key] = offset

    def reload(self) -> None:
        """Every offset as the store now holds it (a follower installed its leader's snapshot)."""
        self.table = {}
        self.load()
        self.table.update(self.dirty)

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's offsets (the store deleted its rows): a topic created again with the name starts
        with none."""
        for key in [k for k in self.table if k[1] == topic]:
            del self.table[key]
            self.dirty.pop(key, None)

    def groups_of_topic(self, topic: str) -> set[str]:
        return {group for group, t, _q in self.table if t == topic}
