"""A broker's place in its broker group: leader or follower, and the switch between the two.

A group is the brokers sharing ``brokerClusterName`` and ``brokerName``, each with its own store. Roles are static
here: ``brokerId`` 0 leads, any other id follows, until a planned switchover (``halfmq admin switchLeader``) hands
the leadership to a follower; each side then records its new role beside its store (``ROLE_FILE``: the id it is
shown under and the leader it follows), so a restart keeps it. Routes show the leader as brokerId 0, and the member
that handed over its leadership takes the id of the one that took it.

Replication is on for a broker with ``haListenPort`` >= 0 that is part of a group: one with ``namesrvAddr``,
``haMasterAddress`` or a ``brokerId`` above 0. A broker alone is unchanged: no port, no records, no gate.

Leading: the writer numbers every write in the leader's epoch (one more than any its store saw), a
``ReplicationLeader`` gates answers on the in-sync set, and ``LeaderServices`` (check-backs, delays, timers,
retention) run. Following: a ``ReplicationFollower`` applies the leader's records, and none of those services run.
Taking over is the restart path: the follower's link stops, the writer leads at the new epoch, the services start
fresh from the store as after a kill -9.

Switchover (``switch``, on the leader): writes are refused from then on (SERVICE_NOT_AVAILABLE: producers retry,
nothing is answered by two leaders), the target must acknowledge every record this leader holds, then it is told
to lead at the next epoch (HALFMQ_REPL_PROMOTE); once it answers, this broker follows it. A target that does not
catch up within ``SWITCH_TIMEOUT_S`` leaves everything as it was.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand

from halfmq.store import NotLeaderError, ReplicationError

from ..errors import BrokerError, Failure
from ..services.leading import LeaderServices
from . import wire
from .failover import Failover, member_id
from .follower import ReplicationFollower
from .leader import ReplicationLeader

log = logging.getLogger(__name__)
ROLE_FILE = "replication.json"
SWITCH_TIMEOUT_S = 30.0


class Between:
    """The store's gate and write refusal while a member of a group has no role: after it stopped leading and
    before it follows, or before its first election. It takes no write, and answers none still waiting: a group
    member's store is never without a gate (without one it would answer writes on its own copy alone)."""

    committed = -1  #: nothing waiting is published

    def __init__(self, store, why: str):
        self.store = store
        self.why = why

    def install(self) -> None:
        self.store.set_gate(self)
        self.store.write_refusal = self.refusal

    def refusal(self) -> Exception:
        return NotLeaderError(self.why)

    def shipped(self, record) -> None:
        pass

    def durable(self, seq: int) -> None:
        self.store.link.fail_held(ReplicationError(f"{self.why}; the write may be stored"))


def replicated(config) -> bool:
    return config.haListenPort >= 0 and bool(config.namesrvAddr or config.haMasterAddress or config.brokerId > 0
                                             or config.haEtcdEndpoints)


