"""RocketMQ 5 clients by client id, and their telemetry streams.

A ``ClientSession`` is what the broker's registries and the check-back scheduler see of a gRPC client: it has the
remoting channel's shape (``writable``, ``unread_bytes``, ``heard_since``, ``send_request``, ``client_id``,
``remote``), so a gRPC producer is registered in ``ctx.producers`` under its topics' transaction groups
(``transaction_group``) and the scheduler's CHECK_TRANSACTION_STATE to it goes out as a server-pushed
RecoverOrphanedTransactionCommand on its telemetry stream. Remoting producers never register under those groups
(names.check_remoting_group refuses them every remoting request) and gRPC sessions under no other, so a half is
checked only over the protocol it came in on.

A session belongs to whoever opened it (auth.ClientId.owner): the account with ACL on, the client's address with
ACL off. A call naming a client id that another owner's session holds is refused FORBIDDEN, whatever it asks, so
telemetry, termination and recovery commands reach only the owner; the id is free again once its session is
terminated by its owner or expires (no stream and no call for channelExpiredTimeout). With ACL off a client has no
identity but its address, so callers on one host (or behind one NAT) are not told apart; callers elsewhere are.

Bounds (broker/config.py): client ids per owner and in all; a stream's answers not yet taken by its reader
(grpcTelemetryMaxUnreadBytes): above it the stream's next command is not read until the reader catches up, and
no transaction check is queued to it (``send_request`` answers False; the scheduler sends the check again later);
the answers not yet taken on every stream together (grpcTelemetryMaxUnreadBytesTotal, ``UnreadTotal``): above it,
the same for every stream with answers of its own still untaken, so sessions × grpcTelemetryMaxUnreadBytes is
no longer what a broker may hold. A session keeps nothing of a client's settings but the topics it publishes.
"""
from __future__ import annotations

import asyncio
import logging
import time

from halfmq.protocol.codes import LanguageCode, RequestCode
from halfmq.protocol.message import decode_record

from ..names import GRPC_GROUP_PREFIX
from ..services.clients import ClientInfo
from .auth import ClientId
from .convert import peer_host, to_message
from .schema import Code, pb
from .status import GrpcError

log = logging.getLogger(__name__)
_LANGUAGES = {"JAVA": LanguageCode.JAVA, "CPP": LanguageCode.CPP, "DOT_NET": LanguageCode.DOTNET,
              "PYTHON": LanguageCode.PYTHON, "GOLANG": LanguageCode.GO, "RUST": LanguageCode.RUST,
              "PHP": LanguageCode.PHP, "NODE_JS": LanguageCode.NODE_JS, "RUBY": LanguageCode.RUBY}


def transaction_group(topic: str) -> str:
    """The producer group a gRPC half of ``topic`` is filed under (5.x producers have no group; any producer of the
    topic may answer its check, as in the reference)."""
    return GRPC_GROUP_PREFIX + topic


def transaction_id(broker: str, half_offset: int, queue_offset: int) -> str:
    """``<brokerName>:<half offset><queue offset>`` (hex): in a cluster, another broker refuses it rather than decide
    whatever half it holds at those offsets (brokerName is the broker group's: its replicas decide it alike)."""
    return f"{broker}:{half_offset:016X}{queue_offset:016X}"


def parse_transaction_id(text: str, broker: str) -> tuple[int, int] | None:
    """(half commit-log offset, half queue offset), or None when ``text`` is not a transaction id ``broker`` gave."""
    name, _, place = text.rpartition(":")
    if name != broker or len(place) != 32:
        return None
    try:
        return int(place[:16], 16), int(place[16:], 16)
    except ValueError:
        return None


class UnreadTotal:
    """The answers queued on every telemetry stream and not yet taken by their readers, bytes, against
    grpcTelemetryMaxUnreadBytesTotal."""

    __slots__ = ("bytes", "limit")

    def __init__(self, limit: int):
        self.bytes, self.limit = 0, limit


