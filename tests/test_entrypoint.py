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
           "HALFMQ_brokerIP1": "127.0.0.1", "HALFMQ_grpcListenPort": "0"}
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
