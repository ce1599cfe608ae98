"""Request, response, language and flag codes of the remoting protocol (reference §1.2, §2)."""
from enum import IntEnum


class RequestCode(IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    CHECK_CLIENT_CONFIG = 46
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_TOPICS_BY_CLUSTER = 224
    DELETE_TOPIC_IN_BROKER = 215
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    GET_CONSUME_STATS = 208
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    RESUME_CHECK_HALF_MESSAGE = 323
    GET_BROKER_CONFIG = 26
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    DELETE_SUBSCRIPTIONGROUP = 207
    DELETE_EXPIRED_COMMITLOG = 329
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    #: halfmq's own admin codes (RocketMQ has none for these), far from RocketMQ's range.
    HALFMQ_GET_HALF_STATUS = 20001
    HALFMQ_GET_TRANSACTION_RECORDS = 20002
    #: one page of a broker's topics with their queues' offsets (the dashboard's topic list and topic page)
    HALFMQ_GET_TOPIC_STATS = 20003
    #: one page of a broker's consumer groups with online members and lag (the dashboard's group list and page)
    HALFMQ_GET_CONSUMER_GROUPS = 20004
    #: one page of a broker's live producer groups with their clients, remoting and gRPC (the dashboard)
    HALFMQ_GET_PRODUCER_GROUPS = 20005
    #: a broker group's replication: its members, their sequences and lag, the in-sync set (admin)
    HALFMQ_GET_REPLICATION = 20006
    #: hand a broker group's leadership to one of its followers (admin, sent to the leader)
    HALFMQ_SWITCH_LEADER = 20007
    #: the replication link (haListenPort): a follower asks to follow; the leader's records, snapshot pieces and
    #: promotion go to it; its acknowledgements and the consumer offsets committed at it come back
    HALFMQ_REPL_FOLLOW = 20010
    HALFMQ_REPL_RECORDS = 20011
    HALFMQ_REPL_SNAPSHOT = 20012
    HALFMQ_REPL_ACK = 20013
    HALFMQ_REPL_OFFSETS = 20014
    HALFMQ_REPL_PROMOTE = 20015


#: Codes that read or change broker state for operators: served only to admin peers (see broker/acl).
ADMIN_REQUEST_CODES = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.GET_ALL_TOPIC_CONFIG,
    RequestCode.GET_BROKER_RUNTIME_INFO, RequestCode.GET_CONSUMER_CONNECTION_LIST,
    RequestCode.GET_PRODUCER_CONNECTION_LIST, RequestCode.GET_CONSUME_STATS, RequestCode.RESUME_CHECK_HALF_MESSAGE,
    RequestCode.HALFMQ_GET_HALF_STATUS, RequestCode.HALFMQ_GET_TRANSACTION_RECORDS,
    RequestCode.GET_BROKER_CONFIG, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    RequestCode.DELETE_SUBSCRIPTIONGROUP, RequestCode.DELETE_EXPIRED_COMMITLOG, RequestCode.DELETE_TOPIC_IN_NAMESRV,
    RequestCode.HALFMQ_GET_TOPIC_STATS, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO,
    RequestCode.HALFMQ_GET_CONSUMER_GROUPS, RequestCode.HALFMQ_GET_PRODUCER_GROUPS,
    RequestCode.HALFMQ_GET_REPLICATION, RequestCode.HALFMQ_SWITCH_LEADER})
#: A broker's registration with a name server: an admin account's with ACL on, open with it off (as RocketMQ's).
BROKER_REGISTRATION_CODES = frozenset({RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER})
#: The replication link between a broker group's members: an admin account's with ACL on, like registrations.
REPLICATION_CODES = frozenset({RequestCode.HALFMQ_REPL_FOLLOW, RequestCode.HALFMQ_REPL_RECORDS,
                               RequestCode.HALFMQ_REPL_SNAPSHOT, RequestCode.HALFMQ_REPL_ACK,
                               RequestCode.HALFMQ_REPL_OFFSETS, RequestCode.HALFMQ_REPL_PROMOTE})


class ResponseCode(IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    INVALID_PARAMETER = 29
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    FLOW_CONTROL = 215
    ILLEGAL_OPERATION = 604


class LanguageCode(IntEnum):
    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12
    NODE_JS = 13


class SerializeType(IntEnum):
    JSON = 0
    ROCKETMQ = 1


FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2

#: The version ordinal the broker and our client put in their headers (V4_9_8).
BROKER_VERSION = 409


class TransactionResolution(IntEnum):
    """A producer's answer for a half (END_TRANSACTION's commitOrRollback; gRPC's TransactionResolution maps onto
    it): the one definition of what a decision is."""

    UNKNOWN = 0
    COMMIT = 8
    ROLLBACK = 12


class SysFlag:
    """MessageSysFlag bits (reference §4.3)."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_PREPARED_TYPE = 0x4
    TRANSACTION_COMMIT_TYPE = 0x8
    TRANSACTION_ROLLBACK_TYPE = 0xC
    TRANSACTION_MASK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20


class PullSysFlag:
    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL = 0x10


class Perm:
    PRIORITY = 8
    READ = 4
    WRITE = 2
    INHERIT = 1


def _mq_version_names() -> tuple[str, ...]:
    """RocketMQ's MQVersion.Version enum in declaration order (a client's ``version`` is its ordinal)."""
    names = ["V3_0_0_SNAPSHOT", "V3_0_0_ALPHA1", *(f"V3_0_0_BETA{n}" for n in range(1, 6))]
    for n in range(6, 10):
        names += [f"V3_0_0_BETA{n}_SNAPSHOT", f"V3_0_0_BETA{n}"]
    names.append("V3_0_0_FINAL")
    # Then SNAPSHOT and release per patch: 3.0.1-3.0.15, 3.1.x and 3.2.x from .0, 3.3-3.9 from .1, 4.x and 5.x
    # from .0.
    releases = [(3, 0, p) for p in range(1, 16)]
    releases += [(3, minor, p) for minor in (1, 2) for p in range(10)]
    releases += [(3, minor, p) for minor in range(3, 10) for p in range(1, 10)]
    releases += [(major, minor, p) for major in (4, 5) for minor in range(10) for p in range(10)]
    for major, minor, patch in releases:
        names += [f"V{major}_{minor}_{patch}_SNAPSHOT", f"V{major}_{minor}_{patch}"]
    names.append("HIGHER_VERSION")
    return tuple(names)


MQ_VERSION_NAMES = _mq_version_names()


def version_name(ordinal: int) -> str:
    """A client's header ``version`` as RocketMQ names it (409 → V4_9_8); past the enum, HIGHER_VERSION, as
    RocketMQ's MQVersion.getVersionDesc answers."""
    if ordinal < 0:
        return str(ordinal)
    return MQ_VERSION_NAMES[min(ordinal, len(MQ_VERSION_NAMES) - 1)]


def language_name(code: int | str) -> str:
    """A client's header ``language`` by name (3 → PYTHON); a name or unknown code is kept as it came."""
    try:
        return LanguageCode(int(code)).name
    except ValueError:
        return str(code)
