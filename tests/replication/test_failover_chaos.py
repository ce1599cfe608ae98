"""Chaos for failover on etcd (issue 41): a broker group of three real processes elects its leader on a real
3-member etcd while 64 sends are in flight, transactions run (halfmq's TransactionProducer: COMMIT, ROLLBACK and
UNKNOW locally, check-backs answered) and a consumer reads. Faults, in an order the seed draws: SIGKILL or SIGSTOP
of the leader, of a follower, of an etcd member. After every fault, once the group is whole again, and at the end:

- nothing acknowledged is lost: every member holds every acknowledged body, at the queue offset its send was
  acknowledged with (two leaders acknowledging the same offset would leave one of them elsewhere or gone);
- no acknowledged body is stored twice (the producers never retry: a body is sent once);
- no rolled-back half is ever visible, to the consumer or in any member's store;
- every half is resolved as its producer decided: a committed body exactly once for a COMMIT, none for a ROLLBACK
  (at the end every acknowledged COMMIT half is there: check-backs resolve the ones whose decision was lost);
- nothing the consumer read is gone afterwards (readers never see what a failover takes back).

The seed is printed when a run fails; each run takes about a minute (the faults are bounded by FAULT_BUDGET_S).

Network partitions of the leader, under this load and these checks: test_failover_partitions.py.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import time

import pytest

from halfmq.client import LocalTransactionState, Message, Producer, PullConsumer, TransactionProducer
from halfmq.client.message import SendStatus
from halfmq.client.remoting import Connection
from halfmq.protocol.codes import PullSysFlag, RequestCode, ResponseCode
from halfmq.protocol.headers import PullMessageRequestHeader
from halfmq.protocol.message import decode_offset_msg_id, decode_records

from tests.replication.test_failover import ElectedGroup
from tests.replication.test_group_faults import request, until

pytestmark = pytest.mark.slow
TOPIC = "Chaos"
TX_TOPIC = "ChaosTx"
QUEUES = 4
IN_FLIGHT = 64
TRANSACTIONS_IN_FLIGHT = 8
FAULT_BUDGET_S = 40.0      #: no new fault starts after this long
LEASE_S = 2.0
KINDS = ("kill-leader", "pause-leader", "kill-follower", "pause-follower", "kill-etcd", "pause-etcd")
#: how a transaction's body says what its producer decides: locally, or (UNKNOW locally) when checked back
DECISIONS = {"c": (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.COMMIT_MESSAGE),
             "r": (LocalTransactionState.ROLLBACK_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE),
             "uc": (LocalTransactionState.UNKNOW, LocalTransactionState.COMMIT_MESSAGE),
             "ur": (LocalTransactionState.UNKNOW, LocalTransactionState.ROLLBACK_MESSAGE)}


def commits(body: bytes) -> bool:
    return DECISIONS[body.rsplit(b"-", 1)[1].decode()][1] is LocalTransactionState.COMMIT_MESSAGE


class Decider:
    """The producer's side: the body names the decision; ``halves`` records every half acknowledged (the local
    transaction runs only after its half was stored: SEND_OK)."""

    def __init__(self):
        self.halves: set[bytes] = set()
        self.checks = 0

    async def execute_local_transaction(self, msg, arg):
        self.halves.add(msg.body)
        return DECISIONS[msg.body.rsplit(b"-", 1)[1].decode()][0]

    async def check_local_transaction(self, msg):
        self.checks += 1
        return DECISIONS[msg.body.rsplit(b"-", 1)[1].decode()][1]


async def stored(addr: str, topic: str, stops: dict | None = None) -> list[tuple[int, int, bytes]]:
    """(queue id, queue offset, body) of every message of ``topic`` one member holds, pulled from it directly;
    ``stops`` gets, per queue, where the pulls ended: (offset, the last answer's code, its maxOffset)."""
    conn = await Connection.open(addr)
    out = []
    try:
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                ext = PullMessageRequestHeader(consumerGroup="CG_CHAOS_AUDIT", topic=topic, queueId=queue_id,
                                               queueOffset=offset, maxMsgNums=1000,
                                               sysFlag=PullSysFlag.SUBSCRIPTION, commitOffset=0,
                                               suspendTimeoutMillis=0, subVersion=0, subscription="*",
                                               expressionType="TAG").to_ext()
                answer = await conn.request(RequestCode.PULL_MESSAGE, ext, timeout=10)
                if answer.code != ResponseCode.SUCCESS or not answer.body:
                    if stops is not None:
                        stops[queue_id] = (offset, answer.code, answer.ext_fields.get("maxOffset"))
                    break
                out += [(queue_id, m.queue_offset, m.body) for m in decode_records(answer.body)]
                offset = int(answer.ext_fields["nextBeginOffset"])
    finally:
        await conn.close()
    return out


class LoggedGroup(ElectedGroup):
    """Keeps every line each member printed (the chaos test writes them beside the stores when it fails)."""

    def member_process(self, index: int, *extra: str):
        process = super().member_process(index, *extra)
        process.lines = collections.deque(maxlen=200_000)
        self.outputs.setdefault(index, []).append(process)
        return process

    def dump(self) -> list[str]:
        paths = []
        for index, processes in self.outputs.items():
            path = self.root / f"member-{index}.log"
            with open(path, "w") as out:
                for run, process in enumerate(processes):
                    out.write(f"=== run {run} ===\n" + "\n".join(process.lines) + "\n")
            paths.append(str(path))
        return paths


class Chaos:
    kinds = KINDS  #: the faults a run draws its order of

    def __init__(self, seed: int, group: ElectedGroup, etcd):
        self.seed, self.group, self.etcd = seed, group, etcd
        self.rnd = random.Random(seed)
        self.acked: dict[bytes, tuple[int, int]] = {}      #: body → (queue id, offset) its send was answered with
        self.ack_times: list[tuple[float, float, str]] = []  #: (send began, acknowledged, the member that did)
        self.ack_wall: dict[bytes, str] = {}               #: body → when it was acknowledged (as the logs say)
        self.decider = Decider()
        self.seen: set[bytes] = set()                      #: every body the consumer read, of both topics
        self.violations: list[str] = []
        self.failovers: list[tuple[str, float]] = []
        self.stop = asyncio.Event()

    def log(self, text: str) -> None:
        print(f"seed {self.seed} [{time.monotonic() - self.t0:6.2f} s]: {text}", flush=True)

    # --- the load ---
    async def sender(self, producer: Producer, index: int) -> None:
        n = 0
        while not self.stop.is_set():
            body = f"{self.seed}-s{index}-{n}".encode()
            n += 1
            began = time.monotonic()
            try:
                result = await producer.send(Message(TOPIC, body))
            except Exception:  # noqa: BLE001 - refused or unanswered: not acknowledged, not counted
                await asyncio.sleep(0.05)
                continue
            if result.status is not SendStatus.SEND_OK:  # halfmq never answers 10-12: "sent" on fewer copies
                self.violations.append(f"{body!r} was answered {result.status.name}")
                continue
            self.acked[body] = (result.queue.queue_id, result.queue_offset)
            self.ack_times.append((began, time.monotonic(), decode_offset_msg_id(result.offset_msg_id)[0]))
            self.ack_wall[body] = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"

    async def transactions(self, producer: TransactionProducer, index: int) -> None:
        n = 0
        kinds = sorted(DECISIONS)
        while not self.stop.is_set():
            body = f"{self.seed}-t{index}-{n}-{kinds[n % len(kinds)]}".encode()
            n += 1
            try:
                await producer.send_message_in_transaction(Message(TX_TOPIC, body))
            except Exception:  # noqa: BLE001 - the half (or its decision) did not get through: checks resolve it
                await asyncio.sleep(0.05)

    async def consumer(self, consumer: PullConsumer) -> None:
        offsets: dict[tuple[str, int], int] = collections.defaultdict(int)
        while not self.stop.is_set():
            found = False
            for topic in (TOPIC, TX_TOPIC):
                try:
                    queues = await consumer.fetch_subscribe_queues(topic)
                except Exception:  # noqa: BLE001 - not created yet, or no name server answer: next round
                    continue
                for queue in queues:
                    try:
                        result = await consumer.pull(queue, offsets[topic, queue.queue_id], max_nums=256,
                                                     timeout=2.0)
                    except Exception:  # noqa: BLE001 - the member read from is gone or paused: ask for the route
                        consumer.instance.routes.invalidate(topic)
                        continue
                    for message in result.messages:
                        self.seen.add(message.body)
                        if topic == TX_TOPIC and not commits(message.body):
                            self.violations.append(f"the consumer read rolled-back {message.body!r}")
                    if result.messages:
                        found = True
                    offsets[topic, queue.queue_id] = max(offsets[topic, queue.queue_id], result.next_begin_offset)
            if not found:
                await asyncio.sleep(0.1)

    async def more_acked(self, count: int, what: str) -> None:
        target = len(self.acked) + count
        await until(self._at_least(target), 60, what)

    def _at_least(self, target: int):
        async def check():
            return len(self.acked) >= target
        return check

    # --- the group's state ---
    async def statuses(self, exclude: int = -1) -> dict[int, dict | str]:
        """Each member's replication status (what it says, or why it said nothing), asked with a short timeout:
        a paused member answers nothing."""
        async def one(member):
            conn = await Connection.open(member.broker_addr)
            try:
                answer = await conn.request(RequestCode.HALFMQ_GET_REPLICATION, {}, timeout=1.5)
            finally:
                await conn.close()
            return json.loads(answer.body or b"{}")
        out = {}
        for index, member in enumerate(self.group.members):
            if index == exclude:
                continue
            try:
                out[index] = await one(member)
            except Exception as exc:  # noqa: BLE001 - being killed or paused
                out[index] = repr(exc)
        return out

    async def leader(self, exclude: int = -1) -> int:
        for index, state in (await self.statuses(exclude)).items():
            if isinstance(state, dict) and state.get("role") == "leader":
                return index
        return -1

    async def whole(self, what: str) -> int:
        """Waits until one member leads with all three in sync; returns its index."""
        async def check():
            for index, state in (await self.statuses()).items():
                if isinstance(state, dict) and state.get("role") == "leader" and len(state["inSync"]) == 3:
                    return index + 1
            return False
        try:
            return await until(check, 90, f"seed {self.seed}: a leader with every member in sync after {what}") - 1
        except AssertionError as exc:
            outputs = "\n".join(f"--- member {i} ---\n{m.output(40)}" for i, m in enumerate(self.group.members))
            raise AssertionError(f"{exc}\nstatuses: {await self.statuses()}\n{outputs}") from None

    async def elected(self, exclude: int) -> int:
        async def check():
            index = await self.leader(exclude)
            return index >= 0 and index + 1
        return await until(check, 60, f"seed {self.seed}: a leader other than member {exclude}") - 1

    def first_ack_after(self, when: float) -> float | None:
        after = [acked for began, acked, _ in self.ack_times if began > when]
        return min(after) - when if after else None

    async def measure_failover(self, kind: str, when: float) -> None:
        await until(self._acked_after(when), 60, f"seed {self.seed}: a send acknowledged after {kind}")
        gap = self.first_ack_after(when)
        self.failovers.append((kind, gap))
        self.log(f"{kind}: first send begun after the fault acknowledged {gap:.2f} s after it")

    def _acked_after(self, when: float):
        async def check():
            return self.first_ack_after(when) is not None
        return check

    # --- faults ---
    async def fault(self, kind: str) -> None:
        rnd, group = self.rnd, self.group
        leader = await self.whole("the previous fault")
        followers = [i for i in range(group.size) if i != leader]
        await self.more_acked(200, f"sends before {kind}")
        when = time.monotonic()
        if kind == "kill-leader":
            delay = rnd.uniform(0.1, 3.0)
            self.log(f"SIGKILL leader member {leader}, restarted {delay:.2f} s later")
            await group.members[leader].kill_group()
            await asyncio.sleep(delay)
            await group.start_member(leader)
            await self.measure_failover(kind, when)
        elif kind == "pause-leader":
            past = rnd.random() < 0.7
            self.log(f"SIGSTOP leader member {leader} " + ("past its lease" if past else "for under a lease"))
            os.killpg(group.members[leader].pgid, signal.SIGSTOP)
            if past:
                await self.elected(exclude=leader)
                await asyncio.sleep(rnd.uniform(0.0, 2.0))
            else:
                await asyncio.sleep(rnd.uniform(0.2, LEASE_S / 3))
            os.killpg(group.members[leader].pgid, signal.SIGCONT)
            await self.measure_failover(kind, when)
        elif kind == "kill-follower":
            victim, delay = rnd.choice(followers), rnd.uniform(0.1, 3.0)
            self.log(f"SIGKILL follower member {victim}, restarted {delay:.2f} s later")
            await group.members[victim].kill_group()
            await asyncio.sleep(delay)
            await group.start_member(victim)
        elif kind == "pause-follower":
            victim, pause = rnd.choice(followers), rnd.uniform(0.3, 3.0)
            self.log(f"SIGSTOP follower member {victim} for {pause:.2f} s")
            os.killpg(group.members[victim].pgid, signal.SIGSTOP)
            await asyncio.sleep(pause)
            os.killpg(group.members[victim].pgid, signal.SIGCONT)
        elif kind == "kill-etcd":
            victim = await asyncio.to_thread(self.etcd.leader_index) if rnd.random() < 0.5 else rnd.randrange(3)
            delay = rnd.uniform(0.5, 3.0)
            self.log(f"SIGKILL etcd member {victim}, restarted {delay:.2f} s later")
            self.etcd.kill(victim)
            await asyncio.sleep(delay)
            await asyncio.to_thread(self.etcd.restart, victim)
        elif kind == "pause-etcd":
            victim = await asyncio.to_thread(self.etcd.leader_index) if rnd.random() < 0.5 else rnd.randrange(3)
            pause = rnd.uniform(0.5, 3.0)
            self.log(f"SIGSTOP etcd member {victim} for {pause:.2f} s")
            self.etcd.pause(victim)
            await asyncio.sleep(pause)
            self.etcd.resume(victim)
        await self.audit(f"after {kind}")

    # --- the checks ---
    async def audit(self, what: str, final: bool = False, members: list[int] | None = None) -> None:
        """Once the group is whole: every member holds what was acknowledged before, at its offset, once; no
        rolled-back half anywhere; at the end also every acknowledged COMMIT half and everything read. With
        ``members``, at once and only those (the side of a partition that elected a leader)."""
        if members is None:
            await self.whole(what)
        acked = dict(self.acked)  # acknowledged before the group was whole again: on every member by now
        halves = set(self.decider.halves)
        seen = set(self.seen)
        for index, member in enumerate(self.group.members):
            if members is not None and index not in members:
                continue
            async def holds():
                rows = await stored(member.broker_addr, TOPIC)
                held = {body for _, _, body in rows}
                return held.issuperset(acked) and rows
            try:
                rows = await until(holds, 5 if self.violations else 60, "")  # once one lacks them, soon
            except AssertionError:
                stops: dict = {}
                rows = await stored(member.broker_addr, TOPIC, stops)
                held = {(queue_id, offset): body for queue_id, offset, body in rows}
                missing = sorted(set(acked) - set(held.values()), key=acked.get)
                places = [(body, acked[body], held.get(acked[body]), self.ack_wall.get(body)) for body in missing]
                self.violations.append(f"{what}: member {index} lacks {len(missing)} of {len(acked)} acknowledged "
                                       f"bodies: (body, acknowledged at (queue, offset), held there, acknowledged at) first "
                                       f"{places[:3]}, last {places[-3:]}; pulls ended at (offset, code, "
                                       f"maxOffset) {stops}; status {(await self.statuses()).get(index)}")
            at = {(queue_id, offset): body for queue_id, offset, body in rows}
            counts = collections.Counter(body for _, _, body in rows)
            twice = [body for body in acked if counts[body] > 1]
            if twice:
                self.violations.append(f"{what}: member {index} holds {len(twice)} acknowledged bodies more than "
                                       f"once, e.g. {twice[:3]}")
            moved = [(body, place, at.get(place)) for body, place in acked.items()
                     if body in counts and at.get(place) != body]
            if moved:
                self.violations.append(f"{what}: member {index}: {len(moved)} acknowledged bodies are not at the "
                                       f"offset they were acknowledged with (body, (queue, offset), found): "
                                       f"{moved[:3]}")
            tx_rows = await self.tx_rows(member, halves if final else set())
            tx_counts = collections.Counter(body for _, _, body in tx_rows)
            rolled_back = [body for body in tx_counts if not commits(body)]
            if rolled_back:
                self.violations.append(f"{what}: member {index} shows {len(rolled_back)} rolled-back halves, e.g. "
                                       f"{rolled_back[:3]}")
            again = [body for body, count in tx_counts.items() if count > 1]
            if again:
                self.violations.append(f"{what}: member {index} committed {len(again)} halves more than once, e.g. "
                                       f"{again[:3]}")
            if final:
                unresolved = {body for body in halves if commits(body)} - set(tx_counts)
                if unresolved:
                    self.violations.append(f"{what}: member {index} lacks {len(unresolved)} committed halves, e.g. "
                                           f"{sorted(unresolved)[:3]}")
                gone = seen - {body for _, _, body in rows} - set(tx_counts)
                if gone:
                    self.violations.append(f"{what}: member {index} lacks {len(gone)} bodies the consumer read, "
                                           f"e.g. {sorted(gone)[:3]}")
        assert not self.violations, f"seed {self.seed}: " + "\n".join(self.violations)
        self.log(f"{what}: checked {len(acked)} acknowledged sends, {len(halves)} acknowledged halves, "
                 f"{len(seen)} bodies read on " + ("every member" if members is None else f"members {members}"))

    async def tx_rows(self, member, halves: set[bytes]) -> list[tuple[int, int, bytes]]:
        """The committed transactional messages ``member`` holds; with ``halves``, once every COMMIT among them
        is there (check-backs resolve those whose decision was lost with a leader), or after a minute."""
        wanted = {body for body in halves if commits(body)}

        async def resolved():
            rows = await stored(member.broker_addr, TX_TOPIC)
            return {body for _, _, body in rows} >= wanted and (rows or not wanted) and [rows]
        try:
            return (await until(resolved, 60, ""))[0]
        except AssertionError:
            return await stored(member.broker_addr, TX_TOPIC)

    async def pending(self) -> int:
        leader = self.group.members[await self.whole("the load stopped")]
        return (await request(leader.broker_addr, RequestCode.HALFMQ_GET_HALF_STATUS, limit=100))["pending"]

    # --- the run ---
    async def run(self) -> None:
        self.t0 = time.monotonic()
        group = self.group
        await self.whole("the start")
        namesrv = group.namesrv_addr
        producer = Producer(f"PG_CHAOS_{self.seed}", namesrv, send_timeout=2.0, retry_times=0)
        tx_producer = TransactionProducer(f"TXG_CHAOS_{self.seed}", self.decider, namesrv, send_timeout=2.0,
                                          retry_times=0)
        consumer = PullConsumer(f"CG_CHAOS_{self.seed}", namesrv, request_timeout=2.0)
        await producer.start()
        await tx_producer.start()
        await consumer.start()
        load = [asyncio.ensure_future(self.sender(producer, i)) for i in range(IN_FLIGHT)]
        load += [asyncio.ensure_future(self.transactions(tx_producer, i)) for i in range(TRANSACTIONS_IN_FLIGHT)]
        load.append(asyncio.ensure_future(self.consumer(consumer)))
        try:
            kinds = list(self.kinds)
            self.rnd.shuffle(kinds)
            done = []
            for kind in kinds:
                if time.monotonic() - self.t0 > FAULT_BUDGET_S:
                    break
                await self.fault(kind)
                done.append(kind)
            await self.more_acked(200, "sends after the last fault")
            self.stop.set()
            await asyncio.gather(*load)
            # Halves whose decision was lost are checked back (transactionCheckInterval) and resolved.
            await until(self._none_pending, 90, f"seed {self.seed}: every half resolved")
            await self.audit("the end", final=True)
            gaps = ", ".join(f"{kind} {gap:.2f} s" for kind, gap in self.failovers)
            self.log(f"faults {done}; first acknowledgement after a leader fault: {gaps or 'none'}; "
                     f"{len(self.acked)} sends and {len(self.decider.halves)} halves acknowledged, "
                     f"{self.decider.checks} check-backs answered, {len(self.seen)} bodies read")
        finally:
            self.stop.set()
            await asyncio.gather(*load, return_exceptions=True)
            await consumer.close()
            await tx_producer.close()
            await producer.close()

    async def _none_pending(self) -> bool:
        return await self.pending() == 0


@pytest.mark.parametrize("seed", [4101, 4102, 4103])
async def test_faults_of_leaders_followers_and_etcd_under_load_keep_every_acknowledged_write(tmp_path, etcd, seed):
    group = LoggedGroup(tmp_path, etcd, flags=("--transactionTimeOut=1000", "--transactionCheckInterval=1000"))
    group.outputs = {}
    group.cluster = f"Chaos{seed}"  # its own keys in the module's etcd
    try:
        await group.start()
        await Chaos(seed, group, etcd).run()
    except BaseException:
        print(f"failing seed: {seed}; the members' output: {group.dump()}")
        raise
    finally:
        for member in group.members:  # a paused member takes no SIGTERM
            if member is not None and member.proc is not None and member.proc.returncode is None:
                os.killpg(member.pgid, signal.SIGCONT)
        await group.stop()
