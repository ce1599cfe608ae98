"""Durability: committed groups are synced to disk by a helper process before they are answered.

``Syncer`` is the event loop's side of the helper (sync_helper.py). With SYNC_FLUSH every committed group is
one request, written to the helper's stdin; the helper answers each request after an ``fdatasync`` of the data
file that started after the request arrived, so the group's pages are on disk. Requests that arrive during a
sync are all answered by the next one (group commit of syncs). With ASYNC_FLUSH groups are answered at commit
and a sync is requested every ``flush_interval_s`` while something is unsynced.

A process, not a thread: a sync thread must win the GIL back from the busy loop twice per sync, which delayed
every acknowledgement by up to a switch interval and doubled the broker's system time in futex calls.

If the helper dies, the groups waiting for it fail with a clear error (they are not known to be durable, so
they are not acknowledged) and a new helper is started for the next ones.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import subprocess
import sys
import time
from typing import Callable

from .errors import StoreError

log = logging.getLogger(__name__)
_HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sync_helper.py")
_SYNCED = ord(".")
MAX_WAITING = 100_000  #: groups waiting for a sync before new ones are refused (the disk is not keeping up)


class Syncer:
    def __init__(self, data_file: str, loop: asyncio.AbstractEventLoop, sync_each: bool, flush_interval_s: float,
                 publish: Callable[[list, dict], None]):
        self.data_file = data_file
        self.loop = loop
        self.sync_each = sync_each
        self.flush_interval_s = flush_interval_s
        self.publish = publish  # publish(ops, grown) on the loop, once the ops' groups are durable (or failed)
        self.waiting: collections.deque = collections.deque()  # (ops, grown, requested at), oldest first
        self.last_sync_seconds = 0.0
        self.proc: subprocess.Popen | None = None
        self._dirty = False
        self._timer: asyncio.TimerHandle | None = None
        self._drained: asyncio.Event | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        self._spawn()
        if not self.sync_each:
            self._timer = self.loop.call_later(self.flush_interval_s, self._tick)

    def _spawn(self) -> None:
        # -I -S: no site packages or environment, so the helper starts in milliseconds.
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", _HELPER, self.data_file], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0)
        os.set_blocking(self.proc.stdin.fileno(), False)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.loop.add_reader(self.proc.stdout.fileno(), self._on_answers)

    def submit(self, ops: list, grown: dict) -> None:
        """A group was committed: answer ``ops`` once it is durable (SYNC_FLUSH) or note it is unsynced."""
        if not self.sync_each:
            self._dirty = True
            return
        if len(self.waiting) >= MAX_WAITING:
            self._fail([(ops, grown, 0.0)], StoreError("the store's disk is not keeping up with the writes "
                                                       "(nothing of this write is acknowledged)"))
            return
        self._request(ops, grown)

    def _request(self, ops: list, grown: dict) -> None:
        self.waiting.append((ops, grown, time.perf_counter()))
        try:
            os.write(self.proc.stdin.fileno(), b"s")
        except OSError as exc:  # the helper is gone (or its pipe is full: it has hung)
            self._helper_lost(f"cannot reach the sync helper: {exc}")

    def _tick(self) -> None:
        if self._dirty:
            self._dirty = False
            self._request([], {})
        self._timer = self.loop.call_later(self.flush_interval_s, self._tick)

    def _on_answers(self) -> None:
        try:
            answers = os.read(self.proc.stdout.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError as exc:
            self._helper_lost(f"the sync helper's pipe failed: {exc}")
            return
        if not answers:
            self._helper_lost(f"the sync helper exited (status {self.proc.wait()})")
            return
        done_ops: list = []
        done_grown: dict = {}
        failed = []
        now = time.perf_counter()
        for answer in answers:
            item = self.waiting.popleft()
            self.last_sync_seconds = now - item[2]
            if answer == _SYNCED:
                done_ops += item[0]
                done_grown.update(item[1])  # later groups only grow a queue further
            else:
                failed.append(item)
        if failed:
            self._fail(failed, StoreError("the store could not sync to disk (nothing of this write is "
                                          "acknowledged)"))
        if done_ops:
            self.publish(done_ops, done_grown)
        self._notify_drained()

    def _helper_lost(self, reason: str, restart: bool = True) -> None:
        log.error("%s; %d groups waiting for a sync fail", reason, len(self.waiting))
        waiting, self.waiting = list(self.waiting), collections.deque()
        self.loop.remove_reader(self.proc.stdout.fileno())
        self._close_helper(kill=True)
        self._fail(waiting, StoreError(f"the store's sync helper failed ({reason}); nothing of this write is "
                                       "acknowledged"))
        self._notify_drained()
        if restart:
            self._spawn()

    def _fail(self, items: list, error: Exception) -> None:
        ops = [op for item in items for op in item[0]]
        for op in ops:
            op.outcome = (False, error)
        if ops:
            self.publish(ops, {})

    def _notify_drained(self) -> None:
        if not self.waiting and self._drained is not None:
            self._drained.set()

    async def close(self, timeout: float = 30.0) -> None:
        """Sync what is unsynced, wait for every answer (at most ``timeout`` seconds), stop the helper."""
        if self._timer is not None:
            self._timer.cancel()
        if self._dirty:
            self._dirty = False
            self._request([], {})
        if self.waiting:
            self._drained = asyncio.Event()
            try:
                await asyncio.wait_for(self._drained.wait(), timeout)
            except asyncio.TimeoutError:
                self._helper_lost(f"the sync helper did not answer within {timeout} s", restart=False)
                return
        self.loop.remove_reader(self.proc.stdout.fileno())
        self._close_helper(kill=False)

    def _close_helper(self, kill: bool) -> None:
        proc = self.proc
        if kill and proc.poll() is None:
            proc.kill()
        proc.stdin.close()  # EOF: a healthy helper exits at once
        proc.stdout.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
