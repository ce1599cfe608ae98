"""Interop fixtures: the real RocketMQ C++ client, installed on demand, run in subprocesses."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEER_PYTHON = ROOT / ".peers" / "cpp-client" / "bin" / "python"
PEER_SCRIPT = Path(__file__).with_name("peer.py")


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath).startswith(str(Path(__file__).parent)):
            item.add_marker(pytest.mark.interop)


@pytest.fixture(scope="session")
def peer_python() -> Path:
    """The peer venv's interpreter, installing the client first when it is missing."""
    subprocess.run(["bash", str(ROOT / "scripts" / "install_cpp_client.sh")], check=True, timeout=600)
    return PEER_PYTHON


@pytest.fixture
def run_peer(peer_python, tmp_path):
    """``await run_peer(mode, args, timeout)`` → the JSON objects the scenario printed."""

    async def run(mode: str, args: dict, timeout: float = 60, until=None) -> list[dict]:
        """Run a scenario to its end. With ``until`` (a coroutine function), the scenario is told to keep
        running after its output (``hold``) and its stdin is closed only once ``until()`` returned."""
        env = {**os.environ, "ROCKETMQ_CLIENT_LOG_DIR": str(tmp_path / "rocketmq-logs") + "/"}
        if until is not None:
            args = {**args, "hold": True}
        proc = await asyncio.create_subprocess_exec(str(peer_python), str(PEER_SCRIPT), mode, json.dumps(args),
                                                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, env=env, cwd=str(tmp_path))
        if until is not None:
            try:
                await asyncio.wait_for(until(), timeout)
            finally:
                proc.stdin.close()
        else:
            proc.stdin.close()
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            raise AssertionError(f"peer {mode} timed out; stdout={out[-2000:]!r} stderr={err[-2000:]!r}") from None
        assert proc.returncode == 0, f"peer {mode} exited {proc.returncode}: {err.decode()[-3000:]}"
        return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]

    return run
