"""The broker started the way the Docker image starts it: the `halfmq` console script, `-c broker.conf`,
settings from HALFMQ_ environment variables, stopped by SIGTERM (docker stop)."""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sys
from pathlib import Path

from halfmq.client import Message, Producer, PullConsumer

ROOT = Path(__file__).resolve().parents[1]


async def test_console_script_with_conf_and_environment(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    shutil.copy(ROOT / "conf" / "broker.conf", etc / "broker.conf")
    env = {**os.environ, "HALFMQ_storePathRootDir": str(tmp_path / "store"), "HALFMQ_bindAddress": "127.0.0.1",
           "HALFMQ_listenPort": "0", "HALFMQ_namesrvListenPort": "0", "HALFMQ_metricsPromExporterPort": "0",
           "HALFMQ_brokerIP1": "127.0.0.1", "HALFMQ_grpcListenPort": "0", "HALFMQ_dashboardPort": "0"}
    halfmq = Path(sys.executable).with_name("halfmq")
    proc = await asyncio.create_subprocess_exec(str(halfmq), "broker", "-c", str(etc / "broker.conf"), env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line, "the broker exited before it was ready"
            match = re.search(rb"halfmq ready: broker (\S+) namesrv (\S+)", line)
            if match:
                namesrv = match.group(2).decode()
                break
        async with Producer("PG", namesrv) as producer, PullConsumer("CG", namesrv) as consumer:
            result = await producer.send(Message("Docker", b"from the entry point"))
            assert result.offset_msg_id.startswith("7F000001")  # brokerIP1 is what ids and routes carry
            assert [m.body for m in (await consumer.pull(result.queue, 0)).messages] == [b"from the entry point"]
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        assert proc.returncode == 0
        assert (tmp_path / "store" / "lmdb").is_dir()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_docker_image_copies_every_folder_the_install_needs():
    """The image installs with `pip install -e .`, which fails when a package folder of pyproject is missing."""
    import tomllib

    package_dirs = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
                       .values())
    copied = {line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")}
    assert package_dirs <= copied, f"Dockerfile does not COPY {sorted(package_dirs - copied)}"
    assert {"pyproject.toml", "scripts"} <= copied


def test_dockerignore_keeps_the_context_to_what_the_image_copies():
    """The build context was 786 MB with .venv in it: .dockerignore leaves out the local venv, peers, git and
    caches, and none of what the Dockerfile COPYs."""
    import fnmatch

    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.removeprefix("**/")) for p in patterns)

    for path in (".venv", ".peers", ".git", "store_data", "halfmq.egg-info", ".pytest_cache"):
        assert ignored(path), f".dockerignore lets {path} into the build context"
    copied = [part for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")
              for part in line.split()[1:-1]]
    assert copied and not [path for path in copied if ignored(path)]


async def test_the_broker_as_pid_1_opens_its_store(tmp_path):
    """In a container without an init the broker is PID 1: its store writer must still take it for its parent
    (it took any parent of PID 1 for an orphan's and quit, so the store never opened)."""
    proc = await asyncio.create_subprocess_exec(
        "unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "halfmq.broker.cli", "broker",
        "--bindAddress=127.0.0.1", "--listenPort=0", "--namesrvListenPort=0", "--metricsPromExporterPort=-1",
        "--grpcListenPort=-1", "--dashboardPort=-1", f"--storePathRootDir={tmp_path / 'store'}", "--mapSize=67108864",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output = b""
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            output += line
            assert line, f"the broker exited before it was ready: {output.decode()[-2000:]}"
            match = re.search(rb"halfmq ready: broker (\S+) namesrv (\S+)", line)
            if match:
                break
        async with Producer("PG", match.group(2).decode()) as producer:
            await producer.send(Message("Pid1", b"stored by a broker that is PID 1"))
        os.kill(_child_of(proc.pid), signal.SIGTERM)  # the broker: unshare waits for it and exits with its status
        await asyncio.wait_for(proc.wait(), 30)
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()  # unshare: --kill-child takes the broker with it
            await proc.wait()


def _child_of(pid: int) -> int:
    """The process whose parent is ``pid`` (the broker unshare started)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = (Path("/proc") / entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                return int(entry)
    raise AssertionError(f"process {pid} has no child")
