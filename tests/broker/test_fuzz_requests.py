"""A stateful request fuzzer against a live broker with ACL on, through both doors: remoting (issue 11, item 7)
and the RocketMQ 5 gRPC endpoint.

Several identities — an account with some rights (``app``), one with every right but on the admin's topics
(``wide``: system, retry and internal topics and groups are its to try), a wrong secret, and none (unsigned) — send
random sequences of valid and malformed requests over remoting (sends of the three kinds, pulls, reads by id and
key, send-back, heartbeats, transaction ends, locks, admin codes, unknown codes, random fields, garbage frames) and
over gRPC (SendMessage of the four types with gzip bodies, bad timestamps, reserved property names, oversized
bodies; ReceiveMessage with long polls, batch sizes, bad durations, bad queue ids, and long polls left waiting;
AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue with real and forged receipt handles;
EndTransaction with own, other accounts' and forged transaction ids; QueryRoute, QueryAssignment, Heartbeat;
Telemetry streams with producer and consumer settings, left open; NotifyClientTermination), using their own client
ids and other clients' (the good gRPC client's among them). The admin account's good clients — one remoting, one
gRPC (a producer with a live telemetry stream, publishing Secret, whose transaction halves there are checked over
that stream only) — are the neighbours. After each sequence the invariants are checked (``check_invariants``):

1. the broker is alive: the good remoting client sends and pulls, and the good gRPC client sends, receives and
   acknowledges, each within ``ALIVE_BOUND_S``;
2. every request got an answer within its bound (a long poll's own timeout plus ``ANSWER_BOUND_S``), or its
   remoting connection was closed (garbage); a gRPC call is answered with a Status, never a gRPC error;
3. no identity read what its rights forbid: no byte of a ``Secret`` record (their bodies say CLASSIFIED) ever
   reaches a fuzzing identity — in a remoting answer or a request the broker sends it (a check-back), in a gRPC
   answer or a command pushed on its telemetry streams;
4. no identity wrote what its rights forbid: ``ReadOnly``, ``Secret``, ``Good`` and ``GoodGrpc`` hold only what the
   admin wrote, no admin transaction half (remoting or gRPC) is ever committed, and an identity without a valid
   account is refused everything it asks over gRPC;
5. no identity ends or takes over another's session: the good gRPC client's telemetry stream stays open and
   carries only what was asked of it;
6. every acknowledged send (either door) is readable, once, where its answer said;
7. the broker never hit an unexpected error (a bug: logged by the dispatcher as such, or by grpc, or answered
   INTERNAL_SERVER_ERROR over gRPC);
8. the process's RSS stays within ``RSS_GROWTH_MIB`` of where it started.

Seeded: ``FUZZ_SEED`` (default: random) and ``FUZZ_SEQUENCES`` (default 2,000); ``FUZZ_DOORS`` (default
``remoting,grpc``) picks the doors fuzzed (the good clients of both are checked whatever it says). A failure names
the seed, the sequence and that sequence's calls; the sequences are replayed in order from a fresh broker with that
seed, or from ``FUZZ_FIRST`` on (each sequence draws from its own generator, so a failure that does not depend on
what earlier sequences left behind replays alone). (Not HALFMQ_*: a broker started from the command line reads
those as its configuration and refuses unknown keys.)

    FUZZ_SEED=1 .venv/bin/python -m pytest tests/broker/test_fuzz_requests.py -s
    FUZZ_SEED=1 FUZZ_FIRST=3 FUZZ_SEQUENCES=4 .venv/bin/python -m pytest tests/broker/test_fuzz_requests.py -s
"""
from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import random
import re
import struct
import time

import grpc
from google.protobuf import text_format
import pytest

from halfmq.broker.grpc.schema import ClientType, Code, Encoding, FilterType, MessageType, TransactionResolution, pb
from halfmq.client import Credentials
from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode, ResponseCode, SysFlag
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.frame import encode_frame
from halfmq.protocol.message import BatchItem, UniqKeyGenerator, decode_records, encode_batch
from halfmq.protocol.properties import encode_properties

from tests.support.grpc_raw import GrpcRaw, signed_metadata
from tests.support.raw import RawClient

SEQUENCES = int(os.environ.get("FUZZ_SEQUENCES", "2000"))
FIRST = int(os.environ.get("FUZZ_FIRST", "0"))
DOORS = set(os.environ.get("FUZZ_DOORS", "remoting,grpc").split(","))
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
  - accessKey: wide
    secretKey: wide-secret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
    topicPerms:
      - Secret=DENY
      - ReadOnly=SUB
      - Good=DENY
      - GoodGrpc=DENY
