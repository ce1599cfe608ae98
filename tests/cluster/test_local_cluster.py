"""``halfmq cluster`` (issue 25 item 6): name servers and brokers on one host from one command, run as users run it
(``python -m halfmq.broker.cli cluster ...``), every member a real process. Members are watched through pidfds
opened while they run, so a test cannot mistake a reused PID for a member still alive."""
from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import signal
import socket
import sys
import urllib.request

import pytest

from halfmq.broker import local_cluster
from halfmq.client import Message, Producer
from halfmq.client.admin import Admin

READY = re.compile(r"halfmq cluster ready: namesrvAddr (\S+) (.*)")
BROKER = re.compile(r"(broker-\d+(?:-(?:follower|member)-\d+)?) (\S+) grpc (\S+) metrics (\S+) dashboard (\S+)")
ETCD = re.compile(r" etcd (\S+)$")
START_TIMEOUT = 180  # five Python processes importing at once on a loaded 2-core machine
STOP_TIMEOUT = 90


class ClusterCommand:
    """One ``halfmq cluster`` process this test started, and its members (found in /proc as its children)."""

    def __init__(self, root, *args: str):
        self.args = [sys.executable, "-m", "halfmq.broker.cli", "cluster", f"--dir={root}", *args]
        self.proc: asyncio.subprocess.Process | None = None
        self.out: list[str] = []
        self.namesrv_addr = ""
        self.brokers: dict[str, tuple[str, str, str, str]] = {}  #: name → (address, gRPC, metrics, dashboard)
        self.etcd: list[str] = []  #: etcd's client addresses, with --replicas

    async def start(self) -> "ClusterCommand":
        self.proc = await asyncio.create_subprocess_exec(*self.args, stdout=asyncio.subprocess.PIPE,
                                                         stderr=asyncio.subprocess.PIPE)
        return self

    async def line(self, pattern: re.Pattern, timeout: float = START_TIMEOUT) -> re.Match:
        async def read() -> re.Match:
            while line := await self.proc.stdout.readline():
                self.out.append(line.decode().rstrip())
                if match := pattern.search(self.out[-1]):
                    return match
            raise AssertionError(f"halfmq cluster exited with {await self.proc.wait()} before printing "
                                 f"{pattern.pattern!r}:\n" + "\n".join(self.out) + (await self.stderr()))
        return await asyncio.wait_for(read(), timeout)

    async def ready(self) -> "ClusterCommand":
        match = await self.line(READY)
        self.namesrv_addr = match.group(1)
        self.brokers = {name: addrs for name, *addrs in BROKER.findall(match.group(2))}
        etcd = ETCD.search(match.group(2))
        self.etcd = etcd.group(1).split(",") if etcd else []
        return self

    async def stderr(self) -> str:
        return (await self.proc.stderr.read()).decode()

    def members(self) -> dict[int, list[str]]:
        """PID → command line of each process the cluster started."""
        pids = []
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            with open(f"/proc/{self.proc.pid}/task/{tid}/children") as f:
                pids += map(int, f.read().split())
        return {pid: open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0") for pid in pids}

    async def stop(self) -> None:
        """SIGTERM, and SIGKILL if it does not end in time (its members then get SIGTERM: PR_SET_PDEATHSIG)."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()


class Watched:
    """pidfds of processes, opened while they run: ``gone`` waits until every one has exited."""

    def __init__(self, pids):
        self.fds = {pid: os.pidfd_open(pid) for pid in pids}

    async def gone(self, timeout: float) -> None:
        """Fails naming any still running ``timeout`` s later, after killing it (through its pidfd): a failed test
        leaves no member behind."""
        loop = asyncio.get_running_loop()
        running = []
        try:
            for pid, fd in self.fds.items():
                exited = loop.create_future()
                loop.add_reader(fd, lambda f=exited: f.done() or f.set_result(None))
                try:
                    await asyncio.wait_for(exited, timeout)
                except asyncio.TimeoutError:
                    running.append(pid)
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                finally:
                    loop.remove_reader(fd)
        finally:
            self.close()
        assert not running, f"members {running} still ran {timeout} s later"

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


@pytest.fixture
async def clusters():
    """Starts ``halfmq cluster`` commands; any still running at the end is stopped."""
    started: list[ClusterCommand] = []

    async def start(root, *args: str) -> ClusterCommand:
        started.append(await ClusterCommand(root, *args).start())
        return started[-1]
    yield start
    for cluster in started:
        await cluster.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_one_command_starts_a_cluster_that_spreads_sends_and_sigterm_stops_every_member(tmp_path, clusters):
    cluster = await (await clusters(tmp_path, "--namesrvs=2", "--brokers=3", "--namesrv-port=0", "--broker-port=0",
                                    "--cluster-name=LocalTest", "--", "--logLevel=WARNING")).ready()
    members = cluster.members()
    watched = Watched(members)
    try:
        assert sorted(args[3] for args in members.values()) == ["broker"] * 3 + ["namesrv"] * 2
        for pid in members:  # sessions of their own: a terminal's Ctrl-C reaches only the cluster
            assert os.getsid(pid) == pid
        assert sorted(cluster.brokers) == ["broker-0", "broker-1", "broker-2"]
        ports = [addr.rsplit(":", 1)[1] for addrs in cluster.brokers.values() for addr in addrs]
        assert len(set(ports)) == 12, cluster.brokers
        namesrvs = cluster.namesrv_addr.split(";")
        assert len(namesrvs) == 2
        for namesrv in namesrvs:
            async with Admin(namesrv) as admin:
                assert {row["brokerName"]: row["addr"] for row in await admin.cluster_list()} == \
                    {name: addrs[0] for name, addrs in cluster.brokers.items()}
                assert (await admin.cluster_info())["clusterAddrTable"] == \
                    {"LocalTest": ["broker-0", "broker-1", "broker-2"]}
        landed = collections.Counter()
        async with Producer("PG_LOCAL_CLUSTER", cluster.namesrv_addr) as producer:
            for i in range(60):
                landed[(await producer.send(Message("LocalCluster", b"%d" % i))).queue.broker_name] += 1
        assert set(landed) == {"broker-0", "broker-1", "broker-2"}, landed
        for name, (_, grpc, metrics, dashboard) in cluster.brokers.items():
            with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as answer:
                assert b"rocketmq_" in answer.read()
            for what, addr in (("gRPC", grpc), ("dashboard", dashboard)):
                assert not refused(int(addr.rsplit(":", 1)[1])), f"{name}'s {what} port does not answer"
            assert (tmp_path / name).is_dir() and any((tmp_path / name).iterdir()), f"{name} has no store"
        cluster.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(cluster.proc.wait(), STOP_TIMEOUT) == 0, await cluster.stderr()
        await watched.gone(10)  # the cluster waited for each of them before it exited
    finally:
        watched.close()
    assert await cluster.stderr() == ""
    for name in ("namesrv-0", "namesrv-1", "broker-0", "broker-1", "broker-2"):
        assert "ready" in (tmp_path / "logs" / f"{name}.log").read_text(), f"{name}'s output is not in its log"


async def test_replicas_start_a_broker_group_whose_followers_hold_every_acknowledged_send(tmp_path, clusters):
    cluster = await (await clusters(tmp_path, "--namesrvs=1", "--brokers=1", "--replicas=2", "--no-etcd",
                                    "--namesrv-port=0", "--broker-port=0", "--", "--logLevel=WARNING")).ready()
    assert sorted(cluster.brokers) == ["broker-0", "broker-0-follower-1"]
    async with Admin(cluster.namesrv_addr) as admin:
        async def in_sync() -> bool:
            rows = await admin.replication()
            return any(row.get("role") == "leader" and row["inSync"] == [0, 1] for row in rows)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not await in_sync():  # two processes of their own: nothing here to wait on but their answers
            assert loop.time() < deadline, await admin.replication()
            await asyncio.sleep(0.1)
        async with Producer("PG_REPLICAS", cluster.namesrv_addr) as producer:
            results = [await producer.send(Message("LocalReplicas", b"%d" % i)) for i in range(20)]
        rows = {row["brokerId"]: row for row in await admin.replication()}
        assert rows[0]["role"] == "leader" and rows[1]["role"] == "follower", rows
        assert rows[0]["minInSyncReplicas"] == 2
        # Acknowledged: the follower has every record the leader has (nothing was written since).
        assert rows[1]["seq"] == rows[0]["seq"] and rows[1]["committed"] == rows[0]["committed"]
    assert {r.queue.broker_name for r in results} == {"broker-0"}
    assert (tmp_path / "broker-0-follower-1").is_dir()


async def admin_cli(namesrv: str, *args: str) -> list[dict]:
    """``halfmq admin ... --json``, run as users run it."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "halfmq.broker.cli", "admin", *args, "-n",
                                                namesrv, "--json", stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


async def test_replicas_elect_their_leader_on_the_clusters_etcd_and_a_killed_leader_is_replaced(tmp_path, clusters):
    from tests.support.etcd import missing_tools
    if missing_tools():
        pytest.fail("etcd is not installed: run scripts/install_etcd.sh")
    cluster = await (await clusters(tmp_path, "--namesrvs=1", "--brokers=1", "--replicas=3", "--namesrv-port=0",
                                    "--broker-port=0", "--", "--logLevel=WARNING")).ready()
    assert sorted(cluster.brokers) == ["broker-0-member-1", "broker-0-member-2", "broker-0-member-3"]
    assert len(cluster.etcd) == 3
    members = cluster.members()
    watched = Watched(members)
    try:
        etcd_pids = [pid for pid, args in members.items() if os.path.basename(args[0]) == "etcd"]
        assert len(etcd_pids) == 3
        for pid in etcd_pids:
            args = members[pid]
            assert "--pre-vote" in args and args[args.index("--data-dir") + 1].startswith(str(tmp_path / "etcd-"))
        for pid, args in members.items():
            if "broker" in args:
                assert f"--haEtcdEndpoints={','.join(cluster.etcd)}" in args

        async def leader(exclude: str = "") -> dict | bool:
            rows = await admin_cli(cluster.namesrv_addr, "replicationStatus")
            return next((row for row in rows if row.get("role") == "leader" and row["brokerAddr"] != exclude
                         and len(row["inSync"]) >= 2), False)
        first = await until(leader, 90, "a leader with a follower in sync")
        async with Producer("PG_ELECTED", cluster.namesrv_addr, send_timeout=3.0) as producer:
            before = [await producer.send(Message("LocalElected", b"before-%d" % i)) for i in range(20)]
            name = next(name for name, addrs in cluster.brokers.items() if addrs[0] == first["brokerAddr"])
            victim = next(pid for pid, args in members.items() if f"--storePathRootDir={tmp_path / name}" in args)
            os.kill(victim, signal.SIGKILL)
            second = await until(lambda: leader(exclude=first["brokerAddr"]), 60, "another leader")
            assert second["epoch"] > first["epoch"], (first, second)
            after = await until(lambda: producer.send(Message("LocalElected", b"after")), 60, "a send after the kill")
        assert after.queue.broker_name == "broker-0" and {r.queue.broker_name for r in before} == {"broker-0"}
        assert cluster.proc.returncode is None, "the cluster stopped when one member of a group died"
        cluster.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(cluster.proc.wait(), STOP_TIMEOUT) == 1  # a member died meanwhile
        await watched.gone(10)
    finally:
        watched.close()
    errors = await cluster.stderr()
    assert "exited with status -9; its broker group elects another leader" in errors, errors


async def until(check, timeout: float, what: str):
    """Polls the coroutine function ``check`` until it returns a true value (other processes: nothing to wait on)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = None
    while loop.time() < deadline:
        try:
            last = await check()
        except Exception as exc:  # noqa: BLE001 - not answering yet, retried until the deadline
            last = exc
        if last and not isinstance(last, Exception):
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for: {what} (last: {last!r})")


def test_etcd_needs_replicas_and_its_ports_are_laid_out_after_the_brokers(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(local_cluster.shutil, "which", lambda name: f"/usr/bin/{name}")
    plan = local_cluster.parse_args([f"--dir={tmp_path}", "--brokers=2", "--replicas=2"])
    assert plan.etcd_ports == [(10951, 10952), (10953, 10954), (10955, 10956)]  # 4 brokers from 10911
    assert local_cluster.parse_args([f"--dir={tmp_path}", "--replicas=2", "--no-etcd"]).etcd_ports == []
    assert local_cluster.parse_args([f"--dir={tmp_path}", "--brokers=1"]).etcd_ports == []
    assert local_cluster.parse_args([f"--dir={tmp_path}", "--replicas=3", "--broker-port=0"]).etcd_ports == \
        [(0, 0)] * 3
    for args, message in ((["--etcd"], "--etcd elects a broker group's leader: it needs --replicas 2 or more"),
                          (["--replicas=2", "--etcd-port=2378"], "2379 and 2380 are left to a system etcd"),
                          (["--replicas=2", "--etcd-port=10913"], "port 10913 is a name server's or a broker's")):
        with pytest.raises(SystemExit):
            local_cluster.parse_args([f"--dir={tmp_path}", *args])
        assert message in capsys.readouterr().err
    monkeypatch.setattr(local_cluster.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit):
        local_cluster.parse_args([f"--dir={tmp_path}", "--replicas=2"])
    assert "install Debian's etcd-server package" in capsys.readouterr().err


async def test_members_do_not_outlive_a_killed_cluster(tmp_path, clusters):
    cluster = await (await clusters(tmp_path, "--namesrvs=1", "--brokers=1", "--namesrv-port=0",
                                    "--broker-port=0")).ready()
    watched = Watched(cluster.members())
    cluster.proc.kill()
    await cluster.proc.wait()
    await watched.gone(STOP_TIMEOUT)


async def test_a_member_that_dies_stops_the_cluster_with_a_message(tmp_path, clusters):
    cluster = await (await clusters(tmp_path, "--namesrvs=1", "--brokers=2", "--namesrv-port=0",
                                    "--broker-port=0")).ready()
    members = cluster.members()
    watched = Watched(members)
    try:
        victim = next(pid for pid, args in members.items() if "--brokerName=broker-1" in args)
        os.kill(victim, signal.SIGKILL)  # a crash
        assert await asyncio.wait_for(cluster.proc.wait(), STOP_TIMEOUT) == 1
        await watched.gone(10)
    finally:
        watched.close()
    errors = await cluster.stderr()
    assert "halfmq cluster: broker-1 exited with status -9; stopping the others" in errors, errors
    assert str(tmp_path / "logs" / "broker-1.log") in errors


async def test_a_member_that_cannot_start_is_reported_and_the_others_are_stopped(tmp_path, clusters):
    namesrv_port = free_port()
    with socket.socket() as taken:  # broker-0's port is in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cluster = await clusters(tmp_path, "--namesrvs=1", "--brokers=1", f"--namesrv-port={namesrv_port}",
                                 f"--broker-port={taken.getsockname()[1]}")
        assert await asyncio.wait_for(cluster.proc.wait(), START_TIMEOUT) == 1
    errors = await cluster.stderr()
    assert "halfmq cluster: cannot start: broker-0 exited with status 1 before it was ready" in errors, errors
    assert "halfmq: cannot start" in errors, "the broker's own reason is not shown"
    assert refused(namesrv_port), "the name server still runs"


async def test_sigint_while_starting_stops_what_started(tmp_path, clusters):
    namesrv_port = free_port()
    cluster = await clusters(tmp_path, "--namesrvs=1", "--brokers=1", f"--namesrv-port={namesrv_port}",
                             "--broker-port=0")
    await cluster.line(re.compile("halfmq cluster: starting"))
    cluster.proc.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(cluster.proc.wait(), STOP_TIMEOUT) == 0, await cluster.stderr()
    assert not any(READY.search(line) for line in cluster.out)
    assert refused(namesrv_port), "the name server still runs"


@pytest.mark.parametrize("args, message", [
    (["--brokers=0"], "--namesrvs, --brokers and --replicas must be at least 1"),
    (["--host=0.0.0.0"], "not every interface"),
    (["--host=localhost"], "is not an IPv4 address"),
    (["--brokers=1", "--broker-port=65533"], "broker-0 would listen on up to 65537, above 65535"),
    (["--namesrvs=3", "--namesrv-port=65534"], "name server 2 would listen on 65536, above 65535"),
    (["--broker-port=65530", "--brokers=2"], "broker-1 would listen on up to 65544, above 65535"),
    (["--namesrvs=3", "--namesrv-port=10920", "--broker-port=10911", "--brokers=2"],
     "--namesrv-port and --broker-port overlap: port 10921"),
    (["--", "--listenPort=10"], "--listenPort after --: the cluster sets it for each broker (--broker-port)"),
    (["--", "--noSuchKey=1"], "broker flags after --: unknown configuration key 'noSuchKey'"),
    (["--", "-c", "/nonexistent/broker.conf"], "cannot read config file /nonexistent/broker.conf"),
    (["--", "listenPort=1"], "is not of the form --KEY=VALUE"),
])
def test_bad_command_lines_are_refused_before_anything_starts(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exited:
        local_cluster.parse_args([f"--dir={tmp_path / 'data'}", *args])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_ports_are_laid_out_from_the_two_bases():
    assert local_cluster.plan_ports(2, 2, 9876, 10911) == (
        [9876, 9877], [(10911, 10912, 10913, 10914, 10915), (10921, 10922, 10923, 10924, 10925)])
    assert local_cluster.plan_ports(1, 2, 0, 0) == ([0], [(0, 0, 0, 0, 0), (0, 0, 0, 0, 0)])
