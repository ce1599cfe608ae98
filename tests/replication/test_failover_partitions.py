"""Network partitions of a broker group's leader (issue 41), under the chaos test's load and checks
(test_failover_chaos.py): 64 sends in flight, transactions, a consumer.

Each member reaches etcd through proxies of its own and the others reach its replication port through its proxy
(``haAdvertisedAddress``, tests/support/proxy.py), so one member can be cut off while clients and name servers
still reach it: the worst case, a leader that goes on taking sends it may no longer answer. Faults:

- ``partition-leader``: the leader cut off from etcd and from its followers, mostly past its lease (the others
  elect a new leader), sometimes for under its lease (it may step down before its key expires); then healed;
- ``cut-leader-from-followers``: the leader cut off from its followers only, so it keeps its lease: it removes
  them from the in-sync set in etcd and then refuses writes (``minInSyncReplicas`` 2); then healed;
- ``cut-leader-from-etcd``: the leader cut off from etcd only, its followers still streaming from it: it steps
  down when its lease runs out and a follower is elected (or, for a shorter cut, it may keep leading).

A heal either lets through what was held (as TCP does after a short cut) or resets every held connection (as after
TCP gave up), as the seed draws. Besides the chaos test's checks after every fault (and, while the old leader is
still cut off, on the members that elected a new one): once a new leader acknowledged a send, the old one
acknowledges none of the sends begun after it, and once healed it is back in the in-sync set as a follower.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from halfmq.broker.local_cluster import free_etcd_ports
from halfmq.broker.replication import wire
from halfmq.protocol.command import decode_command
from halfmq.protocol.errors import FrameError
from halfmq.protocol.frame import FrameDecoder

from tests.replication.test_failover_chaos import LEASE_S, Chaos, LoggedGroup
from tests.replication.test_group_faults import until
from tests.support.proxy import Proxy

pytestmark = pytest.mark.slow
#: what each fault cuts the leader off from: (etcd, its followers)
CUTS = {"partition-leader": (True, True), "cut-leader-from-followers": (False, True),
        "cut-leader-from-etcd": (True, False)}
WHAT = {"partition-leader": "etcd and its followers", "cut-leader-from-followers": "its followers (not from etcd)",
        "cut-leader-from-etcd": "etcd (not from its followers)"}
MAX_LAG_S = 1.0  #: ElectedGroup's haMaxLagMillis
KINDS = ("partition-leader", "partition-leader", "cut-leader-from-followers", "cut-leader-from-etcd")


def follower_id(data: bytes) -> str | None:
    """The brokerId a replication link's first request (HALFMQ_REPL_FOLLOW) names; "" for anything else."""
    try:
        frames = FrameDecoder(wire.MAX_FRAME).feed(data)
    except FrameError:
        return ""
    if not frames:
        return None
    return str(decode_command(frames[0]).ext_fields.get("brokerId", ""))


class PartitionedGroup(LoggedGroup):
    """Member i (election id i + 1) reaches etcd member k through ``etcd_proxies[i][k]``, and every follower
    reaches member i's replication port through ``ha_proxies[i]`` (its advertised replication address)."""

    def __init__(self, root, etcd, **kw):
        super().__init__(root, etcd, **kw)
        self.etcd_endpoints = list(etcd.endpoints)
        self.ha_ports = free_etcd_ports(self.size)  # fixed: the proxies, made first, are aimed at them
        self.etcd_proxies: list[list[Proxy]] = []
        self.ha_proxies: list[Proxy] = []

    async def start(self) -> "PartitionedGroup":
        for index in range(self.size):
            self.etcd_proxies.append([await Proxy(endpoint).start() for endpoint in self.etcd_endpoints])
            self.ha_proxies.append(await Proxy(f"127.0.0.1:{self.ha_ports[index]}", follower_id).start())
        await super().start()
        return self

    def member_process(self, index: int, *extra: str):
        process = super().member_process(index, *extra)
        process.args = [a for a in process.args if not a.startswith(("--haEtcdEndpoints=", "--haListenPort="))]
        process.args += [f"--haEtcdEndpoints={','.join(p.addr for p in self.etcd_proxies[index])}",
                         f"--haListenPort={self.ha_ports[index]}",
                         f"--haAdvertisedAddress={self.ha_proxies[index].addr}"]
        return process

    def isolate(self, index: int, etcd: bool, members: bool) -> None:
        """Cuts member ``index`` off from etcd, and from the members it leads or follows."""
        if members:
            for other, proxy in enumerate(self.ha_proxies):
                proxy.cut(None if other == index else {str(index + 1)})
        if etcd:
            for proxy in self.etcd_proxies[index]:
                proxy.cut()

    @property
    def proxies(self) -> list[Proxy]:
        return [*self.ha_proxies, *(proxy for proxies in self.etcd_proxies for proxy in proxies)]

    def heal(self, reset: bool) -> None:
        for proxy in self.proxies:
            proxy.heal(reset)

    async def stop(self) -> None:
        self.heal(reset=True)  # a held link would hold up a member's stop
        await super().stop()
        await asyncio.gather(*(proxy.stop() for proxy in self.proxies))