class ClientSession:
    def __init__(self, client_id: str, owner: str, remote: str, language: str, max_unread: int, max_body: int,
                 broker: str, total: UnreadTotal):
        self.client_id = client_id
        self.broker = broker  #: brokerName, which the transaction ids it is sent name
        self.owner = owner
        self.remote = peer_host(remote) if remote else ""  #: ip:port, as a remoting channel's (admin shows it)
        self.language = _LANGUAGES.get(language, LanguageCode.OTHER)
        self.total = total
        self.producer_topics: set[str] = set()
        self.version = ""  #: the client's user-agent version, from its settings (admin pages show it)
        #: set by the first heartbeat: the client runs. Clients send settings while they start, and the Python
        #: client drops a check that comes before it runs, so checks wait for this (as RocketMQ's proxy registers
        #: producers on heartbeats).
        self.running = False
        self.max_unread = max_unread
        self.max_body = max_body
        self._outbox: asyncio.Queue | None = None  # the live telemetry stream's, None without one
        self._unread = 0
        self._drained = asyncio.Event()  # set while the live stream's unread answers are within max_unread
        self._drained.set()
        self._last_heard = time.monotonic()

    def __repr__(self) -> str:
        return f"ClientSession({self.client_id} {self.remote})"

    # --- the channel shape (broker/channel.Channel) the registries and check_back use ---
    @property
    def writable(self) -> bool:
        return self._outbox is not None

    @property
    def unread_bytes(self) -> int:
        return self._unread

    @property
    def full(self) -> bool:
        """The stream's reader left more than max_unread bytes of answers untaken, or some while every stream's
        readers together left more than the broker's total."""
        unread = self._unread
        return unread > self.max_unread or (unread > 0 and self.total.bytes > self.total.limit)

    def _set_unread(self, unread: int) -> None:
        self.total.bytes += unread - self._unread
        self._unread = unread

    def heard_since(self, when: float) -> bool:
        return self._last_heard > when

    def heard(self) -> None:
        self._last_heard = time.monotonic()

    def send_request(self, cmd) -> bool:
        """Push a broker-to-client command: a transaction check becomes RecoverOrphanedTransactionCommand;
        remoting-only notifications have no gRPC form and are dropped. False without a live stream, or when its
        reader is behind (``full``): the check is due again later."""
        if self._outbox is None:
            return False
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return True
        if self.full:
            return False
        ext = cmd.ext_fields
        rec = decode_record(cmd.body)
        command = pb.TelemetryCommand()
        recover = command.recover_orphaned_transaction_command
        recover.message.CopyFrom(to_message(rec, max_body=self.max_body))
        recover.transaction_id = transaction_id(self.broker, int(ext["commitLogOffset"]),
                                                int(ext["tranStateTableOffset"]))
        self.queue(self._outbox, command)
        return True

    # --- the telemetry stream ---
    def attach(self) -> asyncio.Queue:
        """A new telemetry stream replaces the previous one (the client rebuilt it)."""
        if self._outbox is not None:
            self._outbox.put_nowait(None)
        self._outbox = asyncio.Queue()
        self._set_unread(0)
        self._drained.set()
        return self._outbox

    def detach(self, outbox: asyncio.Queue) -> bool:
        """The stream of ``outbox`` ended; True when it was the session's live one."""
        if self._outbox is not outbox:
            return False
        self._outbox = None
        self._set_unread(0)
        self._drained.set()
        return True

    def end_stream(self) -> None:
        """Close the live telemetry stream (the client terminated, or the broker stops)."""
        if self._outbox is not None:
            self._outbox.put_nowait(None)
            self._outbox = None
            self._set_unread(0)
            self._drained.set()

    def queue(self, outbox: asyncio.Queue, command) -> None:
        """Queue ``command`` on the stream of ``outbox``, counted until its reader takes it (``written``); nothing
        when that stream is no longer the live one."""
        if outbox is not self._outbox:
            return
        size = command.ByteSize()
        self._set_unread(self._unread + size)
        if self.full:
            self._drained.clear()
        outbox.put_nowait((command, size))

    def written(self, outbox: asyncio.Queue, size: int) -> None:
        if outbox is not self._outbox:
            return
        self._set_unread(max(0, self._unread - size))
        if not self.full:
            self._drained.set()

    async def room(self, outbox: asyncio.Queue) -> None:
        """Wait until the reader of ``outbox``'s stream is within max_unread (or the stream is no longer live)."""
        while outbox is self._outbox and self.full:
            self._drained.clear()  # full for the broker's total, it was set: its own reader's next take wakes it
            await self._drained.wait()

    def info(self) -> ClientInfo:
        return ClientInfo(self.client_id, self, int(self.language), 0)


