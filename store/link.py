"""The broker's side of the writer process (writer.py): groups out, outcomes and durability back.

Groups are numbered in the order they are sent; the writer applies them in that order and sends their outcomes,
in order, once they are durable (SYNC_FLUSH) or committed (ASYNC_FLUSH); ``publish(items, grown)`` is then called
on the event loop. If the
writer dies, every group not yet published fails with StoreUnavailableError (none is known to be durable) and a
new writer is started.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import pickle
import socket
import subprocess
import sys
import time
from typing import Callable, Protocol

from .errors import CorruptStoreError, StoreError, StoreUnavailableError
from .ops import PutMessage
from .redo import ApplyRedo
from .writer import FRAME, take_messages

log = logging.getLogger(__name__)
MAX_WAITING_GROUPS = 100_000  #: groups sent but not durable before new ones are refused (the disk is behind)
LINK_BUFFER_BYTES = 8 << 20  #: the socket buffer asked for on both ends of the link (a batch half's group: ~1 MiB)


class ReplicationGate(Protocol):
    """What holds a group's answers until its group's other members have it (broker/replication/)."""

    #: groups whose replication record's sequence is at most this may be published
    committed: int

    def shipped(self, record: tuple[int, int, bytes]) -> None:
        """A leader's writer committed ``record`` (epoch, sequence, payload); durable here once ``durable`` says
        so."""

    def durable(self, seq: int) -> None:
        """Groups up to replication sequence ``seq`` are durable here (a leader's own records, or the records a
        follower's groups applied)."""


class _Group:
    __slots__ = ("gid", "ops", "completions", "outcomes", "grown", "sent", "seq")

    def __init__(self, gid: int, ops: list, completions: list, seq: int):
        self.sent = time.perf_counter()
        self.gid = gid
        self.ops = ops
        self.completions = completions
        self.outcomes: list | None = None
        self.grown: dict = {}
        self.seq = seq  #: the replication record it holds or applies (0: none, published once durable)


class _Protocol(asyncio.Protocol):
    def __init__(self, link: "WriterLink"):
        self.link = link
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        for message in take_messages(self.buffer):
            self.link.on_message(message)

    def connection_lost(self, exc) -> None:
        self.link.on_lost(exc)


class WriterLink:
    def __init__(self, path: str, map_size: int, max_map_size: int, sync_each: bool, flush_interval_ms: int,
                 publish: Callable[[list, dict], None], on_ready: Callable[[dict, dict], None],
                 inherit_fds: tuple[int, ...] = ()):
        self.inherit_fds = inherit_fds  # the store's owner lock: held as long as the writer lives
        self.last_commit_seconds = 0.0  # the writer's last commit (its data sync included)
        self.last_sync_seconds = 0.0    # from a group's hand-off to its publication (durable)
        self.args = [path, str(map_size), str(max_map_size), "1" if sync_each else "0", str(flush_interval_ms),
                     str(os.getpid())]
        self.publish = publish        # publish([(completion, outcome)], grown) in group order
        self.on_ready = on_ready      # on_ready(queue_max, topic_ids) when a writer (re)started
        self.new_topics: Callable[[dict], None] = lambda topics: None
        self.proc: subprocess.Popen | None = None
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[_Group] = collections.deque()  # sent, not yet published; oldest first
        self.next_gid = 1
        self.closing = False
        self.gate: ReplicationGate | None = None
        self.last_seq = 0  #: the last replication record the writer made (a leader's)
        self.epoch: int | None = None  #: the epoch the writer records in (lead), told again to a restarted writer
        self._leading: asyncio.Future | None = None
        self._ready: asyncio.Future | None = None
        self._closed: asyncio.Future | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        # A group's ops go out whole in one write where the kernel allows (net.core.wmem_max caps it): the rest of
        # a payload larger than the socket's buffer waits for the loop's next turn, so with batch halves being
        # prepared (a slice per connection per turn) a 1 MiB group took 5 turns, 40-160 ms, to reach the writer.
        for sock in (ours, theirs):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, LINK_BUFFER_BYTES)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "halfmq.store.writer_process", *self.args, str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(), *self.inherit_fds))
        finally:
            theirs.close()
        self._ready = loop.create_future()
        self.transport, _ = await loop.create_connection(lambda: _Protocol(self), sock=ours)
        if self.epoch is not None:
            # A writer restarted while the store leads its group: the first message it reads, before any group,
            # so that every commit it makes is recorded and shipped (its sequence goes on from the store's).
            self._write(("lead", self.epoch, True))
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), 60)
        except BaseException:
            self._kill()
            raise

    def send(self, ops: list, completions: list) -> None:
        if self.transport is None or len(self.waiting) >= MAX_WAITING_GROUPS:
            reason = ("the store's writer process is restarting" if self.transport is None
                      else "the store's disk is not keeping up with the writes")
            error = StoreUnavailableError(f"{reason} (nothing of this write was stored)")
            self.publish([(c, (False, error)) for c in completions], {})
            return
        seq = 0
        for op in ops:  # a follower's group: the last record it applies
            if type(op) is ApplyRedo:
                seq = op.seq
        group = _Group(self.next_gid, ops, completions, seq)
        self.next_gid += 1
        self.waiting.append(group)
        wire = [op.wire() if type(op) is PutMessage else op for op in ops]
        payload = pickle.dumps(("group", group.gid, wire), protocol=pickle.HIGHEST_PROTOCOL)
        self.transport.writelines((FRAME.pack(len(payload)), payload))  # no copy of the payload to prefix it

    # --- from the writer ---
    def on_message(self, message) -> None:
        kind = message[0]
        if kind == "done":  # groups now durable (SYNC_FLUSH) or committed (ASYNC_FLUSH), in order
            by_gid = {group.gid: group for group in self.waiting}
            last = None
            durable = 0
            for _last_gid, answers, grown, new_topics, commit_seconds, seq in message[1]:
                if new_topics:
                    self.new_topics(new_topics)
                if seq is not None:
                    self.last_seq = seq
                for gid, outcomes in answers:
                    group = by_gid[gid]
                    group.outcomes = outcomes
                    # A group that wrote nothing may still answer from what earlier ones wrote (a decision
                    # repeated): it waits until they are on every in-sync copy too.
                    group.seq = max(group.seq, self.last_seq)
                    durable = max(durable, group.seq)
                last = by_gid[answers[-1][0]]
                last.grown = grown
                self.last_commit_seconds = commit_seconds
            if self.gate is not None:
                self.gate.durable(durable)
            self._publish_upto(last.gid)
        elif kind == "failed":
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(CorruptStoreError(f"the store at {self.args[0]} cannot be opened: "
                                                            f"{message[1]}"))
        elif kind == "redo":  # a leader's record, committed (durable once its "done" comes)
            if self.gate is not None:
                self.gate.shipped(message[1])
        elif kind in ("led", "lead-refused"):
            if self._leading is not None and not self._leading.done():
                if kind == "led":
                    self._leading.set_result(None)
                else:
                    self._leading.set_exception(StoreError(message[1]))
            elif kind == "lead-refused":  # a restarted writer: nothing it commits could be shipped
                log.critical("the restarted writer will not record for epoch %s: %s; stopping it", self.epoch,
                             message[1])
                self.transport.close()
        elif kind == "ready":
            _kind, queue_max, topic_ids = message
            self.on_ready(queue_max, topic_ids)
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(None)

    async def lead(self, epoch: int) -> None:
        """From now on the writer records each commit as replication record of ``epoch`` (store/redo.py).

        Raises:
            StoreError: the store already holds records of ``epoch`` or a later one."""
        self._leading = asyncio.get_running_loop().create_future()
        self._write(("lead", epoch, False))
        await asyncio.wait_for(self._leading, 60)
        self.epoch = epoch

    def _write(self, message) -> None:
        payload = pickle.dumps(message)
        self.transport.write(FRAME.pack(len(payload)) + payload)

    def release(self) -> None:
        """The gate's committed sequence moved: publish what it now allows."""
        self._publish_upto(self.next_gid)

    def fail_held(self, error: StoreError) -> None:
        """Groups durable here but held for the gate fail with ``error`` (what they wrote stays: the answer is
        that it is not known to be on enough copies)."""
        items, waiting = [], self.waiting
        while waiting and waiting[0].outcomes is not None:
            group = waiting.popleft()
            items.extend((c, (False, error)) for c in group.completions)
        if items:
            self.publish(items, {})

    def _publish_upto(self, gid: int) -> None:
        items, grown = [], {}
        waiting = self.waiting
        group = None
        committed = self.gate.committed if self.gate is not None else None
        while waiting and waiting[0].gid <= gid and waiting[0].outcomes is not None:
            if committed is not None and waiting[0].seq > committed:
                break
            group = waiting.popleft()
            for op, completion, outcome in zip(group.ops, group.completions, group.outcomes):
                # A send's value came back as a plain tuple (ops.Op.result).
                result = op.result
                items.append((completion, (True, result(outcome[1])) if result is not None and outcome[0]
                              else outcome))
            grown.update(group.grown)  # later groups only grow a queue further
        if group is not None:
            self.last_sync_seconds = time.perf_counter() - group.sent
        if items:
            self.publish(items, grown)
        if not waiting and self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def on_lost(self, exc) -> None:
        self.transport = None
        waiting, self.waiting = list(self.waiting), collections.deque()
        if self._closed is not None and not waiting:
            self._closed.done() or self._closed.set_result(None)
            return
        status = self.proc.poll() if self.proc is not None else None
        reason = f"the store's writer process stopped (status {status})" if status is not None else \
            f"the connection to the store's writer process was lost ({exc})"
        log.error("%s; %d groups waiting for it fail", reason, len(waiting))
        error = StoreUnavailableError(f"{reason}; nothing of this write is acknowledged")
        self.publish([(c, (False, error)) for group in waiting for c in group.completions], {})
        self._kill()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(CorruptStoreError(
                f"the store at {self.args[0]} cannot be opened: its writer process died while opening it ({reason}); "
                "the data file may be truncated or corrupted"))
        if self._closed is not None:
            self._closed.done() or self._closed.set_result(None)
        elif not self.closing:
            asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        try:
            await self.start()
            log.info("a new store writer process took over (pid %d)", self.proc.pid)
        except Exception:
            log.exception("could not restart the store's writer process; writes fail until the broker restarts")

    async def close(self, timeout: float = 30.0) -> None:
        """Let the writer finish what was sent, sync, and exit."""
        self.closing = True
        if self.transport is None:
            self._kill()
            return
        self._closed = asyncio.get_running_loop().create_future()
        payload = pickle.dumps(("close",))
        self.transport.write(FRAME.pack(len(payload)) + payload)
        try:
            await asyncio.wait_for(asyncio.shield(self._closed), timeout)
            await asyncio.get_running_loop().run_in_executor(None, self.proc.wait, timeout)
        except (asyncio.TimeoutError, subprocess.TimeoutExpired):
            log.error("the store's writer process did not finish within %s s; stopping it", timeout)
        finally:
            if self.transport is not None:
                self.transport.close()
            self._kill()

    def _kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.error("the store's writer process %d did not exit", proc.pid)
