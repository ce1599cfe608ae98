"""Every fenced code block of README.md and of the pages of docs/ runs as written, against a live broker
(docs/ARCHITECTURE.md aside: a map of the code, whose diagrams are text).

How each kind of block runs (the pages themselves are never edited for the test):

- ```python: saved as a script in a temp folder and run there with ``.venv/bin/python``, NAMESRV_ADDR set to the
  test broker's name server. The examples read it (``os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876")``), so they
  run unchanged against the default broker too; a block that writes an address in any other way is refused.
  A block that uses Spark also runs with each invocation in SPARK_INVOCATIONS, which docs/spark.md shows.
- ```bash / ```sh: command by command from the repository root. REWRITES points them at the test: the default
  name-server address becomes the test broker's and ``/tmp/`` a temp folder. A command that starts a broker
  (BROKER_START) runs for ever: it gets free loopback ports and a temp store (port flags rewritten, HALFMQ_ variables
  for what it does not set), is checked ready (its ready line, then a request answered through its name server),
  and is stopped by its PID with SIGTERM, which must end it cleanly.
- ```properties: not run; every key must be a real configuration key with a valid value.
- ```text: output shown, not run. A block without a language fails: say what it is.
- SKIPPED lists, with the reason, the commands that cannot run here.

Every block runs as if typed into a fresh shell: PYSPARK_PYTHON, PYSPARK_DRIVER_PYTHON and VIRTUAL_ENV unset and
``.venv/bin`` off the PATH (an activated venv would hide a README that only works inside one). The whole file takes
about 100 s on the 2-core machine, 95 of them in the three Spark runs (marked ``spark`` and ``slow``): the Spark
example with each invocation and the audit job. Each block runs alone (the tests may run on several workers): the
broker holds a message on Orders from the start.
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from halfmq.broker.config import build_config, parse_properties
from halfmq.client import BlockingProducer, Message
from halfmq.client.admin import Admin

from tests.support.broker_process import BrokerProcess
from tests.support.broker_thread import BrokerThread

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
#: the pages whose blocks run: the README and docs/, but the map of the code
DOCS = [README] + sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "ARCHITECTURE.md")
VENV_BIN = REPO / ".venv" / "bin"
DEFAULT_NAMESRV = "127.0.0.1:9876"
#: How the README's Python examples find the name server (and the only address a Python block may write).
NAMESRV_LOOKUP = f'os.environ.get("NAMESRV_ADDR", "{DEFAULT_NAMESRV}")'

#: Shell commands that cannot run in this test, by a pattern they match, and why.
SKIPPED = {
    r"^bash scripts/test\.sh": "the whole test suite, this test included; CI runs it",
    r"^(sudo )?docker\b": "tests/test_docker.py builds the image and runs it under dockerd",
}
#: A shell command that starts a broker (it runs until stopped).
BROKER_START = re.compile(r"(^|\s)(\S*halfmq broker|bash scripts/start_broker\.sh)\b")
#: The README's ways of running a Spark example saved as app.py; each runs every Spark block.
SPARK_INVOCATIONS = (".venv/bin/python app.py", "PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit app.py")
#: What a block's output must show, by a string that identifies the block.
EXPECTED_OUTPUT = {
    "PushConsumer(": ["SEND_OK", "Orders created order-1"],
    "send_message_in_transaction": ["COMMIT_MESSAGE"],
    "producer.transaction(": ["committed order and message"],
    "pyspark": [r"\d+ orders in parquet"],
    "transaction_audit": ["committed"],
}
TIMEOUT = {"run": 120, "spark": 300}  # seconds


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    section: str
    line: int
    page: str = "README.md"  #: the page, relative to the repository

    @property
    def name(self) -> str:
        section = re.sub(r'[^a-z0-9]+', '-', self.section.lower()).strip('-')
        return f"{Path(self.page).stem}-{section}-L{self.line}-{self.lang}"

    @property
    def uses_spark(self) -> bool:
        return "pyspark" in self.text or "spark-submit" in self.text or "halfmq.pipeline.jobs" in self.text


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    """Fenced blocks (indented ones too, as in list items), with the heading they are under."""
    blocks, section, fence = [], "top", None
    for number, line in enumerate(text.splitlines(), 1):
        if fence is None:
            if match := re.match(r"#+\s+(.*)", line):
                section = match.group(1)
            elif match := re.match(r"(\s*)```\s*(\S*)\s*$", line):
                fence, indent, lang, start, body = True, len(match.group(1)), match.group(2), number, []
        elif line.strip() == "```":
            blocks.append(Block(lang, "".join(body), section, start, page))
            fence = None
        else:
            body.append((line[indent:] if not line[:indent].strip() else line.lstrip()) + "\n")
    assert fence is None, f"{page}: the block opened at line {start} is never closed"
    return blocks


BLOCKS = [block for doc in DOCS for block in readme_blocks(doc.read_text(), str(doc.relative_to(REPO)))]


def shell_commands(block: Block) -> list[str]:
    """One entry per command: continuation lines joined, blank lines and comments dropped."""
    joined = re.sub(r"\\\n\s*", "", block.text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def skip_reason(command: str) -> str | None:
    return next((why for pattern, why in SKIPPED.items() if re.search(pattern, command)), None)


def fresh_shell_env(**extra: str) -> dict[str, str]:
    """The environment of a new shell with the venv not activated, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HALFMQ_", "PYSPARK_")) and k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and Path(p).resolve() != VENV_BIN.resolve())
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def readme_broker(tmp_path_factory):
    """One broker for every block, which run in README order as a reader would run them (a message on Orders from
    the start lets any one of them run alone)."""
    bt = BrokerThread(tmp_path_factory.mktemp("readme") / "store")
    with BlockingProducer("readme-seed", bt.broker.namesrv_addr) as producer:  # so that any block can run alone
        producer.send(Message("Orders", b'{"id": 0}', tags="created", keys="order-0"))
    yield bt.broker
    bt.stop()