class GroupMember:
    """Owns the broker's role. ``broker_id`` is the id routes show (0 while leading)."""

    def __init__(self, ctx, services: LeaderServices, find_leader=None, on_role_change=None):
        self.ctx = ctx
        self.config = ctx.config
        self.services = services
        self.find_leader = find_leader          #: async () -> the leader's HA address known to the name servers
        self.on_role_change = on_role_change    #: called after the role changed (the broker registers again)
        self.enabled = replicated(ctx.config)
        if self.enabled:
            # Started with whatever its store holds, an unacknowledged tail of its own leadership included: nothing
            # of it is read until it leads or its leader has seen the store (ReplicationFollower._confirmed).
            ctx.store.reads_held = (f"broker {self.config.brokerName} has not resynced with its group since it "
                                    f"started: read from the group's leader")
        self.ha_addr = ""                       #: this member's replication address, once listening
        self.leader: ReplicationLeader | None = None
        self.follower: ReplicationFollower | None = None
        self._role_path = os.path.join(self.config.storePathRootDir, ROLE_FILE)
        saved = self._saved_role()
        self.broker_id: int = saved.get("brokerId", self.config.brokerId) if self.enabled else self.config.brokerId
        self.leader_ha_addr: str = saved.get("leader", "") or self.config.haMasterAddress
        self._switching = asyncio.Lock()
        #: with haEtcdEndpoints: the election decides the role; ``election_id`` names this member there and is the
        #: id routes show while it follows
        self.failover: Failover | None = None
        self.election_id = member_id(self.config, saved.get("electionId")) if self.config.haEtcdEndpoints else 0
        if self.election_id:
            self.broker_id = self.election_id
            if saved.get("electionId") != self.election_id:
                self._write_role({"electionId": self.election_id})

    @property
    def leading(self) -> bool:
        return self.broker_id == 0

    @property
    def epoch(self) -> int:
        """The epoch this broker leads at (0 while it does not lead)."""
        return self.leader.epoch if self.leader is not None else 0

    # --- lifecycle ---
    async def start(self) -> None:
        if self.enabled:
            self._between("waiting for its role")
        if self.election_id:
            self.failover = Failover(self, self.election_id)
            await self.failover.start()
        elif self.enabled and self.leading:
            await self._lead(self._next_epoch())
        elif self.enabled:
            self._follow()
        else:
            self.ctx.metrics.load_pending()
            self.services.start()

    async def stop(self) -> None:
        if self.failover is not None:
            await self.failover.stop()  # resigns first: another member takes over at once
        await self.services.stop()
        if self.leader is not None:
            await self.leader.stop()
            self.leader = None
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None

    async def _drain(self, timeout: float = 10.0) -> None:
        """Writes handed to the writer while this member led are answered (refused, by the ``Between`` gate)
        before a follower's gate is in place: a follower publishes what its leader committed, and a record of its
        own leadership at the same sequence is not that."""
        link, loop = self.ctx.store.link, asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while link.waiting and loop.time() < deadline:
            await asyncio.sleep(0.005)  # each group fails as its commit comes back: no event says "all came"

    def _between(self, why: str) -> None:
        Between(self.ctx.store, f"broker {self.config.brokerName}/{self.broker_id} is {why}: writes go to the "
                                f"group's leader").install()

    def _next_epoch(self) -> int:
        epochs = self.ctx.store.epochs
        return (epochs[-1][0] if epochs else 0) + 1

    async def _lead(self, epoch: int, election=None) -> None:
        store = self.ctx.store
        await store.lead(epoch)
        store.reads_held = None  # what the leader holds is the group's
        self.leader = ReplicationLeader(self.ctx, epoch)
        if election is not None:
            # Elected: nothing is answered past the lease, and the in-sync set is kept in etcd.
            self.leader.deadline = lambda: election.leading_until
            self.leader.isr_keeper = self.failover
        self.leader.start()
        # As after a restart: the tables are read from the store (a follower's were fed by its records).
        self.ctx.topics.reload(set(self.ctx.topics.topics) | set(store.topics()))
        self.ctx.offsets.reload()
        self.ctx.metrics.load_pending()
        self.services.start()
        log.info("leading broker group %s at epoch %d (record %d)", self.config.brokerName, epoch,
                 store.position[1])

    def _follow(self) -> None:
        # With failover the election names the leader; the name servers' view may be a term behind.
        self.follower = ReplicationFollower(self.ctx, self.leader_ha_addr or None,
                                            find_leader=None if self.election_id else self.find_leader,
                                            on_promote=self._promoted, broker_id=self.broker_id,
                                            ha_addr=self.ha_addr)
        self.follower.start()
        log.info("following the leader of broker group %s (%s) as brokerId %d", self.config.brokerName,
                 self.leader_ha_addr or "from the name servers", self.broker_id)

    # --- roles from the election (failover.py) ---
    async def take_over(self, epoch: int, election) -> None:
        """Elected at ``epoch``: lead, as after a restart. The in-sync set starts as this member alone (the others
        join again once they acknowledged everything committed: the set never holds a member not waited for)."""
        follower, self.follower = self.follower, None
        if follower is not None:
            await follower.stop()
            self._between("taking the leadership")
        self.broker_id = 0
        # etcd's set of the previous epoch goes first: while it still named a member that is not following yet,
        # this leader could commit without it and, losing its lease, leave that member electable without the
        # records (CI chaos seed 4101, etcd slow after a member's restart).
        others = [m for m in (election.isr.members if election.isr else ()) if m != str(self.election_id)]
        if others:
            await election.shrink_isr(others)
        await self._lead(epoch, election)
        if self.on_role_change is not None:
            await self.on_role_change()

    async def follow(self, leader_ha_addr: str) -> None:
        """The election names another leader: follow it (stepping down first if this broker led)."""
        if self.leader is not None:
            await self.step_down(f"{leader_ha_addr} leads")
        if self.follower is not None and self.follower.leader_addr == leader_ha_addr:
            return
        if self.follower is not None:
            follower, self.follower = self.follower, None
            await follower.stop()
        self._between("changing leaders")
        await self._drain()
        self.broker_id = self.election_id
        self.leader_ha_addr = leader_ha_addr
        self._follow()
        if self.on_role_change is not None:
            await self.on_role_change()

    async def step_down(self, reason: str) -> None:
        """Stop leading now (the lease is lost, or another leader exists): writes waiting for copies fail, the
        leader's services stop; the election loop then follows whoever leads."""
        leader, self.leader = self.leader, None
        if leader is None:
            return
        log.warning("stepping down as the leader of %s: %s", self.config.brokerName, reason)
        # At once (before anything awaits): from now on nothing is taken or answered until a role is taken again.
        self.broker_id = self.election_id
        if self.follower is None:
            self._between("between leaders")
        leader.deadline = lambda: 0.0
        await self.services.stop()
        await leader.stop()
        if self.on_role_change is not None:
            await self.on_role_change()

    # --- the replication port's requests (the leader serves them) ---
    def register(self, dispatcher) -> None:
        dispatcher.register(RequestCode.HALFMQ_REPL_FOLLOW, self._follow_request)
        dispatcher.register(RequestCode.HALFMQ_REPL_ACK, self._ack)
        dispatcher.register(RequestCode.HALFMQ_REPL_OFFSETS, self._offsets)
        dispatcher.on_channel_closed(self._closed)

    def _follow_request(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields
        cfg = self.config
        if ext.get("clusterName") != cfg.brokerClusterName or ext.get("brokerName") != cfg.brokerName:
            log.warning("refused a follower from %s: it belongs to %s/%s, not to this group %s/%s", channel.remote,
                        ext.get("clusterName"), ext.get("brokerName"), cfg.brokerClusterName, cfg.brokerName)
            raise BrokerError(Failure.FORBIDDEN, f"this is broker group {cfg.brokerClusterName}/{cfg.brokerName}")
        if self.leader is None:
            raise BrokerError(Failure.NOT_REPLICATED,
                              f"this broker does not lead its group; its leader is {self.leader_ha_addr or 'unknown'}")
        try:
            broker_id, epoch, seq = int(ext["brokerId"]), int(ext["epoch"]), int(ext["seq"])
        except (KeyError, ValueError):
            raise BrokerError(Failure.BAD_REQUEST, "HALFMQ_REPL_FOLLOW needs brokerId, epoch and seq") from None
        if broker_id <= 0:
            raise BrokerError(Failure.BAD_REQUEST, f"a follower's brokerId is above 0, not {broker_id}")
        answer = self.leader.follow(channel, broker_id, ext.get("brokerAddr", channel.remote), ext.get("haAddr", ""),
                                    epoch, seq)
        return cmd.response(ResponseCode.SUCCESS, None, answer)

    def _ack(self, channel, cmd: RemotingCommand) -> None:
        if self.leader is not None:
            ext = cmd.ext_fields
            seq, snapshot = ext.get("seq"), ext.get("snapshot")
            self.leader.acked(channel, int(seq) if seq is not None else None,
                              int(snapshot) if snapshot is not None else None)

    def _offsets(self, channel, cmd: RemotingCommand) -> None:
        if self.leader is not None and self.leader._session(channel) is not None:
            for (group, topic, queue_id), offset in wire.read_offsets(cmd).items():
                self.ctx.offsets.commit(group, topic, queue_id, offset)

    def _closed(self, channel) -> None:
        if self.leader is not None:
            self.leader.channel_closed(channel)

    # --- switchover ---
    async def switch(self, target_id: int) -> dict:
        """Hand the leadership to follower ``target_id`` (admin: HALFMQ_SWITCH_LEADER); returns once this broker
        follows it."""
        if self.leader is None:
            raise BrokerError(Failure.BAD_REQUEST, "this broker does not lead its group: send switchLeader to the "
                                                   "leader")
        if self.failover is not None:
            raise BrokerError(Failure.BAD_REQUEST, "this group elects its leader on etcd (haEtcdEndpoints): stop "
                                                   "the leader to hand over")
        async with self._switching:
            leader = self.leader
            session = leader.sessions.get(target_id)
            if session is None or not session.streaming or not session.ha_addr:
                raise BrokerError(Failure.BAD_REQUEST, f"follower {target_id} is not connected and streaming")
            leader.refusal = f"broker group {self.config.brokerName} is handing its leadership to {session.addr}"
            try:
                await self._wait_caught_up(session)
            except BaseException:
                leader.refusal = None
                raise
            epoch = leader.epoch + 1
            # The target checks it holds every record up to ``seq``, then leads at ``epoch``; this broker follows.
            session.channel.send_request(wire.promote(epoch, leader.local))
            session.channel.flush()
            await self._demote(session.broker_id, session.ha_addr)
            return {"leader": session.addr, "epoch": epoch}

    async def _wait_caught_up(self, session) -> None:
        leader = self.leader
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SWITCH_TIMEOUT_S
        # Groups handed to the writer before the refusal: the last one's record must be durable and acknowledged.
        while leader.store.link.waiting or session.acked < leader.local:
            if loop.time() > deadline:
                raise BrokerError(Failure.FOLLOWER_BEHIND, f"follower {session.broker_id} did not catch up within "
                                                           f"{SWITCH_TIMEOUT_S:.0f} s; the leadership stays here")
            await leader.progress()

    async def _demote(self, new_id: int, leader_ha_addr: str) -> None:
        await self.services.stop()
        leader, self.leader = self.leader, None
        await leader.stop()
        self._between("handing over its leadership")
        await self._drain()
        self._save_role(new_id, leader_ha_addr)
        self.broker_id = new_id
        self.leader_ha_addr = leader_ha_addr
        self._follow()
        log.info("handed the leadership of %s to %s; following it as brokerId %d", self.config.brokerName,
                 leader_ha_addr, new_id)
        if self.on_role_change is not None:
            await self.on_role_change()

    async def _promoted(self, epoch: int, seq: int) -> None:
        """The leader handed over its leadership (HALFMQ_REPL_PROMOTE): lead at ``epoch`` from now on, once every
        record up to ``seq`` is durable here."""
        follower, self.follower = self.follower, None
        if follower is None:
            return
        await follower.stop()
        self._between("taking the leadership")
        if self.ctx.store.position[1] < seq:
            log.error("refused the leadership: this store holds records up to %d, the leader had %d",
                      self.ctx.store.position[1], seq)
            self._follow()
            return
        self._save_role(0, "")
        self.broker_id = 0
        self.leader_ha_addr = ""
        await self._lead(epoch)
        if self.on_role_change is not None:
            await self.on_role_change()

    # --- the role file ---
    def _saved_role(self) -> dict:
        try:
            with open(self._role_path) as file:
                return json.load(file)
        except FileNotFoundError:
            return {}

    def _save_role(self, broker_id: int, leader_ha_addr: str) -> None:
        self._write_role({"brokerId": broker_id, "leader": leader_ha_addr})

    def _write_role(self, role: dict) -> None:
        os.makedirs(os.path.dirname(self._role_path), exist_ok=True)
        temp = self._role_path + ".tmp"
        with open(temp, "w") as file:
            json.dump(role, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, self._role_path)

    # --- status ---
    def status(self) -> dict:
        if not self.enabled:
            return {"role": "standalone", "brokerId": self.broker_id}
        part = self.leader.status() if self.leader is not None else \
            self.follower.status() if self.follower is not None else {"role": "candidate"}
        return {"brokerId": self.broker_id, "haAddr": self.ha_addr, **part}
