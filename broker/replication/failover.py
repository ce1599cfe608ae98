"""Automatic failover: with ``haEtcdEndpoints`` a broker group elects its leader on etcd (election.py).

Each member runs ``Failover``: while the group has a leader it follows it (the leader key names its replication
address); when the key goes (the leader's lease expired or was revoked), every member of the in-sync set that etcd
holds may campaign, the one with the most records first (members publish their last record; the others wait a
moment per member ahead of them), and the winner, by one etcd transaction, also raises the group's epoch. Only a
member of that in-sync set can win, and every member of it has every acknowledged record: the leader counts a
member's acknowledgements before it asks etcd to add it (``grow_isr``), and stops waiting for one only once etcd
removed it (``shrink_isr``).

Fencing: the leader acknowledges nothing past ``GroupElection.leading_until`` (a third of the lease before a new
leader can exist; ``ReplicationLeader.deadline``), followers refuse records of an older epoch, and a deposed
leader's in-sync set changes fail their compare-and-swap. Taking over is the restart path (``GroupMember._lead``);
a leader that loses its lease stops leading at once and follows whoever is elected.

Without etcd's quorum nothing is elected and the in-sync set cannot shrink: a leader keeps answering while its
in-sync members acknowledge and its lease holds, and refuses writes once either fails.
"""
from __future__ import annotations

import asyncio
import logging
import zlib

from .election import ElectionError, GroupElection, NotLeader

log = logging.getLogger(__name__)
RANK_WAIT_S = 0.3      #: a candidate waits this long per in-sync member that holds more records
RETRY_S = 0.2          #: after etcd did not answer


def member_id(config, stored: int | None) -> int:
    """The id a member is known by in its group's election (its follower id in routes): ``brokerId`` when given,
    else the one it chose before (kept beside its store), else one derived from its address."""
    if config.brokerId > 0:
        return config.brokerId
    if stored:
        return stored
    return 1 + zlib.crc32(f"{config.advertised_ip}:{config.listenPort}:{config.storePathRootDir}".encode()) % 1000


class Failover:
    """Keeps ``member`` (GroupMember) leading or following as etcd's election says."""

    def __init__(self, member, election_id: int):
        self.member = member
        self.id = election_id
        cfg = member.config
        self.election = GroupElection(
            [e.strip() for e in cfg.haEtcdEndpoints.split(",") if e.strip()], cfg.brokerClusterName,
            cfg.brokerName, str(election_id), member.ha_addr, lease_seconds=cfg.haLeaseSeconds,
            on_lost=self._lost)
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self.election.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="failover")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.election.close()  # resigns: a follower takes over within milliseconds

    def _lost(self, reason: str) -> None:
        """The lease is gone (or etcd shows another leader): stop leading now, then look for the new leader."""
        if self.member.leader is not None:
            asyncio.get_running_loop().create_task(self.member.step_down(reason))
        self._changed.set()

    # --- the loop ---
    async def _run(self) -> None:
        while True:
            try:
                state = await self.election.read_group()
                leader = state.leader
                if leader is None:
                    if await self._campaign(state):
                        continue
                elif leader.id == str(self.id):
                    if self.member.leader is None:
                        # A lease of an earlier run of this member: give it up, a campaign follows.
                        await self.election.resign()
                        continue
                else:
                    await self.member.follow(leader.addr)
                await self._wait(state)
            except asyncio.CancelledError:
                raise
            except ElectionError as exc:
                log.warning("failover: etcd: %s", exc)
                await asyncio.sleep(RETRY_S)
            except Exception:
                log.exception("failover step failed")
                await asyncio.sleep(RETRY_S)

    async def _wait(self, state) -> None:
        """Until the leader key changes, or this member's lease is lost."""
        self._changed.clear()
        watch = asyncio.ensure_future(self.election.next_leader(state, timeout=max(10.0, 4 * self.election.ttl)))
        lost = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({watch, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watch, lost):
                task.cancel()
            await asyncio.gather(watch, lost, return_exceptions=True)

    async def _campaign(self, state) -> bool:
        """Campaign if this member may lead (it is in the in-sync set etcd holds, or the group has none yet),
        after the members holding more records had their turn; True once it leads."""
        isr = state.isr
        if isr is not None and str(self.id) not in isr.members:
            return False
        store = self.member.ctx.store
        mine = tuple(store.position)
        await self.election.publish({"epoch": mine[0], "seq": mine[1], "addr": self.member.ha_addr})
        ahead = sum(1 for member, info in state.members.items()
                    if member != str(self.id) and (isr is None or member in isr.members)
                    and (info.get("epoch", 0), info.get("seq", 0)) > mine)
        if ahead:
            await asyncio.sleep(RANK_WAIT_S * ahead)
            if (await self.election.read_group()).leader is not None:
                return False
        epochs = store.epochs
        epoch = await self.election.campaign(min_epoch=(epochs[-1][0] if epochs else 0) + 1)
        if epoch is None:
            return False
        try:
            await self.member.take_over(epoch, self.election)
        except Exception:
            log.exception("failover: could not lead at epoch %d; resigning", epoch)
            await self.election.resign()
            await self.member.step_down("taking over failed")
            return False
        return True

    # --- the in-sync set, for the leader ---
    async def grow(self, broker_id: int) -> bool:
        try:
            await self.election.grow_isr(str(broker_id))
            return True
        except NotLeader as exc:
            self._lost(str(exc))
            return False

    async def shrink(self, broker_id: int) -> bool:
        try:
            await self.election.shrink_isr([str(broker_id)])
            return True
        except NotLeader as exc:
            self._lost(str(exc))
            return False