"""
ADMIN = Credentials("admin", "admin-secret")
APP = Credentials("app", "app-secret")
WIDE = Credentials("wide", "wide-secret")  # every topic and group but Secret (and the good clients' topics)
WRONG = Credentials("app", "not-the-secret")
NO_ACCOUNT = (None, WRONG)

TOPICS = ["Open", "ReadOnly", "Secret", "Good", "Unlisted", "%RETRY%CG_APP", "%DLQ%CG_APP", "%RETRY%CG_ADMIN",
          "RMQ_SYS_TRANS_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SCHEDULE_TOPIC_XXXX", "TBW102", "", "a b",
          "x" * 300, "Open\x00", "../../etc"]
GROUPS = ["CG_APP", "PG_APP", "PG_ADMIN", "CG_ADMIN", "", "g" * 300, "%RETRY%CG_APP", "bad group", "%GRPC%Secret",
          "%GRPC%Open"]
NUMBERS = ["0", "1", "-1", "7", "2147483647", "-2147483649", "9" * 30, "x", "", "1.5", "true"]
EXT_KEYS = ["topic", "queueId", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m", "consumerGroup",
            "queueOffset", "maxMsgNums", "sysFlag", "commitOffset", "suspendTimeoutMillis", "subVersion",
            "producerGroup", "tranStateTableOffset", "commitLogOffset", "commitOrRollback", "msgId", "offset",
            "group", "delayLevel", "clientID", "key", "maxNum", "beginTimestamp", "endTimestamp", "timestamp",
            "subscription", "expressionType", "originMsgId", "maxReconsumeTimes", "fromTransactionCheck"]
_uniq = UniqKeyGenerator()


def now_ms() -> str:
    """A send's bornTimestamp: the client's clock, signed, checked against authorizationSkewSeconds."""
    return str(int(time.time() * 1000))


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


#: the admin's writes (setup, probes) are not what is tested: CI once took more than 5 s for the first topic's durable write while
#: the suite's slow tests (image builds, JVMs) started beside it
SETUP_TIMEOUT_S = 30.0


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
        self.trace: list[str] = []  # the calls of the current sequence, for the failure message
        self.late: list[Violation] = []  # seen by background readers (held receives, telemetry streams)
        self.grpc: GrpcDoor | None = None

    async def setup(self) -> None:
        self.admin = await RawClient.connect(self.broker.addr)
        for topic in ("Open", "ReadOnly", "Secret", "Good", "GoodGrpc"):
            ext = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6,
                   "topicFilterType": "SINGLE_TAG", "order": "false"}
            r = await self.admin.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ADMIN.sign(
                {k: str(v) for k, v in ext.items()}, b""), timeout=SETUP_TIMEOUT_S)
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
                      FuzzConnection("wrong", self.broker.addr, WRONG), FuzzConnection("wide", self.broker.addr, WIDE)]
        self.grpc = GrpcDoor(self, f"127.0.0.1:{self.broker.grpc_port}")
        await self.grpc.setup()
        self.rss_start = rss_mib()

    async def close(self) -> None:
        if self.grpc is not None:
            await self.grpc.close()

    async def admin_send(self, topic: str, body: bytes, group: str = "PG_ADMIN", keys: str | None = None,
                         props: dict | None = None, sys_flag: int = 0) -> RemotingCommand:
        properties = {P.UNIQ_KEY: _uniq.next(), P.WAIT: "true", **({P.KEYS: keys} if keys else {}), **(props or {})}
        ext = {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": str(sys_flag), "g": now_ms(), "h": "0",
               "i": encode_properties(properties), "j": "0", "k": "false"}
        r = await self.admin.request(RequestCode.SEND_MESSAGE_V2, ADMIN.sign(ext, body), body, timeout=SETUP_TIMEOUT_S)
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
                  "sysFlag": rng.choice(["0", "0", "4", "8"]), "flag": "0",
                  # a signed time outside authorizationSkewSeconds (long past, ahead), none (0), not a number
                  "bornTimestamp": rng.choice([now_ms(), now_ms(), now_ms(), "1", str(2**62), "0", "x"]),
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
                      "bornTimestamp": now_ms(), "flag": "0", "properties": props, "reconsumeTimes": "0",
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
        self.trace = []
        jobs = []
        for _ in range(rng.randrange(2, 9)):
            if "grpc" in DOORS and ("remoting" not in DOORS or rng.random() < 0.5):
                jobs.append(self.grpc.job(rng))
                continue
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
        self.trace.append(f"remoting {conn.name}: {code} {kind} {oneway=} {ext} {body[:60]!r}")
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
        if conn.creds in NO_ACCOUNT and r.code == ResponseCode.SUCCESS and code not in (
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
        self.trace.append("remoting garbage frame")
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
        if self.late:
            raise self.late[0]
        started = time.perf_counter()
        probe = await self.admin_send("Good", b"GOOD-%d" % index)
        got = await self.admin_pull("Good", int(probe.ext_fields["queueId"]), int(probe.ext_fields["queueOffset"]), 1)
        if [m.body for m in got] != [b"GOOD-%d" % index] or time.perf_counter() - started > ALIVE_BOUND_S:
            raise Violation(f"the good client was not served within {ALIVE_BOUND_S}s")
        started = time.perf_counter()
        await self.grpc.probe(index)
        if time.perf_counter() - started > ALIVE_BOUND_S:
            raise Violation(f"the good gRPC client was not served within {ALIVE_BOUND_S}s")
        if index % 20 == 19:  # the admin's halves are discarded after transactionCheckMax checks: a fresh one
            await self.grpc.admin_half()
        for topic in ("ReadOnly", "Secret", "Good", "GoodGrpc"):  # only the admin wrote there
            for queue in (0, 1):
                start = self.checked_upto.get((topic, queue), 0)
                while True:
                    records = await self.admin_pull(topic, queue, start)
                    for m in records:
                        if m.body.startswith(b"FUZZ"):
                            raise Violation(f"a fuzzing account wrote into {topic}: {m.body[:40]!r}")
                        if b"HALF" in m.body:
                            raise Violation(f"an admin transaction half was committed into {topic}: {m.body!r}")
                    if not records:
                        break
                    start = records[-1].queue_offset + 1
                self.checked_upto[(topic, queue)] = start
        acked, self.acked = self.acked, []
        self.acks_checked += len(acked)
        for topic, queue, offset, body in acked:
            # a gRPC send's answer names the offset, not the queue: the message is in one of the topic's queues
            config = self.broker.ctx.topics.get(topic)
            queues = [queue] if queue is not None else range(config.write_queue_nums if config else 16)
            found = []
            for q in queues:
                records = await self.admin_pull(topic, q, offset, 1)
                found += [(q, m.body) for m in records if m.body == body or queue is not None]
            if [b for _q, b in found] != [body]:
                raise Violation(f"an acknowledged send to {topic}/{queue}@{offset} is not readable there once: "
                                f"{[(q, b[:30]) for q, b in found]}")
            before = await self.admin_pull(topic, found[0][0], max(0, offset - 16), 16)
            if any(m.body == body for m in before if m.queue_offset != offset):
                raise Violation(f"an acknowledged send to {topic}/{found[0][0]}@{offset} is stored twice")
        if rss_mib() - self.rss_start > RSS_GROWTH_MIB:
            raise Violation(f"RSS grew from {self.rss_start:.0f} to {rss_mib():.0f} MiB")


# --- the gRPC door (RocketMQ 5, apache.rocketmq.v2) ---
GOOD_GRPC_ID = "good-grpc@1"  # the admin's good gRPC client: fuzzing identities borrow its client id too
GRPC_TOPICS = ["Open", "ReadOnly", "Secret", "GoodGrpc", "Good", "Unlisted", "%RETRY%CG_APP", "%DLQ%CG_APP",
               "RMQ_SYS_TRANS_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SCHEDULE_TOPIC_XXXX", "TBW102", "",
               "a b", "x" * 300, "%GRPC%Secret"]
GRPC_GROUPS = ["CG_APP", "CG_GOOD", "CG_ADMIN", "%GRPC%Secret", "%GRPC%Open", "%RETRY%CG_APP", "", "g" * 300,
               "bad group"]
RESERVED_NAMES = sorted(P.RESERVED_KEYS)
MAX_MESSAGE_SIZE = 64 << 10  # the fuzzing broker's maxMessageSize: an oversized body stays cheap to build
HELD_RECEIVES = 8  # long-poll receives left waiting across sequences (each cancelled when a newer one comes)
LIVE_STREAMS = 4  # telemetry streams left open across sequences, so their server-pushed commands are read
#: gRPC errors that are not the broker's: the fuzzer cancelled the call, or the transport refused its size
_NOT_THE_BROKERS = (grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED)


class GrpcIdentity:
    """A fuzzing identity over gRPC: its own connection, its client id, how it signs."""

    def __init__(self, name: str, endpoint: str, creds: Credentials | None):
        self.name, self.creds = name, creds
        self.client_id = f"fuzz-{name}@1"
        self.raw = GrpcRaw(endpoint)

    def metadata(self, client_id: str) -> tuple:
        if self.creds is None:
            return signed_metadata(client_id)
        return signed_metadata(client_id, self.creds.access_key, self.creds.secret_key)


class GrpcDoor:
    """The gRPC side of the fuzzer: the identities' calls, the good gRPC client, and the checks of every answer
    (the invariants are the Fuzzer's; a violation seen by a background reader waits in ``fuzzer.late``)."""

    def __init__(self, fuzzer: "Fuzzer", endpoint: str):
        self.fuzzer = fuzzer
        self.endpoint = endpoint
        self.handles: list[tuple[str, str, str]] = []  # group, topic, handle of messages an account received
        self.own_transactions: list[tuple[str, str]] = []  # topic, id of halves the app account sent
        self.admin_transactions: list[str] = []  # ids of the admin's gRPC halves (in Secret)
        self.held: list = []  # (receive call, its reader task)
        self.streams: list = []  # (telemetry call, its reader task)
        self.methods_called: set[str] = set()
        self.good_events: list[str] = []
        self.identities: list[GrpcIdentity] = []
        self.good: GrpcIdentity | None = None
        self.good_stream = self.good_reader = None  # set by setup (close() may follow a setup that failed)

    async def setup(self) -> None:
        self.identities = [GrpcIdentity("app", self.endpoint, APP), GrpcIdentity("anon", self.endpoint, None),
                           GrpcIdentity("wrong", self.endpoint, WRONG), GrpcIdentity("wide", self.endpoint, WIDE)]
        self.good = GrpcIdentity("good", self.endpoint, ADMIN)
        # the good client is a producer of GoodGrpc and Secret with a live telemetry stream: Secret's gRPC halves
        # are checked over this stream, and only this one
        self.good_stream = self.good.raw.stub("Telemetry")(metadata=self.good.metadata(GOOD_GRPC_ID))
        await self.good_stream.write(pb.TelemetryCommand(settings=pb.Settings(
            client_type=ClientType["PRODUCER"], publishing=pb.Publishing(
                topics=[pb.Resource(name="GoodGrpc"), pb.Resource(name="Secret")]))))
        first = await asyncio.wait_for(self.good_stream.read(), ALIVE_BOUND_S)
        assert first.status.code == Code["OK"], first
        self.good_reader = asyncio.ensure_future(self._read_good_stream())
        await self.admin_half()

    async def _read_good_stream(self) -> None:
        """The good client's stream stays open for the whole run; it ending is recorded (another identity took
        the session over or ended it)."""
        try:
            while (command := await self.good_stream.read()) is not grpc.aio.EOF:
                if command.HasField("settings") or command.HasField("status"):
                    self.good_events.append(f"unasked {command.WhichOneof('command')}")
        except grpc.aio.AioRpcError as exc:
            self.good_events.append(f"error {exc.code()} {exc.details()}")
            return
        self.good_events.append("the broker ended the stream")

    async def admin_half(self) -> None:
        """An admin half in Secret that nobody decides: its checks go to the good client's stream only."""
        msg = self.message("Secret", b"CLASSIFIED-GRPC-HALF-%d" % len(self.admin_transactions),
                           MessageType["TRANSACTION"])
        answer = await self.good.raw.stub("SendMessage")(pb.SendMessageRequest(messages=[msg]),
                                                          metadata=self.good.metadata(GOOD_GRPC_ID),
                                                          timeout=ALIVE_BOUND_S)
        assert answer.status.code == Code["OK"], answer
        self.admin_transactions.append(answer.entries[0].transaction_id)

    async def close(self) -> None:
        for call, task in self.held + self.streams:
            call.cancel()
            task.cancel()
        tasks = [task for _call, task in self.held + self.streams]
        if self.good_stream is not None:
            self.good_stream.cancel()
        if self.good_reader is not None:
            self.good_reader.cancel()
            tasks.append(self.good_reader)
        await asyncio.gather(*tasks, return_exceptions=True)
        for identity in self.identities + ([self.good] if self.good else []):
            await identity.raw.close()

    @staticmethod
    def message(topic: str, body: bytes, kind: int, group: str | None = None):
        msg = pb.Message(topic=pb.Resource(name=topic), body=body)
        sp = msg.system_properties
        sp.message_id = _uniq.next()
        sp.message_type = kind
        sp.body_encoding = Encoding["IDENTITY"]
        sp.born_timestamp.GetCurrentTime()
        sp.born_host = "127.0.0.1"
        if group is not None:
            sp.message_group = group
        return msg

    # --- the good client (an invariant: it is served within ALIVE_BOUND_S) ---
    async def probe(self, index: int) -> None:
        meta = self.good.metadata(GOOD_GRPC_ID)
        body = b"GOOD-GRPC-%d" % index
        sent = await self.good.raw.stub("SendMessage")(pb.SendMessageRequest(messages=[
            self.message("GoodGrpc", body, MessageType["NORMAL"])]), metadata=meta, timeout=ALIVE_BOUND_S)
        if sent.status.code != Code["OK"]:
            raise Violation(f"the good gRPC client's send failed: {sent.status}")
        request = pb.ReceiveMessageRequest(group=pb.Resource(name="CG_GOOD"), message_queue=pb.MessageQueue(
            topic=pb.Resource(name="GoodGrpc"), id=-1), batch_size=32, filter_expression=pb.FilterExpression(
            type=FilterType["TAG"], expression="*"))
        request.invisible_duration.FromSeconds(30)
        request.long_polling_timeout.FromMilliseconds(int(ALIVE_BOUND_S * 500))
        got = [a async for a in self.good.raw.stub("ReceiveMessage")(request, metadata=meta, timeout=ALIVE_BOUND_S)]
        messages = [a.message for a in got if a.HasField("message")]
        if [m.body for m in messages] != [body]:
            raise Violation(f"the good gRPC client received {[m.body[:30] for m in messages]}, not {body!r}")
        acked = await self.good.raw.stub("AckMessage")(pb.AckMessageRequest(
            group=pb.Resource(name="CG_GOOD"), topic=pb.Resource(name="GoodGrpc"),
            entries=[pb.AckMessageEntry(message_id=m.system_properties.message_id,
                                        receipt_handle=m.system_properties.receipt_handle) for m in messages]),
            metadata=meta, timeout=ALIVE_BOUND_S)
        if acked.status.code != Code["OK"]:
            raise Violation(f"the good gRPC client's ack failed: {acked.status}")
        if self.good_events:
            raise Violation(f"the good gRPC client's telemetry stream (client id {GOOD_GRPC_ID}) was disturbed: "
                            f"{self.good_events[0]}")

    # --- one call of a sequence ---
    def job(self, rng):
        identity = rng.choice(self.identities)
        valid = rng.random() < 0.35
        if valid:
            identity = self.identities[0]  # the app account, with a call it may make
        client_id = identity.client_id
        if rng.random() < 0.1:
            client_id = rng.choice([GOOD_GRPC_ID, "fuzz-client", "admin-client"] +
                                   [i.client_id for i in self.identities])
        name = rng.choice(["SendMessage", "SendMessage", "ReceiveMessage", "ReceiveMessage", "AckMessage",
                           "ChangeInvisibleDuration", "EndTransaction", "QueryRoute", "QueryAssignment", "Heartbeat",
                           "Telemetry", "NotifyClientTermination", "ForwardMessageToDeadLetterQueue"])
        if name == "NotifyClientTermination" and rng.random() < 0.5:
            client_id = rng.choice([GOOD_GRPC_ID] + [i.client_id for i in self.identities])
        return getattr(self, f"call_{name}")(rng, identity, client_id, valid)

    @staticmethod
    def describe(identity, client_id, name, request) -> str:
        text = re.sub(r"(.)\1{15,}", lambda m: f"{m.group(1)}*{len(m.group(0))}",
                      text_format.MessageToString(request, as_one_line=True))
        return f"grpc {identity.name} as {client_id!r}: {name} {text[:2000]}"

    async def unary(self, identity, client_id, name, request, bound=ANSWER_BOUND_S):
        self.fuzzer.trace.append(self.describe(identity, client_id, name, request))
        self.fuzzer.requests += 1
        self.methods_called.add(name)
        try:
            answer = await identity.raw.stub(name)(request, metadata=identity.metadata(client_id), timeout=bound)
        except grpc.aio.AioRpcError as exc:
            self.rpc_error(identity, name, exc)
            return None
        self.check_answer(identity, name, answer)
        return answer

    def rpc_error(self, identity, name, exc) -> None:
        if "SendMessageOperation" in (exc.debug_error_string() or ""):
            return  # the fuzzer wrote on a stream the broker had already ended (it refused the caller): grpc's own
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise Violation(f"grpc {identity.name}: {name} unanswered within its bound")
        if exc.code() not in _NOT_THE_BROKERS:
            raise Violation(f"grpc {identity.name}: {name} answered with a gRPC error, not a Status: "
                            f"{exc.code()} {exc.details()}")

    def check_answer(self, identity, name, answer) -> None:
        if b"CLASSIFIED" in answer.SerializeToString():
            raise Violation(f"grpc {identity.name} received a Secret record in a {name} answer: "
                            f"{str(answer)[:600]}")
        statuses = [answer.status] + [entry.status for entry in getattr(answer, "entries", ())]
        if any(s.code in (Code["INTERNAL_SERVER_ERROR"], Code["INTERNAL_ERROR"]) for s in statuses):
            raise Violation(f"the broker failed a gRPC {name} of {identity.name} (an unexpected error): "
                            f"{str(answer)[:600]}")
        if identity.creds in NO_ACCOUNT and answer.HasField("status") and answer.status.code == Code["OK"]:
            raise Violation(f"grpc {identity.name} (no valid account) was served: {name} {str(answer)[:300]}")
        self.fuzzer.successes += answer.HasField("status") and answer.status.code == Code["OK"]

    # --- generators: each builds one request (valid for the app account when ``valid``) and makes the call ---
    def fuzz_message(self, rng, valid: bool):
        topic = "Open" if valid else rng.choice(GRPC_TOPICS)
        kind = MessageType["NORMAL"] if valid else rng.choice(
            [MessageType["NORMAL"], MessageType["FIFO"], MessageType["DELAY"], MessageType["TRANSACTION"], 0, 7])
        if valid and rng.random() < 0.4:
            kind = rng.choice([MessageType["FIFO"], MessageType["DELAY"], MessageType["TRANSACTION"]])
        body = self.fuzzer.body(rng)
        msg = self.message(topic, body, kind, f"MG-{rng.randrange(3)}" if kind == MessageType["FIFO"] else None)
        sp = msg.system_properties
        if kind == MessageType["DELAY"]:
            sp.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + rng.choice([50, 200]))
        if rng.random() < 0.3:
            sp.tag = rng.choice(["a", "b", "", "x y"])
            sp.keys.extend(rng.choice([["K-OPEN"], ["K-SECRET"], []]))
        if rng.random() < 0.15:
            sp.body_encoding = Encoding["GZIP"]
            msg.body = gzip.compress(body)
        if not valid:
            for _ in range(rng.choice([0, 0, 1, 2])):
                mutate = rng.randrange(9)
                if mutate == 0:
                    msg.user_properties[rng.choice(RESERVED_NAMES)] = rng.choice(["true", "Secret", "1", "-1"])
                elif mutate == 1:
                    sp.born_timestamp.seconds = rng.choice([-1, -(2**40), 2**40, 0])
                    sp.born_timestamp.nanos = rng.choice([0, -1, 10**9 + 5])
                elif mutate == 2:
                    sp.delivery_timestamp.seconds = rng.choice([-5, 0, 2**40, int(time.time()) + 10**8])
                elif mutate == 3:
                    sp.body_encoding = Encoding["GZIP"]
                    msg.body = rng.choice([b"\x1f\x8b\x08garbage", gzip.compress(b"\0" * (MAX_MESSAGE_SIZE * 4)),
                                           body])
                elif mutate == 4:
                    msg.body = rng.choice([b"", b"FUZZ" + b"x" * (MAX_MESSAGE_SIZE + 1)])
                elif mutate == 5:
                    sp.message_group = rng.choice(["", "g" * 2000, "MG-0"])
                elif mutate == 6:
                    sp.ClearField("message_id") if rng.random() < 0.5 else setattr(sp, "message_id", "dup")
                elif mutate == 7:
                    sp.body_encoding = rng.choice([0, 9])
                else:
                    msg.user_properties["k" * rng.choice([1, 5000])] = "v" * rng.choice([1, 5000])
        return msg, self.stored_body(msg)

    @staticmethod
    def stored_body(msg) -> bytes | None:
        """The body a reader gets back (a gzip body is stored decompressed); None when it cannot be stored."""
        if msg.system_properties.body_encoding != Encoding["GZIP"]:
            return msg.body
        try:
            return gzip.decompress(msg.body)
        except (OSError, EOFError):
            return None

    async def call_SendMessage(self, rng, identity, client_id, valid):
        pairs = [self.fuzz_message(rng, valid) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        answer = await self.unary(identity, client_id, "SendMessage",
                                  pb.SendMessageRequest(messages=[m for m, _b in pairs]))
        if answer is None:
            return
        for (msg, stored), entry in zip(pairs, answer.entries):
            if entry.status.code != Code["OK"]:
                continue
            kind = msg.system_properties.message_type
            if kind == MessageType["TRANSACTION"]:
                self.own_transactions.append((msg.topic.name, entry.transaction_id))
            elif kind in (MessageType["NORMAL"], MessageType["FIFO"]):
                self.fuzzer.acked.append((msg.topic.name, None, entry.offset, stored))
        if answer.entries and len(answer.entries) != len(pairs):  # none: the whole call was refused
            raise Violation(f"grpc {identity.name}: SendMessage of {len(pairs)} messages answered "
                            f"{len(answer.entries)} entries")

    def receive_request(self, rng, valid: bool):
        request = pb.ReceiveMessageRequest(
            group=pb.Resource(name="CG_APP" if valid else rng.choice(GRPC_GROUPS)),
            message_queue=pb.MessageQueue(topic=pb.Resource(name="Open" if valid else rng.choice(GRPC_TOPICS)),
                                          id=rng.choice([-1, 0, 1, 1, 7, 2**31 - 1])),
            batch_size=rng.choice([1, 4, 32]) if valid else rng.choice([1, 32, 0, -1, 1025, 10**6]),
            filter_expression=pb.FilterExpression(type=FilterType["TAG"], expression="*"))
        if not valid and rng.random() < 0.2:
            request.filter_expression.type = rng.choice([FilterType["SQL"], 0, 5])
            request.filter_expression.expression = rng.choice(["a > 1", "||", "", "a || b"])
        if valid or rng.random() < 0.8:
            request.invisible_duration.FromMilliseconds(rng.choice([1_000, 5_000, 30_000]) if valid else
                                                        rng.choice([1_000, 0, -1_000, 999, 13 * 3_600_000]))
        else:
            request.auto_renew = rng.random() < 0.5
        if rng.random() < 0.7:
            request.long_polling_timeout.FromMilliseconds(rng.choice([0, 20, 50]) if valid else
                                                          rng.choice([0, 20, -1_000, 61_000]))
        return request

    async def call_ReceiveMessage(self, rng, identity, client_id, valid):
        request = self.receive_request(rng, valid)
        if rng.random() < 0.1:  # a long poll left waiting: cancelled when newer ones come
            request.long_polling_timeout.FromSeconds(rng.choice([20, 60]))
            self.fuzzer.trace.append(self.describe(identity, client_id, "ReceiveMessage (held)", request))
            call = identity.raw.stub("ReceiveMessage")(request, metadata=identity.metadata(client_id), timeout=90)
            self.held.append((call, asyncio.ensure_future(self.read_receive(identity, call, request, held=True))))
            while len(self.held) > HELD_RECEIVES:
                old, task = self.held.pop(0)
                old.cancel()
                await asyncio.gather(task, return_exceptions=True)
            return
        self.fuzzer.trace.append(self.describe(identity, client_id, "ReceiveMessage", request))
        polling = request.long_polling_timeout.ToMilliseconds() / 1000
        call = identity.raw.stub("ReceiveMessage")(request, metadata=identity.metadata(client_id),
                                                   timeout=max(0.0, polling) + ANSWER_BOUND_S)
        await self.read_receive(identity, call, request)

    async def read_receive(self, identity, call, request, held: bool = False) -> None:
        self.fuzzer.requests += 1
        self.methods_called.add("ReceiveMessage")
        try:
            try:
                async for answer in call:
                    self.check_answer(identity, "ReceiveMessage", answer)
                    if answer.HasField("message") and identity.creds not in NO_ACCOUNT:
                        self.handles.append((request.group.name, request.message_queue.topic.name,
                                             answer.message.system_properties.receipt_handle))
            except grpc.aio.AioRpcError as exc:
                self.rpc_error(identity, "ReceiveMessage", exc)
        except Violation as exc:
            if not held:
                raise
            self.fuzzer.late.append(exc)  # no one awaits a held receive: the next check raises it
        del self.handles[:-64]

    def handle(self, rng, valid: bool) -> tuple[str, str, str]:
        """(group, topic, handle): a real one an account received, or forged."""
        if self.handles and (valid or rng.random() < 0.5):
            group, topic, handle = rng.choice(self.handles)
            if not valid and rng.random() < 0.3:
                group, topic = rng.choice(GRPC_GROUPS), rng.choice(GRPC_TOPICS)
            return group, topic, handle
        queue, offset, version = rng.randrange(3), rng.randrange(8), rng.choice([0, 1, 2**40, 2**64 - 1])
        forged = rng.choice([f"{queue:x}:{offset:x}:{version:x}", "0:0:0", "zz", ":::", "1:2", "x" * 5000, "",
                             "-1:-1:-1", f"{queue}:{offset}"])
        return rng.choice(GRPC_GROUPS[:3]), rng.choice(["Open", "ReadOnly", "Secret", "GoodGrpc"]), forged

    async def call_AckMessage(self, rng, identity, client_id, valid):
        group, topic, _h = self.handle(rng, valid)
        entries = []
        for _ in range(rng.choice([1, 1, 2, 4]) if valid else rng.choice([0, 1, 3])):
            _g, _t, handle = self.handle(rng, valid)
            entries.append(pb.AckMessageEntry(message_id="x", receipt_handle=handle))
        await self.unary(identity, client_id, "AckMessage", pb.AckMessageRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=entries))

    async def call_ChangeInvisibleDuration(self, rng, identity, client_id, valid):
        group, topic, handle = self.handle(rng, valid)
        request = pb.ChangeInvisibleDurationRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic),
                                                    receipt_handle=handle, message_id="x")
        request.invisible_duration.FromMilliseconds(rng.choice([0, 1_000, 30_000]) if valid else
                                                    rng.choice([0, -5_000, 13 * 3_600_000, 2**40]))
        await self.unary(identity, client_id, "ChangeInvisibleDuration", request)

    async def call_ForwardMessageToDeadLetterQueue(self, rng, identity, client_id, valid):
        group, topic, handle = self.handle(rng, valid)
        await self.unary(identity, client_id, "ForwardMessageToDeadLetterQueue",
                         pb.ForwardMessageToDeadLetterQueueRequest(
                             group=pb.Resource(name=group), topic=pb.Resource(name=topic), receipt_handle=handle,
                             message_id="x", delivery_attempt=rng.choice([1, 16]), max_delivery_attempts=16))

    async def call_EndTransaction(self, rng, identity, client_id, valid):
        if valid and self.own_transactions:
            topic, transaction = rng.choice(self.own_transactions)
        else:
            topic = rng.choice(["Open", "Secret", "ReadOnly"] + GRPC_TOPICS)
            remoting = [f"{half:016X}{int(queue_offset):016X}" for half, queue_offset in self.fuzzer.half_offsets]
            transaction = rng.choice(self.admin_transactions + remoting + [t for _t, t in self.own_transactions] +
                                     ["", "zz", "0" * 32, "F" * 32, "1" * 31, "g" * 32])
        await self.unary(identity, client_id, "EndTransaction", pb.EndTransactionRequest(
            topic=pb.Resource(name=topic), message_id="x", transaction_id=transaction,
            resolution=rng.choice([TransactionResolution["COMMIT"], TransactionResolution["ROLLBACK"]]) if valid
            else rng.choice([0, 1, 2, 7]), source=rng.choice([0, 1, 2])))

    async def call_QueryRoute(self, rng, identity, client_id, valid):
        await self.unary(identity, client_id, "QueryRoute", pb.QueryRouteRequest(
            topic=pb.Resource(name="Open" if valid else rng.choice(GRPC_TOPICS))))

    async def call_QueryAssignment(self, rng, identity, client_id, valid):
        await self.unary(identity, client_id, "QueryAssignment", pb.QueryAssignmentRequest(
            topic=pb.Resource(name="Open" if valid else rng.choice(GRPC_TOPICS)),
            group=pb.Resource(name="CG_APP" if valid else rng.choice(GRPC_GROUPS))))

    async def call_Heartbeat(self, rng, identity, client_id, valid):
        request = pb.HeartbeatRequest(client_type=rng.choice(list(ClientType.values())))
        if rng.random() < 0.7:
            request.group.name = "CG_APP" if valid else rng.choice(GRPC_GROUPS)
        await self.unary(identity, client_id, "Heartbeat", request)

    async def call_NotifyClientTermination(self, rng, identity, client_id, valid):
        request = pb.NotifyClientTerminationRequest()
        if rng.random() < 0.5:
            request.group.name = rng.choice(GRPC_GROUPS)
        await self.unary(identity, client_id, "NotifyClientTermination", request)

    def settings(self, rng, valid: bool):
        if rng.random() < 0.5:
            topics = ["Open"] if valid else rng.sample(GRPC_TOPICS, rng.choice([0, 1, 2]))
            settings = pb.Settings(client_type=ClientType["PRODUCER"], publishing=pb.Publishing(
                topics=[pb.Resource(name=t) for t in topics]))
        else:
            topics = ["Open"] if valid else rng.sample(GRPC_TOPICS, rng.choice([0, 1, 2]))
            settings = pb.Settings(client_type=rng.choice([ClientType["SIMPLE_CONSUMER"], ClientType["PUSH_CONSUMER"]]),
                                   subscription=pb.Subscription(
                                       group=pb.Resource(name="CG_APP" if valid else rng.choice(GRPC_GROUPS)),
                                       subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name=t),
                                                                           expression=pb.FilterExpression(
                                                                               type=FilterType["TAG"], expression="*"))
                                                      for t in topics]))
        if not valid and rng.random() < 0.2:
            settings.client_type = rng.choice([0, 4, 9])
            settings.user_agent.hostname = "h" * rng.choice([10, 70_000])
        return settings

    async def call_Telemetry(self, rng, identity, client_id, valid):
        """A telemetry stream with settings, left open for the next sequences: what the broker pushes on it later
        (transaction checks) is read and checked too."""
        settings = self.settings(rng, valid)
        self.fuzzer.trace.append(self.describe(identity, client_id, "Telemetry", settings))
        self.fuzzer.requests += 1
        self.methods_called.add("Telemetry")
        call = identity.raw.stub("Telemetry")(metadata=identity.metadata(client_id))
        first = asyncio.get_running_loop().create_future()
        reader = asyncio.ensure_future(self.read_stream(identity, call, first))
        self.streams.append((call, reader))
        try:
            await call.write(pb.TelemetryCommand(settings=settings))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the broker ended the stream first (it refused the caller): the reader saw why
        try:
            await asyncio.wait_for(asyncio.shield(first), ANSWER_BOUND_S)
        except asyncio.TimeoutError:
            raise Violation(f"grpc {identity.name}: Telemetry settings unanswered within {ANSWER_BOUND_S}s") from None
        while len(self.streams) > LIVE_STREAMS:
            old, task = self.streams.pop(0)
            old.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def read_stream(self, identity, call, first) -> None:
        try:
            try:
                while (command := await call.read()) is not grpc.aio.EOF:
                    if not first.done():
                        first.set_result(None)
                    self.check_answer(identity, "Telemetry", command)
            except grpc.aio.AioRpcError as exc:
                self.rpc_error(identity, "Telemetry", exc)
        except Violation as exc:
            self.fuzzer.late.append(exc)  # the stream lives on across sequences: the next check raises it
        finally:
            if not first.done():
                first.set_result(None)


