"""A stateful request fuzzer against a live broker with ACL on (issue 11, item 7).

Several connections — an account with some rights (``app``), a wrong secret, and none (unsigned) — send random
sequences of valid and malformed requests of every code the broker serves (sends of the three kinds, pulls, reads
by id and key, send-back, heartbeats, transaction ends, locks, admin codes, unknown codes, random fields, garbage
frames). After each sequence the invariants are checked:

- the broker is alive: a well-behaved admin client sends and pulls within ``ALIVE_BOUND_S``;
- every two-way request got an answer within the bound, or its connection was closed (garbage);
- no account read what its rights forbid: no byte of a ``Secret`` record (their bodies say CLASSIFIED) (admin-only topic) ever reaches a fuzzing
  connection, in an answer or in a request the broker sends it (a check-back);
- no account wrote what its rights forbid: ``ReadOnly`` and ``Secret`` hold only what the admin wrote;
- every acknowledged send is readable, once, where its answer said;
- the broker never hit an unexpected error (a bug: logged by the dispatcher as such);
- the process's RSS stays within ``RSS_GROWTH_MIB`` of where it started.

Seeded: ``FUZZ_SEED`` (default: random) and ``FUZZ_SEQUENCES`` (default 2,000); a failure names the
seed and the sequence, and the sequences are replayed in order from a fresh broker with that seed. (Not HALFMQ_*:
a broker started from the command line reads those as its configuration and refuses unknown keys.)
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import struct
import time

from halfmq.client import Credentials
from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode, ResponseCode, SysFlag
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.frame import encode_frame
from halfmq.protocol.message import BatchItem, UniqKeyGenerator, decode_records, encode_batch
from halfmq.protocol.properties import encode_properties

from tests.support.raw import RawClient

SEQUENCES = int(os.environ.get("FUZZ_SEQUENCES", "2000"))
ALIVE_BOUND_S = 2.0
ANSWER_BOUND_S = 5.0
RSS_GROWTH_MIB = 300

ACL = """
accounts:
  - accessKey: admin
    secretKey: admin-secret
    admin: true
  - accessKey: app
    secretKey: app-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Open=PUB|SUB
      - ReadOnly=SUB
    groupPerms:
      - PG_APP=PUB|SUB
