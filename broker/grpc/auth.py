"""Who is calling: the RocketMQ 5 clients' request metadata, and their ACL signature.

Every call carries ``x-mq-client-id`` and, with credentials, ``authorization: MQv2-HMAC-SHA1 Credential=<access
key>, SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(secret key, x-mq-date-time)>``. The accounts and the
permission rules are the remoting ones (broker/acl.py: plain_acl.yml, ``owner``'s retry/DLQ and system-topic
rules, ``check_read`` for every read of a topic, with ACL on or off).

The client id obeys the remoting rule (names.check_client_id: 1-255 bytes, no control character) and is who the
call's session is (sessions.py); it carries its owner (``ClientId.owner``): the account with ACL on, the client's
address with ACL off. Every lookup of a session by it, in whichever module, is checked against the session's owner.

A signature must cover x-mq-date-time, and that time must be within authorizationSkewSeconds of the broker's clock
(acl.check_signed_time, the remoting door's rule too): a captured authorization header is refused UNAUTHORIZED
once the window has passed.
"""
from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time

from ..acl import PUB, SUB, AccessValidator, Account, check_signed_time
from ..errors import BrokerError, Failure
from ..names import check_client_id
from .convert import peer_host
from .recent import remember
from .schema import Code
from .status import GrpcError

_AUTHORIZATION = re.compile(r"MQv2-HMAC-SHA1\s+Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),\s*Signature=(\w+)")
TOPIC, GROUP = "topic", "group"
DATE_TIME = "x-mq-date-time"  #: when the client signed the call, ``%Y%m%dT%H%M%SZ`` (UTC)


class ClientId(str):
    """A caller's client id with whom it was presented by: ``owner`` is ``account <access key>`` with ACL on and
    ``address <host>`` with ACL off (all the broker knows of a client then; a client's connections to several
    advertised endpoints all come from its host)."""

    __slots__ = ("owner",)

    def __new__(cls, text: str, owner: str):
        self = super().__new__(cls, text)
        self.owner = owner
        return self


class Caller:
    """The metadata of one call: the client id (with its owner), the peer's ``host:port`` and, with ACL on, its
    account."""

    __slots__ = ("client_id", "account", "namespace", "language", "remote")

    def __init__(self, client_id: ClientId, account: Account | None, namespace: str, language: str, remote: str):
        self.client_id = client_id
        self.account = account
        self.namespace = namespace
        self.language = language
        self.remote = remote


def metadata_of(context) -> dict[str, str]:
    return {key: value for key, value in (context.invocation_metadata() or ())
            if isinstance(value, str)}


#: with ACL off, the callers of the latest (metadata, peer) pairs: a client's calls repeat theirs (``authenticate``)
_UNSIGNED: dict[tuple, Caller] = {}
UNSIGNED_CALLERS = 256  #: pairs remembered, each of at most UNSIGNED_METADATA_BYTES of metadata
UNSIGNED_METADATA_BYTES = 4096


def authenticate(validator: AccessValidator, context) -> Caller:
    """The caller of ``context``'s call; with ACL on, its signature is checked (every call: it must be recent).

    Raises:
        GrpcError: CLIENT_ID_REQUIRED without x-mq-client-id, BAD_REQUEST for one the remoting rule refuses;
            UNAUTHORIZED for a missing or wrong signature.
    """
    if validator.enabled:
        return _authenticate(validator, context)
    key = (context.invocation_metadata(), context.peer())
    caller = _UNSIGNED.get(key)
    if caller is None:
        caller = _authenticate(validator, context)
        remember(_UNSIGNED, key, caller, key[0] or (), UNSIGNED_CALLERS, UNSIGNED_METADATA_BYTES)
    return caller


def _authenticate(validator: AccessValidator, context) -> Caller:
    meta = metadata_of(context)
    client_id = meta.get("x-mq-client-id", "")
    if not client_id:
        raise GrpcError(Code["CLIENT_ID_REQUIRED"], "the x-mq-client-id metadata is required")
    try:
        check_client_id(client_id, "x-mq-client-id")
    except BrokerError as exc:
        raise GrpcError(Code["BAD_REQUEST"], exc.remark) from None
    remote = peer_host(context.peer() or "")
    account = None
    if validator.enabled:
        match = _AUTHORIZATION.fullmatch(meta.get("authorization", "").strip())
        if match is None:
            raise GrpcError(Code["UNAUTHORIZED"], "ACL is on: the authorization metadata (MQv2-HMAC-SHA1) is "
                                                  "missing or malformed")
        access_key, signed, signature = match.groups()
        account = validator.accounts.get(access_key)
        if account is None:
            raise GrpcError(Code["UNAUTHORIZED"], f"no account for access key {access_key!r}")
        names = [name.strip() for name in signed.split(";")]
        signed_text = "".join(meta.get(name, "") for name in names)
        expected = hmac.new(account.secret_key.encode(), signed_text.encode(), hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected.lower(), signature.lower()):
            raise GrpcError(Code["UNAUTHORIZED"], "the signature does not match")
        if DATE_TIME not in names:
            raise BrokerError(Failure.SIGNATURE_EXPIRED, f"the signature must cover {DATE_TIME}: without it, it "
                                                         f"holds for ever")
        check_signed_time(signed_at(meta.get(DATE_TIME, "")), validator.skew_seconds)
    owner = f"account {account.access_key}" if account is not None else f"address {remote.rsplit(':', 1)[0]}"
    return Caller(ClientId(client_id, owner), account, meta.get("x-mq-namespace", ""), meta.get("x-mq-language", ""),
                  remote)


def signed_at(text: str) -> int:
    """x-mq-date-time in ms since the epoch.

    Raises:
        BrokerError: SIGNATURE_EXPIRED for a time that does not parse (it names no time the broker could accept).
    """
    try:
        return calendar.timegm(time.strptime(text, "%Y%m%dT%H%M%SZ")) * 1000
    except ValueError:
        raise BrokerError(Failure.SIGNATURE_EXPIRED, f"{DATE_TIME} {text[:32]!r} is not a time "
                                                     f"(%Y%m%dT%H%M%SZ)") from None


def require(caller: Caller, *needs: tuple[str, str, int]) -> None:
    """Each (kind, name, permission) must be granted to the caller's account; SUB on a topic (reading it) is
    decided by AccessValidator.check_read, the rule the remoting door uses too (with ACL off: system topics to
    loopback callers only).

    Raises:
        GrpcError: FORBIDDEN naming the resource.
    """
    account = caller.account
    for kind, name, perm in needs:
        try:
            if kind == TOPIC and perm == SUB:
                AccessValidator.check_read(account, caller.remote, name)
            elif account is not None and not account.admin:
                AccessValidator._require(account, kind, name, perm)
        except BrokerError as exc:
            raise GrpcError(Code["FORBIDDEN"], exc.remark) from None


def may_publish(caller: Caller, topic: str) -> bool:
    """Is the caller allowed to publish to ``topic`` (and so to have it auto-created, as a remoting send may)?"""
    try:
        require(caller, (TOPIC, topic, PUB))
    except GrpcError:
        return False
    return True


__all__ = ["Caller", "ClientId", "authenticate", "may_publish", "require", "PUB", "SUB", "TOPIC", "GROUP"]