async def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    """Run to completion; fail with the output unless it exits 0 within ``timeout``. Returns the output."""
    proc = await asyncio.create_subprocess_exec(*args, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = await proc.communicate()
        pytest.fail(f"{' '.join(args)} still running after {timeout} s:\n{out.decode(errors='replace')[-4000:]}")
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"{' '.join(args)} exited with {proc.returncode}:\n{text[-6000:]}"
    return text


def check_expected_output(block: Block, output: str) -> None:
    for marker, patterns in EXPECTED_OUTPUT.items():
        if marker in block.text:
            for pattern in patterns:
                assert re.search(pattern, output), f"{block.name}: no {pattern!r} in its output:\n{output[-4000:]}"


def example_env(namesrv: str, tmp_path: Path) -> dict[str, str]:
    """A reader's shell pointed at the test broker, with its temp files (the Spark sink's owner records,
    sink_lease.py) in the test's folder rather than /tmp."""
    return fresh_shell_env(NAMESRV_ADDR=namesrv, TMPDIR=str(tmp_path))


async def run_python(block: Block, namesrv: str, tmp_path: Path) -> None:
    env = example_env(namesrv, tmp_path)
    invocations = SPARK_INVOCATIONS if "pyspark" in block.text else (".venv/bin/python app.py",)
    for number, invocation in enumerate(invocations):
        folder = tmp_path / str(number)  # what one run leaves (a stream's checkpoint) must not steer the next
        folder.mkdir()
        (folder / "app.py").write_text(block.text)
        # The README's invocation, run from the script's folder: .venv/ is the repository's.
        command = invocation.replace(".venv/", f"{VENV_BIN.parent}/")
        output = await run(["bash", "-c", command], folder, env, TIMEOUT["spark" if block.uses_spark else "run"])
        check_expected_output(block, output)


#: (pattern, replacement, why) applied to every shell command.
REWRITES = (
    (re.escape(DEFAULT_NAMESRV), "{namesrv}", "the test broker's name server instead of the default one"),
    (r"(?<![\w.])/tmp/", "{tmp}/", "the test's temp folder instead of /tmp"),
)
#: Applied to broker start-ups only: free loopback ports and a temp store whatever the flags say.
BROKER_REWRITES = (
    (r"--(listenPort|namesrvListenPort|metricsPromExporterPort|dashboardPort)=\d+", r"--\1=0", "any free port"),
    (r"--bindAddress=\S+", "--bindAddress=127.0.0.1", "loopback only"),
    (r"--storePathRootDir=\S+", "--storePathRootDir={tmp}/store", "a temp store"),
)
BROKER_ENV = {"HALFMQ_bindAddress": "127.0.0.1", "HALFMQ_listenPort": "0", "HALFMQ_namesrvListenPort": "0",
              "HALFMQ_metricsPromExporterPort": "0", "HALFMQ_storePathRootDir": "{tmp}/store",
              "HALFMQ_grpcListenPort": "0", "HALFMQ_dashboardPort": "0"}


def rewrite(command: str, rules, **values: str) -> str:
    for pattern, replacement, _why in rules:
        command = re.sub(pattern, replacement.format(**values), command)
    return command


async def run_broker_start(command: str, tmp_path: Path, monkeypatch) -> None:
    """Start it, see it ready and answering, stop it by its PID: it must exit 0 and leave nothing running."""
    env = fresh_shell_env(**{key: value.format(tmp=tmp_path) for key, value in BROKER_ENV.items()})
    for key in [k for k in os.environ if k not in env]:  # BrokerProcess starts it with this process's environment
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(REPO)
    broker = BrokerProcess(tmp_path / "store")
    # `bash -c` runs a lone command in its own process (exec), so the PID is the broker's (start_broker.sh
    # execs it too): SIGTERM reaches the broker itself.
    broker.args = ["bash", "-c", rewrite(command, BROKER_REWRITES, tmp=str(tmp_path))]
    await broker.start(timeout=120)
    try:
        async with Admin(broker.namesrv) as admin:
            assert (await asyncio.wait_for(admin.cluster_info(), 30))["brokerAddrTable"], broker.output()
        broker.proc.send_signal(signal.SIGTERM)
        status = await asyncio.wait_for(broker.proc.wait(), 60)
        assert status == 0, f"{command}: exited with {status} on SIGTERM:\n{broker.output()}"
    finally:
        await broker.stop()


async def run_shell(block: Block, namesrv: str, tmp_path: Path, monkeypatch) -> None:
    commands = shell_commands(block)
    if all(skip_reason(c) for c in commands):
        pytest.skip("; ".join(dict.fromkeys(skip_reason(c) for c in commands)))
    for command in commands:
        if skip_reason(command):
            print(f"skipped {command!r}: {skip_reason(command)}")
            continue
        command = rewrite(command, REWRITES, namesrv=namesrv, tmp=str(tmp_path))
        if BROKER_START.search(command):
            await run_broker_start(command, tmp_path, monkeypatch)
        else:
            timeout = TIMEOUT["spark" if block.uses_spark else "run"]
            output = await run(["bash", "-c", command], REPO, example_env(namesrv, tmp_path), timeout)
            check_expected_output(Block(block.lang, command, block.section, block.line), output)


def check_properties(block: Block) -> None:
    build_config(parse_properties(block.text, f"{block.page} line {block.line}"))


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name, marks=[pytest.mark.spark, pytest.mark.slow] if b.uses_spark else [])
                                   for b in BLOCKS])
