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


@pytest.mark.parametrize("flag", ["--brokerName=a<b>", "--brokerClusterName=x;y", "--namesrvAddr=host-without-port"])
def test_cli_refuses_a_bad_broker_name_or_name_server_address_before_making_a_store(tmp_path, flag):
    store = tmp_path / "store"
    result = run_cli("broker", "--bindAddress=127.0.0.1", "--listenPort=0", "--namesrvListenPort=-1",
                     "--dashboardPort=-1", "--grpcListenPort=-1", "--metricsPromExporterPort=-1",
                     f"--storePathRootDir={store}", flag)
    assert result.returncode == 2, result
    assert flag.split("=")[0].lstrip("-") in result.stderr
    assert not store.exists()


def test_cli_starts_logs_effective_config_and_stops_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "halfmq.broker.cli", "broker", "--bindAddress=127.0.0.1",
                             "--listenPort=0", "--namesrvListenPort=0", f"--storePathRootDir={tmp_path}",
                             "--mapSize=67108864", "--metricsPromExporterPort=0", "--grpcListenPort=-1",
                             "--dashboardPort=0"],
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


@pytest.mark.parametrize("env, needle", [
    ({"HALFMQ_transactionTimeout": "3000"}, "did you mean 'transactionTimeOut'?"),
    ({"HALFMQ_listenport": "1"}, "did you mean 'listenPort'?"),
])
def test_environment_keys_follow_the_flags_case_rules(env, needle):
    """A wrong-case key is refused with the flag's "did you mean"; RocketMQ spelling and all upper case are taken."""
    with pytest.raises(ConfigError, match=re.escape(needle)) as refused:
        load_config(None, [], env)
    assert next(iter(env)) in str(refused.value)
    flag = next(iter(env))[len("HALFMQ_"):]
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(None, [f"--{flag}=1"], {})
    assert load_config(None, [], {"HALFMQ_TRANSACTIONTIMEOUT": "3000"}).transactionTimeOut == 3000
    assert load_config(None, [], {"HALFMQ_transactionTimeOut": "3000"}).transactionTimeOut == 3000


def test_cli_refuses_wrong_case_environment_key():
    result = run_cli("broker", "--listenPort=0", env={"HALFMQ_transactionTimeout": "3000"})
    assert result.returncode == 2
    assert "did you mean 'transactionTimeOut'?" in result.stderr


@pytest.mark.parametrize("setting", ["listenPort", "namesrvListenPort", "metricsPromExporterPort", "dashboardPort"])
def test_cli_port_in_use_is_one_clear_line(tmp_path, setting):
    """A port in use: exit 1 with one line naming the setting and the port; everything started is stopped (no
    asyncio noise, no writer process left holding the store: the store opens again at once)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = {"listenPort": 0, "namesrvListenPort": 0, "metricsPromExporterPort": 0, "grpcListenPort": -1,
                 "dashboardPort": 0, setting: port}
        result = run_cli("broker", "--bindAddress=127.0.0.1", f"--storePathRootDir={tmp_path}", "--mapSize=67108864",
                         *(f"--{key}={value}" for key, value in flags.items()))
    assert result.returncode == 1, result
    output = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(output) == 1, output
    assert setting in output[0] and str(port) in output[0] and "in use" in output[0]


@pytest.mark.parametrize("where", ["under-a-file", "a-file"])
def test_cli_store_folder_that_cannot_be_made_names_its_key(tmp_path, where):
    """A store folder that cannot be created (a parent is a file, or it is one): exit 1 with one line naming
    storePathRootDir, not a bare [Errno 20]."""
    (tmp_path / "file").write_text("")
    store = tmp_path / "file" / "store" if where == "under-a-file" else tmp_path / "file"
    result = run_cli("broker", "--bindAddress=127.0.0.1", f"--storePathRootDir={store}", "--listenPort=0",
                     "--namesrvListenPort=0", "--metricsPromExporterPort=-1", "--grpcListenPort=-1", "--dashboardPort=-1")
    assert result.returncode == 1, result
    output = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(output) == 1, output
    assert f"storePathRootDir={store}" in output[0] and "Not a directory" in output[0], output


async def test_failed_start_stops_what_it_started(tmp_path):
    """Broker.start failing at its last step (the metrics port) leaves no task running and the store closed."""
    import asyncio
    import socket

    from halfmq.broker.server import Broker, StartError
    from tests.conftest import broker_config

    before = asyncio.all_tasks()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = Broker(broker_config(tmp_path / "store", metricsPromExporterPort=port))
        with pytest.raises(StartError, match=f"metricsPromExporterPort={port}"):
            await broker.start()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() <= before
    assert broker.store.closed
    assert all(not server.is_serving() for server in broker.servers)
    again = Broker(broker_config(tmp_path / "store"))
    await again.start()  # the failed start released the store
    await again.stop()


def test_the_configuration_reference_is_generated_from_the_tables():
    """A key added to BrokerConfig or NamesrvConfig goes into conf/broker.conf (the test above) and into
    docs/configuration-reference.md, which scripts/config_reference.py writes from the tables."""
    assert "scripts/config_reference.py" in (ROOT / "docs" / "configuration.md").read_text()
    import importlib.util

    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    assert reference.PAGE.read_text() == reference.page(), (
        "docs/configuration-reference.md differs from the configuration tables: run "
        ".venv/bin/python scripts/config_reference.py")
