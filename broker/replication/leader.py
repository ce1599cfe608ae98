"""A broker group's leader: it ships every record its writer makes to its followers and answers a write only once
every member of the in-sync set has it durable.

The gate (store/link.py ``ReplicationGate``). The writer hands over each commit's record once it is durable here
(``durable``); the leader keeps it in a ring of recent records (``RING_BYTES``) and streams it to every follower.
``committed`` is the last sequence durable on the leader and on every in-sync follower: the store publishes a group
(answers, queue bounds readers see) only up to it, so nothing is answered, or read, before every in-sync copy has
it; followers are told it before the answers it covers go out. While the in-sync set has fewer than ``minInSyncReplicas`` members, writes are refused before they are stored
and the groups waiting for copies fail (``ReplicationError``: SERVICE_NOT_AVAILABLE, which a producer retries
elsewhere; never a "stored on one copy" success).

The in-sync set. The leader counts itself. A follower joins once it has acknowledged everything durable here,
and leaves when the oldest record it has not acknowledged is older than ``haMaxLagMillis`` (or its link closes).
A follower that ever joined is recorded in the store (``MEMBERS_KEY``, replicated like everything else), so the
group knows it has followers: ``minInSyncReplicas`` 0 means 2 then, 1 before.

Catch-up. A follower whose records are a prefix of the leader's and whose next record is still in the ring is
streamed from there; any other (an empty store, one far behind, one holding an unacknowledged tail of an older
epoch) first receives a snapshot (``MessageStore.snapshot``: a consistent copy taken while writes go on), which
replaces its store, and then the stream from the snapshot's sequence.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from dataclasses import dataclass, field

from halfmq.store import ReplicationError
from halfmq.store.ops import PutMeta
from halfmq.store.redo import is_prefix

from . import wire

log = logging.getLogger(__name__)
RING_BYTES = 256 << 20        #: recent records kept for followers that are behind (older ones: a snapshot)
MEMBERS_KEY = "repl.members"  #: meta: the ids of the followers that were ever in sync
HIGH_WATER = 8 << 20          #: bytes queued to a follower's socket before records wait for its acknowledgements
SHRINK_RETRY_S = 0.5          #: between attempts to remove a member from etcd's in-sync set
MAX_FOLLOWERS = 15            #: followers one leader serves at once (a bound on what strangers can make it keep)
MAX_SNAPSHOTS = 1             #: snapshots taken at once: each is a copy of the whole store on disk


@dataclass
class FollowerSession:
    """One follower's link as the leader sees it."""

    channel: object
    broker_id: int
    addr: str
    next_seq: int                #: the next record to send
    acked: int = 0               #: the last record it has durable
    in_sync: bool = False
    snapshot_path: str | None = None
    snapshot_sent: int = 0       #: snapshot bytes sent
    snapshot_acked: int = 0
    snapshot_size: int = 0
    snapshot_position: tuple[int, int] = (0, 0)
    ha_addr: str = ""            #: where it serves the replication port once it leads
    connected_at: float = field(default_factory=time.monotonic)

    @property
    def streaming(self) -> bool:
        return self.snapshot_path is None and self.snapshot_size == 0


