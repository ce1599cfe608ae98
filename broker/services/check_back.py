"""The check-back scheduler (ARCHITECTURE.md decisions 5–6, reference §5.5–5.6).

Pending halves sit in the store's due index ordered by next check time, so a pass reads only what is due: its
cost follows the number of pending halves, never the history. One timer is armed for the earliest due time.
A check goes to the channel the half arrived on if it is still open, else to another live producer of the group
(round robin). An attempt counts toward transactionCheckMax only when the check was written to a channel; a half
with no live producer waits for a sign of life of its group (any registration: a heartbeat), which makes it due at
once, and is tried again every transactionCheckInterval meanwhile. One that no producer answered for
fileReservedTime is discarded (resumable), so halves nobody will answer never pin the store.

Fairness (issue 11): "open" is not "reading". A producer stalled with its connection open (SIGSTOP, a hung loop)
took all 600 checks of its group's 40 halves into its socket buffers, each counted, and the halves were discarded
while a live producer of the group got none. So a channel is a candidate only while its ``unread_bytes`` (write
buffer plus the checks sent since it last sent anything) is within ``transactionCheckMaxUnreadBytes``, and a
check counts only if the producer showed it was reading: when the half comes up again and the channel its last
check went to has sent nothing since, that check is taken back (not counted) and the half goes to another producer.
"""
from __future__ import annotations

import asyncio
import logging
import time
import weakref

from halfmq.protocol import properties as P
from halfmq.protocol.codes import FLAG_ONEWAY, RequestCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import create_offset_msg_id, record_properties_text, rewrite_record
from halfmq.protocol.properties import decode_properties, encode_properties
from halfmq.store import HalfState
from halfmq.store.txops import pending_since

from ..context import now_ms
from ..log_limit import LimitedLog

log = logging.getLogger(__name__)
PASS_LIMIT = 2000
#: a failing pass is retried after 1 s, then twice as long each time it fails again, at most this long
MAX_PASS_BACKOFF_MS = 60_000
_GONE = object()  # the channel a check went to is gone (closed): the check was not read either


