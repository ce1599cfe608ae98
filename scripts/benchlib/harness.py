"""What every benchmark starts and stops: brokers, name servers, broker groups, and the checkouts they run.

A broker is a subprocess on free loopback ports over a temporary store (``temp_store``, removed by ``run_main`` at
the end, also on an error or Ctrl-C). A checkout to measure (``--trees``) is a folder or a git revision: a revision
becomes a tree of this repository's objects (``git archive``) in a temporary folder, so nothing is checked out in
the worktree the benchmark runs from. A tree's broker runs with the tree's .venv when it has one, else with this
interpreter and the tree's packages first on its path (``tree_env``).
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the one entry of the benchmarks, which also runs their helper processes (a client, a probe, an attacker)
ENTRY = REPO / "scripts" / "bench.py"
READY = re.compile(rb"halfmq ready: broker (\S+) namesrv (\S+) metrics (\S+)")
NAMESRV_READY = re.compile(rb"halfmq namesrv ready: (\S+)")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

#: Temporary folders this run made (stores, trees): removed at its end (remove_temp_stores), and only these.
TEMP_STORES: list[str] = []


def temp_store(prefix: str = "halfmq-bench-") -> str:
    path = tempfile.mkdtemp(prefix=prefix)
    TEMP_STORES.append(path)
    return path


def remove_temp_stores() -> None:
    """Remove the folders made by temp_store (call once whatever used them has stopped)."""
    while TEMP_STORES:
        shutil.rmtree(TEMP_STORES.pop(), ignore_errors=True)


def run_main(coro) -> None:
    """Run a benchmark's main coroutine: Ctrl-C or SIGTERM cancel it (its ``finally`` blocks stop the brokers it
    spawned), then the temporary stores are removed."""
    # imported here: a helper process run by another checkout's interpreter (instructions) imports this module too
    from halfmq.broker.loop import new_event_loop
    loop = new_event_loop()
    task = loop.create_task(coro)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        loop.run_until_complete(task)
    except asyncio.CancelledError:
        print("interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    finally:
        loop.close()
        remove_temp_stores()


# --- checkouts ---

@functools.cache  # one copy of a revision per run
def tree(spec: str) -> str:
    """A folder holding the code of ``spec``: the folder itself, or for a git revision of this repository a
    temporary copy of that revision's files (run with this interpreter: ``tree_command``)."""
    if os.path.isdir(spec):
        return os.path.abspath(spec)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", spec], capture_output=True, text=True)
    if commit.returncode != 0:
        raise SystemExit(f"{spec!r} is neither a folder nor a git revision of {REPO}")
    folder = temp_store("halfmq-bench-tree-")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", spec], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    Path(folder, ".bench-revision").write_text(commit.stdout.strip() + "\n")
    return folder


def tree_python(tree: str | Path) -> str:
    """The interpreter of a checkout: its .venv's, else this one."""
    venv = Path(tree) / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def tree_command(tree: str | None) -> tuple[str, dict[str, str] | None]:
    """(interpreter, environment to add) running ``halfmq`` from a checkout (None: this one): its .venv, or this
    interpreter with the tree's packages first on the path."""
    python = tree_python(tree) if tree else sys.executable
    if not tree or python != sys.executable:
        return python, None
    return python, tree_env(tree, temp_store("halfmq-bench-path-"))


def tree_env(tree: str | Path, scratch: str) -> dict[str, str]:
    """The environment importing ``halfmq`` from ``tree`` under this interpreter: a folder of links named as the
    packages are mapped (empty for this checkout, which the interpreter imports already)."""
    tree = Path(tree).resolve()
    if tree == REPO:
        return {}
    root = Path(tempfile.mkdtemp(prefix="halfmq-tree-", dir=scratch))
    (root / "halfmq").mkdir()
    for package in tree.iterdir():
        if (package / "__init__.py").is_file():
            (root / "halfmq" / package.name).symlink_to(package)
    return {"PYTHONPATH": str(root)}


def has(tree: str | None, part: str) -> bool:
    """Whether a checkout (None: this one) has a part that came later (``dashboard``, ``broker/grpc``)."""
    return not tree or os.path.isdir(os.path.join(tree, part))


# --- processes ---