class Sessions:
    """Sessions by client id, each its owner's; a producer session is registered in ``ctx.producers`` for each
    topic it publishes."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.by_client: dict[str, ClientSession] = {}
        self._per_owner: dict[str, int] = {}
        self.unread = UnreadTotal(ctx.config.grpcTelemetryMaxUnreadBytesTotal)

    def get(self, client_id: ClientId, remote: str = "", language: str = "") -> ClientSession:
        """The caller's session, opened on its first call.

        Raises:
            GrpcError: FORBIDDEN when another owner's session holds the id; TOO_MANY_REQUESTS for a new id beyond
                grpcMaxClientIdsPerOwner or grpcMaxClientIds.
        """
        session = self.by_client.get(client_id)
        if session is None:
            session = self._open(client_id, remote, language)
        elif session.owner != client_id.owner:
            raise GrpcError(Code["FORBIDDEN"], f"client id {client_id} is another client's: its session was opened "
                                               f"by another {client_id.owner.split(' ', 1)[0]}")
        session.heard()
        return session

    def _open(self, client_id: ClientId, remote: str, language: str) -> ClientSession:
        cfg = self.ctx.config
        owner = client_id.owner
        if self._per_owner.get(owner, 0) >= cfg.grpcMaxClientIdsPerOwner:
            raise GrpcError(Code["TOO_MANY_REQUESTS"], f"{owner} has grpcMaxClientIdsPerOwner "
                                                       f"({cfg.grpcMaxClientIdsPerOwner}) client ids already")
        if len(self.by_client) >= cfg.grpcMaxClientIds:
            raise GrpcError(Code["TOO_MANY_REQUESTS"], f"the broker has grpcMaxClientIds ({cfg.grpcMaxClientIds}) "
                                                       f"client ids already")
        plain = str(client_id)
        session = self.by_client[plain] = ClientSession(plain, owner, remote, language,
                                                        cfg.grpcTelemetryMaxUnreadBytes, cfg.maxMessageSize,
                                                        cfg.brokerName, self.unread)
        self._per_owner[owner] = self._per_owner.get(owner, 0) + 1
        return session

    def declares(self, session: ClientSession, topics) -> None:
        """``session``'s settings name the topics it produces to now: those it no longer names stop getting their
        halves' checks."""
        topics = set(topics)
        for topic in session.producer_topics - topics:
            self.ctx.producers.unregister(transaction_group(topic), session)
        session.producer_topics = topics
        self.refresh(session)

    def publishes(self, session: ClientSession, topics) -> None:
        """``session`` sends halves to ``topics``: it may answer their checks (once its stream is live). Beyond
        grpcTelemetryMaxSettingsTopics topics the session answers no more topics' checks (the sender of a half is
        asked first all the same, check_back's sender channel)."""
        most = self.ctx.config.grpcTelemetryMaxSettingsTopics
        for topic in topics:
            if len(session.producer_topics) < most:
                session.producer_topics.add(topic)
        self.refresh(session)

    def heartbeat(self, session: ClientSession) -> None:
        session.running = True
        self.refresh(session)

    def refresh(self, session: ClientSession) -> None:
        """Re-register a live producer that runs (it heartbeats): keeps it from expiring, and a first registration
        makes its topics' waiting halves due."""
        if not (session.writable and session.running):
            return
        for topic in session.producer_topics:
            self.ctx.producers.register(transaction_group(topic), session.info())

    def closed(self, session: ClientSession) -> None:
        self.ctx.producers.channel_closed(session)

    def terminated(self, client_id: str) -> None:
        """Forget the session of ``client_id`` (its owner terminated it, or it expired)."""
        session = self.by_client.pop(client_id, None)
        if session is not None:
            left = self._per_owner.get(session.owner, 1) - 1
            if left:
                self._per_owner[session.owner] = left
            else:
                self._per_owner.pop(session.owner, None)
            session.end_stream()
            self.ctx.producers.channel_closed(session)

    def close_all(self) -> None:
        for session in list(self.by_client.values()):
            session.end_stream()
            self.ctx.producers.channel_closed(session)
        self.by_client.clear()
        self._per_owner.clear()
