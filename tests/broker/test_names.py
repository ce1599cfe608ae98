"""Every client-supplied name that becomes a store key or a topic is checked at the boundary (broker/names.py):
refused with a code and a remark naming the field and the limit, nothing stored, and a restart finds every other
group's offsets and messages as they were."""
from __future__ import annotations

import json
import struct

import lmdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from halfmq.broker import names
from halfmq.broker.errors import BrokerError
from halfmq.protocol import properties as P
from halfmq.protocol.codes import PullSysFlag, RequestCode, ResponseCode, SysFlag
from halfmq.protocol.message import BatchItem, decode_offset_msg_id, decode_records, encode_batch
from halfmq.protocol.properties import encode_properties
from halfmq.store.keys import offset_key

from tests.support.raw import RawClient

BAD_GROUPS = {"nul": "g\x00x", "600-bytes": "g" * 600}
LONG_KEY = "k" * 600


def refused(r, code: int, *words: str) -> bool:
    """The answer refuses with ``code`` and a remark naming each of ``words`` (the field, the limit)."""
    return r.code == code and all(w in (r.remark or "") for w in words)


def limit_words(bad: str) -> tuple[str, ...]:
    """What the remark must say about ``bad``: the 120-character group limit or the character it refused."""
    return (str(names.MAX_GROUP_LENGTH),) if len(bad) > names.MAX_GROUP_LENGTH else ("illegal character",)


async def start(broker_factory, store):
    broker = await broker_factory(store_dir=store)
    return broker, await RawClient.connect(broker.addr)


async def consumer_offset(c: RawClient, group: str, topic: str = "T", queue_id: int = 0) -> str:
    r = await c.request(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic,
                                                            "queueId": queue_id, "setZeroIfNotFound": "false"})
    return r.ext_fields.get("offset") if r.code == ResponseCode.SUCCESS else f"code {r.code}"


def pull_commit_ext(group: str, commit_offset: int, topic: str = "T") -> dict:
    return {"consumerGroup": group, "topic": topic, "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
            "sysFlag": PullSysFlag.COMMIT_OFFSET | PullSysFlag.SUBSCRIPTION, "commitOffset": commit_offset,
            "suspendTimeoutMillis": 0, "subVersion": 0, "subscription": "*"}


async def bodies(c: RawClient, topic: str) -> list[bytes]:
    r = await c.pull(topic, 0, 0)
    return [m.body for m in decode_records(r.body)] if r.code == ResponseCode.SUCCESS else []


# --- HEART_BEAT ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", BAD_GROUPS.values(), ids=BAD_GROUPS.keys())
@pytest.mark.parametrize("kind", ["consumer", "producer"])
async def test_heartbeat_with_a_bad_group_is_refused_whole(broker, bad, kind):
    c = await RawClient.connect(broker.addr)
    consumers, producers = {"GoodCG": {"T": "*"}}, ["GoodPG"]
    if kind == "consumer":
        consumers[bad] = {"T": "*"}
    else:
        producers.append(bad)
    r = await c.heartbeat("client-1", producers, consumers)
    assert refused(r, ResponseCode.SYSTEM_ERROR, f"{kind}DataSet.groupName", *limit_words(bad)), r.remark
    # nothing of it registered, not even the good groups that came before the bad one
    r = await c.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "GoodCG"})
    assert r.code == ResponseCode.SYSTEM_ERROR
    r = await c.request(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "GoodPG"})
    assert r.code == ResponseCode.SYSTEM_ERROR
    r = await c.request(RequestCode.GET_ALL_TOPIC_CONFIG)
    assert not [t for t in json.loads(r.body)["topicConfigTable"] if t.startswith("%RETRY%")]
    # the same connection registers once it sends good names
    assert (await c.heartbeat("client-1", ["GoodPG"], {"GoodCG": {"T": "*"}})).code == ResponseCode.SUCCESS
    r = await c.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "GoodCG"})
    assert json.loads(r.body)["consumerIdList"] == ["client-1"]
    c.close()


