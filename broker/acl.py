"""Access control compatible with RocketMQ 4.x plain ACL (conf/plain_acl.yml), and the admin-code rule.

A request is signed by the client: ``Signature`` = Base64(HMAC-SHA1(secretKey, values of all other extFields
sorted by key, then the body)), with ``AccessKey`` (and optionally ``SecurityToken``) among the fields. Accounts
grant topics and groups DENY, PUB, SUB or PUB|SUB, with defaults for unlisted resources; admin requests need an
admin account. With ACL off, admin requests are served to loopback peers only.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
from dataclasses import dataclass, field

import yaml

from halfmq.protocol.codes import ADMIN_REQUEST_CODES, RequestCode, ResponseCode

from .errors import BrokerError
from .topics import RETRY_PREFIX

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


def signature(secret_key: str, ext_fields: dict[str, str], body: bytes) -> str:
    """RocketMQ's AclUtils: HMAC-SHA1 over the sorted extField values (without Signature) and the body."""
    content = "".join(ext_fields[k] for k in sorted(ext_fields) if k != "Signature").encode() + (body or b"")
    return base64.b64encode(hmac.new(secret_key.encode(), content, hashlib.sha1).digest()).decode()


def is_loopback(remote: str) -> bool:
    host = remote.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _send_topic(ext: dict[str, str]) -> str | None:
    return ext.get("b") or ext.get("topic")


class AccessValidator:
    """Checks each request; raises BrokerError(NO_PERMISSION) when it is not allowed."""

    def __init__(self, accounts: dict[str, Account] | None):
        self.accounts = accounts  # None: ACL off

    def check(self, channel, cmd) -> None:
        if self.accounts is None:
            if cmd.code in ADMIN_REQUEST_CODES and not is_loopback(channel.remote):
                raise BrokerError(ResponseCode.NO_PERMISSION,
                                  f"admin request {cmd.code} is only served to loopback clients when ACL is off")
            return
        ext = cmd.ext_fields
        account = self.accounts.get(ext.get("AccessKey", ""))
        if account is None:
            raise BrokerError(ResponseCode.NO_PERMISSION, f"no account for AccessKey {ext.get('AccessKey', '')!r}")
        expected = signature(account.secret_key, ext, cmd.body)
        if not hmac.compare_digest(expected.encode(), ext.get("Signature", "").encode()):
            raise BrokerError(ResponseCode.NO_PERMISSION, "the signature does not match")
        if cmd.code in ADMIN_REQUEST_CODES:
            if not account.admin:
                raise BrokerError(ResponseCode.NO_PERMISSION, f"request {cmd.code} needs an admin account")
            return
        for kind, resource, needed in self._resources(cmd):
            if account.admin:
                continue
            if not account.allows(kind, resource, needed):
                raise BrokerError(ResponseCode.NO_PERMISSION,
                                  f"{account.access_key} may not {'publish to' if needed == PUB else 'subscribe'} "
                                  f"{kind} {resource}")

    @staticmethod
    def _resources(cmd):
        code, ext = cmd.code, cmd.ext_fields
        if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
            topic = _send_topic(ext) or ""
            if topic.startswith(RETRY_PREFIX):
                yield "group", topic[len(RETRY_PREFIX):], SUB
            else:
                yield "topic", topic, PUB
        elif code == RequestCode.END_TRANSACTION:
            yield "group", ext.get("producerGroup", ""), PUB
        elif code == RequestCode.PULL_MESSAGE:
            topic = ext.get("topic", "")
            if not topic.startswith(RETRY_PREFIX):
                yield "topic", topic, SUB
            yield "group", ext.get("consumerGroup", ""), SUB
        elif code in (RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET):
            yield "topic", ext.get("topic", ""), SUB
            yield "group", ext.get("consumerGroup", ""), SUB
        elif code in (RequestCode.GET_CONSUMER_LIST_BY_GROUP, RequestCode.UNREGISTER_CLIENT):
            if ext.get("consumerGroup"):
                yield "group", ext["consumerGroup"], SUB
        elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
            yield "group", ext.get("group", ""), SUB
        elif code == RequestCode.HEART_BEAT:
            try:
                data = json.loads(cmd.body or b"{}")
            except (ValueError, RecursionError):
                return  # not a heartbeat to take groups from; its processor answers the malformed body
            if not isinstance(data, dict):
                return
            for consumer in data.get("consumerDataSet") or []:
                if isinstance(consumer, dict):
                    yield "group", str(consumer.get("groupName", "")), SUB
                    for sub in consumer.get("subscriptionDataSet") or []:
                        topic = str(sub.get("topic", "")) if isinstance(sub, dict) else ""
                        if topic and not topic.startswith(RETRY_PREFIX):
                            yield "topic", topic, SUB
