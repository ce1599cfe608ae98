"""RocketMQ 5 clients by client id, and their telemetry streams.

A ``ClientSession`` is what the broker's registries and the check-back scheduler see of a gRPC client: it has the
remoting channel's shape (``writable``, ``unread_bytes``, ``heard_since``, ``send_request``, ``client_id``,
``remote``), so a gRPC producer is registered in ``ctx.producers`` under its topics' transaction groups
(``transaction_group``) and the scheduler's CHECK_TRANSACTION_STATE to it goes out as a server-pushed
RecoverOrphanedTransactionCommand on its telemetry stream. Remoting producers never register under those groups
and gRPC sessions under no other, so a half is checked only over the protocol it came in on.
"""
from __future__ import annotations

import asyncio
import logging
import time

from halfmq.protocol.codes import LanguageCode, RequestCode
from halfmq.protocol.message import decode_record

from ..services.clients import ClientInfo
from .convert import peer_host, to_message
from .schema import pb

log = logging.getLogger(__name__)
#: the producer group a gRPC half of topic T is filed under (5.x producers have no group; any producer of the
#: topic may answer its check, as in the reference)
GRPC_GROUP_PREFIX = "%GRPC%"
_LANGUAGES = {"JAVA": LanguageCode.JAVA, "CPP": LanguageCode.CPP, "DOT_NET": LanguageCode.DOTNET,
              "PYTHON": LanguageCode.PYTHON, "GOLANG": LanguageCode.GO, "RUST": LanguageCode.RUST,
              "PHP": LanguageCode.PHP, "NODE_JS": LanguageCode.NODE_JS, "RUBY": LanguageCode.RUBY}


def transaction_group(topic: str) -> str:
    return GRPC_GROUP_PREFIX + topic


def transaction_id(half_offset: int, queue_offset: int) -> str:
    return f"{half_offset:016X}{queue_offset:016X}"


def parse_transaction_id(text: str) -> tuple[int, int] | None:
    """(half commit-log offset, half queue offset), or None when ``text`` is not one of ours."""
    if len(text) != 32:
        return None
    try:
        return int(text[:16], 16), int(text[16:], 16)
    except ValueError:
        return None


class ClientSession:
    def __init__(self, client_id: str, remote: str, language: str):
        self.client_id = client_id
        self.remote = peer_host(remote) if remote else ""  #: ip:port, as a remoting channel's (admin shows it)
        self.language = _LANGUAGES.get(language, LanguageCode.OTHER)
        self.settings = None
        self.producer_topics: set[str] = set()
        self._outbox: asyncio.Queue | None = None  # the live telemetry stream's, None without one
        self._unread = 0
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

    def heard_since(self, when: float) -> bool:
        return self._last_heard > when

    def heard(self) -> None:
        self._last_heard = time.monotonic()

    def send_request(self, cmd) -> bool:
        """Push a broker-to-client command: a transaction check becomes RecoverOrphanedTransactionCommand;
        remoting-only notifications have no gRPC form and are dropped."""
        if self._outbox is None:
            return False
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return True
        ext = cmd.ext_fields
        rec = decode_record(cmd.body)
        command = pb.TelemetryCommand()
        recover = command.recover_orphaned_transaction_command
        recover.message.CopyFrom(to_message(rec))
        recover.transaction_id = transaction_id(int(ext["commitLogOffset"]), int(ext["tranStateTableOffset"]))
        self._unread += len(cmd.body)
        self._outbox.put_nowait((command, len(cmd.body)))
        return True

    # --- the telemetry stream ---
    def attach(self) -> asyncio.Queue:
        """A new telemetry stream replaces the previous one (the client rebuilt it)."""
        if self._outbox is not None:
            self._outbox.put_nowait(None)
        self._outbox = asyncio.Queue()
        self._unread = 0
        return self._outbox

    def detach(self, outbox: asyncio.Queue) -> bool:
        """The stream of ``outbox`` ended; True when it was the session's live one."""
        if self._outbox is not outbox:
            return False
        self._outbox = None
        self._unread = 0
        return True

    def end_stream(self) -> None:
        """Close the live telemetry stream (the client terminated, or the broker stops)."""
        if self._outbox is not None:
            self._outbox.put_nowait(None)
            self._outbox = None

    def written(self, size: int) -> None:
        self._unread = max(0, self._unread - size)

    def info(self) -> ClientInfo:
        return ClientInfo(self.client_id, self, int(self.language), 0)


class Sessions:
    """Sessions by client id; a producer session is registered in ``ctx.producers`` for each topic it publishes."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.by_client: dict[str, ClientSession] = {}

    def get(self, client_id: str, remote: str = "", language: str = "") -> ClientSession:
        session = self.by_client.get(client_id)
        if session is None:
            session = self.by_client[client_id] = ClientSession(client_id, remote, language)
        session.heard()
        return session

    def publishes(self, session: ClientSession, topics) -> None:
        """``session`` produces to ``topics``: it may answer their halves' checks (once its stream is live)."""
        for topic in topics:
            session.producer_topics.add(topic)
        self.refresh(session)

    def refresh(self, session: ClientSession) -> None:
        """Re-register a live producer (a heartbeat): keeps it from expiring, and a first registration makes its
        topics' waiting halves due."""
        if not session.writable:
            return
        for topic in session.producer_topics:
            self.ctx.producers.register(transaction_group(topic), session.info())

    def closed(self, session: ClientSession) -> None:
        self.ctx.producers.channel_closed(session)

    def terminated(self, client_id: str) -> None:
        session = self.by_client.pop(client_id, None)
        if session is not None:
            session.end_stream()
            self.ctx.producers.channel_closed(session)

    def close_all(self) -> None:
        for session in list(self.by_client.values()):
            session.end_stream()
            self.ctx.producers.channel_closed(session)
        self.by_client.clear()