@pytest.mark.parametrize("client_id, topic, words", [
    ("client\x00one", "T", ("clientID", "control character")),
    ("c" * 300, "T", ("clientID", "255")),
    ("client-1", "T\x00x", ("subscriptionDataSet.topic", "illegal character")),
    ("client-1", "t" * 128, ("subscriptionDataSet.topic", "127")),
], ids=["nul-client-id", "long-client-id", "nul-topic", "long-topic"])
async def test_heartbeat_with_a_bad_client_id_or_subscription_topic_is_refused_whole(broker, client_id, topic,
                                                                                      words):
    c = await RawClient.connect(broker.addr)
    r = await c.heartbeat(client_id, ["GoodPG"], {"GoodCG": {topic: "*"}})
    assert refused(r, ResponseCode.SYSTEM_ERROR, *words), r.remark
    r = await c.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "GoodCG"})
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert broker.ctx.topics.get("%RETRY%GoodCG") is None
    c.close()


# --- consumer offsets: UPDATE_CONSUMER_OFFSET (two-way, oneway) and PULL with a commit -----------------------
@pytest.mark.parametrize("bad", BAD_GROUPS.values(), ids=BAD_GROUPS.keys())
@pytest.mark.parametrize("way", ["update", "update-oneway", "pull-commit"])
async def test_bad_group_offset_commit_is_refused_and_a_restart_keeps_every_other_offset(broker_factory, tmp_path,
                                                                                         bad, way):
    store = tmp_path / "store"
    broker, c = await start(broker_factory, store)
    assert (await c.send("T", b"m")).code == ResponseCode.SUCCESS
    q = {"topic": "T", "queueId": 0}
    # the good groups: one durable update, one oneway update and one pull commit (both flushed later)
    assert (await c.request(RequestCode.UPDATE_CONSUMER_OFFSET,
                            {**q, "consumerGroup": "G1", "commitOffset": 3})).code == ResponseCode.SUCCESS
    c.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "consumerGroup": "G2", "commitOffset": 5})
    assert (await c.request(RequestCode.PULL_MESSAGE, pull_commit_ext("G3", 7))).code == ResponseCode.SUCCESS

    bad_ext = {**q, "consumerGroup": bad, "commitOffset": 11}
    if way == "update":
        r = await c.request(RequestCode.UPDATE_CONSUMER_OFFSET, bad_ext)
        assert refused(r, ResponseCode.SYSTEM_ERROR, "consumerGroup", *limit_words(bad)), r.remark
    elif way == "update-oneway":
        c.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, bad_ext)
    else:
        r = await c.request(RequestCode.PULL_MESSAGE, pull_commit_ext(bad, 11))
        assert refused(r, ResponseCode.SYSTEM_ERROR, "consumerGroup", *limit_words(bad)), r.remark
    r = await c.request(RequestCode.QUERY_CONSUMER_OFFSET, {**q, "consumerGroup": bad})
    assert refused(r, ResponseCode.SYSTEM_ERROR, "consumerGroup"), r.remark  # also after the oneway: in order
    assert not [key for key in broker.ctx.offsets.table if key[0] == bad]
    c.close()

    await broker.stop()
    broker, c = await start(broker_factory, store)
    assert [await consumer_offset(c, g) for g in ("G1", "G2", "G3")] == ["3", "5", "7"]
    assert not [key for key in broker.ctx.offsets.table if key[0] == bad]
    c.close()


# --- sends: KEYS entries and UNIQ_KEY ------------------------------------------------------------------------
BAD_PROPS = {
    "long-keys-entry": ({P.KEYS: f"ok {LONG_KEY}"}, ("KEYS", str(names.MAX_MESSAGE_KEY_BYTES))),
    "nul-keys-entry": ({P.KEYS: "a\x00b"}, ("KEYS", "control character")),
    "long-uniq-key": ({P.UNIQ_KEY: LONG_KEY}, ("UNIQ_KEY", str(names.MAX_MESSAGE_KEY_BYTES))),
}


