"""Group commit for gRPC writes: the messages, halves and decisions of concurrent calls reach the store as one
write group.

The store writes what was submitted in one loop iteration as one group (one hand-off to the writer process, one
sync). A remoting connection's frames arrive many per read, so their sends share an iteration; a gRPC call is a task
of its own (one per iteration under grpc.aio, measured), so without this each gRPC send was a group of its own and
the writer did a group's work per message (issue 15: measured 3x the writer CPU per send of remoting). Here a send
waits while the previous group of gRPC sends is being written, and the sends that waited go together once it is
durable: nothing waits when sends come one at a time, and under load the groups grow with the load. A send whose
call ends while it waits (its deadline passed, the client went away) is not written: its client was told it failed.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from halfmq.store.completion import Completion


class GroupCommit:
    def __init__(self):
        self._queued: list[tuple[Callable[[], Completion], asyncio.Future]] = []
        self._unfinished = 0  #: writes of the group being written that are not durable yet

    def store(self, write: Callable[[], Completion]) -> asyncio.Future:
        """``write()`` submits one write and returns its Completion (e.g. SendProcessor.submit_message for a
        record); it is called once the group ahead is durable. The future has the write's result, or what
        ``write`` or the store raised."""
        future = asyncio.get_running_loop().create_future()
        self._queued.append((write, future))
        if not self._unfinished:
            self._write_queued()
        return future

    def _write_queued(self) -> None:
        queued, self._queued = self._queued, []
        for write, future in queued:
            if future.done():  # its call was cancelled while it waited: it is not stored
                continue
            try:
                completion = write()
            except Exception as exc:
                future.set_exception(exc)
                continue
            self._unfinished += 1
            completion.add_done_callback(lambda done, future=future: self._finished(done, future))

    def _finished(self, completion, future: asyncio.Future) -> None:
        if not future.done():
            if completion.exception() is not None:
                future.set_exception(completion.exception())
            else:
                future.set_result(completion.result())
        self._unfinished -= 1
        if not self._unfinished and self._queued:
            self._write_queued()
