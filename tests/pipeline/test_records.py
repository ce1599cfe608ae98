"""The columnar pull-body decoder against the protocol's own record decoder, on the record shapes it must handle."""
from __future__ import annotations

from halfmq.pipeline.records import records_to_batch
from halfmq.protocol.message import MessageRecord, decode_records, encode_record


def record(offset: int, properties_text: str, topic: str = "T", store_host: str = "10.0.0.1:10911",
           born_host: str = "10.0.0.2:5555") -> bytes:
    return bytes(encode_record(MessageRecord(
        topic, f"body-{offset}".encode(), queue_id=3, queue_offset=offset, physical_offset=1000 + offset,
        born_timestamp=1_700_000_000_000 + offset, store_timestamp=1_700_000_000_500 + offset,
        born_host=born_host, store_host=store_host), properties_text))


def expected(buf: bytes) -> list[dict]:
    return [{"topic": r.topic, "broker_name": "broker-q", "queue_id": r.queue_id, "queue_offset": r.queue_offset,
             "msg_id": r.msg_id, "keys": r.keys, "tags": r.tags, "body": r.body,
             "properties": list(r.properties.items()),
             "born_ms": r.born_timestamp, "store_ms": r.store_timestamp} for r in decode_records(buf)]


def decoded(batch) -> list[dict]:
    rows = batch.to_pylist()
    for row in rows:
        row["born_ms"] = int(row.pop("born_timestamp").timestamp() * 1000)
        row["store_ms"] = int(row.pop("store_timestamp").timestamp() * 1000)
    return rows


def test_every_field_as_the_protocol_decodes_it():
    buf = b"".join([
        record(0, "UNIQ_KEY\x01ABC\x02TAGS\x01a\x02KEYS\x01k1 k2\x02"),
        record(1, ""),  # no UNIQ_KEY: the offset message id
        record(2, "TAGS\x01b\x02bad\x02\x01novalue\x02noname\x01\x02x\x01y\x01z\x02ü\x01é"),  # malformed dropped
        record(3, "TAGS\x01a\x02k\x011\x02k\x012\x02", topic="L" * 200),  # a repeated name; v2 magic
        record(4, "TAGS\x01c\x02", store_host="[::1]:10911", born_host="[fe80::1]:1"),  # IPv6 hosts
    ])
    assert decoded(records_to_batch(buf, 10, None, "broker-q")) == expected(buf)


def test_offsets_past_the_end_and_other_tags_are_dropped():
    buf = b"".join(record(i, f"TAGS\x01{'ab'[i % 2]}\x02") for i in range(6))
    assert [r["queue_offset"] for r in decoded(records_to_batch(buf, 4, None, "b"))] == [0, 1, 2, 3]
    assert [r["queue_offset"] for r in decoded(records_to_batch(buf, 4, {"b"}, "b"))] == [1, 3]
    assert records_to_batch(buf, 0, None, "b") is None
    assert records_to_batch(b"", 10, None, "b") is None
