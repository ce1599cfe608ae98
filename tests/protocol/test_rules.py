"""protocol/rules.py and protocol/signing.py: the rules every side shares, written once."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from halfmq.broker import names
from halfmq.broker.acl import Account, AccessValidator
from halfmq.broker.errors import BrokerError
from halfmq.client.remoting import Credentials
from halfmq.protocol.codes import RequestCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.rules import MAX_GROUP_LENGTH, MAX_MESSAGE_KEY_BYTES, MAX_TOPIC_LENGTH, is_group, is_message_key, is_topic

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "transactions", "store", "broker", "client", "pipeline", "dashboard")
#: what a rule's copy looks like in code: a pattern of the name characters, the retry and dead-letter prefixes
#: as values of their own (prose that names them is no copy)
PATTERN_TEXT = "a-zA-Z0-9_-"
PREFIXES = ("%RETRY%", "%DLQ%")


@pytest.mark.parametrize("value", ["Orders", "%RETRY%g", "a|b", "x" * MAX_GROUP_LENGTH, "x" * (MAX_GROUP_LENGTH + 1),
                                   "x" * MAX_TOPIC_LENGTH, "x" * (MAX_TOPIC_LENGTH + 1), "", "a b", "a\x00", "é"])
def test_the_dashboards_checks_are_the_brokers(value):
    """What the dashboard and clients check before asking is exactly what the broker refuses."""
    for shared, broker_check in ((is_topic, names.check_topic), (is_group, names.check_group)):
        try:
            broker_check(value)
            accepted = True
        except BrokerError:
            accepted = False
        assert shared(value) == accepted, (shared.__name__, value)


@pytest.mark.parametrize("value", ["order-1", "k" * MAX_MESSAGE_KEY_BYTES, "k" * (MAX_MESSAGE_KEY_BYTES + 1),
                                   "é" * (MAX_MESSAGE_KEY_BYTES // 2), "é" * (MAX_MESSAGE_KEY_BYTES // 2 + 1), "",
                                   "a b", "a\tb", "a\x85b", "a\ud800", "a\x7f"])
def test_the_dashboards_key_check_is_the_brokers(value):
    try:
        names.check_message_key(value)
        accepted = True
    except BrokerError:
        accepted = False
    assert is_message_key(value) == accepted, value


def test_a_signed_request_passes_the_brokers_check_and_a_changed_one_does_not():
    creds = Credentials("app", "secret-1")
    ext = creds.sign({"topic": "Orders", "queueId": "1"}, b"body")
    validator = AccessValidator({"app": Account("app", "secret-1", admin=True)})
    cmd = RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, ext_fields=ext, body=b"body")
    assert validator._account(cmd).access_key == "app"
    cmd.body = b"other body"
    with pytest.raises(BrokerError, match="signature"):
        validator._account(cmd)


def test_each_rule_is_written_once():
    """The name pattern and the retry and dead-letter prefixes appear in code only in protocol/rules.py; MAX_QUEUES
    is defined only there (docstrings and comments may name them)."""
    copies = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel == "protocol/rules.py":
                continue
            tree = ast.parse(path.read_text(), rel)
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                          and node.body and isinstance(node.body[0], ast.Expr)
                          and isinstance(node.body[0].value, ast.Constant)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                    if PATTERN_TEXT in node.value or node.value in PREFIXES:
                        copies.append(f"{rel}:{node.lineno} {node.value!r}")
                elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MAX_QUEUES"
                                                          for t in node.targets):
                    copies.append(f"{rel}:{node.lineno} MAX_QUEUES =")
    assert not copies, "rules copied outside protocol/rules.py:\n" + "\n".join(copies)
