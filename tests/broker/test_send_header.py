"""SEND_MESSAGE_V2's header decoder on the send path gives what the generic from_ext gives, error for error."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halfmq.broker.processors.send import decode_v2_header
from halfmq.protocol.errors import HeaderError
from halfmq.protocol.headers import SendMessageRequestHeaderV2

USUAL = {"a": "PG", "b": "TopicA", "c": "TBW102", "d": "4", "e": "3", "f": "0", "g": "1763900000000", "h": "0",
         "i": "UNIQ_KEY\x01AC11\x02WAIT\x01true\x02", "j": "0", "k": "false", "m": "true", "n": "broker-a"}
#: spellings around each edge from_ext draws: signs, spaces, underscores, non-ASCII digits, int64 bounds, 19+ chars
EDGES = ["0", "7", "-1", " 5 ", "+3", "1_000", "٣", "", "x", "true", "false", "TRUE", "1", " false", "9" * 18, "9" * 19,
         "-" + "9" * 18, "-" + "9" * 19, str(2 ** 63), str(2 ** 63 - 1), str(-(2 ** 63)), "0" * 30 + "1", "1e3"]


def outcome(decode, ext):
    try:
        return decode(ext)
    except HeaderError as exc:
        return ("HeaderError", str(exc))


def test_the_usual_header():
    assert decode_v2_header(USUAL) == SendMessageRequestHeaderV2.from_ext(USUAL)


@pytest.mark.parametrize("key", sorted(USUAL) + ["l"])
@pytest.mark.parametrize("text", EDGES)
def test_each_field_at_each_edge(key, text):
    ext = {**USUAL, key: text}
    assert outcome(decode_v2_header, ext) == outcome(SendMessageRequestHeaderV2.from_ext, ext)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(USUAL) + ["l"]), st.sampled_from(EDGES) | st.text(max_size=4)),
       st.sets(st.sampled_from(sorted(USUAL))))
def test_same_header_or_same_error_as_from_ext(changed, removed):
    ext = {k: v for k, v in {**USUAL, **changed}.items() if k not in removed}
    assert outcome(decode_v2_header, ext) == outcome(SendMessageRequestHeaderV2.from_ext, ext)