class ReplicationLeader:
    """The leader's side of the replication link, and the store's gate while it leads."""

    def __init__(self, ctx, epoch: int):
        self.ctx = ctx
        self.store = ctx.store
        self.config = ctx.config
        self.epoch = epoch
        epoch_now, seq = self.store.position
        self.local = seq                     #: the last record durable here
        self.shipped_seq = seq               #: the last record committed here (shipped, maybe not yet durable)
        self.committed = seq                 #: the last record durable on every in-sync member
        self.ring: collections.deque = collections.deque()  # (seq, epoch, payload, durable at)
        self.ring_bytes = 0
        self.sessions: dict[int, FollowerSession] = {}      # broker id -> session
        self.members: set[int] = set(self.store.get_meta(MEMBERS_KEY) or ())
        self.refusal: str | None = None      #: why writes are refused besides the in-sync set (a switchover)
        #: with automatic failover: the monotonic time past which nothing may be answered (the lease), and what
        #: keeps the in-sync set in etcd (grow, shrink); None: this leader alone decides (roles by brokerId)
        self.deadline = None
        self.isr_keeper = None
        #: members out of sync here (gone, or lagging) but still in etcd's in-sync set until removed there: waited
        #: for (at the record they acknowledged) as if in sync
        self.ghosts: dict[int, int] = {}
        self._committing = seq               #: durable on every in-sync member, followers not yet told
        self._commit_scheduled = False
        self._progress: asyncio.Future | None = None
        self._lag_task: asyncio.Task | None = None
        self._snapshots = os.path.join(self.config.storePathRootDir, "repl-snapshots")

    # --- lifecycle ---
    def start(self) -> None:
        self.store.link.last_seq = self.local
        self.store.set_gate(self)
        self.store.write_refusal = self.write_refusal
        self._lag_task = asyncio.get_running_loop().create_task(self._watch_lag(), name="replication-lag")

    async def stop(self) -> None:
        if self._lag_task is not None:
            self._lag_task.cancel()
            await asyncio.gather(self._lag_task, return_exceptions=True)
        for session in list(self.sessions.values()):
            session.channel.close()
            self._drop_snapshot(session)
        self.sessions.clear()
        # Writes still waiting for copies are not known to be on enough of them: they are not acknowledged. The
        # member puts its next role's gate in place (GroupMember): a store of a group is never without one.
        self.store.link.fail_held(ReplicationError(f"broker group {self.config.brokerName}'s leader stopped leading "
                                                   f"before enough copies had the write; it may be stored"))

    # --- the in-sync set ---
    @property
    def min_in_sync(self) -> int:
        configured = self.config.minInSyncReplicas
        return configured if configured > 0 else (2 if self.members else 1)

    def in_sync(self) -> list[int]:
        """The in-sync set: the leader's id (0) and its in-sync followers' (and, with failover, those etcd still
        lists)."""
        return [0] + sorted({s.broker_id for s in self.sessions.values() if s.in_sync} | set(self.ghosts))

    def _leased(self) -> bool:
        return self.deadline is None or time.monotonic() < self.deadline()

    def write_refusal(self) -> Exception | None:
        if self.refusal is not None:
            return ReplicationError(self.refusal)
        if not self._leased():
            return ReplicationError(f"broker group {self.config.brokerName}'s leader has no confirmed lease: it "
                                    f"may be replaced; nothing was stored")
        isr = self.in_sync()
        if len(isr) < self.min_in_sync:
            return ReplicationError(self._short(isr))
        return None

    def _short(self, isr: list[int]) -> str:
        return (f"not enough in-sync replicas in broker group {self.config.brokerName}: {len(isr)} of "
                f"minInSyncReplicas {self.min_in_sync} (in sync: {isr}); nothing was stored, retry later or "
                f"elsewhere")

    # --- the store's gate ---
    def shipped(self, record: tuple[int, int, bytes]) -> None:
        """The writer committed a record: it goes to the followers now, while this store syncs it."""
        epoch, seq, payload = record
        self.ring.append((seq, epoch, payload, time.monotonic()))
        self.ring_bytes += len(payload)
        while self.ring_bytes > RING_BYTES and len(self.ring) > 1:
            self.ring_bytes -= len(self.ring.popleft()[2])
        self.shipped_seq = seq
        for session in self.sessions.values():
            self._pump(session)

    def durable(self, seq: int) -> None:
        self.local = max(self.local, seq)
        self._advance()

    async def progress(self, timeout: float = 1.0) -> None:
        """Wait for the next record made durable here or acknowledged by a follower (at most ``timeout``)."""
        if self._progress is None or self._progress.done():
            self._progress = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._progress), timeout)
        except asyncio.TimeoutError:
            pass

    def _advance(self) -> None:
        if self._progress is not None and not self._progress.done():
            self._progress.set_result(None)
        isr = self.in_sync()
        if len(isr) < self.min_in_sync:
            # Durable here, not known to be on enough copies: not acknowledged (and not shown to readers).
            self.store.link.fail_held(ReplicationError(
                self._short(isr).replace("nothing was stored", "the write may be stored")))
            return
        if not self._leased():
            return  # past the lease, nothing is answered: another leader may exist
        committed = min([self.local] + [s.acked for s in self.sessions.values() if s.in_sync]
                        + list(self.ghosts.values()))
        self._committing = max(self._committing, committed)
        if self._committing > self.committed and not self._commit_scheduled:
            self._commit_scheduled = True
            asyncio.get_running_loop().call_soon(self._commit)

    def _commit(self) -> None:
        """Once per loop iteration: the followers are told the committed sequence before anything it covers is
        answered. A leader that dies right after answering has already handed them the notice, so what it
        acknowledged is shown by its followers' readers (told after, a SIGKILL in between hid the last answers)."""
        self._commit_scheduled = False
        if self._committing <= self.committed or not self._leased():
            return
        self.committed = self._committing
        for session in self.sessions.values():
            if session.streaming:
                session.channel.send_request(wire.records([], self.committed))
        self.store.link.release()  # a stopped leader's gate is replaced: this releases only what the new one allows

    # --- followers ---
    def follow(self, channel, broker_id: int, addr: str, ha_addr: str, epoch: int, seq: int) -> dict:
        """A follower asks to follow: where its stream starts (the answer's fields)."""
        if epoch > self.epoch or (epoch == self.epoch and seq > self.shipped_seq):
            # It holds records this leader does not: this leader's store was lost or restored. It is refused (a
            # snapshot would throw its records away); writes go on here only if enough other members are in sync
            # (set minInSyncReplicas), and the operator hands the leadership to it. A claim alone does not stop
            # the leader: with ACL off, anyone could send one.
            why = (f"follower {broker_id} ({addr}) holds records up to ({epoch}, {seq}), this leader only up to "
                   f"({self.epoch}, {self.local}): restart it as brokerId 0 and this broker as a follower")
            log.error("refused a follower: %s", why)
            raise ReplicationError(why)
        if broker_id not in self.sessions and len(self.sessions) >= MAX_FOLLOWERS:
            raise ReplicationError(f"this leader already serves {len(self.sessions)} followers (at most "
                                   f"{MAX_FOLLOWERS})")
        old = self.sessions.get(broker_id)
        if old is not None and old.channel is not channel:
            log.info("follower %d (%s) connected again; its earlier link is closed", broker_id, addr)
            if old.in_sync:
                self._leave(old)
            self._forget(old)
            old.channel.close()
        epochs = self.store.epochs
        first = self.ring[0][0] if self.ring else self.shipped_seq + 1
        session = FollowerSession(channel, broker_id, addr, next_seq=seq + 1, acked=seq, ha_addr=ha_addr)
        self.sessions[broker_id] = session
        if is_prefix(epochs, self.shipped_seq, epoch, seq) and seq + 1 >= first:
            log.info("follower %d (%s) follows from record %d", broker_id, addr, seq + 1)
            self._join(session)
            asyncio.get_running_loop().call_soon(self._pump, session)
            answer = {"from": str(seq + 1)}
        else:
            taking = sum(1 for s in self.sessions.values() if s is not session and not s.streaming)
            if taking >= MAX_SNAPSHOTS:
                # A store copy each: one at a time, whoever asks (the follower asks again after a pause).
                del self.sessions[broker_id]
                raise ReplicationError(f"another follower's snapshot is being sent; follow again later")
            log.info("follower %d (%s) at (%d, %d) gets a snapshot first", broker_id, addr, epoch, seq)
            session.acked = 0
            session.snapshot_size = -1  # being taken
            asyncio.get_running_loop().create_task(self._snapshot(session))
            answer = {"snapshot": "1"}
        answer.update(epoch=str(self.epoch), commit=str(self.committed))
        return answer

    def acked(self, channel, seq: int | None, snapshot: int | None) -> None:
        session = self._session(channel)
        if session is None:
            return
        if snapshot is not None:
            session.snapshot_acked = snapshot
            self._send_snapshot(session)
            return
        session.acked = max(session.acked, seq)
        self._join(session)
        self._pump(session)
        self._advance()

    def _join(self, session: FollowerSession) -> None:
        """A follower holding everything committed joins the in-sync set: from now on it is waited for."""
        # Against what may be released by the next _commit, not what was: a member joining between the two would
        # be in the set (electable) without records its leader is about to answer for.
        if session.in_sync or not session.streaming or session.acked < self._committing:
            return
        session.in_sync = True
        self.ghosts.pop(session.broker_id, None)  # counted as itself from now on
        log.info("follower %d (%s) is in sync at record %d", session.broker_id, session.addr, session.acked)
        if self.isr_keeper is not None:  # counted here first, then in etcd (KIP-497's order)
            asyncio.get_running_loop().create_task(self._grow(session.broker_id))
        if session.broker_id not in self.members:
            self.members.add(session.broker_id)
            self.store.submit(PutMeta(MEMBERS_KEY, sorted(self.members)))

    def channel_closed(self, channel) -> None:
        session = self._session(channel)
        if session is not None:
            log.warning("follower %d (%s) disconnected", session.broker_id, session.addr)
            if session.in_sync:
                self._leave(session)
            self._forget(session)
            self._advance()

    def _leave(self, session: FollowerSession) -> None:
        """A follower leaves the in-sync set. With failover, etcd first: until it removed the member there, the
        leader goes on waiting for it (a ghost), so etcd's set never holds a member the leader did not wait for."""
        session.in_sync = False
        if self.isr_keeper is None:
            return
        self.ghosts[session.broker_id] = session.acked
        asyncio.get_running_loop().create_task(self._shrink(session.broker_id))

    async def _shrink(self, broker_id: int) -> None:
        while broker_id in self.ghosts and self.isr_keeper is not None:
            try:
                removed = await self.isr_keeper.shrink(broker_id)
            except Exception as exc:  # etcd unavailable: it stays waited for (writes wait, or are refused)
                log.warning("could not remove follower %d from the in-sync set in etcd: %s", broker_id, exc)
                await asyncio.sleep(SHRINK_RETRY_S)
                continue
            if removed:
                self.ghosts.pop(broker_id, None)
                self._advance()
            return

    async def _grow(self, broker_id: int) -> None:
        try:
            await self.isr_keeper.grow(broker_id)
        except Exception as exc:  # counted here anyway: etcd's set is a subset of what the leader waits for
            log.warning("could not add follower %d to the in-sync set in etcd: %s", broker_id, exc)

    def _session(self, channel) -> FollowerSession | None:
        for session in self.sessions.values():
            if session.channel is channel:
                return session
        return None

    def _forget(self, session: FollowerSession) -> None:
        if self.sessions.get(session.broker_id) is session:
            del self.sessions[session.broker_id]
        self._drop_snapshot(session)

    def _pump(self, session: FollowerSession) -> None:
        """Send the records the follower lacks, while its socket takes them."""
        if not session.streaming or not session.channel.writable:
            return
        ring = self.ring
        while session.next_seq <= self.shipped_seq and session.channel.unread_bytes < HIGH_WATER:
            if not ring or session.next_seq < ring[0][0]:
                log.warning("follower %d (%s) fell behind the kept records (next %d, oldest kept %s); it will "
                            "resync from a snapshot", session.broker_id, session.addr, session.next_seq,
                            ring[0][0] if ring else "-")
                session.channel.close()
                return
            start = session.next_seq - ring[0][0]
            batch, size = [], 0
            for index in range(start, len(ring)):
                rseq, epoch, payload, _at = ring[index]
                batch.append((epoch, rseq, payload))
                size += len(payload)
                if size >= wire.RECORDS_BATCH_BYTES:
                    break
            session.channel.send_request(wire.records(batch, self.committed))
            session.next_seq = batch[-1][1] + 1

    async def _watch_lag(self) -> None:
        """Followers that stopped keeping up leave the in-sync set."""
        period = max(self.config.haMaxLagMillis / 4000, 0.05)
        while True:
            await asyncio.sleep(period)
            self.check_lag()

    def check_lag(self) -> None:
        limit = self.config.haMaxLagMillis / 1000
        now = time.monotonic()
        for session in self.sessions.values():
            if session.in_sync and self.lag_seconds(session, now) > limit:
                self._leave(session)
                log.warning("follower %d (%s) left the in-sync set: record %d is unacknowledged for over %d ms",
                            session.broker_id, session.addr, session.acked + 1, self.config.haMaxLagMillis)
        self._advance()

    def lag_seconds(self, session: FollowerSession, now: float | None = None) -> float:
        """How long the oldest record the follower has not acknowledged has been durable here (0: none)."""
        if session.acked >= self.shipped_seq or not self.ring:
            return 0.0
        index = session.acked + 1 - self.ring[0][0]
        if index < 0:
            return float("inf")
        return (now or time.monotonic()) - self.ring[min(index, len(self.ring) - 1)][3]

    # --- snapshots ---
    async def _snapshot(self, session: FollowerSession) -> None:
        os.makedirs(self._snapshots, exist_ok=True)
        path = os.path.join(self._snapshots, f"follower-{session.broker_id}-{id(session)}.mdb")
        session.snapshot_path = path
        try:
            position = await asyncio.get_running_loop().run_in_executor(None, self.store.snapshot, path)
        except Exception:
            log.exception("snapshot for follower %d failed", session.broker_id)
            self._drop_snapshot(session)
            session.channel.close()
            return
        if self.sessions.get(session.broker_id) is not session:
            self._drop_snapshot(session)
            return
        session.snapshot_position = position
        session.snapshot_size = os.path.getsize(path)
        session.next_seq = position[1] + 1
        session.acked = position[1]
        log.info("snapshot for follower %d: %d bytes at record %d", session.broker_id, session.snapshot_size,
                 position[1])
        self._send_snapshot(session)

    def _send_snapshot(self, session: FollowerSession) -> None:
        if session.snapshot_path is None or session.snapshot_size <= 0:
            return
        with open(session.snapshot_path, "rb") as snapshot:
            while (session.snapshot_sent < session.snapshot_size and session.snapshot_sent - session.snapshot_acked
                   < wire.SNAPSHOT_WINDOW * wire.SNAPSHOT_PIECE):
                snapshot.seek(session.snapshot_sent)
                piece = snapshot.read(wire.SNAPSHOT_PIECE)
                end = session.snapshot_sent + len(piece)
                last = session.snapshot_position if end >= session.snapshot_size else None
                session.channel.send_request(wire.snapshot_piece(session.snapshot_sent, piece, last))
                session.snapshot_sent = end
        if session.snapshot_acked >= session.snapshot_size:
            # Installed: the stream goes on from the snapshot's record.
            self._drop_snapshot(session)
            session.snapshot_size = 0
            self._join(session)
            self._pump(session)
            self._advance()

    def _drop_snapshot(self, session: FollowerSession) -> None:
        if session.snapshot_path is not None:
            try:
                os.unlink(session.snapshot_path)
            except FileNotFoundError:
                pass
            session.snapshot_path = None

    # --- status ---
    def status(self) -> dict:
        now = time.monotonic()
        return {"role": "leader", "epoch": self.epoch, "seq": self.local, "committed": self.committed,
                "leased": self._leased(),
                "minInSyncReplicas": self.min_in_sync, "inSync": self.in_sync(),
                "members": sorted(self.members),
                "followers": [{"brokerId": s.broker_id, "addr": s.addr, "acked": s.acked, "inSync": s.in_sync,
                               "lagMillis": int(1000 * min(self.lag_seconds(s, now), 1e9)),
                               "behind": self.shipped_seq - s.acked, "snapshot": not s.streaming}
                              for s in sorted(self.sessions.values(), key=lambda s: s.broker_id)]}