class PartitionChaos(Chaos):
    kinds = KINDS

    async def fault(self, kind: str) -> None:
        rnd, group = self.rnd, self.group
        leader = await self.whole("the previous fault")
        old = group.members[leader].broker_addr
        await self.more_acked(200, f"sends before {kind}")
        reset = rnd.random() < 0.5
        heal = "reset" if reset else "delivered"
        when = time.monotonic()
        alone = None  #: since when the leader, cut off from its followers, was alone in its in-sync set
        from_etcd, from_followers = CUTS[kind]
        if from_etcd:
            past = rnd.random() < 0.8
            self.log(f"leader member {leader} cut off from {WHAT[kind]} "
                     + ("past its lease" if past else "for under its lease") + f", held links then {heal}")
            group.isolate(leader, from_etcd, from_followers)
            if past:
                await self.elected(exclude=leader)
                await until(self._acked_elsewhere(old, when), 60, f"seed {self.seed}: a send acknowledged by the "
                                                                  f"new leader")
                await asyncio.sleep(rnd.uniform(0.0, 2.0))  # the cut-off leader keeps getting sends meanwhile
                await self.audit(f"during {kind}", members=[i for i in range(group.size) if i != leader])
            else:  # healed while it leads, or once it stepped down (two thirds in) with its key still in etcd
                await asyncio.sleep(rnd.uniform(0.2, LEASE_S))
        else:
            brief = rnd.random() < 0.3
            self.log(f"leader member {leader} cut off from {WHAT[kind]} "
                     + ("for under haMaxLagMillis" if brief else "until it is alone in sync")
                     + f", held links then {heal}")
            group.isolate(leader, from_etcd, from_followers)
            if brief:  # writes wait for the followers, which are still in sync
                await asyncio.sleep(rnd.uniform(0.2, 0.8 * MAX_LAG_S))
            else:
                async def shrunk():
                    state = (await self.statuses()).get(leader)
                    return isinstance(state, dict) and state.get("inSync") == [0]
                # Holding its lease it goes on leading, alone once etcd removed its followers: it refuses writes.
                await until(shrunk, 30, f"seed {self.seed}: the cut-off leader's in-sync set shrunk to itself")
                alone = time.monotonic()
                await asyncio.sleep(rnd.uniform(0.0, 1.5))
        healed = time.monotonic()
        group.heal(reset)
        if alone is not None:
            answered = [acked - alone for began, acked, _ in self.ack_times if alone < began and acked < healed]
            if answered:
                self.violations.append(f"{kind}: {len(answered)} sends begun while the leader was alone in its "
                                       f"in-sync set were acknowledged (s after): {answered[:3]}")
        await self.measure_failover(kind, when)
        self.check_fenced(old, when, healed)
        now = await self.whole(f"{kind} healed")
        if group.members[now].broker_addr != old:
            state = (await self.statuses()).get(leader)
            if not isinstance(state, dict) or state.get("role") != "follower":
                self.violations.append(f"{kind}: the old leader (member {leader}) is not a follower once healed: "
                                       f"{state}")
        await self.audit(f"after {kind}")

    def _acked_elsewhere(self, old: str, when: float):
        async def check():
            return any(began > when and host != old for began, _, host in self.ack_times)
        return check

    def check_fenced(self, old: str, when: float, healed: float) -> None:
        """Once another member acknowledged a send begun after the fault, the old leader acknowledges no send
        begun after that (up to the heal: it may lead again later, elected anew)."""
        if not any(host == old for began, _, host in self.ack_times if began < when):
            self.violations.append(f"no send acknowledged before the fault names the old leader {old}: the "
                                   f"members acknowledging cannot be told apart")
        first = min((acked for began, acked, host in self.ack_times if began > when and host != old), default=None)
        if first is None:
            return
        late = [(began - when, acked - when) for began, acked, host in self.ack_times
                if host == old and first < began < healed]
        if late:
            self.violations.append(f"the old leader {old} acknowledged {len(late)} sends begun after the new leader's "
                                   f"first acknowledgement ({first - when:.2f} s after the fault), e.g. (began, "
                                   f"acknowledged, s after the fault) {late[:3]}")


@pytest.mark.parametrize("seed", [4201, 4202, 4203])
async def test_partitions_of_the_leader_under_load_keep_every_acknowledged_write(tmp_path, etcd, seed):
    group = PartitionedGroup(tmp_path, etcd, flags=("--transactionTimeOut=1000", "--transactionCheckInterval=1000"))
    group.outputs = {}
    group.cluster = f"Partition{seed}"  # its own keys in the module's etcd
    try:
        await group.start()
        await PartitionChaos(seed, group, etcd).run()
    except BaseException:
        print(f"failing seed: {seed}; the members' output: {group.dump()}")
        raise
    finally:
        await group.stop()
