"""Each header's generated decoder (Header.from_ext, made once per class) gives what a plain loop over the header's
field specs gives, header for header and error for error: for SEND_MESSAGE_V2 at each edge of each field, and for
every header class on arbitrary extFields."""
from __future__ import annotations

import dataclasses
import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halfmq.protocol import headers
from halfmq.protocol.errors import HeaderError
from halfmq.protocol.headers import Header, SendMessageRequestHeaderV2

USUAL = {"a": "PG", "b": "TopicA", "c": "TBW102", "d": "4", "e": "3", "f": "0", "g": "1763900000000", "h": "0",
         "i": "UNIQ_KEY\x01AC11\x02WAIT\x01true\x02", "j": "0", "k": "false", "m": "true", "n": "broker-a"}
#: spellings around each edge a decoder draws: signs, spaces, underscores, non-ASCII digits, int64 bounds, 19+ chars,
#: the small integers' table (its last and the first beyond it, leading zeros)
EDGES = ["0", "7", "1023", "1024", "007", "-1", " 5 ", "+3", "1_000", "٣", "", "x", "true", "false", "TRUE", "1", " false", "9" * 18, "9" * 19,
         "-" + "9" * 18, "-" + "9" * 19, str(2 ** 63), str(2 ** 63 - 1), str(-(2 ** 63)), "0" * 30 + "1", "1e3"]
HEADERS = sorted((cls for _name, cls in inspect.getmembers(headers, inspect.isclass)
                  if issubclass(cls, Header) and cls is not Header and dataclasses.is_dataclass(cls)),
                 key=lambda cls: cls.__name__)


def reference(cls, ext: dict[str, str]):
    """The decoding every generated decoder must match: field by field, in the class's order."""
    kwargs = {}
    for name, key, kind, required in cls._field_specs():
        text = ext.get(key)
        if text is None:
            if required:
                raise HeaderError(f"the custom header field {key!r} ({name}) is required")
            continue
        kwargs[name] = headers._parse(key, kind, text)
    return cls(**kwargs)


def outcome(decode, ext):
    try:
        return decode(ext)
    except HeaderError as exc:
        return ("HeaderError", str(exc))


def test_the_usual_send_header():
    assert SendMessageRequestHeaderV2.from_ext(USUAL) == reference(SendMessageRequestHeaderV2, USUAL)


@pytest.mark.parametrize("key", sorted(USUAL) + ["l"])
@pytest.mark.parametrize("text", EDGES)
def test_each_send_header_field_at_each_edge(key, text):
    ext = {**USUAL, key: text}
    assert outcome(SendMessageRequestHeaderV2.from_ext, ext) == outcome(
        lambda e: reference(SendMessageRequestHeaderV2, e), ext)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(USUAL) + ["l"]), st.sampled_from(EDGES) | st.text(max_size=4)),
       st.sets(st.sampled_from(sorted(USUAL))))
def test_the_send_header_decodes_as_the_reference(changed, removed):
    ext = {k: v for k, v in {**USUAL, **changed}.items() if k not in removed}
    assert outcome(SendMessageRequestHeaderV2.from_ext, ext) == outcome(
        lambda e: reference(SendMessageRequestHeaderV2, e), ext)


@settings(max_examples=40, deadline=None)
@pytest.mark.parametrize("cls", HEADERS, ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_every_header_decodes_as_the_reference(cls, data):
    keys = [key for _name, key, _kind, _required in cls._field_specs()]
    ext = data.draw(st.dictionaries(st.sampled_from(keys), st.sampled_from(EDGES) | st.text(max_size=4)))
    assert outcome(cls.from_ext, ext) == outcome(lambda e: reference(cls, e), ext)


def test_a_subclass_of_a_decoded_header_decodes_its_own_fields():
    SendMessageRequestHeaderV2.from_ext(USUAL)  # the parent's decoder is made first

    @dataclasses.dataclass(slots=True, kw_only=True)
    class Extended(SendMessageRequestHeaderV2):
        extra: str = headers.req()

    with pytest.raises(HeaderError, match="extra"):
        Extended.from_ext(USUAL)
    assert Extended.from_ext({**USUAL, "extra": "x"}).extra == "x"