@pytest.mark.parametrize("props, words", BAD_PROPS.values(), ids=BAD_PROPS.keys())
async def test_plain_send_with_a_bad_message_key_is_refused_and_nothing_is_stored(broker_factory, tmp_path,
                                                                                   props, words):
    store = tmp_path / "store"
    broker, bad_client = await start(broker_factory, store)
    good_client = await RawClient.connect(broker.addr)
    r = await bad_client.send("KT", b"bad", props=props)
    assert refused(r, ResponseCode.MESSAGE_ILLEGAL, *words), r.remark
    for i in range(3):  # another client's sends are not disturbed
        r = await good_client.send("KT", f"good{i}".encode(), keys=f"key{i}")
        assert r.code == ResponseCode.SUCCESS, r.remark
    assert await bodies(good_client, "KT") == [b"good0", b"good1", b"good2"]
    r = await good_client.request(RequestCode.QUERY_MESSAGE, {"topic": "KT", "key": "ok", "maxNum": 32,
                                                              "beginTimestamp": 0, "endTimestamp": 2 ** 62})
    assert r.code == ResponseCode.QUERY_NOT_FOUND
    bad_client.close()
    good_client.close()

    await broker.stop()
    broker, c = await start(broker_factory, store)
    assert await bodies(c, "KT") == [b"good0", b"good1", b"good2"]
    c.close()


def batch(*items: tuple[bytes, dict]) -> bytes:
    return encode_batch([BatchItem(body, encode_properties(props)) for body, props in items])


@pytest.mark.parametrize("where", ["in-an-item", "batch-level"])
async def test_batch_with_an_oversized_keys_entry_is_refused_whole_and_nothing_is_stored(broker, where):
    bad_client, good_client = await RawClient.connect(broker.addr), await RawClient.connect(broker.addr)
    bad_keys = {P.KEYS: f"ok {LONG_KEY}"}
    if where == "in-an-item":  # the bad message comes second: the first must not be stored either
        body, outer = batch((b"bad0", {P.KEYS: "k0"}), (b"bad1", bad_keys)), {}
    else:  # batch-level properties apply to each message that has none of its own
        body, outer = batch((b"bad0", {}), (b"bad1", {})), bad_keys
    r = await bad_client.send("BT", body, props=outer, code=RequestCode.SEND_BATCH_MESSAGE)
    assert refused(r, ResponseCode.MESSAGE_ILLEGAL, "KEYS", str(names.MAX_MESSAGE_KEY_BYTES)), r.remark
    r = await good_client.send("BT", batch((b"good0", {P.KEYS: "k0"}), (b"good1", {})),
                               code=RequestCode.SEND_BATCH_MESSAGE)
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert await bodies(good_client, "BT") == [b"good0", b"good1"]
    bad_client.close()
    good_client.close()


async def send_half(c: RawClient, body: bytes, keys: str):
    props = {P.TRAN_MSG: "true", P.PGROUP: "PG_TX", P.KEYS: keys}
    return await c.send("TXK", body, group="PG_TX", props=props, sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)


async def pending_halves(c: RawClient) -> int:
    r = await c.request(RequestCode.HALFMQ_GET_HALF_STATUS, {"limit": 100})
    return json.loads(r.body)["pending"]


async def test_transactional_send_with_an_oversized_keys_entry_is_refused_and_nothing_is_stored(broker_factory,
                                                                                                  tmp_path):
    store = tmp_path / "store"
    broker, bad_client = await start(broker_factory, store)
    good_client = await RawClient.connect(broker.addr)
    r = await send_half(bad_client, b"bad", f"ok {LONG_KEY}")
    assert refused(r, ResponseCode.MESSAGE_ILLEGAL, "KEYS", str(names.MAX_MESSAGE_KEY_BYTES)), r.remark
    assert await pending_halves(good_client) == 0
    r = await send_half(good_client, b"good", "key1")
    assert r.code == ResponseCode.SUCCESS, r.remark
    _host, offset = decode_offset_msg_id(r.ext_fields["msgId"])
    end = {"producerGroup": "PG_TX", "tranStateTableOffset": r.ext_fields["queueOffset"], "commitLogOffset": offset,
           "commitOrRollback": 8, "msgId": r.ext_fields["transactionId"], "fromTransactionCheck": "false"}
    assert (await good_client.request(RequestCode.END_TRANSACTION, end)).code == ResponseCode.SUCCESS
    assert await bodies(good_client, "TXK") == [b"good"]
    assert await pending_halves(good_client) == 0
    bad_client.close()
    good_client.close()

    await broker.stop()
    broker, c = await start(broker_factory, store)
    assert await bodies(c, "TXK") == [b"good"]
    assert await pending_halves(c) == 0
    c.close()


