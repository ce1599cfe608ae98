"""What goes to the writer process and back keeps every field: the ops' and values' own pickled forms (their
__reduce__, plain tuples for speed) must follow their fields as they change."""
from __future__ import annotations

import dataclasses
import pickle

import msgpack
import pytest

from halfmq.store.halfs import HalfState, HalfStatus
from halfmq.store.ops import PutMessage, PutMessages
from halfmq.store.requests import PutRequest, PutResult
from halfmq.store.txops import DecideHalf, Decision, PrepareHalf, decision_wire

STATE = HalfState(HalfStatus.DISCARDED, "PG", "Topic", 3, "UNIQ", 5, 6, 7, checks=2, client_id="c1", size=9,
                  tags_code=-4, keys="a b", waiting=True, last_check_ts=1, decided_ts=2, decided_by="check",
                  committed_offset=11, discarded_offset=44, batch=12, committed_last=55, parts=b"\x01\x02")
VALUES = [
    STATE,
    PrepareHalf(PutRequest("HALF", 1, bytearray(b"record"), 7, False, "k"), STATE, 5000, ("k1", "k2 k3")),
    DecideHalf(123, "PG", 17, True, True),
]


def test_every_field_is_set_in_the_examples():
    # A field added later must get a value here, or its round trip below proves nothing.
    for value in VALUES:
        defaults = {f.name: f.default for f in dataclasses.fields(value)}
        assert all(getattr(value, name) != default for name, default in defaults.items()), type(value).__name__


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_round_trip_keeps_every_field(value):
    back = pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == value and type(back) is type(value)


@pytest.mark.parametrize("committed", [PutResult(1, 2, 3, 4), None])
def test_a_decision_comes_back_as_plain_values_and_is_rebuilt_whole(committed):
    answer = decision_wire(STATE, True, HalfStatus.PREPARED, committed)
    wire = pickle.loads(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
    assert all(type(v) in (bool, int, str, tuple, type(None)) for v in wire)
    decision = DecideHalf.result(wire)
    assert decision == Decision(True, HalfStatus.PREPARED, STATE.status, STATE.topic, STATE.store_ts,
                                STATE.decided_ts, committed)
    assert decision.previous is HalfStatus.PREPARED and decision.status is HalfStatus.DISCARDED
    assert type(decision.committed) is type(committed)


def test_a_send_goes_as_its_fields_and_its_value_comes_back_a_put_result():
    request = PutRequest("Topic", 2, bytearray(b"record"), 7, True, "k")
    assert PutMessage(request).wire() == tuple(getattr(request, f.name) for f in dataclasses.fields(request))
    result = PutMessage.result((1, 2, 3, 4))
    assert type(result) is PutResult and result == PutResult(1, 2, 3, 4)


def test_a_batch_comes_back_as_put_results():
    results = PutMessages.result([(1, 2, 3, 4), (5, 6, 7, 8)])
    assert results == [PutResult(1, 2, 3, 4), PutResult(5, 6, 7, 8)] and all(type(r) is PutResult for r in results)


def test_a_half_state_row_keeps_every_field_and_rows_of_earlier_versions_still_read():
    back = HalfState.from_bytes(STATE.to_bytes())
    assert back == STATE and back.status is HalfStatus.DISCARDED
    # Before rows were arrays: a map by field name, the status under "state", fields at their defaults left out.
    legacy = msgpack.packb({"state": "PREPARED", "group": "PG", "topic": "T", "queue_id": 1, "uniq": "U",
                            "queue_offset": 2, "store_ts": 3, "due": 4, "checks": 1, "batch": 2})
    assert HalfState.from_bytes(legacy) == HalfState(HalfStatus.PREPARED, "PG", "T", 1, "U", 2, 3, 4, checks=1,
                                                     batch=2)
    # An array row written before its last fields existed: they read as their defaults.
    short = msgpack.packb(["COMMITTED", "PG", "T", 1, "U", 2, 3, 4])
    assert HalfState.from_bytes(short) == HalfState(HalfStatus.COMMITTED, "PG", "T", 1, "U", 2, 3, 4)