"""
ADMIN = Credentials("admin", "admin-secret")
APP = Credentials("app", "app-secret")
WRONG = Credentials("app", "not-the-secret")

TOPICS = ["Open", "ReadOnly", "Secret", "Good", "Unlisted", "%RETRY%CG_APP", "%DLQ%CG_APP", "%RETRY%CG_ADMIN",
          "RMQ_SYS_TRANS_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SCHEDULE_TOPIC_XXXX", "TBW102", "", "a b",
          "x" * 300, "Open\x00", "../../etc"]
GROUPS = ["CG_APP", "PG_APP", "PG_ADMIN", "CG_ADMIN", "", "g" * 300, "%RETRY%CG_APP", "bad group"]
NUMBERS = ["0", "1", "-1", "7", "2147483647", "-2147483649", "9" * 30, "x", "", "1.5", "true"]
EXT_KEYS = ["topic", "queueId", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m", "consumerGroup",
            "queueOffset", "maxMsgNums", "sysFlag", "commitOffset", "suspendTimeoutMillis", "subVersion",
            "producerGroup", "tranStateTableOffset", "commitLogOffset", "commitOrRollback", "msgId", "offset",
            "group", "delayLevel", "clientID", "key", "maxNum", "beginTimestamp", "endTimestamp", "timestamp",
            "subscription", "expressionType", "originMsgId", "maxReconsumeTimes", "fromTransactionCheck"]
_uniq = UniqKeyGenerator()


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Violation(AssertionError):
    pass


class FuzzConnection:
    """One fuzzing identity: a connection (reopened when the broker closes it) and how it signs."""

    def __init__(self, name: str, addr: str, creds: Credentials | None):
        self.name, self.addr, self.creds = name, addr, creds
        self.client: RawClient | None = None

    async def ensure(self) -> RawClient:
        if self.client is None or self.client.closed.is_set():
            self.client = await RawClient.connect(self.addr)
        return self.client

    def sign(self, ext: dict, body: bytes) -> dict:
        ext = {k: str(v) for k, v in ext.items()}
        return self.creds.sign(ext, body) if self.creds is not None else ext


class Fuzzer:
    def __init__(self, broker, seed: int):
        self.broker = broker
        self.seed = seed
        self.secret_offsets: list[int] = []
        self.known_offsets: list[int] = []
        self.half_offsets: list[tuple[int, str]] = []
        self.acked: list[tuple[str, int, int, bytes]] = []  # topic, queue, offset, body
        self.checked_upto: dict[tuple[str, int], int] = {}
        self.counter = 0
        self.requests = 0
        self.codes_sent: set[int] = set()
        self.successes = 0
        self.acks_checked = 0

    async def setup(self) -> None:
        self.admin = await RawClient.connect(self.broker.addr)
        for topic in ("Open", "ReadOnly", "Secret", "Good"):
            ext = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6,
                   "topicFilterType": "SINGLE_TAG", "order": "false"}
            r = await self.admin.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ADMIN.sign(
                {k: str(v) for k, v in ext.items()}, b""))
            assert r.code == ResponseCode.SUCCESS, r.remark
        for i in range(4):
            r = await self.admin_send("Secret", b"CLASSIFIED-%d" % i, keys="K-SECRET")
            self.secret_offsets.append(int(r.ext_fields["msgId"][-16:], 16))
            r = await self.admin_send("ReadOnly", b"ADMIN-RO-%d" % i, keys="K-RO")
            self.known_offsets.append(int(r.ext_fields["msgId"][-16:], 16))
            r = await self.admin_send("Secret", b"CLASSIFIED-HALF-%d" % i, group="PG_ADMIN",
                                      props={P.TRAN_MSG: "true", P.PGROUP: "PG_ADMIN"},
                                      sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)
            self.half_offsets.append((int(r.ext_fields["msgId"][-16:], 16), r.ext_fields["queueOffset"]))
        self.conns = [FuzzConnection("app", self.broker.addr, APP), FuzzConnection("anon", self.broker.addr, None),
                      FuzzConnection("wrong", self.broker.addr, WRONG)]
        self.rss_start = rss_mib()

    async def admin_send(self, topic: str, body: bytes, group: str = "PG_ADMIN", keys: str | None = None,
                         props: dict | None = None, sys_flag: int = 0) -> RemotingCommand:
        properties = {P.UNIQ_KEY: _uniq.next(), P.WAIT: "true", **({P.KEYS: keys} if keys else {}), **(props or {})}
        ext = {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": str(sys_flag), "g": "1", "h": "0",
               "i": encode_properties(properties), "j": "0", "k": "false"}
        r = await self.admin.request(RequestCode.SEND_MESSAGE_V2, ADMIN.sign(ext, body), body)
        assert r.code == ResponseCode.SUCCESS, r.remark
        return r

    # --- request generators: each returns (code, ext, body, oneway, kind) ---
    def body(self, rng) -> bytes:
        self.counter += 1
        return b"FUZZ-%d-%d" % (self.seed & 0xFFFF, self.counter) + rng.randbytes(rng.choice([0, 0, 8, 200]))

    def props(self, rng) -> str:
        props = {P.UNIQ_KEY: _uniq.next(), P.WAIT: "true"}
        for _ in range(rng.randrange(3)):
            key = rng.choice([P.TAGS, P.KEYS, P.DELAY, P.TRAN_MSG, P.PGROUP, "custom", P.REAL_TOPIC, P.UNIQ_KEY])
            props[key] = rng.choice(["a", "K-SECRET", "true", "3", "-1", "x y", "Secret", "99"])
        text = encode_properties(props)
        return text if rng.random() > 0.05 else rng.choice(["\x01\x02", "a\x01", text[:5], "=\x02" * 3])

    def gen_send(self, rng):
        topic, body = rng.choice(TOPICS), self.body(rng)
        kind = rng.choice(["v2", "v1", "batch"])
        if kind == "batch":
            items = [BatchItem(self.body(rng), encode_properties({P.UNIQ_KEY: _uniq.next()}))
                     for _ in range(rng.randrange(1, 5))]
            body = encode_batch(items) if rng.random() > 0.1 else rng.randbytes(30)
            code = RequestCode.SEND_BATCH_MESSAGE
        else:
            code = RequestCode.SEND_MESSAGE_V2 if kind == "v2" else RequestCode.SEND_MESSAGE
        fields = {"producerGroup": rng.choice(GROUPS[:4]), "topic": topic, "defaultTopic": "TBW102",
                  "defaultTopicQueueNums": "4", "queueId": rng.choice(["0", "1", "-1", "5"]),
                  "sysFlag": rng.choice(["0", "0", "4", "8"]), "bornTimestamp": "1", "flag": "0",
                  "properties": self.props(rng), "reconsumeTimes": rng.choice(["0", "20"]), "unitMode": "false",
                  "batch": "true" if code == RequestCode.SEND_BATCH_MESSAGE else "false"}
        if code != RequestCode.SEND_MESSAGE:
            short = dict(zip("abcdefghijkm", ["producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums",
                                              "queueId", "sysFlag", "bornTimestamp", "flag", "properties",
                                              "reconsumeTimes", "unitMode", "batch"]))
            fields = {k: fields[v] for k, v in short.items()}
        if rng.random() < 0.1:
            fields.pop(rng.choice(list(fields)))
        return code, fields, body, False, ("send", topic, kind)

    def gen_pull(self, rng):
        ext = {"consumerGroup": rng.choice(GROUPS), "topic": rng.choice(TOPICS), "queueId": rng.choice(["0", "1", "9"]),
               "queueOffset": rng.choice(NUMBERS[:5]), "maxMsgNums": rng.choice(["1", "32", "0", "-1"]),
               "sysFlag": rng.choice(["4", "6", "0", "2", "15"]), "commitOffset": rng.choice(NUMBERS[:4]),
               "suspendTimeoutMillis": rng.choice(["0", "20", "50"]), "subVersion": "0",
               "subscription": rng.choice(["*", "a || b", "", "||"]), "expressionType": rng.choice(["TAG", "SQL92"])}
        return RequestCode.PULL_MESSAGE, ext, b"", False, ("pull",)

    def gen_read(self, rng):
        which = rng.randrange(3)
        offset = str(rng.choice(self.secret_offsets + self.known_offsets + [h for h, _q in self.half_offsets] + [-1,
                                                                                                             10**12]))
        if which == 0:
            return RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset}, b"", False, ("view",)
        if which == 1:
            ext = {"topic": rng.choice(TOPICS), "key": rng.choice(["K-SECRET", "K-RO", ""]), "maxNum": "32",
                   "beginTimestamp": "0", "endTimestamp": str(2**62)}
            return RequestCode.QUERY_MESSAGE, ext, b"", False, ("query",)
        ext = {"offset": offset, "group": rng.choice(GROUPS), "delayLevel": rng.choice(["0", "-1", "1"]),
               "originMsgId": "", "maxReconsumeTimes": rng.choice(["0", "16"])}
        return RequestCode.CONSUMER_SEND_MSG_BACK, ext, b"", False, ("sendback",)

    def gen_client(self, rng):
        which = rng.randrange(4)
        client_id = rng.choice(["fuzz-client", "admin-client", ""])
        if which == 0:
            body = {"clientID": client_id,
                    "producerDataSet": [{"groupName": rng.choice(GROUPS)} for _ in range(rng.randrange(3))],
                    "consumerDataSet": [{"groupName": rng.choice(GROUPS), "consumeType": "CONSUME_PASSIVELY",
                                         "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                                         "subscriptionDataSet": [{"topic": rng.choice(TOPICS), "subString": "*"}]}
                                        for _ in range(rng.randrange(3))]}
            raw = json.dumps(body).encode() if rng.random() > 0.1 else rng.randbytes(20)
            return RequestCode.HEART_BEAT, {}, raw, False, ("heartbeat",)
        if which == 1:
            half, queue_offset = rng.choice(self.half_offsets)
            ext = {"producerGroup": rng.choice(["PG_ADMIN", "PG_APP"]), "tranStateTableOffset": queue_offset,
                   "commitLogOffset": str(half), "commitOrRollback": rng.choice(["0", "8", "12", "3"]),
                   "msgId": "x", "fromTransactionCheck": rng.choice(["true", "false"])}
            return RequestCode.END_TRANSACTION, ext, b"", rng.random() < 0.5, ("endtx",)
        if which == 2:
            body = json.dumps({"consumerGroup": rng.choice(GROUPS), "clientId": client_id,
                               "mqSet": [{"topic": rng.choice(TOPICS), "brokerName": "broker-a", "queueId": 0}]})
            code = rng.choice([RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ])
            return code, {}, body.encode(), False, ("lock",)
        ext = {"clientID": client_id, "producerGroup": rng.choice(GROUPS), "consumerGroup": rng.choice(GROUPS)}
        return RequestCode.UNREGISTER_CLIENT, ext, b"", False, ("unregister",)

    def gen_generic(self, rng):
        codes = sorted(self.broker.dispatcher.handlers) + [0, 25, 50, 318, 9999, -5]
        code = rng.choice([c for c in codes if c != RequestCode.PULL_MESSAGE])  # held pulls: gen_pull bounds them
        ext = {rng.choice(EXT_KEYS): rng.choice(NUMBERS + TOPICS[:4] + GROUPS[:3]) for _ in range(rng.randrange(8))}
        body = rng.choice([b"", rng.randbytes(rng.randrange(64)), b"{}", b'{"clientID": 1}'])
        return code, ext, body, rng.random() < 0.1, ("generic", code)

    def gen_valid(self, rng):
        """A request the app account may make, well formed (so the valid paths run, and their answers are checked
        for leaks and their sends read back)."""
        which = rng.randrange(6)
        if which <= 1:
            code = rng.choice([RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH_MESSAGE])
            topic, body = "Open", self.body(rng)
            if code == RequestCode.SEND_BATCH_MESSAGE:
                body = encode_batch([BatchItem(self.body(rng), encode_properties({P.UNIQ_KEY: _uniq.next()}))
                                     for _ in range(rng.randrange(1, 4))])
            props = encode_properties({P.UNIQ_KEY: _uniq.next(), P.WAIT: "true", P.KEYS: "K-OPEN"})
            fields = {"producerGroup": "PG_APP", "topic": topic, "defaultTopic": "TBW102",
                      "defaultTopicQueueNums": "4", "queueId": rng.choice(["0", "1"]), "sysFlag": "0",
                      "bornTimestamp": "1", "flag": "0", "properties": props, "reconsumeTimes": "0",
                      "unitMode": "false", "batch": "true" if code == RequestCode.SEND_BATCH_MESSAGE else "false"}
            if code != RequestCode.SEND_MESSAGE:
                fields = dict(zip("abcdefghijkm", fields.values()))
            return code, fields, body, False, ("send", topic, "valid")
        if which == 2:
            ext = {"consumerGroup": "CG_APP", "topic": rng.choice(["Open", "ReadOnly"]), "queueId": rng.choice("01"),
                   "queueOffset": str(rng.randrange(4)), "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0",
                   "suspendTimeoutMillis": "0", "subVersion": "0", "subscription": "*", "expressionType": "TAG"}
            return RequestCode.PULL_MESSAGE, ext, b"", False, ("pull",)
        if which == 3:
            return (RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(rng.choice(self.known_offsets))}, b"", False,
                    ("view",))
        if which == 4:
            ext = {"topic": "ReadOnly", "key": "K-RO", "maxNum": "32", "beginTimestamp": "0",
                   "endTimestamp": str(2**62)}
            return RequestCode.QUERY_MESSAGE, ext, b"", False, ("query",)
        body = {"clientID": "fuzz-client", "producerDataSet": [{"groupName": "PG_APP"}],
                "consumerDataSet": [{"groupName": "CG_APP", "consumeType": "CONSUME_PASSIVELY",
                                     "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                                     "subscriptionDataSet": [{"topic": "Open", "subString": "*"}]}]}
        return RequestCode.HEART_BEAT, {}, json.dumps(body).encode(), False, ("heartbeat",)

    GENERATORS = ("gen_send", "gen_send", "gen_pull", "gen_read", "gen_read", "gen_client", "gen_generic",
                  "gen_generic")

    # --- one sequence ---
    async def run_sequence(self, index: int) -> None:
        rng = random.Random(f"{self.seed}-{index}")
        jobs = []
        for _ in range(rng.randrange(2, 9)):
            conn = rng.choice(self.conns)
            if rng.random() < 0.04:
                jobs.append(self.garbage(rng))
                continue
            if rng.random() < 0.35:
                conn = self.conns[0]  # the app account, with a request it may make
                code, ext, body, oneway, kind = self.gen_valid(rng)
            else:
                code, ext, body, oneway, kind = getattr(self, rng.choice(self.GENERATORS))(rng)
            jobs.append(self.request(conn, code, ext, body, oneway, kind))
        await asyncio.gather(*jobs)
        await self.check_invariants(index)

    async def request(self, conn: FuzzConnection, code, ext, body, oneway, kind) -> None:
        client = await conn.ensure()
        ext = conn.sign(ext, body)
        self.requests += 1
        self.codes_sent.add(code)
        if oneway:
            client.oneway(code, ext, body)
            return
        try:
            r = await client.request(code, ext, body, timeout=ANSWER_BOUND_S)
        except ConnectionError:
            return  # the broker closed the connection (it may for a frame it cannot decode)
        except asyncio.TimeoutError:
            raise Violation(f"{conn.name}: request {code} {kind} unanswered after {ANSWER_BOUND_S}s") from None
        self.forbid_secret(conn, r)
        self.successes += r.code == ResponseCode.SUCCESS
        if conn.creds is not APP and r.code == ResponseCode.SUCCESS and code not in (
                RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT, RequestCode.CHECK_CLIENT_CONFIG,
                RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.GET_BROKER_CLUSTER_INFO):
            if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
                raise Violation(f"{conn.name} (no valid account) stored a message: {kind} {r}")
        if r.code == ResponseCode.SUCCESS and kind[0] == "send":
            self.record_ack(conn, ext, body, code, r, kind)
        while not client.incoming.empty():  # requests the broker sent this connection (check-backs)
            self.forbid_secret(conn, client.incoming.get_nowait())

    @staticmethod
    def forbid_secret(conn: FuzzConnection, cmd: RemotingCommand) -> None:
        text = cmd.body + json.dumps(cmd.ext_fields).encode() + (cmd.remark or "").encode()
        if b"CLASSIFIED" in text:  # in the bodies of Secret records only; no request carries it
            raise Violation(f"{conn.name} received a Secret record: {cmd!r} {cmd.body[:200]!r}")

    def record_ack(self, conn, ext, body, code, r, kind) -> None:
        topic = kind[1]
        props = ext.get("i") if code != RequestCode.SEND_MESSAGE else ext.get("properties")
        sys_flag = ext.get("f") if code != RequestCode.SEND_MESSAGE else ext.get("sysFlag")
        if topic.startswith("%") or sys_flag not in ("0", "8") or not props or "TRAN_MSG" in props or \
                "DELAY" in props:
            return  # a retry may move to a DLQ, a half or delayed message is not readable yet
        queue, offset = int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"])
        if code == RequestCode.SEND_BATCH_MESSAGE:
            from halfmq.protocol.message import decode_batch
            for i, item in enumerate(decode_batch(body)):
                self.acked.append((topic, queue, offset + i, item.body))
        else:
            self.acked.append((topic, queue, offset, body))

    async def garbage(self, rng) -> None:
        """A frame the codec must refuse (bad lengths, bad header): answered or closed, never a hang."""
        client = await RawClient.connect(self.broker.addr)
        frame = rng.choice([rng.randbytes(rng.randrange(1, 40)), struct.pack(">I", 2**31) + b"xx",
                            encode_frame(0, b"{not json", b""), encode_frame(1, rng.randbytes(10), b""),
                            encode_frame(0, json.dumps({"code": "x", "opaque": []}).encode(), b"")])
        client.transport.write(frame)
        client.transport.write_eof()
        await asyncio.wait_for(client.closed.wait(), ANSWER_BOUND_S)

    # --- invariants ---
    async def admin_pull(self, topic: str, queue: int, offset: int, n: int = 32) -> list:
        ext = {"consumerGroup": "CG_ADMIN", "topic": topic, "queueId": str(queue), "queueOffset": str(offset),
               "maxMsgNums": str(n), "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
               "subVersion": "0", "subscription": "*", "expressionType": "TAG"}
        r = await self.admin.request(RequestCode.PULL_MESSAGE, ADMIN.sign(ext, b""), timeout=ALIVE_BOUND_S)
        return decode_records(r.body) if r.code == ResponseCode.SUCCESS else []

    async def check_invariants(self, index: int) -> None:
        started = time.perf_counter()
        probe = await self.admin_send("Good", b"GOOD-%d" % index)
        got = await self.admin_pull("Good", int(probe.ext_fields["queueId"]), int(probe.ext_fields["queueOffset"]), 1)
        if [m.body for m in got] != [b"GOOD-%d" % index] or time.perf_counter() - started > ALIVE_BOUND_S:
            raise Violation(f"the good client was not served within {ALIVE_BOUND_S}s")
        for topic in ("ReadOnly", "Secret"):  # only the admin wrote there
            for queue in (0, 1):
                start = self.checked_upto.get((topic, queue), 0)
                while True:
                    records = await self.admin_pull(topic, queue, start)
                    for m in records:
                        if m.body.startswith(b"FUZZ"):
                            raise Violation(f"a fuzzing account wrote into {topic}: {m.body[:40]!r}")
                    if not records:
                        break
                    start = records[-1].queue_offset + 1
                self.checked_upto[(topic, queue)] = start
        acked, self.acked = self.acked, []
        self.acks_checked += len(acked)
        for topic, queue, offset, body in acked:
            records = await self.admin_pull(topic, queue, offset, 1)
            if [m.body for m in records] != [body]:
                raise Violation(f"an acknowledged send to {topic}/{queue}@{offset} is not readable there: "
                                f"{[m.body[:30] for m in records]}")
            before = await self.admin_pull(topic, queue, max(0, offset - 16), 16)
            if any(m.body == body for m in before if m.queue_offset != offset):
                raise Violation(f"an acknowledged send to {topic}/{queue}@{offset} is stored twice")
        if rss_mib() - self.rss_start > RSS_GROWTH_MIB:
            raise Violation(f"RSS grew from {self.rss_start:.0f} to {rss_mib():.0f} MiB")


class UnexpectedErrors(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record):
        if "unexpected error" in record.getMessage() or record.exc_info:
            self.records.append(self.format(record))


async def test_random_request_sequences_keep_every_invariant(broker_factory, tmp_path):
    seed = int(os.environ.get("FUZZ_SEED") or random.randrange(2**32))
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    broker = await broker_factory(aclEnable=True, aclConfigFile=str(acl), transactionTimeOut=50,
                                  transactionCheckInterval=100, serverMaxFrameSize=1 << 20)
    errors = UnexpectedErrors()
    logging.getLogger("halfmq").addHandler(errors)
    fuzzer = Fuzzer(broker, seed)
    index = -1
    try:
        await fuzzer.setup()
        started = time.perf_counter()
        for index in range(SEQUENCES):
            await fuzzer.run_sequence(index)
            if errors.records:
                raise Violation(f"the broker hit an unexpected error: {errors.records[0]}")
        took = time.perf_counter() - started
    except Exception as exc:
        raise AssertionError(f"fuzzer failed at sequence {index}; reproduce with FUZZ_SEED={seed}: "
                             f"{exc}") from exc
    finally:
        logging.getLogger("halfmq").removeHandler(errors)
    print(f"fuzzer: seed {seed}, {SEQUENCES} sequences, {fuzzer.requests} requests of {len(fuzzer.codes_sent)} "
          f"codes ({fuzzer.successes} answered SUCCESS, {fuzzer.acks_checked} acknowledged sends read back) in "
          f"{took:.1f}s")
    assert fuzzer.successes > SEQUENCES // 4 and fuzzer.acks_checked > SEQUENCES // 20  # the valid paths ran
    served = set(broker.dispatcher.handlers)
    assert served <= fuzzer.codes_sent, f"codes never sent: {sorted(served - fuzzer.codes_sent)}"
