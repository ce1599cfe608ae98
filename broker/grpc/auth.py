"""Who is calling: the RocketMQ 5 clients' request metadata, and their ACL signature.

Every call carries ``x-mq-client-id`` and, with credentials, ``authorization: MQv2-HMAC-SHA1 Credential=<access
key>, SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(secret key, x-mq-date-time)>``. The accounts and the
permission rules are the remoting ones (broker/acl.py: plain_acl.yml, ``owner``'s retry/DLQ and system-topic
rules); what each RPC needs is listed in one table, ``NEEDS`` in the modules that serve them.
"""
from __future__ import annotations

import hashlib
import hmac
import re

from ..acl import PUB, SUB, AccessValidator, Account
from ..errors import BrokerError
from .schema import Code
from .status import GrpcError

_AUTHORIZATION = re.compile(r"MQv2-HMAC-SHA1\s+Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),\s*Signature=(\w+)")
TOPIC, GROUP = "topic", "group"


class Caller:
    """The metadata of one call: the client id and, with ACL on, its account."""

    __slots__ = ("client_id", "account", "namespace", "language")

    def __init__(self, client_id: str, account: Account | None, namespace: str, language: str):
        self.client_id = client_id
        self.account = account
        self.namespace = namespace
        self.language = language


def metadata_of(context) -> dict[str, str]:
    return {key: value for key, value in (context.invocation_metadata() or ())
            if isinstance(value, str)}


def authenticate(validator: AccessValidator, context) -> Caller:
    """The caller of ``context``'s call; with ACL on, its signature is checked.

    Raises:
        GrpcError: CLIENT_ID_REQUIRED without x-mq-client-id; UNAUTHORIZED for a missing or wrong signature.
    """
    meta = metadata_of(context)
    client_id = meta.get("x-mq-client-id", "")
    if not client_id:
        raise GrpcError(Code["CLIENT_ID_REQUIRED"], "the x-mq-client-id metadata is required")
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
        signed_text = "".join(meta.get(name.strip(), "") for name in signed.split(";"))
        expected = hmac.new(account.secret_key.encode(), signed_text.encode(), hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected.lower(), signature.lower()):
            raise GrpcError(Code["UNAUTHORIZED"], "the signature does not match")
    return Caller(client_id, account, meta.get("x-mq-namespace", ""), meta.get("x-mq-language", ""))


def require(caller: Caller, *needs: tuple[str, str, int]) -> None:
    """Each (kind, name, permission) must be granted to the caller's account (nothing to check with ACL off).

    Raises:
        GrpcError: FORBIDDEN naming the resource.
    """
    account = caller.account
    if account is None or account.admin:
        return
    for kind, name, perm in needs:
        try:
            AccessValidator._require(account, kind, name, perm)
        except BrokerError as exc:
            raise GrpcError(Code["FORBIDDEN"], exc.remark) from None


def require_any(caller: Caller, kind: str, name: str) -> None:
    """PUB or SUB on the resource (a route is asked for by producers and consumers alike)."""
    try:
        require(caller, (kind, name, PUB))
    except GrpcError:
        require(caller, (kind, name, SUB))


__all__ = ["Caller", "authenticate", "require", "require_any", "PUB", "SUB", "TOPIC", "GROUP"]