# --- the other requests that carry a name into a key ---------------------------------------------------------
async def test_lock_end_transaction_and_query_message_refuse_bad_names(broker):
    c = await RawClient.connect(broker.addr)
    mq = {"topic": "T", "brokerName": "b", "queueId": 0}
    for group, client_id, topic, words in [("g\x00x", "c1", "T", ("consumerGroup", "illegal character")),
                                           ("G", "c\x00", "T", ("clientId", "control character")),
                                           ("G", "c1", "t" * 200, ("mqSet.topic", "127"))]:
        body = json.dumps({"consumerGroup": group, "clientId": client_id, "mqSet": [{**mq, "topic": topic}]})
        for code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
            r = await c.request(code, body=body.encode())
            assert refused(r, ResponseCode.SYSTEM_ERROR, *words), r.remark
    end = {"producerGroup": "p" * 600, "tranStateTableOffset": 0, "commitLogOffset": 0, "commitOrRollback": 8,
           "msgId": "x", "fromTransactionCheck": "false"}
    r = await c.request(RequestCode.END_TRANSACTION, end)
    assert refused(r, ResponseCode.SYSTEM_ERROR, "producerGroup", "120"), r.remark
    r = await c.request(RequestCode.QUERY_MESSAGE, {"topic": "T", "key": LONG_KEY, "maxNum": 1,
                                                    "beginTimestamp": 0, "endTimestamp": 1})
    assert refused(r, ResponseCode.SYSTEM_ERROR, "key", str(names.MAX_MESSAGE_KEY_BYTES)), r.remark
    r = await c.request(RequestCode.UNREGISTER_CLIENT, {"clientID": "c1", "consumerGroup": "g\x00x"})
    assert refused(r, ResponseCode.SYSTEM_ERROR, "consumerGroup"), r.remark
    c.close()


# --- a store written before these rules ----------------------------------------------------------------------
@pytest.mark.parametrize("bad_key", [b"g\x00\x00x\x00T\x000", b"\xff\xfe\x00T\x000", b"g\x00T\x00zero", b"g\x00T"],
                         ids=["nul-in-group", "not-utf8", "queue-id-not-a-number", "two-parts"])
async def test_a_store_holding_a_bad_offset_key_still_starts_with_every_other_offset(broker_factory, tmp_path,
                                                                                     bad_key):
    store = tmp_path / "store"
    broker, c = await start(broker_factory, store)
    q = {"topic": "T", "queueId": 0, "commitOffset": 9}
    for group in ("G1", "G2"):
        r = await c.request(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "consumerGroup": group})
        assert r.code == ResponseCode.SUCCESS
    c.close()
    await broker.stop()
    env = lmdb.open(str(store / "lmdb"), map_size=1 << 30, max_dbs=32)
    try:
        with env.begin(write=True) as txn:
            txn.put(bad_key, struct.pack(">Q", 1), db=env.open_db(b"offsets", txn=txn))
    finally:
        env.close()

    broker, c = await start(broker_factory, store)
    assert [await consumer_offset(c, g) for g in ("G1", "G2")] == ["9", "9"]
    c.close()


# --- names.py on its own -------------------------------------------------------------------------------------
CHECKS = [names.check_topic, names.check_group, names.check_client_id, names.check_message_key,
          lambda v: names.validate_topic_name(v)]


def outcome(check, value):
    """None when ``check`` accepts ``value``, else the BrokerError; any other exception fails the test."""
    try:
        check(value)
    except BrokerError as exc:
        assert exc.code in (ResponseCode.SYSTEM_ERROR, ResponseCode.MESSAGE_ILLEGAL)
        assert exc.remark and exc.remark.isprintable()  # a remark never carries the control characters it names
        return exc
    return None


@given(st.text())
def test_any_text_is_accepted_or_refused_with_a_broker_error(value):
    for check in CHECKS:
        outcome(check, value)


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.binary(),
                 st.lists(st.text(max_size=3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers())))
def test_a_value_that_is_not_a_string_is_refused(value):
    for check in CHECKS:
        assert outcome(check, value) is not None


@given(st.dictionaries(st.sampled_from([P.KEYS, P.UNIQ_KEY, P.TRAN_MSG, P.PGROUP, P.TAGS, "other"]),
                       st.one_of(st.text(), st.sampled_from(["true", "G", LONG_KEY]))),
       st.one_of(st.none(), st.text()))
