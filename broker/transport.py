"""asyncio.Protocol per connection: bytes → frames → commands → dispatcher, with backpressure.

Reading pauses while a connection has too many requests in progress or while its write buffer is full, so a
fast producer cannot make the broker buffer without bound. Frames that arrived in one read beyond the in-flight
limit wait, decoded only once a request of the connection finished.

A connection dispatches at most ``DISPATCH_SLICE`` frames per loop iteration and continues in the next, so the
loop turns between slices: answers that became durable meanwhile go out, and other connections get their turn.
The frames a burst brought (up to ``BURST_FRAMES``) still make one write group: the connection holds the store's
group (MessageStore.hold_group) until the last of them is dispatched, because each writer commit costs a data
sync. Measured at 64 in flight (1 KiB, SYNC_FLUSH), alternated in one run: slices of 4 frames in bursts of 32 gave
20.7k sends/s against 18.9k for slices of 32 that each were a group (21.7k for 043d5c1); slices of 2 gave 19.1k,
bursts of 64 14.7k. Earlier, without the hold: slices of 32 gave 18.6-18.8k, 24 gave 17.9-18.0k, 48 gave
16.1-16.7k, 16 gave 16.4k. The answers going out between slices are what counts: with whole bursts per iteration,
the answers of the previous burst waited for the decoding of the next, and client and broker took turns instead of
working at once. Later, with two syncs per commit (store/writer.py), paired rounds against this setting: slices of 8
gave 0.98x sends and 0.92x transactions; not counting oneway frames (a producer's decisions) in a burst, so that a
group held 32 halves and their decisions rather than 16, 0.93-0.95x transactions at 9% less CPU per transaction (at
64 in flight the ring of client, broker and writer is bound by latency more than by CPU).

When a connection closes, the frames it had sent in full are still carried out (their answers go nowhere): a
producer's oneway decision or a consumer's oneway offset written right before the close is applied.

Memory is bounded per connection and in total (issue 11; measured before: 3 connections that pipelined pulls and
never read took the broker from 33 to 1,108 MiB, 40 connections trickling 16 MiB frames held 640 MiB):

- answers: while a connection's write buffer is over ``serverMaxUnreadBytesPerConnection`` (its reader is behind),
  no further frame of it is turned into an answer and it is not read; frames already read wait in its backlog;
- requests in progress: at most ``serverMaxInflightPerConnection`` of them, holding at most
  ``serverMaxInflightBytesPerConnection`` of bodies (a connection pipelining 4 MiB sends or 10k-message batches
  held gigabytes under a count alone); held pulls are requests in progress too;
- frames read but not dispatched: reading pauses once ``MAX_BACKLOG`` wait;
- incomplete frames: a frame is never allocated at its declared size (only the bytes that arrived are held), and
  what a connection holds in incomplete and undispatched frames beyond ``FREE_FRAME_BYTES`` is charged to a budget
  shared by all connections (``serverMaxBufferedFrameBytes``), before any authentication; a connection that would
  go over it stops being read until others' frames complete (in arrival order; after
  ``serverBufferedFrameWaitSeconds`` it is closed).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from halfmq.protocol.codes import FLAG_RESPONSE
from halfmq.protocol.command import decode_command
from halfmq.protocol.errors import FrameError, HeaderError
from halfmq.protocol.frame import FrameDecoder

from .channel import Channel

if TYPE_CHECKING:
    from .dispatch import Dispatcher

log = logging.getLogger(__name__)
DISPATCH_SLICE = 4
#: Most frames of one connection held in one write group (more made one group of the whole in-flight window, and
#: the client and the broker took turns again).
BURST_FRAMES = 32
#: Frames read but not dispatched above which a connection is not read (they wait for the in-flight limit, a slice,
#: or a reader that is behind).
MAX_BACKLOG = 256
#: Bytes of incomplete and undispatched frames a connection may always hold, outside the shared budget: a client
#: pipelining 64 sends of 1 KiB never waits for the budget, whatever other connections hold.
FREE_FRAME_BYTES = 128 << 10
_FRAME_OVERHEAD = 8  # length and header words


class FrameBudget:
    """Bytes held in incomplete (and read but undispatched) frames beyond ``FREE_FRAME_BYTES`` per connection,
    across every connection sharing it. A connection that takes it over the limit while others hold some of it
    stops being read and waits, in arrival order, at most ``wait_seconds``; then it is closed (a waiting connection
    is not read, so it would not even notice that its peer left). A connection alone in the budget may finish its
    frame, so a frame up to serverMaxFrameSize always gets through: the total stays under limit + one frame."""

    def __init__(self, limit: int, wait_seconds: float = 10.0):
        self.limit = limit
        self.wait_seconds = wait_seconds
        self.used = 0
        self._waiting: deque = deque()
        self._timers: dict[object, asyncio.TimerHandle] = {}  # a waiting holder → its wait_seconds timer

    def must_wait(self, charge: int) -> bool:
        return self.used > self.limit and self.used > charge

    def charge(self, holder, held: int, may_wait: bool) -> bool:
        """``holder`` (a connection of either door: ``charged``, ``waiting_for_budget``, ``budget_granted``,
        ``budget_timed_out``) now holds ``held`` bytes of incomplete requests: its charge is what is beyond
        FREE_FRAME_BYTES. True when it went over the budget while others hold some and ``may_wait`` (it is open):
        it then waits, unread, until ``budget_granted``, and is told ``budget_timed_out`` after wait_seconds."""
        charge = held - FREE_FRAME_BYTES if held > FREE_FRAME_BYTES else 0
        delta = charge - holder.charged
        if not delta:
            return False
        holder.charged = charge
        self.used += delta
        if delta < 0:
            self.release()
            return False
        if not may_wait or holder.waiting_for_budget or not self.must_wait(charge):
            return False
        holder.waiting_for_budget = True
        self._waiting.append(holder)
        self._timers[holder] = asyncio.get_running_loop().call_later(self.wait_seconds, self._timed_out, holder)
        return True

    def forget(self, holder) -> None:
        """``holder`` is gone: it waits no more."""
        if holder.waiting_for_budget:
            self._stop_waiting(holder)
            try:
                self._waiting.remove(holder)
            except ValueError:
                pass

    def _stop_waiting(self, holder) -> None:
        holder.waiting_for_budget = False
        timer = self._timers.pop(holder, None)
        if timer is not None:
            timer.cancel()

    def _timed_out(self, holder) -> None:
        self._timers.pop(holder, None)
        holder.budget_timed_out()

    def release(self) -> None:
        """Charges went down: let waiting connections read again while there is room."""
        waiting = self._waiting
        while waiting:
            holder = waiting[0]
            if not holder.waiting_for_budget:
                waiting.popleft()
                continue
            if self.used >= self.limit and self.used > holder.charged:
                break
            waiting.popleft()
            self._stop_waiting(holder)
            holder.budget_granted()


@dataclass
class ConnectionLimits:
    """Per-connection limits and the budget shared by the connections of one broker."""

    max_unread_bytes: int = 4 << 20
    frame_budget: FrameBudget = field(default_factory=lambda: FrameBudget(128 << 20))
    max_inflight_bytes: int = 16 << 20
    refused_bytes_per_second: int = 1 << 20

    @classmethod
    def from_config(cls, config) -> "ConnectionLimits":
        # A name server refuses no request from its header (it registers no body check), so it has no such key.
        refused = getattr(config, "refusedRequestBytesPerSecond", cls.refused_bytes_per_second)
        return cls(config.serverMaxUnreadBytesPerConnection,
                   FrameBudget(config.serverMaxBufferedFrameBytes, config.serverBufferedFrameWaitSeconds),
                   config.serverMaxInflightBytesPerConnection, refused)


class ConnectionSet:
    """The live connections of one listener, for limits, idle checks and shutdown."""

    def __init__(self, max_connections: int):
        self.max_connections = max_connections
        self.protocols: set["BrokerProtocol"] = set()

    def close_idle(self, idle_seconds: float) -> None:
        cutoff = time.monotonic() - idle_seconds
        for proto in list(self.protocols):
            if proto.channel is not None and proto.channel.last_active < cutoff:
                log.info("closing idle connection %s", proto.channel.remote)
                proto.channel.close()

    def stop_reading(self) -> None:
        """Shutdown, first step: read no more requests (frames read but not yet dispatched are dropped unanswered:
        nothing of them was stored), so every request that is stored is also answered before the close."""
        for proto in list(self.protocols):
            proto.stop_reading()

    def close_all(self) -> None:
        for proto in list(self.protocols):
            if proto.transport is not None:
                proto.transport.close()


class BrokerProtocol(asyncio.Protocol):
    def __init__(self, dispatcher: "Dispatcher", connections: ConnectionSet, max_frame: int, max_inflight: int):
        self.dispatcher = dispatcher
        self.connections = connections
        self.decoder = FrameDecoder(max_frame)
        self.max_inflight = max_inflight
        self.inflight = 0
        self.transport = None
        self.channel: Channel | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._backlog: deque = deque()  # frames read but not dispatched yet (in-flight limit, or the next slice)
        self._slice_scheduled = False
        self._burst_left = 0  # frames of the current burst not dispatched yet (its write group is held)
        self._holding = False
        self._stopped = False
        limits: ConnectionLimits = getattr(dispatcher, "limits", None) or ConnectionLimits()
        self.max_unread = limits.max_unread_bytes
        self.max_inflight_bytes = limits.max_inflight_bytes
        self.inflight_bytes = 0
        self.budget = limits.frame_budget
        self._backlog_bytes = 0
        self.charged = 0  # what this connection holds of the shared frame budget
        self.waiting_for_budget = False  # set and cleared by the budget
        self.refused_rate = limits.refused_bytes_per_second
        self._refused_until = 0.0  # loop time until which the bytes of refused requests are being paid for
        self._refused_timer: asyncio.TimerHandle | None = None

    def stop_reading(self) -> None:
        self._stopped = True
        self._end_burst()
        self._backlog.clear()
        self._backlog_bytes = 0
        if self.transport is not None and not self.transport.is_closing() and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    # --- asyncio.Protocol ---
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername") or ("?", 0)
        remote = f"{peer[0]}:{peer[1]}" if len(peer) == 2 else f"[{peer[0]}]:{peer[1]}"
        if len(self.connections.protocols) >= self.connections.max_connections:
            log.warning("refusing connection from %s: serverMaxConnections=%d reached", remote,
                        self.connections.max_connections)
            transport.abort()
            return
        self.channel = Channel(transport, remote)
        self.connections.protocols.add(self)
        # pause_writing comes when this many answer bytes wait for the reader: no further frame is dispatched then.
        transport.set_write_buffer_limits(high=self.max_unread, low=self.max_unread // 4)

    def connection_lost(self, exc) -> None:
        self.connections.protocols.discard(self)
        if self.channel is not None:
            self.channel.closed = True  # the answers to what is dispatched now have nowhere to go
            if self._backlog and not self._stopped:
                self._dispatch_remaining()
        self._end_burst()
        self._backlog.clear()
        self._backlog_bytes = 0
        self.decoder = FrameDecoder(self.decoder.max_frame)
        if self._refused_timer is not None:
            self._refused_timer.cancel()
            self._refused_timer = None
        self.budget.forget(self)
        self._charge()
        if self.channel is not None:
            self.dispatcher.channel_closed(self.channel)

    def data_received(self, data: bytes) -> None:
        channel = self.channel
        if channel is None or channel.closed or self._stopped:
            return
        channel.last_active = time.monotonic()
        decoder = self.decoder
        before = decoder.buffered
        try:
            frames = decoder.feed(data)
        except FrameError as exc:
            log.warning("closing %s: %s", channel.remote, exc)
            self.transport.abort()
            return
        refused = decoder.skipped
        if frames:
            self._backlog.extend(frames)
            self._backlog_bytes += before + len(data) - refused - decoder.buffered
        if decoder.buffered > FREE_FRAME_BYTES:
            refused += self._refuse_pending()
        if refused:
            self._pay_refused(refused)
        if self.charged or decoder.buffered + self._backlog_bytes > FREE_FRAME_BYTES:
            self._charge()
        if not self._slice_scheduled:
            self._dispatch_backlog()
        if len(self._backlog) >= MAX_BACKLOG and not self._reading_paused:
            self._update_reading()

    def _refuse_pending(self) -> int:
        """A large frame whose header arrived is answered now when its declared body is refused (the dispatcher
        knows which requests bound their bodies): its bytes held are freed, the rest is discarded as it comes.
        Returns the bytes of it that were held."""
        pending = self.decoder.pending()
        if pending is None:
            return 0
        frame, body_size = pending
        try:
            cmd = decode_command(frame)
        except HeaderError:
            return 0  # closed when the frame is complete, as any undecodable one
        if not self.dispatcher.refuse_declared_body(self, cmd, body_size):
            return 0
        return self.decoder.skip_pending()

    def _pay_refused(self, size: int) -> None:
        """Read no more of this connection until ``size`` bytes of refused requests have passed at
        refusedRequestBytesPerSecond: a client sending refused bodies again and again is slowed to that rate, not
        served as fast as it writes."""
        loop = asyncio.get_running_loop()
        self._refused_until = max(self._refused_until, loop.time()) + size / self.refused_rate
        if self._refused_timer is None:
            self._refused_timer = loop.call_at(self._refused_until, self._refused_paid)
            self._update_reading()

    def _refused_paid(self) -> None:
        loop = asyncio.get_running_loop()
        if self._refused_until > loop.time():
            self._refused_timer = loop.call_at(self._refused_until, self._refused_paid)
            return
        self._refused_timer = None
        self._update_reading()

    def _charge(self) -> None:
        """Bring this connection's share of the frame budget up to date; over the budget, stop reading it."""
        if self.budget.charge(self, self.decoder.buffered + self._backlog_bytes,
                              self.channel is not None and not self.channel.closed):
            self._update_reading()

    def budget_granted(self) -> None:
        self._update_reading()

    def budget_timed_out(self) -> None:
        if self.transport is not None:
            log.warning("closing %s: it waited %ss for room to buffer its frame (serverMaxBufferedFrameBytes=%d "
                        "in use by other connections' incomplete frames)", self.channel.remote,
                        self.budget.wait_seconds, self.budget.limit)
            self.transport.abort()

    def _dispatch_backlog(self) -> None:
        """Dispatch waiting frames in order while the connection is under its in-flight limit, one slice."""
        self._slice_scheduled = False
        backlog = self._backlog
        budget = DISPATCH_SLICE
        while (backlog and self.inflight < self.max_inflight and self.inflight_bytes < self.max_inflight_bytes
               and not self._writing_paused):
            if not budget:
                self._slice_scheduled = True
                # To the back of the queue twice: the answers of earlier slices, scheduled by their syncs while
                # this slice ran, go out before the next slice is decoded.
                loop = asyncio.get_running_loop()
                loop.call_soon(loop.call_soon, self._dispatch_backlog)
                return
            if not self._burst_left:
                self._start_burst()
            budget -= 1
            frame = backlog.popleft()
            self._backlog_bytes -= len(frame.header) + len(frame.body) + _FRAME_OVERHEAD
            self._burst_left -= 1
            if not self._dispatch_frame(frame):
                self._end_burst()
                return
            if not self._burst_left:
                self._end_burst()
        # The backlog is empty or a limit stopped it: what the burst dispatched goes to the writer now.
        self._end_burst()
        if self.charged:
            self._charge()
        if self._reading_paused:
            self._update_reading()

    def _dispatch_remaining(self) -> None:
        """Carry out every complete request read before the connection closed, whatever the in-flight limits: a
        stock producer writes its transaction decision oneway right before it shuts down, and a consumer its
        offsets (measured before: 30 of 30 decisions were lost when they came behind 8 heartbeats in one write).
        What is carried out is bounded by what the connection was allowed to buffer (MAX_BACKLOG frames)."""
        backlog = self._backlog
        while backlog:
            if not self._burst_left:
                self._start_burst()
            frame = backlog.popleft()
            self._backlog_bytes -= len(frame.header) + len(frame.body) + _FRAME_OVERHEAD
            self._burst_left -= 1
            if not self._dispatch_frame(frame):
                break
            if not self._burst_left:
                self._end_burst()

    def _start_burst(self) -> None:
        self._burst_left = min(len(self._backlog), BURST_FRAMES)
        store = self.dispatcher.store
        if store is not None and not self._holding:
            self._holding = True
            store.hold_group()

    def _end_burst(self) -> None:
        self._burst_left = 0
        if self._holding:
            self._holding = False
            self.dispatcher.store.release_group()

    def _dispatch_frame(self, frame) -> bool:
        """Decode and dispatch one frame; False when the connection had to be closed."""
        try:
            cmd = decode_command(frame)
        except HeaderError as exc:
            # Without a decodable header there is no opaque to answer to: the stream is unusable.
            log.warning("closing %s: undecodable header: %s", self.channel.remote, exc)
            self._backlog.clear()
            self._backlog_bytes = 0
            self.transport.abort()
            return False
        if not cmd.flag & FLAG_RESPONSE:  # clients never answer the broker's oneway requests; ignore stray responses
            self.dispatcher.dispatch(self, cmd)
        return True

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._backlog and not self._slice_scheduled and self.channel is not None and not self.channel.closed:
            self._dispatch_backlog()
        self._update_reading()

    # --- in-flight accounting (called by the dispatcher; ``size``: the request's body, what it holds) ---
    def request_started(self, size: int = 0) -> None:
        self.inflight += 1
        self.inflight_bytes += size
        if self.inflight >= self.max_inflight or self.inflight_bytes >= self.max_inflight_bytes:
            self._update_reading()

    def request_finished(self, size: int = 0) -> None:
        self.inflight -= 1
        self.inflight_bytes -= size
        if self._backlog and not self._slice_scheduled and self.channel is not None and not self.channel.closed:
            self._dispatch_backlog()
        if self._reading_paused:
            self._update_reading()

    def _update_reading(self) -> None:
        should_pause = (self._stopped or self._writing_paused or self.inflight >= self.max_inflight
                        or self.inflight_bytes >= self.max_inflight_bytes or self.waiting_for_budget
                        or len(self._backlog) >= MAX_BACKLOG or self._refused_timer is not None)
        if should_pause == self._reading_paused or self.transport is None or self.transport.is_closing():
            return
        self._reading_paused = should_pause
        if should_pause:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()