async def start_broker(*flags: str, dashboard: bool = True, grpc: bool = True, python: str = sys.executable,
                       cwd: str | None = None, env: dict[str, str] | None = None, store: str | None = None
                       ) -> tuple[asyncio.subprocess.Process, re.Match]:
    """A broker subprocess on free loopback ports over ``store`` (default: a temporary one), with ``flags`` added
    (gRPC off unless a flag turns it on, the dashboard off; ``dashboard=False``: a broker from before the dashboard,
    which knows no such key; ``grpc=False``: one from before the gRPC door), run by ``python`` in ``cwd`` (another
    checkout's broker) with ``env`` added: (process, the match of its ready line: broker, namesrv and metrics
    addresses)."""
    cmd = [python, "-m", "halfmq.broker.cli", "broker", "--bindAddress=127.0.0.1", "--listenPort=0",
           "--namesrvListenPort=0", *(["--grpcListenPort=-1"] if grpc else []),
           *(["--dashboardPort=-1"] if dashboard else []),
           f"--storePathRootDir={store or temp_store()}", *flags]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                cwd=cwd, env={**os.environ, **env} if env else None)
    said: list[bytes] = []
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            if not line:
                raise SystemExit("the broker exited before it was ready; its last words:\n"
                                 + b"".join(said[-20:]).decode(errors="replace"))
            said.append(line)
            match = READY.search(line)
            if match:
                return proc, match
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise


def grpc_endpoint(ready: re.Match) -> str:
    """The gRPC endpoint a broker's ready line names (started with a grpcListenPort)."""
    return ready.string.decode().split(" grpc ")[1].split()[0]


async def start_namesrv(python: str = sys.executable, cwd: str | None = None, env: dict[str, str] | None = None
                        ) -> tuple[asyncio.subprocess.Process, str]:
    """A standalone name server on a free port: (process, address); its output is read on (a full pipe would
    stop it)."""
    proc = await asyncio.create_subprocess_exec(python, "-m", "halfmq.broker.cli", "namesrv",
                                                "--bindAddress=127.0.0.1", "--listenPort=0",
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                cwd=cwd, env={**os.environ, **env} if env else None)
    while line := await asyncio.wait_for(proc.stdout.readline(), 30):
        match = NAMESRV_READY.search(line)
        if match:
            asyncio.get_running_loop().create_task(drain(proc))
            return proc, match.group(1).decode()
    raise SystemExit("the name server exited before it was ready")


async def start_group(tree: str, replicas: int, flags: list[str]
                      ) -> tuple[list[asyncio.subprocess.Process], str, str, str]:
    """The broker of checkout ``tree`` (empty: this one); with ``replicas`` above 1, a name server and a broker group
    of that many members (every write waits for all of them: minInSyncReplicas), the load going to its leader.
    Returns (processes, the leader's address, name server, the leader's metrics address)."""
    python, env = tree_command(tree)
    procs = []
    if replicas > 1:
        namesrv = await start_namesrv(python, tree or None, env)
        procs.append(namesrv[0])
        flags = [*flags, f"--namesrvAddr={namesrv[1]}", "--haListenPort=0", f"--minInSyncReplicas={replicas}",
                 "--brokerName=bench-group"]
    proc, ready = await start_broker(*flags, *(["--brokerId=0"] if replicas > 1 else []), python=python,
                                     cwd=tree or None, env=env, dashboard=has(tree, "dashboard"),
                                     grpc=has(tree, "broker/grpc"))
    procs.append(proc)
    leader = ready.group(1).decode()
    for broker_id in range(1, replicas):
        procs.append((await start_broker(*flags, f"--brokerId={broker_id}", python=python, cwd=tree or None,
                                         env=env))[0])
    if replicas > 1:
        await in_sync(leader, replicas)
    return procs, leader, namesrv[1] if replicas > 1 else ready.group(2).decode(), ready.group(3).decode()


async def in_sync(leader: str, members: int, timeout: float = 60.0) -> None:
    """Wait until every member of the leader's group is in sync (HALFMQ_GET_REPLICATION)."""
    from halfmq.client.remoting import Connection
    from halfmq.protocol.codes import RequestCode
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn = await Connection.open(leader)
        try:
            status = json.loads((await conn.request(RequestCode.HALFMQ_GET_REPLICATION)).body)
        finally:
            await conn.close()
        if len(status.get("inSync", ())) == members:
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"the broker group of {leader} did not get {members} members in sync within {timeout} s")


async def drain(proc) -> None:
    """Read a process's output until it ends, so that it never blocks on a full pipe."""
    while await proc.stdout.readline():
        pass


async def stop(procs) -> None:
    """SIGTERM each process still running, last started first, and wait for it."""
    for proc in reversed(procs):
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()


def helper(*args: str) -> list[str]:
    """The command line of one of the benchmarks' helper processes (``bench.py <benchmark> --<role> ...``)."""
    return [sys.executable, str(ENTRY), *args]


# --- what processes spend ---

def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def child_pids(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0