def test_any_message_properties_are_accepted_or_refused_as_message_illegal(props, producer_group):
    error = outcome(lambda p: names.check_message("T", p, producer_group), props)
    assert error is None or error.code == ResponseCode.MESSAGE_ILLEGAL


@given(st.from_regex(r"[%|a-zA-Z0-9_-]{1,120}", fullmatch=True), st.integers(-2 ** 31, 2 ** 31 - 1))
def test_a_valid_group_gives_valid_retry_and_dlq_topics_and_offset_keys_lmdb_takes(group, queue_id):
    assert names.check_group(group) == group
    for topic in (names.RETRY_PREFIX + group, names.DLQ_PREFIX + group, "t" * names.MAX_TOPIC_LENGTH):
        assert names.check_topic(topic) == topic
        key = offset_key(group, topic, queue_id)
        assert len(key) <= names.LMDB_MAX_KEY_BYTES and key.count(b"\x00") == 2


@given(st.text())
def test_an_accepted_message_key_is_one_key_index_entry_lmdb_takes(key):
    if outcome(names.check_message_key, key) is None:
        assert key.split() == [key]
        longest = ("t" * names.MAX_TOPIC_LENGTH + "\x00" + key + "\x00").encode() + bytes(8)
        assert len(longest) <= names.LMDB_MAX_KEY_BYTES


@pytest.mark.parametrize("check, ok, too_long, limit", [
    (names.check_topic, "t" * 127, "t" * 128, "127"),
    (names.check_group, "g" * 120, "g" * 121, "120"),
    (names.check_client_id, "é" * 127 + "c", "é" * 128, "255"),
    (names.check_message_key, "é" * 187, "é" * 187 + "k", "374"),
], ids=["topic", "group", "client-id", "message-key"])
def test_limits_are_exact_and_counted_in_bytes(check, ok, too_long, limit):
    assert check(ok) == ok
    with pytest.raises(BrokerError) as info:
        check(too_long, "the field")
    assert "the field" in info.value.remark and limit in info.value.remark


@pytest.mark.parametrize("char", ["\x00", "\x01", "\x02", "\x1f", "\x7f", "\x85", "\ud800"])
@pytest.mark.parametrize("check", [names.check_topic, names.check_group, names.check_client_id,
                                   names.check_message_key], ids=["topic", "group", "client-id", "message-key"])
def test_control_characters_separators_and_surrogates_are_refused(check, char):
    with pytest.raises(BrokerError) as info:
        check(f"a{char}b", "the field")
    assert "the field" in info.value.remark and "index 1" in info.value.remark


def test_check_message_names_the_property_and_checks_the_half_group():
    names.check_message("T", {P.KEYS: "a b  c", P.UNIQ_KEY: "7F0000010000" + "0" * 20})
    with pytest.raises(BrokerError) as info:
        names.check_message("T", {P.KEYS: f"a {LONG_KEY}"})
    assert info.value.code == ResponseCode.MESSAGE_ILLEGAL and "KEYS" in info.value.remark
    with pytest.raises(BrokerError) as info:
        names.check_message("T", {P.UNIQ_KEY: "a b"})
    assert "UNIQ_KEY" in info.value.remark
    names.check_message("T", {P.TRAN_MSG: "true"}, "PG")
    names.check_message("T", {P.TRAN_MSG: "true", P.PGROUP: "PG"}, None)
    with pytest.raises(BrokerError) as info:
        names.check_message("T", {P.TRAN_MSG: "true", P.PGROUP: "p\x00g"}, "PG")
    assert info.value.code == ResponseCode.MESSAGE_ILLEGAL and "PGROUP" in info.value.remark
    names.check_message("T", {P.PGROUP: "p\x00g"})  # not a transaction: PGROUP files nothing


def test_the_cache_of_checked_names_keeps_none_longer_than_a_name():
    """Names are checked through a cache (names.is_name, protocol/rules.py): a client sending huge names, each new, must not fill it
    with their bytes."""
    names.is_name.cache_clear()
    for size in (128, 1 << 20):
        with pytest.raises(BrokerError):
            names.check_topic("t" * size)
        with pytest.raises(BrokerError):
            names.check_group("g" * size)
    names.check_topic("Fine")
    with pytest.raises(BrokerError):
        names.check_topic("No!")
    assert names.is_name.cache_info().currsize == 2
