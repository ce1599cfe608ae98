"""Configuration: RocketMQ keys from file, environment and flags; bad keys refuse start-up by name."""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from halfmq.broker.config import BrokerConfig, ConfigError, load_config, parse_properties

ROOT = Path(__file__).resolve().parents[2]


def test_precedence_file_then_environment_then_flags(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("# comment\nlistenPort = 1111\ntransactionTimeOut: 2000\nbrokerName broker-x\n")
    config = load_config(str(conf), ["--listenPort=3333"], {"HALFMQ_transactionTimeOut": "4000",
                                                             "HALFMQ_BROKERNAME": "broker-env"})
    assert config.listenPort == 3333
    assert config.transactionTimeOut == 4000
    assert config.brokerName == "broker-env"


@pytest.mark.parametrize("args, env, needle", [
    (["--listenport=1"], {}, "'listenport'"),
    (["--transactionTimeOut=soon"], {}, "transactionTimeOut"),
    (["--flushDiskType=SOMETIMES"], {}, "flushDiskType"),
    (["--autoCreateTopicEnable=yes"], {}, "autoCreateTopicEnable"),
    (["--listenPort=70000"], {}, "listenPort"),
    (["--messageDelayLevel=1s 2x"], {}, "messageDelayLevel"),
    (["listenPort=1"], {}, "--KEY=VALUE"),
    ([], {"HALFMQ_NOPE": "1"}, "HALFMQ_NOPE"),
])
def test_bad_values_name_the_key(args, env, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(None, args, env)


def test_file_errors_name_the_key_and_file(tmp_path):
    conf = tmp_path / "b.conf"
    conf.write_text("brokerName=a\nnoSuchKey=1\n")
    with pytest.raises(ConfigError, match="noSuchKey.*b.conf"):
        load_config(str(conf), [], {})
    conf.write_text("brokerName=a\nbrokerName=b\n")
    with pytest.raises(ConfigError, match="twice"):
        load_config(str(conf), [], {})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.conf"), [], {})


def test_properties_syntax():
    assert parse_properties("a=1\n! bang\n  b : two words \nc\\\n  ontinued=3\nd\n") == {
        "a": "1", "b": "two words", "continued": "3", "d": ""}


def test_shipped_conf_lists_every_key_and_parses():
    text = (ROOT / "conf" / "broker.conf").read_text()
    for field in dataclasses.fields(BrokerConfig):
        assert re.search(rf"^#{field.name}=", text, re.M), f"{field.name} missing from conf/broker.conf"
    assert load_config(str(ROOT / "conf" / "broker.conf"), [], {}) == BrokerConfig()


def run_cli(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "halfmq.broker.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_cli_refuses_unknown_key_naming_it():
    result = run_cli("broker", "--listenPort=0", "--noSuchKey=1")
    assert result.returncode == 2
    assert "noSuchKey" in result.stderr


def test_cli_starts_logs_effective_config_and_stops_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "halfmq.broker.cli", "broker", "--bindAddress=127.0.0.1",
                             "--listenPort=0", "--namesrvListenPort=0", f"--storePathRootDir={tmp_path}",
                             "--mapSize=67108864", "--metricsPromExporterPort=0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "halfmq ready:" in line:
                break
        text = "".join(seen)
        assert re.search(r"halfmq ready: broker 127\.0\.0\.1:\d+ namesrv 127\.0\.0\.1:\d+", text), text
        assert "effective configuration:" in text and "mapSize=67108864" in text
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[0]
        assert proc.returncode == 0, rest
        assert "halfmq stopped" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
