"""The transaction state machine (halfmq.transactions) against the real store (issue 23): a hypothesis stateful test
drives random sequences of every event — prepare, commit, rollback (from the producer or a check), check sent, no
producer, producer seen, discard, resume, and restarts of the store — through the store's transaction ops, and
checks after each step that every half is in the state the table says, that the due index holds exactly the
pending halves, and that each committed half's message is in its real topic once."""
from __future__ import annotations

import asyncio
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule
import pytest

from halfmq.store import HalfConflictError, HalfState, HalfStatus, MessageStore, StoreConfig
from halfmq.store.txops import DecideHalf, DiscardHalf, MakeDue, PrepareHalf, RescheduleChecks, ResumeHalf
from halfmq.transactions import TABLE, Effect, Event, table_markdown, transition

from tests.store.test_store import request

HALF, REAL = "RMQ_SYS_TRANS_HALF_TOPIC", "Real"


class HalfMachine(RuleBasedStateMachine):
    halves = Bundle("halves")

    def __init__(self):
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="halfmq-machine-")
        self.loop = asyncio.new_event_loop()
        self.store = self._open()
        self.expected: dict[int, HalfStatus] = {}
        self.checks: dict[int, int] = {}
        self.restarts = 0

    def _open(self) -> MessageStore:
        store = MessageStore(StoreConfig(root=self.folder, map_size=32 << 20))
        self.loop.run_until_complete(store.open())
        return store

    def _submit(self, op):
        return self.loop.run_until_complete(self.store.submit(op))

    def teardown(self):
        self.loop.run_until_complete(self.store.close())
        self.loop.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _expect(self, offset: int, event: Event) -> Effect:
        move = transition(self.expected[offset], event)
        if move.effect is not Effect.REFUSE:
            self.expected[offset] = move.to
        return move.effect

    @rule(target=halves)
    def prepare(self):
        state = HalfState(HalfStatus.PREPARED, "PG", REAL, 0, f"u{len(self.expected)}", queue_offset=0, store_ts=0,
                          due=0)
        result, _ = self._submit(PrepareHalf(request(HALF, 0, b"half-%d" % len(self.expected)), state, 60_000))
        self.expected[result.physical_offset] = transition(None, Event.PREPARE).to
        self.checks[result.physical_offset] = 0
        return result.physical_offset

    @rule(offset=halves, commit=st.booleans(), from_check=st.booleans())
    def decide(self, offset, commit, from_check):
        state = self.store.get_half(offset)
        effect = self._expect(offset, Event.COMMIT if commit else Event.ROLLBACK)
        op = DecideHalf(offset, "PG", state.queue_offset, commit, from_check)
        if effect is Effect.REFUSE:
            try:
                self._submit(op)
            except HalfConflictError:
                return
            raise AssertionError(f"{'commit' if commit else 'rollback'} of a {state.status.value} half was applied")
        decision = self._submit(op)
        assert decision.applied == (effect is Effect.APPLY)

    @rule(offset=halves)
    def check_sent(self, offset):
        if self._expect(offset, Event.CHECK_SENT) is Effect.APPLY:
            self.checks[offset] += 1
        self._submit(RescheduleChecks({offset: self.checks[offset]}, [], [], 1_000))

    @rule(offset=halves)
    def no_producer(self, offset):
        self._expect(offset, Event.NO_PRODUCER)
        self._submit(RescheduleChecks({}, [offset], [], 1_000))

    @rule(offset=halves)
    def producer_seen(self, offset):
        self._expect(offset, Event.PRODUCER_SEEN)
        self._submit(MakeDue([offset]))

    @rule(offset=halves)
    def discard(self, offset):
        effect = self._expect(offset, Event.DISCARD)
        state = self._submit(DiscardHalf(offset, 0, "TRANS_CHECK_MAX_TIME_TOPIC", "1.2.3.4:5"))
        assert (state is not None) == (effect is Effect.APPLY)

    @rule(offset=halves)
    def resume(self, offset):
        effect = self._expect(offset, Event.RESUME)
        try:
            self._submit(ResumeHalf(offset))
        except HalfConflictError:
            assert effect is Effect.REFUSE
            return
        assert effect is Effect.APPLY
        self.checks[offset] = 0

    @rule()
    def restart(self):
        for offset in self.expected:
            self._expect(offset, Event.RESTART)
        self.loop.run_until_complete(self.store.close())
        self.store = self._open()
        self.restarts += 1

    @invariant()
    def states_are_the_tables(self):
        for offset, status in self.expected.items():
            assert self.store.get_half(offset).status is status, offset

    @invariant()
    def the_due_index_holds_the_pending_halves(self):
        due = {offset for _due, offset in self.store.due_halves(2 ** 62, 10_000)}
        assert due == {offset for offset, status in self.expected.items() if status is HalfStatus.PREPARED}

    @invariant()
    def each_committed_half_is_in_its_topic_once(self):
        committed = sum(status is HalfStatus.COMMITTED for status in self.expected.values())
        assert self.store.max_offset(REAL, 0) == committed


TestHalfMachine = pytest.mark.slow(HalfMachine.TestCase)  # 15 runs of 30 steps, each a store and a writer process
TestHalfMachine.settings = settings(max_examples=15, stateful_step_count=30, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])


def test_every_pair_not_in_the_table_is_refused():
    statuses = [None, *HalfStatus]
    for status in statuses:
        for event in Event:
            move = transition(status, event)
            assert (move.effect is Effect.REFUSE) == ((status, event) not in TABLE)


def test_the_architecture_document_shows_the_table():
    from pathlib import Path
    doc = (Path(__file__).parents[2] / "docs" / "ARCHITECTURE.md").read_text()
    assert table_markdown() in doc
