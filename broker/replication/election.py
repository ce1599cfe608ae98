"""A broker group's leader election on etcd: the one module that speaks to etcd.

It talks to etcd's v3 JSON gateway (``/v3/kv/...``, ``/v3/lease/...``, ``/v3/watch``; keys and values base64) over
aiohttp, which halfmq already depends on: the handful of calls here need no gRPC client and no new dependency.

Keys, under ``/halfmq/<cluster>/<brokerName>/``:

- ``leader``: ``{"id", "addr", "epoch"}``, put on the holder's lease, so it goes when the lease expires or is revoked;
- ``epoch``: the group's last epoch (a decimal counter); one more for each leader elected;
- ``isr``: ``{"members", "epoch"}``, the in-sync set and the epoch of the leader that wrote it;
- ``members/<id>``: what a member publishes about itself (``publish``), on its lease.

Election (``campaign``) is one transaction: it succeeds only if no ``leader`` key exists and ``isr`` and ``epoch``
are still at the revisions read, and it runs only for a member of the ``isr`` read (any member when a group has no
``isr`` yet: its first leader writes one holding itself). It puts ``leader`` on this member's lease, ``epoch`` one
higher, and ``isr`` stamped with that epoch. The epoch is the fencing token: followers refuse an older one, and
every change to the in-sync set (``shrink_isr``, ``grow_isr``) is a compare-and-swap on the leader key this member
created and on the epoch's revision, so a deposed leader's change fails whatever pause or clock skew it suffered.

Step-down deadline. A lease lives at least its TTL after etcd received the last renewal, hence after that renewal
was sent. The holder renews every TTL/3 and counts itself leader until ``leading_until``: the send time of the last
renewal etcd confirmed, plus 2/3 of the TTL, which leaves a third of the lease between it and the earliest moment a
new leader can exist. The ack path reads ``leading_until`` (a float, no call to etcd); ``on_lost`` is told when the
keep-alive gives up, but may run late (a loop that is busy), so it is a notice, not the fence. Nor is the deadline
the fence: an etcd leader cut off from its quorum goes on confirming renewals by itself until check-quorum makes it
step down (up to two election timeouts: measured here, a holder talking to it stopped leading 2.7 s after etcd lost
its quorum, against 1.3 s through a follower), while the other side may elect an etcd leader that counts the lease
from its own start. The epoch is the fence: followers refuse an older one, so a deposed leader gets no copies.

Failures are bounded: every call has a timeout (``timeout``; the keep-alive TTL/6) and raises ``EtcdUnavailable``
when etcd gives no answer in time (no quorum, no member reachable). Without quorum etcd applies no transaction, so
``campaign`` and the in-sync set changes fail and renewals stop, so the holder's deadline passes. A write that
timed out may still be applied once etcd recovers: a campaign whose answer was lost gives up its lease (the leader
key it may have written goes with it within a TTL), and an in-sync set change that timed out must be taken as
maybe applied (after a shrink, go on waiting for the member; after a grow, go on counting it).
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable

import aiohttp

log = logging.getLogger(__name__)

UNAVAILABLE_CODES = {4, 14}  #: gRPC DEADLINE_EXCEEDED, UNAVAILABLE: etcd's "no leader", "request timed out", ...
NOT_FOUND = 5                #: gRPC NOT_FOUND: "requested lease not found"
RETRY_PAUSE_S = 0.05         #: between keep-alive attempts that failed at once (every member refused)


class ElectionError(Exception):
    pass


class EtcdUnavailable(ElectionError):
    """etcd gave no answer in time (no quorum, or no member reachable): a write may or may not have been applied."""


class EtcdRefused(ElectionError):
    """etcd answered with an error other than being unavailable."""

    def __init__(self, code: int, message: str):
        super().__init__(f"etcd refused (code {code}): {message}")
        self.code = code


class NotLeader(ElectionError):
    """The in-sync set was not changed: this member does not lead, or etcd shows another leader or epoch."""


@dataclass(frozen=True)
class Leader:
    id: str
    addr: str
    epoch: int
    lease: int      #: the holder's lease
    revision: int   #: the key's create revision: one per term, even for one member elected twice


@dataclass(frozen=True)
class Isr:
    members: tuple[str, ...]
    epoch: int      #: the epoch of the leader that wrote it
    revision: int   #: its mod revision (0: no in-sync set yet)


@dataclass(frozen=True)
class GroupState:
    """The group's keys as read at one etcd revision."""

    revision: int
    leader: Leader | None
    epoch: int
    epoch_revision: int
    isr: Isr | None
    members: dict[str, dict]


