"""Request signing of RocketMQ's ACL (AclUtils), one copy for the client that signs and the broker that checks.

``Signature`` = Base64(HMAC-SHA1(secretKey, the values of every other extField, sorted by key, then the body)).
"""
from __future__ import annotations

import base64
import hashlib
import hmac


def signature(secret_key: str, ext_fields: dict[str, str], body: bytes) -> str:
    """The Signature of a request with these extFields (a Signature among them is left out) and body."""
    content = "".join(ext_fields[k] for k in sorted(ext_fields) if k != "Signature").encode() + (body or b"")
    return base64.b64encode(hmac.new(secret_key.encode(), content, hashlib.sha1).digest()).decode()


def sign(ext_fields: dict[str, str] | None, body: bytes, access_key: str, secret_key: str) -> dict[str, str]:
    """A copy of ``ext_fields`` with AccessKey and its Signature added."""
    ext = dict(ext_fields or {})
    ext["AccessKey"] = access_key
    ext["Signature"] = signature(secret_key, ext, body)
    return ext
