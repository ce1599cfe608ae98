"""A connection's burst of requests: dispatched in slices, with the loop turning between them, as one write group.

A real BrokerProtocol on a real socket pair; the dispatcher and the store are recorders, so the order of
dispatches, loop turns and group holds is exact.
"""
from __future__ import annotations

import asyncio
import socket

from halfmq.broker.transport import BURST_FRAMES, DISPATCH_SLICE, BrokerProtocol, ConnectionSet
from halfmq.protocol.command import RemotingCommand

FRAMES = BURST_FRAMES + 8  # a whole burst and the start of the next


class RecordingStore:
    def __init__(self, events: list):
        self.events = events

    def hold_group(self) -> None:
        self.events.append("hold")

    def release_group(self) -> None:
        self.events.append("release")


class RecordingDispatcher:
    limits = None

    def __init__(self, events: list):
        self.events = events
        self.started = asyncio.Event()
        self.done = asyncio.Event()
        self.store = RecordingStore(events)
        self.dispatched = 0

    def dispatch(self, proto, cmd: RemotingCommand) -> None:
        self.dispatched += 1
        self.events.append(cmd.opaque)
        self.started.set()
        if self.dispatched == FRAMES:
            self.done.set()

    def channel_closed(self, channel) -> None:
        pass


async def test_a_burst_is_one_held_group_and_the_loop_turns_between_its_slices():
    loop = asyncio.get_running_loop()
    events: list = []
    dispatcher = RecordingDispatcher(events)
    done = dispatcher.done
    ours, theirs = socket.socketpair()
    transport, proto = await loop.connect_accepted_socket(
        lambda: BrokerProtocol(dispatcher, ConnectionSet(10), 1 << 20, 1000), ours)
    try:
        # Every frame in one write: they arrive together, as a pipelining client's burst does.
        theirs.sendall(b"".join(RemotingCommand(code=10, opaque=i).encode() for i in range(FRAMES)))
        turns = 0

        def turn() -> None:  # a callback of every loop iteration: answers going out would run here
            nonlocal turns
            turns += 1
            events.append(f"turn {turns}")
            if not done.is_set():
                loop.call_soon(turn)

        # Scheduled once the first frames were dispatched: it first runs after the first slice.
        await asyncio.wait_for(dispatcher.started.wait(), 10)
        loop.call_soon(turn)
        await asyncio.wait_for(done.wait(), 10)

        dispatched = [e for e in events if isinstance(e, int)]
        assert dispatched == list(range(FRAMES))
        holds = [i for i, e in enumerate(events) if e == "hold"]
        releases = [i for i, e in enumerate(events) if e == "release"]
        first_burst = events[holds[0] + 1:releases[0]]
        # One hold spans the first burst: its frames, and the loop turns between its slices.
        assert [e for e in first_burst if isinstance(e, int)] == list(range(BURST_FRAMES)), events
        assert [e for e in first_burst if isinstance(e, str)], f"the loop never turned inside the burst: {events}"
        # No slice is longer than DISPATCH_SLICE frames (counted once the loop turns are recorded).
        run = longest = 0
        for e in events[events.index("turn 1"):]:
            run = run + 1 if isinstance(e, int) else 0
            longest = max(longest, run)
        assert longest <= DISPATCH_SLICE, events
        # The next burst holds the group again, and ends once the frames run out.
        assert len(holds) == len(releases) == 2, events
        assert [e for e in events[holds[1]:releases[1]] if isinstance(e, int)] == list(range(BURST_FRAMES, FRAMES))
    finally:
        transport.close()
        theirs.close()


async def test_a_connection_lost_in_a_burst_releases_its_group():
    loop = asyncio.get_running_loop()
    events: list = []
    dispatcher = RecordingDispatcher(events)
    ours, theirs = socket.socketpair()
    transport, proto = await loop.connect_accepted_socket(
        lambda: BrokerProtocol(dispatcher, ConnectionSet(10), 1 << 20, 1000), ours)
    theirs.sendall(b"".join(RemotingCommand(code=10, opaque=i).encode() for i in range(BURST_FRAMES)))
    await asyncio.wait_for(dispatcher.started.wait(), 10)
    assert events[0] == "hold" and "release" not in events, events
    proto.connection_lost(None)  # held writes must not wait for frames that will never be dispatched
    assert events[-1] == "release"
    transport.close()
    theirs.close()
