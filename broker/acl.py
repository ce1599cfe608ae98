"""Access control compatible with RocketMQ 4.x plain ACL (conf/plain_acl.yml), and the admin-code rule.

A request is signed by the client: ``Signature`` = Base64(HMAC-SHA1(secretKey, values of all other extFields
sorted by key, then the body)), with ``AccessKey`` (and optionally ``SecurityToken``) among the fields. Accounts
grant topics and groups DENY, PUB, SUB or PUB|SUB, with defaults for unlisted resources; admin requests need an
admin account. With ACL off, admin requests are served to loopback peers only.

What each request code needs is one table, ``RULES`` (code → the resources it touches and the permission each
needs), built once below from the header classes' ``RESOURCES`` (so the key checked is the key the processor
routes by) plus the body fields of HEART_BEAT and LOCK/UNLOCK_BATCH_MQ; docs/security.md's table is ``rules_markdown()``.
It follows RocketMQ 4.x plain ACL and is stricter where that leaks:

- a ``%RETRY%G``/``%DLQ%G`` topic is group G's: it needs SUB on G, whatever the code (no topic grant opens it);
- a system topic (half, op-half, schedule, TRANS_CHECK_MAX_TIME_TOPIC, ...) is for admin accounts only;
- VIEW_MESSAGE_BY_ID, QUERY_MESSAGE and CONSUMER_SEND_MSG_BACK need SUB on the topic of the record they read:
  the processor calls ``check_record`` once it has the record (the header alone does not name it);
- a heartbeat's producer groups need PUB (only they get CHECK_TRANSACTION_STATE, which carries uncommitted
  bodies), its consumer groups SUB, their subscriptions SUB on the topics; a heartbeat with one refused group
  is refused whole, so nothing of it is registered;
- LOCK/UNLOCK_BATCH_MQ need SUB on the group and its topics; that the client id is the caller's own (the one its
  heartbeat registered on the connection) is checked by the processor with or without ACL;
- a batch half (TRAN_MSG in the batch's properties) needs PUB on its producer group, as a single half does.

Two rules hold with or without ACL, for every request that names a resource:

- no group a request names (nor the group of a ``%RETRY%``/``%DLQ%`` topic it names) may be one of the gRPC
  endpoint's internal groups (``%GRPC%<topic>``, names.check_remoting_group): their producers get gRPC halves'
  checks, so a remoting client must never register as one, end their transactions, or consume as one;
- a record of a system topic is read by admins only, and with ACL off by loopback clients only: ``check_read``,
  the one rule both doors use (remoting through ``check_record``, gRPC through broker/grpc/auth.require).

A signature proves who made a request, not when: a captured request verifies for ever. ``check_signed_time``
refuses a signed time more than authorizationSkewSeconds from the broker's clock (15 min, as AWS SigV4), the one
rule of both doors. The gRPC door checks x-mq-date-time, which the 5.x clients sign on every call. RocketMQ 4.x
signs a request's extFields and body, and the only time among them is a send's ``bornTimestamp``
(``SIGNED_TIME_FIELDS``), set by the client at each attempt: a captured send is refused once the window has
passed; a pull, heartbeat, END_TRANSACTION or admin request carries no signed time, so 4.x signing cannot tell
its replay from the original.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import time
from dataclasses import dataclass, field

import yaml

from halfmq.protocol import properties as P
from halfmq.protocol.codes import ADMIN_REQUEST_CODES, BROKER_REGISTRATION_CODES, REPLICATION_CODES, RequestCode
from halfmq.protocol.headers import (
    GROUP,
    TOPIC,
    ConsumerSendMsgBackRequestHeader,
    EndTransactionRequestHeader,
    GroupRequestHeader,
    Header,
    PullMessageRequestHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    QueueRequestHeader,
    SearchOffsetRequestHeader,
    SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from halfmq.protocol.properties import decode_properties
from halfmq.protocol.signing import signature

from .errors import BrokerError, Failure
from .names import GRPC_GROUP_PREFIX, check_remoting_group
from .topics import DLQ_PREFIX, RETRY_PREFIX, SEND_FORBIDDEN

DENY, ANY, PUB, SUB = 1, 2, 4, 8
_PERMS = {"DENY": DENY, "ANY": ANY | PUB | SUB, "PUB": PUB, "SUB": SUB}


class AclConfigError(ValueError):
    """plain_acl.yml is unreadable or malformed; the message names the problem."""


def parse_perm(text: str, where: str) -> int:
    perm = 0
    for part in str(text).replace(" ", "").split("|"):
        if part not in _PERMS:
            raise AclConfigError(f"{where}: unknown permission {part!r} (DENY, PUB, SUB, PUB|SUB)")
        perm |= _PERMS[part]
    return perm


@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    topic_perms: dict[str, int] = field(default_factory=dict)
    group_perms: dict[str, int] = field(default_factory=dict)

    def allows(self, kind: str, resource: str, needed: int) -> bool:
        perms, default = ((self.topic_perms, self.default_topic_perm) if kind == "topic"
                          else (self.group_perms, self.default_group_perm))
        granted = perms.get(resource, default)
        return not granted & DENY and granted & needed == needed


def _resource_perms(items, where: str) -> dict[str, int]:
    out = {}
    for item in items or []:
        name, sep, perm = str(item).partition("=")
        if not sep or not name.strip():
            raise AclConfigError(f"{where}: {item!r} is not NAME=PERM")
        out[name.strip()] = parse_perm(perm, where)
    return out


def load_accounts(path: str) -> dict[str, Account]:
    """Read plain_acl.yml.

    Raises:
        AclConfigError: the file is missing or malformed.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise AclConfigError(f"cannot read ACL file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise AclConfigError(f"ACL file {path} is not valid YAML: {exc}") from None
    accounts = {}
    for index, raw in enumerate(data.get("accounts") or []):
        where = f"{path} accounts[{index}]"
        if not isinstance(raw, dict) or not raw.get("accessKey") or not raw.get("secretKey"):
            raise AclConfigError(f"{where}: accessKey and secretKey are required")
        accounts[str(raw["accessKey"])] = Account(
            str(raw["accessKey"]), str(raw["secretKey"]), bool(raw.get("admin", False)),
            parse_perm(raw.get("defaultTopicPerm", "DENY"), where), parse_perm(raw.get("defaultGroupPerm", "DENY"), where),
            _resource_perms(raw.get("topicPerms"), where), _resource_perms(raw.get("groupPerms"), where))
    return accounts


def is_loopback(remote: str) -> bool:
    host = remote.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False



#: Where a rule finds the name of a record's topic: the processor reads the record, then calls check_record.
RECORD = "the record read"


@dataclass(frozen=True)
class Need:
    """One resource a request touches: its kind (TOPIC or GROUP), where its name is read, the permission."""

    kind: str
    where: str   # an extFields key, a body path, or RECORD
    perm: int
    header_key: str | None = None  # the extFields key the name is read from, for header needs
    transactional_only: bool = False  # asked only of a transactional (TRAN_MSG=true) message


@dataclass(frozen=True)
class Rule:
    code: RequestCode
    needs: tuple[Need, ...]
    header: type[Header] | None = None
    note: str = ""


def _from_header(code: RequestCode, header: type[Header], note: str = "", record: int = 0,
                 tx_group: str | None = None, **perms: int) -> Rule:
    """A rule whose names are header fields (attribute=permission), plus SUB on the record read if ``record``, plus
    PUB on the group in attribute ``tx_group`` for a transactional message."""
    needs = []
    for attribute, perm in perms.items():
        key = header.wire_key(attribute)
        needs.append(Need(header.RESOURCES[attribute], f"`{key}`", perm, key))
    if tx_group:
        key = header.wire_key(tx_group)
        needs.append(Need(header.RESOURCES[tx_group], f"`{key}`, for a transactional message", PUB, key, True))
    if record:
        needs.append(Need(TOPIC, RECORD, record))
    return Rule(code, tuple(needs), header, note)


def _from_body(code: RequestCode, note: str, *needs: Need) -> Rule:
    return Rule(code, needs, None, note)


C = RequestCode
_RETRY_NOTE = "a %RETRY%G/%DLQ%G topic needs SUB on G"
_SEND_NOTE = (_RETRY_NOTE + "; a half message joins its group's transactions (checks of it go to the group's "
              "producers), so it needs PUB on the group as END_TRANSACTION does")
#: Every request code the broker serves to clients, but the admin codes and SIGNATURE_ONLY (a test checks that
#: every code the broker registers is in one of the three).
RULES: dict[int, Rule] = {rule.code: rule for rule in (
    _from_header(C.SEND_MESSAGE, SendMessageRequestHeader, _SEND_NOTE, tx_group="producerGroup", topic=PUB),
    _from_header(C.SEND_MESSAGE_V2, SendMessageRequestHeaderV2, _SEND_NOTE, tx_group="producerGroup", topic=PUB),
    _from_header(C.SEND_BATCH_MESSAGE, SendMessageRequestHeaderV2, _RETRY_NOTE + "; a batch half (halfmq's "
                 "extension) joins its group's transactions as a half message does", tx_group="producerGroup",
                 topic=PUB),
    _from_header(C.PULL_MESSAGE, PullMessageRequestHeader, "", topic=SUB, consumerGroup=SUB),
    _from_header(C.QUERY_MESSAGE, QueryMessageRequestHeader, "only records of that topic are answered",
                 record=SUB, topic=SUB),
    _from_header(C.QUERY_CONSUMER_OFFSET, QueryConsumerOffsetRequestHeader, "", topic=SUB, consumerGroup=SUB),
    _from_header(C.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader, "", topic=SUB, consumerGroup=SUB),
    _from_header(C.SEARCH_OFFSET_BY_TIMESTAMP, SearchOffsetRequestHeader, "", topic=SUB),
    _from_header(C.GET_MAX_OFFSET, QueueRequestHeader, "", topic=SUB),
    _from_header(C.GET_MIN_OFFSET, QueueRequestHeader, "", topic=SUB),
    _from_header(C.GET_EARLIEST_MSG_STORETIME, QueueRequestHeader, "", topic=SUB),
    _from_header(C.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader, "a system topic's record: admin only",
                 record=SUB),
    _from_body(C.HEART_BEAT, "refused whole if any group or topic is refused",
               Need(GROUP, "body `producerDataSet[].groupName`", PUB),
               Need(GROUP, "body `consumerDataSet[].groupName`", SUB),
               Need(TOPIC, "body `consumerDataSet[].subscriptionDataSet[].topic`", SUB)),
    _from_header(C.UNREGISTER_CLIENT, UnregisterClientRequestHeader, "", producerGroup=PUB, consumerGroup=SUB),
    _from_header(C.CONSUMER_SEND_MSG_BACK, ConsumerSendMsgBackRequestHeader,
                 "only committed records of a non-system topic are copied", record=SUB, group=SUB),
    _from_header(C.END_TRANSACTION, EndTransactionRequestHeader, "a commit writes into the half's topic",
                 record=PUB, producerGroup=PUB),
    _from_header(C.GET_CONSUMER_LIST_BY_GROUP, GroupRequestHeader, "", consumerGroup=SUB),
    _from_body(C.LOCK_BATCH_MQ, "only for the caller's own clientId (its heartbeat's)",
               Need(GROUP, "body `consumerGroup`", SUB), Need(TOPIC, "body `mqSet[].topic`", SUB)),
    _from_body(C.UNLOCK_BATCH_MQ, "only for the caller's own clientId (its heartbeat's)",
               Need(GROUP, "body `consumerGroup`", SUB), Need(TOPIC, "body `mqSet[].topic`", SUB)),
)}
#: Codes that name no topic or group a client could be refused: route, cluster and topic-list queries (what the
#: name server tells anyone) and CHECK_CLIENT_CONFIG. They need a valid signature and nothing else.
SIGNATURE_ONLY = frozenset({C.GET_ROUTEINFO_BY_TOPIC, C.GET_BROKER_CLUSTER_INFO, C.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
                            C.GET_TOPICS_BY_CLUSTER, C.CHECK_CLIENT_CONFIG})
del C


def _perm_name(perm: int) -> str:
    return "|".join(name for name, bit in (("PUB", PUB), ("SUB", SUB)) if perm & bit)


def rules_markdown() -> str:
    """The table docs/security.md shows (a test keeps the two equal)."""
    lines = ["| code | request | needs | note |", "|---|---|---|---|"]
    for rule in sorted(RULES.values(), key=lambda r: r.code):
        needs = "; ".join(f"{_perm_name(n.perm)} on the {n.kind} in {n.where}" for n in rule.needs)
        lines.append(f"| {int(rule.code)} | {rule.code.name} | {needs} | {rule.note} |")
    admin = ", ".join(f"{c.name} ({int(c)})" for c in sorted(ADMIN_REQUEST_CODES))
    lines.append(f"| admin | {admin} | an admin account (ACL off: a loopback client) | |")
    plain = ", ".join(f"{c.name} ({int(c)})" for c in sorted(SIGNATURE_ONLY))
    lines.append(f"| other | {plain} | a valid signature only | they name no resource |")
    joins = ", ".join(f"{c.name} ({int(c)})" for c in sorted(BROKER_REGISTRATION_CODES))
    lines.append(f"| registration | {joins} | an admin account (ACL off: anyone) | served by `halfmq namesrv` only |")
    links = ", ".join(f"{c.name} ({int(c)})" for c in sorted(REPLICATION_CODES))
    lines.append(f"| replication | {links} | an admin account (ACL off: anyone) | served on `haListenPort` only |")
    return "\n".join(lines)


def _body_json(cmd) -> dict:
    try:
        data = json.loads(cmd.body or b"{}")
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        # Nothing to name resources from; refusing here (rather than letting the processor answer the malformed
        # body) keeps one rule: a body-routed request is checked whole or not served.
        raise BrokerError(Failure.BAD_REQUEST, "the request body is not a JSON object")
    return data


def _dicts(value) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _body_resources(code: int, cmd):
    """(kind, name, perm) named by the JSON body of HEART_BEAT and LOCK/UNLOCK_BATCH_MQ."""
    data = _body_json(cmd)
    if code == RequestCode.HEART_BEAT:
        for producer in _dicts(data.get("producerDataSet")):
            yield GROUP, str(producer.get("groupName", "")), PUB
        for consumer in _dicts(data.get("consumerDataSet")):
            yield GROUP, str(consumer.get("groupName", "")), SUB
            for sub in _dicts(consumer.get("subscriptionDataSet")):
                yield TOPIC, str(sub.get("topic", "")), SUB
    else:  # LOCK_BATCH_MQ, UNLOCK_BATCH_MQ
        yield GROUP, str(data.get("consumerGroup", "")), SUB
        for mq in _dicts(data.get("mqSet")):
            yield TOPIC, str(mq.get("topic", "")), SUB


def _transactional(header: type[Header], ext: dict[str, str]) -> bool:
    """Is this send a half message? The same test as the send processor's (TRAN_MSG=true in its properties)."""
    text = ext.get(header.wire_key("properties")) or ""
    if P.TRAN_MSG not in text:  # the common case, without decoding
        return False
    return decode_properties(text).get(P.TRAN_MSG) == "true"


def owner(kind: str, name: str, perm: int) -> tuple[str, str, int]:
    """The resource whose permission decides: a retry or DLQ topic is its group's, and needs SUB on it."""
    if kind == TOPIC:
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if name.startswith(prefix):
                return GROUP, name[len(prefix):], SUB
    return kind, name, perm


#: the signed extField of a request that says when its client made it (a send's bornTimestamp)
SIGNED_TIME_FIELDS = {RequestCode.SEND_MESSAGE: SendMessageRequestHeader.wire_key("bornTimestamp"),
                      RequestCode.SEND_MESSAGE_V2: SendMessageRequestHeaderV2.wire_key("bornTimestamp"),
                      RequestCode.SEND_BATCH_MESSAGE: SendMessageRequestHeaderV2.wire_key("bornTimestamp")}
DEFAULT_SKEW_SECONDS = 900


def check_signed_time(signed_ms: int, skew_seconds: float, now_ms: int | None = None) -> None:
    """A signed request's time must be within ``skew_seconds`` of the broker's clock, either way.

    Raises:
        BrokerError: SIGNATURE_EXPIRED.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if abs(now_ms - signed_ms) > skew_seconds * 1000:
        raise BrokerError(Failure.SIGNATURE_EXPIRED,
                          f"the request was signed {(now_ms - signed_ms) / 1000:.0f} s from the broker's clock, "
                          f"more than authorizationSkewSeconds={skew_seconds:g}: a replay, or a clock to set right")


class AccessValidator:
    """Checks each request; raises BrokerError(FORBIDDEN) when it is not allowed."""

    def __init__(self, accounts: dict[str, Account] | None, skew_seconds: float = DEFAULT_SKEW_SECONDS):
        self.accounts = accounts  # None: ACL off
        self.skew_seconds = skew_seconds  #: authorizationSkewSeconds

    @property
    def enabled(self) -> bool:
        return self.accounts is not None

    def check(self, channel, cmd) -> None:
        account = None
        if self.accounts is None:
            if cmd.code in ADMIN_REQUEST_CODES and not is_loopback(channel.remote):
                raise BrokerError(Failure.FORBIDDEN,
                                  f"admin request {cmd.code} is only served to loopback clients when ACL is off")
        else:
            account = self._account(cmd)
            if (cmd.code in ADMIN_REQUEST_CODES or cmd.code in BROKER_REGISTRATION_CODES
                    or cmd.code in REPLICATION_CODES) and not account.admin:
                raise BrokerError(Failure.FORBIDDEN, f"request {cmd.code} needs an admin account")
        rule = RULES.get(cmd.code)
        if rule is None:
            return
        self._refuse_internal_groups(rule, cmd)
        if account is None or account.admin:
            return
        for kind, name, perm in self._resources(rule, cmd):
            self._require(account, kind, name, perm)

    @staticmethod
    def _refuse_internal_groups(rule: Rule, cmd) -> None:
        """Every group the request names, whatever the permission asked of it (a send's producerGroup even when
        the message is not a half), and every retry/DLQ topic's group."""
        if rule.header is None:
            if GRPC_GROUP_PREFIX.encode() not in (cmd.body or b""):  # the usual body names none: no parsing
                return
            named = ((kind, name, "a group of the body") for kind, name, _perm in _body_resources(rule.code, cmd))
        else:  # every request's path (a send's): a plain loop, no parsing
            ext = cmd.ext_fields
            for need in rule.needs:
                name = ext.get(need.header_key) if need.header_key is not None else None
                if name and GRPC_GROUP_PREFIX in name:
                    kind, group, _perm = owner(need.kind, name, SUB)
                    if kind == GROUP:
                        check_remoting_group(group, need.header_key)
            return
        for kind, name, where in named:
            if GRPC_GROUP_PREFIX in name:
                kind, group, _perm = owner(kind, name, SUB)
                if kind == GROUP:
                    check_remoting_group(group, where)

    def _account(self, cmd) -> Account:
        ext = cmd.ext_fields
        account = self.accounts.get(ext.get("AccessKey", ""))
        if account is None:
            raise BrokerError(Failure.FORBIDDEN, f"no account for AccessKey {ext.get('AccessKey', '')!r}")
        expected = signature(account.secret_key, ext, cmd.body)
        if not hmac.compare_digest(expected.encode(), ext.get("Signature", "").encode()):
            raise BrokerError(Failure.FORBIDDEN, "the signature does not match")
        time_field = SIGNED_TIME_FIELDS.get(cmd.code)
        signed = ext.get(time_field, "") if time_field is not None else ""
        if signed.isdigit() and signed != "0":  # 0: the client said nothing of when (SEND_MESSAGE's default)
            check_signed_time(int(signed), self.skew_seconds)
        return account

    @staticmethod
    def _resources(rule: Rule, cmd):
        if rule.header is None:
            yield from _body_resources(rule.code, cmd)
            return
        ext = cmd.ext_fields
        for need in rule.needs:
            if need.header_key is None:
                continue  # RECORD: checked by the processor through check_record
            if need.transactional_only and not _transactional(rule.header, ext):
                continue
            name = ext.get(need.header_key)
            # An absent field names nothing: an optional one (UNREGISTER_CLIENT's groups) asks for nothing, and a
            # required one is refused by the processor's header class, which reads this very key.
            if name:
                yield need.kind, name, need.perm

    @staticmethod
    def _require(account: Account, kind: str, name: str, perm: int) -> None:
        kind, name, perm = owner(kind, name, perm)
        if kind == TOPIC and name in SEND_FORBIDDEN:
            raise BrokerError(Failure.FORBIDDEN, f"{account.access_key} may not use system topic {name}")
        if not account.allows(kind, name, perm):
            raise BrokerError(Failure.FORBIDDEN,
                              f"{account.access_key} may not {'publish to' if perm == PUB else 'subscribe'} "
                              f"{kind} {name}")

    def check_record(self, channel, cmd, topic: str) -> None:
        """May the sender of ``cmd`` (already authenticated by ``check``) read a record of ``topic``?
        ``check_read`` decides.

        Raises:
            BrokerError: FORBIDDEN.
        """
        self.check_read(None if self.accounts is None else self._account(cmd), channel.remote, topic)

    def check_decision(self, cmd, topic: str) -> None:
        """May the sender of an END_TRANSACTION (already authenticated by ``check``) decide a half of ``topic``?
        Its rule asks PUB on the producer group the request names; committing also writes into the half's topic,
        so that needs PUB too (measured before: an account denied a topic, with the default group grant, committed
        another account's half into it by naming its group and offsets).

        Raises:
            BrokerError: FORBIDDEN.
        """
        if self.accounts is None:
            return
        account = self._account(cmd)
        if not account.admin:
            self._require(account, TOPIC, topic, PUB)

    @staticmethod
    def check_read(account: Account | None, remote: str, topic: str) -> None:
        """May the caller read records of ``topic``? The one rule of both doors (remoting's ``check_record``, the
        gRPC endpoint's reads through broker/grpc/auth.require).

        Records of system topics (halves, discarded halves, delayed copies) go to admins only; with ACL off
        (``account`` None), to loopback clients only, like the admin codes. Other topics need SUB.

        Args:
            account: the caller's account; None with ACL off.
            remote: the caller's ``host:port``.
            topic: the topic read.
        Raises:
            BrokerError: FORBIDDEN.
        """
        if account is None:
            if topic in SEND_FORBIDDEN and not is_loopback(remote):
                raise BrokerError(Failure.FORBIDDEN,
                                  f"a record of system topic {topic} is only served to loopback clients")
            return
        if not account.admin:
            AccessValidator._require(account, TOPIC, topic, SUB)
