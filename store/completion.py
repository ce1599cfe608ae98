"""Completion: the outcome of a write (or a burst of sends), delivered the moment its group is durable.

An asyncio future runs its callbacks one loop iteration after it is resolved, behind whatever was queued
meanwhile (the next frames to decode): the acknowledgements of a synced group then wait for that work. A
Completion calls its callbacks as it is resolved, so the broker writes the answers in the same callback that
learnt the group is on disk. It can still be awaited like a future.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

log = logging.getLogger(__name__)
_PENDING = object()


class Completion:
    __slots__ = ("_loop", "_result", "_exception", "_callbacks", "succeeded")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        #: resolved with a result (not pending, not failed): read without a call (metrics.py count_stored)
        self.succeeded = False
        self._result: Any = _PENDING
        self._exception: BaseException | None = None
        self._callbacks: list[Callable[["Completion"], None]] = []

    def done(self) -> bool:
        return self._result is not _PENDING or self._exception is not None

    def cancelled(self) -> bool:
        return False  # a write in a group cannot be taken back

    def result(self):
        if self._exception is not None:
            raise self._exception
        if self._result is _PENDING:
            raise asyncio.InvalidStateError("the write is not durable yet")
        return self._result

    def exception(self) -> BaseException | None:
        if not self.done():
            raise asyncio.InvalidStateError("the write is not durable yet")
        return self._exception

    def add_done_callback(self, callback: Callable[["Completion"], None]) -> None:
        if self._result is _PENDING and self._exception is None:  # not done(): a call less per write
            self._callbacks.append(callback)
        else:
            callback(self)

    def set_result(self, value) -> None:
        self._result = value
        self.succeeded = True
        self._run_callbacks()

    def set_exception(self, exc: BaseException) -> None:
        self._exception = exc
        self._run_callbacks()

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("a write-completion callback failed")

    def __await__(self):
        if not self.done():
            future = self._loop.create_future()
            self.add_done_callback(lambda _c: future.set_result(None) if not future.done() else None)
            yield from future.__await__()
        return self.result()
