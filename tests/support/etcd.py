"""A real 3-member etcd on loopback for the failover tests: Debian's ``etcd`` binary (scripts/install_etcd.sh), each
member with fresh client and peer ports on 127.0.0.1 and its data dir in one temp folder, which ``stop`` deletes.

- ``--pre-vote``: without it a member that rejoins after a pause or a cut forces an election, and the holder of a
  lease can lose it to a disruption it had no part in (measured here; etcd 3.4's default is off).
- ``--heartbeat-interval 100 --election-timeout 1000``: etcd's own defaults, written out because the failover
  times the tests measure depend on them.
- A clean environment: etcd reads every ``ETCD_*`` variable as a flag, so one left in the caller's environment
  would change (or break) the members.
- Ports are never etcd's defaults (2379/2380), which a system etcd may hold.
- Members are stopped one at a time: stopping all three at once takes a steady 7 s (the leader tries to hand over
  to members that are leaving); one by one takes a quarter of a second.

The methods block (they start processes and poll HTTP): an asyncio test calls ``start``, ``restart`` and
``wait_healthy`` through ``asyncio.to_thread`` so that its own tasks (a lease keep-alive) run meanwhile; the
signals (``kill``, ``pause``, ``resume``) return at once.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from halfmq.broker.local_cluster import free_etcd_ports

SIZE = 3


class EtcdFailed(RuntimeError):
    pass


def missing_tools() -> list[str]:
    """What these members need that is not installed (scripts/install_etcd.sh installs it)."""
    return [tool for tool in ("etcd",) if not shutil.which(tool)]


class EtcdMember:
    def __init__(self, name: str, data_dir: Path, client_port: int, peer_port: int):
        self.name, self.data_dir = name, data_dir
        self.client_port, self.peer_port = client_port, peer_port
        self.log_path = data_dir.parent / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:port``: the form ``haEtcdEndpoints`` takes."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self, initial_cluster: str) -> None:
        """Starts the process; with a data dir from an earlier run etcd rejoins from its WAL and ignores the
        ``--initial-*`` flags."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [shutil.which("etcd") or "etcd", "--name", self.name, "--data-dir", str(self.data_dir),
                 "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                 "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                 "--initial-cluster", initial_cluster, "--initial-cluster-state", "new",
                 "--initial-cluster-token", f"halfmq-test-{os.getpid()}-{self.data_dir.parent.name}",
                 "--pre-vote", "--heartbeat-interval", "100", "--election-timeout", "1000",
                 "--logger", "zap", "--log-outputs", "stderr"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env={"PATH": os.defpath}, start_new_session=True)

    def health(self) -> bool:
        """etcd's own answer: true when this member has a leader and can serve a read through consensus."""
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1.0) as answer:
                return json.loads(answer.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def status(self) -> dict:
        """etcd's maintenance status: ``header.member_id`` is this member's id, ``leader`` the one it follows."""
        request = urllib.request.Request(f"{self.client_url}/v3/maintenance/status", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=1.0) as answer:
            return json.loads(answer.read())

    def signal(self, signum: int) -> None:
        if not self.running():
            raise EtcdFailed(f"{self.name} is not running")
        os.kill(self.proc.pid, signum)

    def wait_exit(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class EtcdCluster:
    """Three members named etcd0..etcd2; ``endpoints`` lists their client addresses (``127.0.0.1:port``)."""

    def __init__(self, size: int = SIZE):
        self.size = size
        self.root: Path | None = None
        self.members: list[EtcdMember] = []

    @property
    def endpoints(self) -> list[str]:
        return [member.endpoint for member in self.members]

    def start(self, timeout: float = 30.0, attempts: int = 3) -> EtcdCluster:
        missing = missing_tools()
        if missing:
            raise EtcdFailed(f"missing {missing}: run scripts/install_etcd.sh (scripts/test.sh does)")
        failures = []
        for _ in range(attempts):
            self.root = Path(tempfile.mkdtemp(prefix="halfmq-etcd-"))
            ports = free_etcd_ports(2 * self.size)
            self.members = [EtcdMember(f"etcd{i}", self.root / f"etcd{i}", ports[2 * i], ports[2 * i + 1])
                            for i in range(self.size)]
            initial = ",".join(f"{member.name}={member.peer_url}" for member in self.members)
            for member in self.members:
                member.launch(initial)
            try:
                self.wait_healthy(timeout=timeout)
                return self
            except EtcdFailed as failure:
                # a member that exited at once most likely lost its port to another process: fresh ports, again
                failures.append(str(failure))
                self.stop()
        raise EtcdFailed(f"etcd did not become healthy in {attempts} attempts:\n" + "\n\n".join(failures))

    def wait_healthy(self, indexes=None, timeout: float = 30.0) -> None:
        """Polls each member's /health until every one (of ``indexes``, default all) answers true."""
        members = [self.members[i] for i in (range(self.size) if indexes is None else indexes)]
        deadline = time.monotonic() + timeout
        waiting = list(members)
        while waiting:
            waiting = [member for member in waiting if not member.health()]
            exited = [member for member in waiting if not member.running()]
            if exited:
                raise EtcdFailed("; ".join(f"{m.name} exited with {m.proc.returncode if m.proc else None}:\n"
                                           f"{m.log_tail()}" for m in exited))
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise EtcdFailed(f"not healthy after {timeout} s: {[m.name for m in waiting]}\n"
                                 + "\n".join(m.log_tail(10) for m in waiting))
            time.sleep(0.05)

    def leader_index(self, timeout: float = 10.0) -> int:
        """The member that leads etcd's own Raft, as the members agree (polled until they do)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = {}
            for index, member in enumerate(self.members):
                try:
                    status = member.status()
                except (OSError, ValueError):
                    continue
                seen[status["header"]["member_id"]] = (index, status.get("leader"))
            leaders = {leader for _, leader in seen.values()}
            if len(leaders) == 1 and (leader := leaders.pop()) in seen:
                return seen[leader][0]
            if time.monotonic() > deadline:
                raise EtcdFailed(f"the members do not agree on a leader after {timeout} s: {seen}")
            time.sleep(0.05)

    def kill(self, index: int) -> None:
        """SIGKILL: the member dies at once and keeps its data dir; ``restart`` brings it back."""
        member = self.members[index]
        member.signal(signal.SIGKILL)
        member.proc.wait()

    def pause(self, index: int) -> None:
        """SIGSTOP: the member holds its sockets but answers nothing, as a member cut off from the network."""
        self.members[index].signal(signal.SIGSTOP)

    def resume(self, index: int) -> None:
        self.members[index].signal(signal.SIGCONT)

    def restart(self, index: int, timeout: float = 30.0) -> None:
        """Starts a killed member again on its ports and data dir and waits until it is healthy."""
        member = self.members[index]
        if member.running():
            raise EtcdFailed(f"{member.name} is still running (pid {member.pid})")
        member.launch(",".join(f"{m.name}={m.peer_url}" for m in self.members))
        self.wait_healthy([index], timeout=timeout)

    def heal(self, timeout: float = 30.0) -> None:
        """Every member running, continued and healthy again: what a test that shares the cluster expects to find
        after one that killed or paused members."""
        for member in self.members:
            if member.running():
                os.kill(member.pid, signal.SIGCONT)  # a no-op for a member that is not stopped
            else:
                member.launch(",".join(f"{m.name}={m.peer_url}" for m in self.members))
        self.wait_healthy(timeout=timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM each member in turn (SIGCONT first: a stopped process takes no signal), then the folder."""
        for member in self.members:
            if member.running():
                os.kill(member.pid, signal.SIGCONT)
                os.kill(member.pid, signal.SIGTERM)
                member.wait_exit(timeout)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