class UnexpectedErrors(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record):
        if "unexpected error" in record.getMessage() or record.exc_info:
            self.records.append(self.format(record))


@pytest.mark.slow  # thousands of random requests over both doors, with restarts
async def test_random_request_sequences_keep_every_invariant(broker_factory, tmp_path):
    seed = int(os.environ.get("FUZZ_SEED") or random.randrange(2**32))
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    broker = await broker_factory(aclEnable=True, aclConfigFile=str(acl), transactionTimeOut=50,
                                  transactionCheckInterval=100, serverMaxFrameSize=1 << 20, grpcListenPort=0,
                                  maxMessageSize=MAX_MESSAGE_SIZE)
    errors = UnexpectedErrors()
    for name in ("halfmq", "grpc"):
        logging.getLogger(name).addHandler(errors)
    fuzzer = Fuzzer(broker, seed)
    index = -1
    try:
        await fuzzer.setup()
        started = time.perf_counter()
        for index in range(FIRST, SEQUENCES):
            await fuzzer.run_sequence(index)
            if errors.records:
                raise Violation(f"the broker hit an unexpected error: {errors.records[0]}")
        took = time.perf_counter() - started
    except Exception as exc:
        calls = "\n  ".join(fuzzer.trace)
        raise AssertionError(f"fuzzer failed at sequence {index}; reproduce with FUZZ_SEED={seed} "
                             f"FUZZ_SEQUENCES={index + 1} (this sequence alone: add FUZZ_FIRST={index}): {exc}\n"
                             f"the calls of sequence {index}:\n  {calls}") from exc
    finally:
        await fuzzer.close()
        for name in ("halfmq", "grpc"):
            logging.getLogger(name).removeHandler(errors)
    ran = SEQUENCES - FIRST
    print(f"fuzzer: seed {seed}, {ran} sequences, {fuzzer.requests} requests of {len(fuzzer.codes_sent)} codes and "
          f"{len(fuzzer.grpc.methods_called)} gRPC methods ({fuzzer.successes} answered SUCCESS or OK, "
          f"{fuzzer.acks_checked} acknowledged sends read back) in {took:.1f}s")
    if ran < 1000:
        return  # a replay of a few sequences: too few for the fuzzer's own coverage checks below
    assert fuzzer.successes > ran // 4 and fuzzer.acks_checked > ran // 20  # the valid paths ran
    if "remoting" in DOORS:
        served = set(broker.dispatcher.handlers)
        assert served <= fuzzer.codes_sent, f"codes never sent: {sorted(served - fuzzer.codes_sent)}"
    if "grpc" in DOORS:
        fuzzed = {"SendMessage", "ReceiveMessage", "AckMessage", "ChangeInvisibleDuration", "EndTransaction",
                  "QueryRoute", "QueryAssignment", "Heartbeat", "Telemetry", "NotifyClientTermination",
                  "ForwardMessageToDeadLetterQueue"}
        assert fuzzed <= fuzzer.grpc.methods_called, f"never called: {sorted(fuzzed - fuzzer.grpc.methods_called)}"