async def test_block_runs(block: Block, readme_broker, tmp_path, monkeypatch):
    if block.lang == "python":
        await run_python(block, readme_broker.namesrv_addr, tmp_path)
    elif block.lang in ("bash", "sh", "shell"):
        await run_shell(block, readme_broker.namesrv_addr, tmp_path, monkeypatch)
    elif block.lang == "properties":
        check_properties(block)
    elif block.lang == "text":
        pytest.skip("output shown, nothing to run")
    else:
        pytest.fail(f"{block.name}: no way to check a {block.lang!r} block; give it a language this test runs")


def test_python_blocks_find_the_name_server_through_namesrv_addr():
    for block in (b for b in BLOCKS if b.lang == "python"):
        written = re.findall(r"[\w.-]+:\d{2,5}\b", block.text.replace(NAMESRV_LOOKUP, ""))
        assert not written, f"{block.name} writes {written}: read {NAMESRV_LOOKUP} instead"


def test_every_skip_and_spark_invocation_is_in_the_docs():
    commands = [c for b in BLOCKS if b.lang in ("bash", "sh", "shell") for c in shell_commands(b)]
    for pattern in SKIPPED:
        assert any(re.search(pattern, c) for c in commands), f"SKIPPED has {pattern!r}, which no command matches"
    text = "".join(doc.read_text() for doc in DOCS)
    for invocation in SPARK_INVOCATIONS:
        assert invocation in text, f"the docs no longer show {invocation!r}: update SPARK_INVOCATIONS"


async def test_database_transaction_example_runs(broker, tmp_path):
    """Beyond running: the order row and the committed message are both there."""
    (example,) = [b for b in BLOCKS if b.lang == "python" and "producer.transaction(" in b.text]
    (tmp_path / "app.py").write_text(example.text)
    published = asyncio.Event()
    broker.store.add_arrival_listener(lambda topic, q, m: published.set() if topic == "OrderEvents" else None)
    output = await run([sys.executable, "app.py"], tmp_path, example_env(broker.namesrv_addr, tmp_path), 60)
    assert "committed order and message" in output
    assert sqlite3.connect(tmp_path / "shop.db").execute("SELECT item FROM orders").fetchall() == [("book",)]
    await asyncio.wait_for(published.wait(), 10)  # END_TRANSACTION is oneway: wait for the commit to land
    assert [s.status.value for _o, s in broker.store.iter_halves()] == ["COMMITTED"]