class CheckBackService:
    def __init__(self, ctx, states):
        self.ctx = ctx
        self.store = ctx.store
        self.states = states
        cfg = ctx.config
        self.interval_ms = cfg.transactionCheckInterval
        self.max_checks = cfg.transactionCheckMax
        self.max_unread = cfg.transactionCheckMaxUnreadBytes
        #: half offset → (channel, time.monotonic(), group) of its last check, until the half comes up again.
        self._last_check: dict[int, tuple[weakref.ref, float, str]] = {}
        self._round_robin = 0
        self.checks_taken_back = 0
        self.waiting_for_producer: dict[str, set[int]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._task: asyncio.Task | None = None
        self._side_tasks: set[asyncio.Task] = set()
        self._again = False
        self._stopped = False
        self.last_pass_seconds = 0.0
        self.checks_sent = 0
        self.checks_undeliverable = 0
        self.discarded = 0
        #: halves discarded because no check could be made of them (an undecodable record, say)
        self.poisoned = 0
        self._failed_passes = 0
        self._backoff_until = 0
        self._limited = LimitedLog(log)

    def start(self) -> None:
        self.states.on_due.append(self.schedule_at)
        self.ctx.producers.register_listeners.append(self.producer_registered)
        self.ctx.producers.close_listeners.append(self.channel_closed)
        # Halves that were waiting for a producer before a restart keep waiting for one (cost: pending only).
        for _due, offset in self.store.due_halves(2 ** 62, 2 ** 31):
            state = self.store.get_half(offset)
            if state is not None and state.waiting:
                self.waiting_for_producer.setdefault(state.group, set()).add(offset)
        head = self.store.next_due()
        if head is not None:
            self.schedule_at(head[0])

    async def stop(self) -> None:
        self._stopped = True
        for listeners, listener in ((self.states.on_due, self.schedule_at),
                                    (self.ctx.producers.register_listeners, self.producer_registered),
                                    (self.ctx.producers.close_listeners, self.channel_closed)):
            if listener in listeners:  # a broker that stops leading keeps its registries
                listeners.remove(listener)
        if self._timer is not None:
            self._timer.cancel()
        tasks = [t for t in (self._task, *self._side_tasks) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    # --- timing ---
    def schedule_at(self, due_ms: int) -> None:
        """Make sure a pass runs no later than ``due_ms`` (broker clock), nor before a failed pass's back-off."""
        due_ms = max(due_ms, self._backoff_until)
        if self._stopped or due_ms >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = due_ms
        self._timer = loop.call_later(max(0.0, (due_ms - now_ms()) / 1000), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self._again = False
            try:
                await self.run_pass()
            except Exception:
                # Backs off, so a pass that keeps failing never loops (measured before: retried at once, 13,000
                # tracebacks in 5 s, and no other half got a check).
                self._failed_passes += 1
                delay = min(1000 << min(self._failed_passes - 1, 16), MAX_PASS_BACKOFF_MS)
                self._backoff_until = now_ms() + delay
                self._limited.log(logging.ERROR, "pass", "transaction check pass failed (%d in a row); next in "
                                  "%d ms", self._failed_passes, delay, exc_info=True)
                self._again = False
            else:
                self._failed_passes = 0
                self._backoff_until = 0
            if not self._again or self._stopped:
                break
        head = self.store.next_due()
        if head is not None and not self._stopped:
            self.schedule_at(head[0])

    def producer_registered(self, group: str, _channel) -> None:
        offsets = self.waiting_for_producer.pop(group, None)
        if offsets:
            self.states.make_due(sorted(offsets))  # the scheduler is woken by the transition itself

    def channel_closed(self, channel) -> None:
        """Checks the channel left unanswered can no longer be answered: their halves go to another producer of
        their group at once, or wait for the group's next one, as undeliverable checks do. CI: a producer that
        crashed right after its half still had an open channel when the half came due; the check went there, and
        the group's next producer waited the whole check interval for it."""
        if not self._last_check:
            return
        due_now: list[int] = []
        for offset, (ref, _when, group) in self._last_check.items():
            # Read or not, a check whose channel closed is not answered there any more (a producer closing says
            # goodbye first: heard from after its check, it was taken to have read it, and the check waited).
            if ref() is not channel:
                continue
            if self.ctx.producers.live_channels(group):
                due_now.append(offset)
            else:
                self.waiting_for_producer.setdefault(group, set()).add(offset)
        if due_now:
            self.states.make_due(due_now)

    # --- one pass ---
    async def run_pass(self) -> int:
        """Check, reschedule or discard every half that is due now. Returns how many were handled."""
        started = time.perf_counter()
        taken_back_before = self.checks_taken_back
        now = now_ms()
        due = self.store.due_halves(now, PASS_LIMIT)
        if not due:
            return 0
        attempts: dict[int, int] = {}   # offset → new check count, for checks written to a channel
        postponed: list[int] = []       # no live producer: wait for one, attempts not burned
        stale: list[tuple[int, int]] = []
        to_discard: list[int] = []
        aged: list[int] = []
        aged_before = now - self.states.max_pending_ms
        poisoned: list[int] = []  # discarded whatever their check count: checking them again cannot work
        rows = self.store.halves_with_records([offset for _due, offset in due])
        self._prune_last_checks()
        for (due_ms, offset), (state, raw) in zip(due, rows, strict=True):
            if state is None or not state.pending or state.due != due_ms:
                stale.append((due_ms, offset))  # an index entry left behind; the write below drops it
                self._last_check.pop(offset, None)
                continue
            checks, unread_by = state.checks, self._unconfirmed(offset)
            if unread_by is not None and checks > 0:
                checks -= 1  # its last check went to a producer that has not read it: it does not count
                self.checks_taken_back += 1
            if checks >= self.max_checks:
                to_discard.append(offset)
                continue
            channel = self._select_channel(state, offset, unread_by)
            try:
                sent = channel is not None and self._send_check(channel, offset, state, raw)
            except Exception as exc:  # no check can be made of this half: it alone is discarded (resumable)
                self.poisoned += 1
                self._limited.log(logging.ERROR, "poison", "half message at %d of group %s is discarded: no "
                                  "check can be made of it (%s: %s)", offset, state.group, type(exc).__name__, exc)
                poisoned.append(offset)
                continue
            if sent:
                attempts[offset] = checks + 1
                self._last_check[offset] = (weakref.ref(channel), time.monotonic(), state.group)
                self.checks_sent += 1
            elif pending_since(state) <= aged_before:
                aged.append(offset)  # nobody answered it for the retention age: it must not pin the store
            else:
                self.waiting_for_producer.setdefault(state.group, set()).add(offset)
                self.checks_undeliverable += 1
                if checks != state.checks:
                    attempts[offset] = checks  # the count taken back is written; due again after the interval
                else:
                    postponed.append(offset)
        if attempts or postponed or stale:
            await self.states.reschedule(attempts, postponed, stale, self.interval_ms)
        metrics = self.ctx.metrics
        discards = [self.states.discard(offset, self.max_checks) for offset in to_discard]  # one group
        discards += [self.states.discard(offset, self.max_checks, aged=True) for offset in aged]
        discards += [self.states.discard(offset, 0) for offset in poisoned]
        for completion in discards:
            if await completion is not None:
                self.discarded += 1
        self.last_pass_seconds = time.perf_counter() - started
        if metrics is not None:
            metrics.check_pass_done(len(attempts), len(postponed), self.checks_taken_back - taken_back_before,
                                    self.last_pass_seconds)
        return len(due)

    def _unconfirmed(self, offset: int):
        """The channel the half's last check went to, if it has sent nothing since (it did not read the check)."""
        last = self._last_check.pop(offset, None)
        if last is None:
            return None
        channel = last[0]()
        if channel is None or not channel.heard_since(last[1]):
            return channel if channel is not None else _GONE
        return None

    def _prune_last_checks(self) -> None:
        """Forget checks whose half will not come up again (decided meanwhile): those confirmed, or long past."""
        if len(self._last_check) <= 4 * PASS_LIMIT:
            return
        cutoff = time.monotonic() - 2 * self.interval_ms / 1000 - 60
        for offset, (ref, when, _group) in list(self._last_check.items()):
            channel = ref()
            if when < cutoff or channel is None or channel.heard_since(when):
                del self._last_check[offset]

    def _candidate(self, channel, avoid) -> bool:
        return (channel is not None and channel is not avoid and channel.writable
                and channel.unread_bytes <= self.max_unread)

    def _select_channel(self, state: HalfState, offset: int, avoid=None):
        """The half's sender, else its client's channel, else a live producer of the group (round robin): one that
        reads (within transactionCheckMaxUnreadBytes) and is not ``avoid`` (it left the last check unread)."""
        group = state.group
        sender = self.states.sender(offset)
        if self._candidate(sender, avoid):
            return sender
        if state.client_id:
            channel = self.ctx.producers.find_by_client_id(group, state.client_id)
            if self._candidate(channel, avoid):
                return channel
        live = self.ctx.producers.live_channels(group)
        for _ in range(len(live)):
            self._round_robin = (self._round_robin + 1) & 0x7FFFFFFF
            channel = live[self._round_robin % len(live)]
            if self._candidate(channel, avoid):
                return channel
        return None

    def _send_check(self, channel, offset: int, state: HalfState, raw: bytes | None) -> bool:
        if raw is None:
            log.error("half message at %d is missing from the commit log (or failed its CRC check)", offset)
            return False
        # The body is the half record shown as a message of its real topic and queue (reference §3.3); a batch
        # half's without the messages it holds: a producer answers from the half's properties, and up to
        # maxMessageSize per check would take a producer's whole transactionCheckMaxUnreadBytes.
        text = record_properties_text(raw)
        try:
            body = rewrite_record(raw, state.topic, state.queue_id, with_check_times(text, state.checks + 1),
                                  without_body=bool(state.batch))
        except MessageFormatError:
            # Properties within a few bytes of the record's limit: the check count does not fit, so the producer
            # gets the half as it was sent (RocketMQ's producers do not need the count to answer).
            body = rewrite_record(raw, state.topic, state.queue_id, text, without_body=bool(state.batch))
        uniq = state.uniq
        header = {"tranStateTableOffset": str(state.queue_offset), "commitLogOffset": str(offset),
                  "msgId": uniq, "transactionId": uniq,
                  "offsetMsgId": create_offset_msg_id(self.ctx.store_host, offset)}
        return channel.send_request(RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE, flag=FLAG_ONEWAY,
                                                    ext_fields=header, body=bytes(body)))


def with_check_times(properties_text: str, checks: int) -> str:
    """The property string with TRANSACTION_CHECK_TIMES set to ``checks``.

    A pass does this for every due half, so the usual case (the property is not there yet) appends to the string
    instead of parsing and rendering every property."""
    if P.TRANSACTION_CHECK_TIMES + P.NAME_VALUE_SEPARATOR in properties_text:
        props = decode_properties(properties_text)
        props[P.TRANSACTION_CHECK_TIMES] = str(checks)
        return encode_properties(props)
    if properties_text and not properties_text.endswith(P.PROPERTY_SEPARATOR):
        properties_text += P.PROPERTY_SEPARATOR
    return f"{properties_text}{P.TRANSACTION_CHECK_TIMES}{P.NAME_VALUE_SEPARATOR}{checks}{P.PROPERTY_SEPARATOR}"