@dataclass(frozen=True)
class _Term:
    """What this member wrote when it won: the compare-and-swap of every in-sync set change checks it."""

    epoch: int
    leader_revision: int
    epoch_revision: int
    isr: Isr


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def _prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with ``prefix`` (its last byte plus one)."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


def _put(key: str, value, lease: int = 0) -> dict:
    put = {"key": _b64(key), "value": _b64(value if isinstance(value, str) else json.dumps(value))}
    if lease:
        put["lease"] = str(lease)
    return {"request_put": put}


def _compare(key: str, target: str, revision: int) -> dict:
    field = {"CREATE": "create_revision", "MOD": "mod_revision"}[target]
    return {"key": _b64(key), "target": target, "result": "EQUAL", field: str(revision)}


class GroupElection:
    """One member's view of its broker group's election. ``endpoints``: etcd client addresses (``host:port``).

    ``start`` opens the HTTP session; ``close`` resigns and closes it. The lease is granted when first needed
    (``campaign``, ``publish``) and kept alive until it is lost, given up (``resign``) or closed.
    """

    def __init__(self, endpoints: Iterable[str], cluster: str, group: str, member_id: str, addr: str,
                 lease_seconds: float = 2.0, timeout: float = 1.0,
                 on_lost: Callable[[str], None] | None = None):
        self.endpoints = [e.removeprefix("http://").rstrip("/") for e in endpoints]
        if not self.endpoints:
            raise ValueError("no etcd endpoints")
        self.prefix = f"/halfmq/{cluster}/{group}/"
        self.member_id, self.addr = str(member_id), addr
        self.timeout = timeout
        self.on_lost = on_lost
        self.ttl = max(1, math.ceil(lease_seconds))   #: etcd grants whole seconds; its answer may raise it
        self._http: aiohttp.ClientSession | None = None
        self._current = 0                   #: the endpoint tried first: the last that answered
        self._lease = 0
        self._confirmed = 0.0               #: monotonic send time of the last renewal etcd confirmed
        self._term: _Term | None = None
        self._keeper: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()
        self._isr_lock = asyncio.Lock()
        #: an in-sync set change got no answer: etcd's set may differ from the term's copy
        self._isr_unsure = False

    # --- keys ---
    @property
    def leader_key(self) -> str:
        return self.prefix + "leader"

    @property
    def epoch_key(self) -> str:
        return self.prefix + "epoch"

    @property
    def isr_key(self) -> str:
        return self.prefix + "isr"

    def member_key(self, member_id: str) -> str:
        return f"{self.prefix}members/{member_id}"

    # --- lifecycle ---
    async def start(self) -> GroupElection:
        self._http = aiohttp.ClientSession()
        return self

    async def close(self) -> None:
        try:
            await self.resign()
        except ElectionError as exc:  # etcd unreachable: the lease expires by itself within its TTL
            log.warning("%s: could not revoke the lease on close: %s", self.prefix, exc)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self._http.close()

    async def __aenter__(self) -> GroupElection:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # --- leading ---
    @property
    def epoch(self) -> int | None:
        """The epoch this member leads at, while it holds the leader key as far as it knows."""
        return self._term.epoch if self._term is not None else None

    @property
    def isr(self) -> Isr | None:
        """The in-sync set as this leader last wrote or read it in etcd."""
        return self._term.isr if self._term is not None else None

    @property
    def leading_until(self) -> float:
        """``time.monotonic()`` past which this member must not acknowledge a write (0 when not leading)."""
        return self._lease_deadline() if self._term is not None else 0.0

    def is_leading(self) -> bool:
        return time.monotonic() < self.leading_until

    def _lease_deadline(self) -> float:
        """The last confirmed renewal's send time plus 2/3 of the TTL: a third of the lease before it can end."""
        return self._confirmed + 2 * self.ttl / 3

    async def campaign(self, min_epoch: int = 0) -> int | None:
        """Tries to become the group's leader. Returns the new epoch (at least ``min_epoch``: a store may have
        seen epochs etcd has not), or None when another member leads, this one is not in the in-sync set, or the
        group's keys changed since they were read. Raises EtcdUnavailable without quorum."""
        if self._term is not None:
            return self._term.epoch
        lease = await self._ensure_lease()
        state = await self.read_group()
        if state.leader is not None or (state.isr is not None and self.member_id not in state.isr.members):
            return None
        epoch = max(state.epoch + 1, min_epoch)
        members = state.isr.members if state.isr is not None else (self.member_id,)
        isr_revision = state.isr.revision if state.isr is not None else 0
        try:
            answer = await self._txn(
                [_compare(self.leader_key, "CREATE", 0), _compare(self.epoch_key, "MOD", state.epoch_revision),
                 _compare(self.isr_key, "MOD", isr_revision)],
                [_put(self.leader_key, {"id": self.member_id, "addr": self.addr, "epoch": epoch}, lease),
                 _put(self.epoch_key, str(epoch)), _put(self.isr_key, {"members": list(members), "epoch": epoch})])
        except EtcdUnavailable:
            # it may yet be applied: give the lease up so that a leader key it wrote goes with it
            self._abandon(lease)
            raise
        except EtcdRefused as refused:
            if refused.code != NOT_FOUND:
                raise
            self._abandon(lease)  # the lease expired between the renewal and the transaction
            return None
        if not answer.get("succeeded") or lease != self._lease:
            return None  # lost, or the keep-alive gave the lease up meanwhile (the key goes with it)
        revision = int(answer["header"]["revision"])  # every put of one transaction has its revision
        self._term = _Term(epoch, revision, revision, Isr(tuple(members), epoch, revision))
        log.info("%s: %s leads at epoch %d", self.prefix, self.member_id, epoch)
        return epoch

    async def resign(self) -> None:
        """Stops leading at once and revokes the lease: the leader key (and ``members/<id>``) go, and a waiting
        member can take over within milliseconds. A later ``campaign`` or ``publish`` takes a new lease."""
        lease = self._lease
        self._term = None
        self._drop_lease()
        if lease:
            await self._revoke(lease)

    # --- the in-sync set ---
    async def shrink_isr(self, removed: Iterable[str]) -> Isr:
        """Removes members from the in-sync set, by compare-and-swap on this leader's term. Call it before the
        leader stops waiting for them. Raises NotLeader when another leader or epoch exists."""
        gone = {str(m) for m in removed}
        return await self._change_isr(lambda members: tuple(m for m in members if m not in gone))

    async def grow_isr(self, added: str) -> Isr:
        """Adds a member to the in-sync set once the leader already counts its acknowledgements, so the set in
        etcd never holds a member the leader does not wait for. Raises NotLeader like ``shrink_isr``."""
        added = str(added)
        return await self._change_isr(lambda members: members if added in members else (*members, added))

    async def _change_isr(self, change: Callable[[tuple[str, ...]], tuple[str, ...]]) -> Isr:
        async with self._isr_lock:
            # twice at most: a change of ours whose answer was lost may have moved the set; read back, retry once
            for _ in range(2):
                term = self._term
                if term is None:
                    raise NotLeader(f"{self.member_id} does not lead {self.prefix}")
                members = change(term.isr.members)
                if members == term.isr.members and not self._isr_unsure:
                    return term.isr
                try:
                    answer = await self._txn(
                        [_compare(self.leader_key, "CREATE", term.leader_revision),
                         _compare(self.epoch_key, "MOD", term.epoch_revision),
                         _compare(self.isr_key, "MOD", term.isr.revision)],
                        [_put(self.isr_key, {"members": list(members), "epoch": term.epoch})],
                        [{"request_range": {"key": _b64(key)}}
                         for key in (self.leader_key, self.epoch_key, self.isr_key)])
                except BaseException:
                    # No answer: etcd may have applied it. Until an answer shows the set, no change is taken for
                    # done because the term's copy says so (a shrink skipped so would stop the leader waiting for
                    # a member etcd still holds); the compare-and-swap reveals the set instead.
                    self._isr_unsure = True
                    raise
                self._isr_unsure = False
                # the term may have ended while etcd answered (the keep-alive gave up): never bring it back
                if answer.get("succeeded"):
                    isr = Isr(members, term.epoch, int(answer["header"]["revision"]))
                    if self._term is term:
                        self._term = replace(term, isr=isr)
                    return isr
                leader_kv, epoch_kv, isr_kv = (self._first_kv(r) for r in answer["responses"])
                if (int(leader_kv.get("create_revision", 0)) != term.leader_revision
                        or int(epoch_kv.get("mod_revision", 0)) != term.epoch_revision):
                    if self._term is term:
                        self._step_down(f"etcd shows another leader or epoch than {term.epoch}")
                    raise NotLeader(f"{self.member_id} no longer leads {self.prefix} at epoch {term.epoch}")
                if self._term is term:
                    self._term = replace(term, isr=self._parse_isr(isr_kv))
            raise ElectionError(f"{self.prefix}: the in-sync set moved twice while changing it")

    # --- reading and watching ---
    async def read_group(self) -> GroupState:
        """Every key of the group at one revision (a linearizable read: it needs etcd's quorum)."""
        end = _prefix_end(self.prefix)
        answer = await self._post("/v3/kv/range", {"key": _b64(self.prefix), "range_end": end}, retry=True)
        kvs = {_unb64(kv["key"]).removeprefix(self.prefix): kv for kv in answer.get("kvs", [])}
        epoch_kv = kvs.get("epoch", {})
        members = {name.removeprefix("members/"): json.loads(_unb64(kv.get("value", "")) or "{}")
                   for name, kv in kvs.items() if name.startswith("members/")}
        return GroupState(revision=int(answer["header"]["revision"]), leader=self._parse_leader(kvs.get("leader")),
                          epoch=int(_unb64(epoch_kv.get("value", "")) or 0),
                          epoch_revision=int(epoch_kv.get("mod_revision", 0)),
                          isr=self._parse_isr(kvs["isr"]) if "isr" in kvs else None, members=members)

    async def current_leader(self) -> Leader | None:
        return (await self.read_group()).leader

    async def next_leader(self, state: GroupState, timeout: float) -> Leader | None:
        """Waits for the first change of the leader key after ``state.revision`` and returns the leader it names
        (None: the key went, the group has no leader). Raises TimeoutError when nothing changed within
        ``timeout``. If etcd no longer holds that history (compacted), returns the leader as it is now."""
        body = {"create_request": {"key": _b64(self.leader_key), "start_revision": str(state.revision + 1)}}
        async with asyncio.timeout(timeout):
            for _ in range(len(self.endpoints)):
                endpoint = self.endpoints[self._current]
                try:
                    async with self._http.post(f"http://{endpoint}/v3/watch", json=body,
                                               timeout=aiohttp.ClientTimeout(total=None)) as answer:
                        while line := await answer.content.readline():
                            if not line.strip():
                                continue
                            result = json.loads(line).get("result", {})
                            if result.get("canceled"):
                                return await self.current_leader()
                            for event in result.get("events", []):
                                # the gateway leaves out the default: an event without a type is a PUT
                                if event.get("type") == "DELETE":
                                    return None
                                return self._parse_leader(event["kv"])
                except aiohttp.ClientError as exc:
                    log.info("%s: watch on %s failed: %s", self.prefix, endpoint, exc)
                self._current = (self._current + 1) % len(self.endpoints)
            raise EtcdUnavailable(f"no etcd member of {self.endpoints} keeps a watch")

    async def publish(self, info: dict) -> None:
        """Puts ``members/<id>`` (what the others need to rank or reach this member) on this member's lease."""
        lease = await self._ensure_lease()
        await self._post("/v3/kv/put", _put(self.member_key(self.member_id), info, lease)["request_put"],
                         retry=True)

    # --- the lease ---
    async def _ensure_lease(self) -> int:
        """This member's lease, renewed just now (so a campaign starts with a fresh deadline), or a new one."""
        if self._lease:
            lease = self._lease
            if await self._renew(lease, self.timeout) > 0:
                return lease
            self._lose(lease, "etcd says the lease expired")
        sent = time.monotonic()
        answer = await self._post("/v3/lease/grant", {"TTL": str(self.ttl)}, retry=True)
        self.ttl = max(self.ttl, int(answer.get("TTL", self.ttl)))  # etcd raises a TTL below its minimum
        self._lease, self._confirmed = int(answer["ID"]), sent
        self._keeper = asyncio.get_running_loop().create_task(self._keep_alive(self._lease))
        return self._lease

    async def _renew(self, lease: int, timeout: float) -> int:
        """One renewal: the TTL etcd answers (0: the lease is gone). Moves the deadline on if it is still ours."""
        sent = time.monotonic()
        answer = await self._post("/v3/lease/keepalive", {"ID": str(lease)}, retry=True, timeout=timeout)
        ttl = int(answer.get("result", {}).get("TTL", 0))
        if ttl > 0 and lease == self._lease:
            self._confirmed = max(self._confirmed, sent)
        return ttl

    async def _keep_alive(self, lease: int) -> None:
        interval = self.ttl / 3
        while lease == self._lease:
            now = time.monotonic()
            deadline = self._lease_deadline()
            if now >= deadline:
                self._lose(lease, f"no renewal confirmed for {now - self._confirmed:.2f} s")
                return
            due = self._confirmed + interval
            if now < due:
                await asyncio.sleep(due - now)
                continue
            try:
                # a timeout of TTL/6 leaves room for a second attempt before the deadline
                ttl = await self._renew(lease, min(self.ttl / 6, deadline - now))
            except ElectionError as exc:
                log.warning("%s: lease renewal failed: %s", self.prefix, exc)
                await asyncio.sleep(min(RETRY_PAUSE_S, max(0.0, deadline - time.monotonic())))
                continue
            if ttl <= 0:
                self._lose(lease, "etcd says the lease expired")
                return

    def _drop_lease(self) -> None:
        self._lease = 0
        if self._keeper is not None and self._keeper is not asyncio.current_task():
            self._keeper.cancel()
        self._keeper = None

    def _abandon(self, lease: int) -> None:
        """Stops using ``lease`` and revokes it in the background (it expires by itself if etcd is away)."""
        if lease != self._lease:
            return
        self._term = None
        self._drop_lease()
        task = asyncio.get_running_loop().create_task(self._revoke_quietly(lease))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _lose(self, lease: int, reason: str) -> None:
        if lease != self._lease:
            return
        leading = self._term is not None
        self._abandon(lease)
        log.warning("%s: %s lost its lease%s: %s", self.prefix, self.member_id,
                    " and steps down" if leading else "", reason)
        if self.on_lost is not None:
            self.on_lost(reason)

    def _step_down(self, reason: str) -> None:
        self._term = None
        log.warning("%s: %s steps down: %s", self.prefix, self.member_id, reason)
        if self.on_lost is not None:
            self.on_lost(reason)

    async def _revoke(self, lease: int) -> None:
        try:
            await self._post("/v3/lease/revoke", {"ID": str(lease)}, retry=True)
        except EtcdRefused as refused:
            if refused.code != NOT_FOUND:  # already gone: what revoking wanted
                raise

    async def _revoke_quietly(self, lease: int) -> None:
        try:
            await self._revoke(lease)
        except ElectionError as exc:
            log.info("%s: lease %d not revoked (it expires by itself): %s", self.prefix, lease, exc)

    # --- HTTP ---
    async def _txn(self, compare: list, success: list, failure: list | None = None) -> dict:
        return await self._post("/v3/kv/txn", {"compare": compare, "success": success, "failure": failure or []},
                                retry=False)

    async def _post(self, path: str, body: dict, retry: bool, timeout: float | None = None) -> dict:
        """One call to etcd within ``timeout``. A request that was never sent (connection refused) goes to the
        next endpoint; with ``retry`` (reads, renewals: harmless twice) so does one that got no answer or an
        "unavailable", each endpoint left getting a share of the time; a write without answer raises at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout if timeout is not None else self.timeout)
        errors = []
        for attempt in range(len(self.endpoints)):
            endpoint = self.endpoints[self._current]
            left = deadline - loop.time()
            if left <= 0:
                break
            share = left / (len(self.endpoints) - attempt) if retry else left
            try:
                async with self._http.post(f"http://{endpoint}{path}", json=body,
                                           timeout=aiohttp.ClientTimeout(total=share)) as answer:
                    payload = json.loads(await answer.read() or b"{}")
                    status = answer.status
            except aiohttp.ClientConnectorError as exc:
                errors.append(f"{endpoint}: {exc}")
                self._current = (self._current + 1) % len(self.endpoints)
                continue
            except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
                errors.append(f"{endpoint}: {exc!r}")
                self._current = (self._current + 1) % len(self.endpoints)
                if retry:
                    continue
                raise EtcdUnavailable(f"etcd gave no answer to {path} ({'; '.join(errors)}): no quorum or "
                                      f"unreachable; the write may or may not be applied") from exc
            if status == 200:
                return payload
            code = int(payload.get("code", 0))
            message = payload.get("message") or payload.get("error") or f"HTTP {status}"
            if code not in UNAVAILABLE_CODES:
                raise EtcdRefused(code, message)
            errors.append(f"{endpoint}: {message}")
            self._current = (self._current + 1) % len(self.endpoints)
            if not retry:
                raise EtcdUnavailable(f"etcd could not apply {path}: {message}; the write may or may not be applied")
        raise EtcdUnavailable(f"etcd gave no answer to {path} within "
                              f"{timeout if timeout is not None else self.timeout} s: no quorum or unreachable "
                              f"({'; '.join(errors) or 'no time left'})")

    # --- parsing ---
    @staticmethod
    def _first_kv(response: dict) -> dict:
        kvs = response.get("response_range", {}).get("kvs", [])
        return kvs[0] if kvs else {}

    @staticmethod
    def _parse_leader(kv: dict | None) -> Leader | None:
        if not kv or not kv.get("value"):
            return None
        value = json.loads(_unb64(kv["value"]))
        return Leader(id=str(value["id"]), addr=value["addr"], epoch=int(value["epoch"]),
                      lease=int(kv.get("lease", 0)), revision=int(kv["create_revision"]))

    @staticmethod
    def _parse_isr(kv: dict) -> Isr:
        if not kv.get("value"):
            return Isr((), 0, 0)
        value = json.loads(_unb64(kv["value"]))
        return Isr(tuple(str(m) for m in value["members"]), int(value["epoch"]), int(kv.get("mod_revision", 0)))
