"""``halfmq cluster``: a local cluster in one command — standalone name servers and N brokers on one host, each a
process of its own (one core each at most: a broker is one event loop plus its writer process), each broker with
its own store folder and ports, registered with every name server.

    halfmq cluster --namesrvs 2 --brokers 3 --dir ./cluster_data [-- --flushDiskType=ASYNC_FLUSH ...]

Name servers start first (their addresses make every broker's ``namesrvAddr``), then the brokers, all at once. Each
member's output goes to ``DIR/logs/<member>.log``; once every member printed its own ready line, one line lists
every address::

    halfmq cluster ready: namesrvAddr 127.0.0.1:9876;127.0.0.1:9877 broker-0 127.0.0.1:10911 grpc 127.0.0.1:10912
    metrics 127.0.0.1:10913 dashboard 127.0.0.1:10914 broker-1 ...

(one line). SIGINT, SIGTERM or SIGHUP stop the brokers (each unregisters from the name servers first), then the
name servers, by the PIDs this process started. A member that fails to start, or exits while the cluster runs,
stops the others and makes the exit status 1, with that member's last output on stderr.

With ``--replicas`` 2 or more the cluster also runs a 3-member etcd (``--etcd``, on by default then: Debian's
``etcd-server``), started before the brokers, and every member of every broker group gets ``--haEtcdEndpoints``: the
group elects its leader there, and a leader that dies is replaced in seconds (docs/replication.md). Members are then
named ``broker-G-member-I`` (the leader is whichever the election chose; ``--brokerId=I`` only names a member), a
broker that exits is reported and the cluster goes on (its group fails over; the exit status is 1 in the end), and
the ready line ends with ``etcd HOST:PORT,HOST:PORT,HOST:PORT``. etcd member i listens for clients on
``--etcd-port`` + 2 i and for its peers on + 1, keeps its data in ``DIR/etcd-i`` and is stopped after the brokers
and name servers, one at a time (stopping all three at once takes etcd seconds: its leader tries to hand over to
members that are leaving).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import dataclasses
import ipaddress
import os
import re
import shutil
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError, load_config, parse_flags
from .loop import new_event_loop

NAMESRV_READY = re.compile(rb"halfmq namesrv ready: (\S+)")
ETCD_READY = re.compile(rb"serving client traffic")  #: logged once the member joined a cluster with quorum
ETCD_SIZE = 3
ETCD_DEFAULT_PORTS = {2379, 2380}  #: a system etcd's: never used here
BROKER_READY = re.compile(rb"halfmq ready: broker (\S+) namesrv \S+ metrics (\S+) grpc (\S+) dashboard (\S+)")
#: Broker ports start this far apart: broker j listens on PORT + 10 j (remoting), + 1 (gRPC), + 2 (metrics),
#: + 3 (dashboard) and + 4 (replication); with replicas, j counts every member of every broker group.
BROKER_PORT_STRIDE = 10
#: Broker keys the cluster sets for each broker, and the option that sets them instead of a broker flag.
MANAGED_KEYS = {"storePathRootDir": "--dir", "brokerName": "(broker-0, broker-1, ...)",
                "brokerClusterName": "--cluster-name", "namesrvAddr": "(its own name servers)",
                "bindAddress": "--host", "listenPort": "--broker-port", "grpcListenPort": "--broker-port",
                "metricsPromExporterPort": "--broker-port", "dashboardPort": "--broker-port",
                "haListenPort": "--broker-port", "brokerId": "--replicas"}
TAIL_LINES = 20
PR_SET_PDEATHSIG = 1


class MemberFailed(Exception):
    """A member exited, or printed no ready line in time; the message names it and ends with its last output."""


@dataclass(frozen=True)
class Plan:
    """What ``halfmq cluster`` starts: the checked command line."""
    namesrvs: int
    brokers: int
    root: Path
    host: str
    namesrv_ports: list[int]
    #: per broker (every member of every group): remoting, gRPC, metrics, dashboard, replication (0 = any free)
    broker_ports: list[tuple[int, int, int, int, int]]
    cluster_name: str
    broker_args: list[str]  #: passed to every broker before the cluster's own flags (which win)
    start_timeout: float
    stop_timeout: float
    replicas: int = 1  #: members of each broker group: a leader and replicas - 1 followers
    #: etcd member i: (client port, peer port) (0 = any free port); empty: no etcd (roles from brokerId)
    etcd_ports: list[tuple[int, int]] = dataclasses.field(default_factory=list)


def plan_ports(namesrvs: int, brokers: int, namesrv_port: int, broker_port: int
               ) -> tuple[list[int], list[tuple[int, int, int, int, int]]]:
    """Name server i on ``namesrv_port + i``; broker j on ``broker_port + 10 j`` (+ 1 gRPC, + 2 metrics,
    + 3 dashboard, + 4 replication); a base of 0 makes each of those ports any free one.

    Raises:
        ValueError: a port would be above 65535, or the two ranges overlap.
    """
    ns = [namesrv_port + i if namesrv_port else 0 for i in range(namesrvs)]
    br = [tuple(broker_port + BROKER_PORT_STRIDE * j + k if broker_port else 0 for k in range(5))
          for j in range(brokers)]
    if max(ns) > 65535:
        raise ValueError(f"--namesrv-port {namesrv_port}: name server {namesrvs - 1} would listen on {max(ns)}, "
                         f"above 65535")
    highest = max(port for ports in br for port in ports)
    if highest > 65535:
        raise ValueError(f"--broker-port {broker_port}: broker-{brokers - 1} would listen on up to {highest}, "
                         f"above 65535")
    if namesrv_port and broker_port:
        taken = set(ns) & {port for ports in br for port in ports}
        if taken:
            raise ValueError(f"--namesrv-port and --broker-port overlap: port {min(taken)} would be used twice "
                             f"(brokers take {BROKER_PORT_STRIDE} ports apart, 5 each)")
    return ns, br


def parse_args(argv: list[str]) -> Plan:
    """The plan, or SystemExit(2) with a message naming the bad option (argparse's way)."""
    own, broker_args = argv, []
    if "--" in argv:
        cut = argv.index("--")
        own, broker_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(
        prog="halfmq cluster", description="Run name servers and brokers on this host, each a process of its own "
                                           "(a broker uses one core at most: run one per core).",
        epilog="Flags after -- go to every broker: --KEY=VALUE (conf/broker.conf's keys) or -c FILE; the cluster "
               "sets " + ", ".join(MANAGED_KEYS) + " itself.")
    parser.add_argument("--namesrvs", type=int, default=2, help="name servers (default: %(default)s)")
    parser.add_argument("--brokers", type=int, default=2, help="brokers, named broker-0, broker-1, ... "
                                                               "(default: %(default)s)")
    parser.add_argument("--dir", default="./cluster_data",
                        help="folder of the brokers' stores (DIR/broker-N) and every member's output "
                             "(DIR/logs/NAME.log) (default: %(default)s)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="IPv4 address of this host every member listens on and advertises: clients connect "
                             "to it (default: %(default)s)")
    parser.add_argument("--namesrv-port", type=int, default=9876,
                        help="name server i listens on this + i; 0 = any free ports (default: %(default)s)")
    parser.add_argument("--broker-port", type=int, default=10911,
                        help=f"broker j listens on this + {BROKER_PORT_STRIDE} j, its gRPC endpoint on + 1, its "
                             f"metrics on + 2, its dashboard on + 3; 0 = any free ports (default: %(default)s)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="members of each broker group: a leader and REPLICAS - 1 followers, each with its own "
                             "store (DIR/broker-N-follower-I); every acknowledged write is on each in-sync member, "
                             "and with 2 or more, minInSyncReplicas=2 (default: %(default)s)")
    parser.add_argument("--etcd", action=argparse.BooleanOptionalAction, default=None,
                        help="with --replicas 2 or more: run a 3-member etcd (Debian's etcd-server) on which each "
                             "broker group elects its leader, so a dead leader is replaced in seconds "
                             "(default: on with replicas; --no-etcd: the leader is fixed, as brokerId 0)")
    parser.add_argument("--etcd-port", type=int, default=None,
                        help="etcd member i serves clients on this + 2 i and its peers on + 1; 0 = any free ports "
                             "(default: the ports after the brokers', or free ones with --broker-port 0)")
    parser.add_argument("--cluster-name", default="DefaultCluster", help="brokerClusterName (default: %(default)s)")
    parser.add_argument("--start-timeout", type=float, default=120.0,
                        help="seconds each member has to print its ready line (default: %(default)s)")
    parser.add_argument("--stop-timeout", type=float, default=60.0,
                        help="seconds each member has to stop after SIGTERM before it is killed "
                             "(default: %(default)s)")
    args = parser.parse_args(own)
    if args.namesrvs < 1 or args.brokers < 1 or args.replicas < 1:
        parser.error("--namesrvs, --brokers and --replicas must be at least 1")
    if not 0 <= args.namesrv_port <= 65535 or not 0 <= args.broker_port <= 65535:
        parser.error("--namesrv-port and --broker-port are port numbers (0 = any free port)")
    if args.start_timeout <= 0 or args.stop_timeout <= 0:
        parser.error("--start-timeout and --stop-timeout must be positive")
    try:
        host = ipaddress.IPv4Address(args.host)
    except ValueError:
        parser.error(f"--host {args.host!r} is not an IPv4 address (routes and message ids carry the brokers' "
                     f"address: give one that clients connect to)")
    if host.is_unspecified:
        parser.error(f"--host {args.host}: give the one address clients connect to, not every interface (routes "
                     f"and message ids carry it)")
    try:
        ns_ports, broker_ports = plan_ports(args.namesrvs, args.brokers * args.replicas, args.namesrv_port,
                                            args.broker_port)
    except ValueError as exc:
        parser.error(str(exc))
    etcd = args.replicas > 1 if args.etcd is None else args.etcd
    etcd_ports: list[tuple[int, int]] = []
    if etcd:
        if args.replicas < 2:
            parser.error("--etcd elects a broker group's leader: it needs --replicas 2 or more")
        if not shutil.which("etcd"):
            parser.error("--replicas with --etcd runs etcd, which is not installed: install Debian's etcd-server "
                         "package (scripts/install_etcd.sh does), or pass --no-etcd for groups with a fixed leader")
        base = args.etcd_port
        if base is None:
            base = args.broker_port + BROKER_PORT_STRIDE * len(broker_ports) if args.broker_port else 0
        try:
            etcd_ports = plan_etcd_ports(base, ns_ports + [p for ports in broker_ports for p in ports])
        except ValueError as exc:
            parser.error(str(exc))
    check_broker_args(parser, broker_args)
    return Plan(args.namesrvs, args.brokers, Path(args.dir).resolve(), args.host, ns_ports, broker_ports,
                args.cluster_name, broker_args, args.start_timeout, args.stop_timeout, args.replicas, etcd_ports)


def plan_etcd_ports(base: int, taken: list[int]) -> list[tuple[int, int]]:
    """etcd member i on ``base + 2 i`` (clients) and ``base + 2 i + 1`` (peers); 0: free ports, chosen at start.

    Raises:
        ValueError: a port above 65535, one of a system etcd's (2379, 2380), or one another member takes.
    """
    if not base:
        return [(0, 0)] * ETCD_SIZE
    ports = [(base + 2 * i, base + 2 * i + 1) for i in range(ETCD_SIZE)]
    flat = [p for pair in ports for p in pair]
    if max(flat) > 65535 or base < 1:
        raise ValueError(f"--etcd-port {base}: etcd would listen on up to {max(flat)}, above 65535")
    if set(flat) & ETCD_DEFAULT_PORTS:
        raise ValueError(f"--etcd-port {base}: etcd's own defaults 2379 and 2380 are left to a system etcd")
    overlap = set(flat) & {p for p in taken if p}
    if overlap:
        raise ValueError(f"--etcd-port {base}: port {min(overlap)} is a name server's or a broker's")
    return ports


def free_etcd_ports(count: int) -> list[int]:
    """Ports the kernel hands out as free on 127.0.0.1 now, all different (each stays bound until all are
    picked), none of a system etcd's."""
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            if sock.getsockname()[1] in ETCD_DEFAULT_PORTS:
                sock.close()
                continue
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def check_broker_args(parser: argparse.ArgumentParser, broker_args: list[str]) -> None:
    """Refuse, before anything starts, flags that set a key the cluster sets, and whatever ``halfmq broker`` would
    refuse (an unknown key, a malformed value, an unreadable -c file)."""
    files = argparse.ArgumentParser(add_help=False)  # as broker_main reads its arguments
    files.add_argument("-c", "--config")
    known, flags = files.parse_known_args(broker_args)
    try:
        for key in parse_flags(flags):
            if key in MANAGED_KEYS:
                parser.error(f"--{key} after --: the cluster sets it for each broker ({MANAGED_KEYS[key]})")
        load_config(known.config, flags)
    except ConfigError as exc:
        parser.error(f"broker flags after --: {exc}")


def _die_with_parent(parent: int):
    """A preexec_fn: the member gets SIGTERM if this process dies without stopping it (killed with SIGKILL), so it
    does not live on, unowned, holding its store and ports. Members run in sessions of their own (a terminal's
    Ctrl-C reaches this process only, which stops brokers before name servers)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


class Member:
    """One name server or broker process: started, its output copied to its log file, stopped by its PID."""

    def __init__(self, name: str, args: list[str], log_path: Path, ready: re.Pattern, env: dict | None = None,
                 fatal: bool = True):
        self.name, self.args, self.log_path, self.ready_pattern = name, args, log_path, ready
        self.env = env  #: None: this process's environment
        self.fatal = fatal  #: its exit stops the cluster (a replicated broker's does not: its group fails over)
        self.proc: asyncio.subprocess.Process | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.ready: asyncio.Future | None = None  #: the ready line's match
        self.reported = False  #: its failure was already reported (by start, or as the member that died)
        self._copy: asyncio.Task | None = None

    async def start(self, timeout: float) -> re.Match:
        """Start and wait for the ready line; raises MemberFailed if the member exits first or prints none in time
        (it is then left as it is, for ``stop``)."""
        loop = asyncio.get_running_loop()
        log = open(self.log_path, "ab", buffering=0)  # unbuffered: the file is current when a member dies
        self.ready = loop.create_future()
        try:
            # limit: a configuration dump at start-up is one long line
            self.proc = await asyncio.create_subprocess_exec(
                *self.args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent(os.getpid()),
                limit=1 << 20, env=self.env)
        except BaseException:
            log.close()
            raise
        self._copy = loop.create_task(self._copy_output(log))
        await asyncio.wait([self.ready, self._copy], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if self.ready.done():
            return self.ready.result()
        self.reported = True
        if self._copy.done():
            raise MemberFailed(f"{self.name} exited with status {self.proc.returncode} before it was ready"
                               f"{self.last_output()}")
        raise MemberFailed(f"{self.name} printed no ready line within {timeout:g} s{self.last_output()}")

    async def _copy_output(self, log) -> None:
        """Copies the member's output to its log file until it exits (and every helper holding the pipe)."""
        try:
            while line := await self.proc.stdout.readline():
                log.write(line)
                self.tail.append(line.decode(errors="replace").rstrip())
                if not self.ready.done() and (match := self.ready_pattern.search(line)):
                    self.ready.set_result(match)
            await self.proc.wait()
        finally:
            log.close()

    def last_output(self) -> str:
        lines = "\n".join(f"  {line}" for line in self.tail) or "  (no output)"
        return f"; its last output ({self.log_path}):\n{lines}"

    async def exited(self) -> int:
        """Waits for the member to exit (its output copied to the end) and returns its status."""
        status = await self.proc.wait()
        await self._copy
        return status

    async def stop(self, timeout: float) -> str | None:
        """SIGTERM, then SIGKILL after ``timeout``; what went wrong, if anything not yet reported, for the final
        message."""
        if self.proc is None:
            return None
        asked = self.proc.returncode is None
        if asked:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.exited()
                return f"{self.name} did not stop within {timeout:g} s of SIGTERM and was killed{self.last_output()}"
        elif self.reported:
            await self.exited()
            return None
        status = await self.exited()
        # A member still starting has no handler for SIGTERM yet: it ends by the signal, as it was asked to.
        if status != 0 and not (asked and status == -signal.SIGTERM):
            return f"{self.name} ended with status {status}{self.last_output()}"
        return None


class LocalCluster:
    def __init__(self, plan: Plan):
        self.plan = plan
        logs = plan.root / "logs"
        cli = [sys.executable, "-m", "halfmq.broker.cli"]
        self.namesrvs = [Member(f"namesrv-{i}", [*cli, "namesrv", f"--bindAddress={plan.host}",
                                                 f"--listenPort={port}"], logs / f"namesrv-{i}.log", NAMESRV_READY)
                         for i, port in enumerate(plan.namesrv_ports)]
        self.brokers: list[Member] = []
        self._cli, self._logs = cli, logs
        self.namesrv_addr = ""
        self.etcd: list[Member] = []
        self.lost: list[str] = []  #: replicated brokers that exited while the cluster ran
        self.etcd_endpoints = ""  #: haEtcdEndpoints: every etcd member's client address

    @property
    def members(self) -> list[Member]:
        return [*self.namesrvs, *self.brokers, *self.etcd]

    def _etcd_members(self) -> list[Member]:
        plan = self.plan
        ports = plan.etcd_ports
        if ports and not ports[0][0]:
            # Ports of its own choosing: an earlier run's data dir names other ports, so etcd starts afresh (the
            # groups' epochs live on in their stores: a new leader's epoch is above any its store saw).
            for i in range(len(ports)):
                shutil.rmtree(plan.root / f"etcd-{i}", ignore_errors=True)
            free = free_etcd_ports(2 * len(ports))
            ports = [(free[2 * i], free[2 * i + 1]) for i in range(len(ports))]
        host = plan.host
        peers = ",".join(f"etcd-{i}=http://{host}:{peer}" for i, (_, peer) in enumerate(ports))
        self.etcd_endpoints = ",".join(f"{host}:{client}" for client, _ in ports)
        members = []
        for i, (client, peer) in enumerate(ports):
            # --pre-vote: a member that rejoins does not force an election (the lease holder would lose its lease);
            # a clean environment: etcd reads every ETCD_* variable as a flag. An earlier run's data dir is
            # rejoined from its WAL (the --initial-* flags are then ignored).
            members.append(Member(f"etcd-{i}", [
                shutil.which("etcd") or "etcd", "--name", f"etcd-{i}", "--data-dir", str(plan.root / f"etcd-{i}"),
                "--listen-client-urls", f"http://{host}:{client}", "--advertise-client-urls", f"http://{host}:{client}",
                "--listen-peer-urls", f"http://{host}:{peer}", "--initial-advertise-peer-urls", f"http://{host}:{peer}",
                "--initial-cluster", peers, "--initial-cluster-state", "new",
                "--initial-cluster-token", f"halfmq-{plan.cluster_name}", "--pre-vote",
                "--heartbeat-interval", "100", "--election-timeout", "1000", "--logger", "zap",
                "--log-outputs", "stderr"], self._logs / f"etcd-{i}.log", ETCD_READY, env={"PATH": os.defpath}))
        return members

    async def start(self) -> str:
        """Start every member; returns the ready line. Raises MemberFailed (the members started stay up for
        ``stop``)."""
        plan = self.plan
        self._logs.mkdir(parents=True, exist_ok=True)
        elected = bool(plan.etcd_ports)
        if elected:
            self.etcd = self._etcd_members()
        # etcd and the name servers together: both are there before any broker starts
        ready = await _all_ready([m.start(plan.start_timeout) for m in [*self.namesrvs, *self.etcd]])
        self.namesrv_addr = ";".join(match.group(1).decode() for match in ready[:len(self.namesrvs)])
        # A group of replicas refuses writes while fewer than two members have them (a leader that lost its store
        # cannot take writes alone); a flag after -- may say otherwise, as it comes later.
        group_args = ["--minInSyncReplicas=2"] if plan.replicas > 1 else []
        for k, (port, grpc_port, metrics_port, dashboard_port, ha_port) in enumerate(plan.broker_ports):
            group, broker_id = divmod(k, plan.replicas)
            if elected:
                # The election gives the roles; brokerId only names the member (its id while it follows).
                name, broker_id = f"broker-{group}-member-{broker_id + 1}", broker_id + 1
                role_args = [f"--haEtcdEndpoints={self.etcd_endpoints}"]
            else:
                name = f"broker-{group}" if broker_id == 0 else f"broker-{group}-follower-{broker_id}"
                role_args = []
            # The plan's flags come after the user's: the cluster's keys win over a -c file's or a repeated flag.
            self.brokers.append(Member(name, [
                *self._cli, "broker", *group_args, *plan.broker_args, f"--storePathRootDir={plan.root / name}",
                f"--brokerName=broker-{group}", f"--brokerId={broker_id}", f"--brokerClusterName={plan.cluster_name}",
                f"--namesrvAddr={self.namesrv_addr}", f"--bindAddress={plan.host}", f"--listenPort={port}",
                f"--grpcListenPort={grpc_port}", f"--metricsPromExporterPort={metrics_port}",
                f"--dashboardPort={dashboard_port}", f"--haListenPort={ha_port}", *role_args],
                self._logs / f"{name}.log", BROKER_READY, fatal=not elected))
        ready = await _all_ready([b.start(plan.start_timeout) for b in self.brokers])
        brokers = " ".join(f"{b.name} {m.group(1).decode()} grpc {m.group(3).decode()} metrics {m.group(2).decode()} "
                           f"dashboard {m.group(4).decode()}" for b, m in zip(self.brokers, ready, strict=True))
        etcd = f" etcd {self.etcd_endpoints}" if elected else ""
        return f"halfmq cluster ready: namesrvAddr {self.namesrv_addr} {brokers}{etcd}"

    async def first_exit(self) -> Member:
        """The first member to exit whose exit stops the cluster (any exit is a failure while the cluster runs)."""
        waits = {asyncio.ensure_future(m.proc.wait()): m for m in self.members if m.fatal}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return waits[next(iter(done))]

    async def stop(self) -> list[str]:
        """Brokers first (each unregisters from the name servers that are still up; a group's members resign their
        leases in etcd), then name servers, then etcd's members one at a time; returns what went wrong."""
        timeout = self.plan.stop_timeout
        problems = await asyncio.gather(*(b.stop(timeout) for b in self.brokers))
        problems += await asyncio.gather(*(n.stop(timeout) for n in self.namesrvs))
        for member in self.etcd:
            problems.append(await member.stop(timeout))
        return [p for p in problems if p]

    async def watch_brokers(self) -> None:
        """Reports each replicated broker that exits (its group fails over; the cluster goes on)."""
        async def watch(member: Member) -> None:
            status = await member.exited()
            member.reported = True
            self.lost.append(member.name)
            print(f"halfmq cluster: {member.name} exited with status {status}; its broker group elects another "
                  f"leader if it led{member.last_output()}", file=sys.stderr, flush=True)
        await asyncio.gather(*(watch(b) for b in self.brokers if not b.fatal))


async def _all_ready(starts: list) -> list[re.Match]:
    """The ready lines of members started together. Once every one of them is ready or failed, the failures are
    raised together (the members started stay for ``stop``)."""
    results = await asyncio.gather(*starts, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if any(not isinstance(f, MemberFailed) for f in failures):
        raise next(f for f in failures if not isinstance(f, MemberFailed))
    if failures:
        raise MemberFailed("\n".join(map(str, failures)))
    return results


async def run(plan: Plan) -> int:
    cluster = LocalCluster(plan)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    stopping = loop.create_task(stop.wait())
    status = 0
    replicas = f", {plan.replicas} members each" if plan.replicas > 1 else ""
    if plan.etcd_ports:
        replicas += f", electing their leaders on a {ETCD_SIZE}-member etcd"
    print(f"halfmq cluster: starting {plan.namesrvs} name server(s) and {plan.brokers} broker(s){replicas} in "
          f"{plan.root} (their output: {plan.root / 'logs'})", flush=True)
    try:
        starting = loop.create_task(cluster.start())
        await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            print(starting.result(), flush=True)  # raises MemberFailed
            watching = loop.create_task(cluster.watch_brokers())
            died = loop.create_task(cluster.first_exit())
            await asyncio.wait([died, stopping], return_when=asyncio.FIRST_COMPLETED)
            if died.done():
                member = died.result()
                member.reported, status = True, 1
                print(f"halfmq cluster: {member.name} exited with status {await member.exited()}; stopping the "
                      f"others{member.last_output()}", file=sys.stderr, flush=True)
            else:
                died.cancel()
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            if cluster.lost:
                status = 1
        else:  # asked to stop while starting: what started is stopped below
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
    except MemberFailed as exc:
        status = 1
        print(f"halfmq cluster: cannot start: {exc}", file=sys.stderr, flush=True)
    finally:
        stopping.cancel()
        for problem in await cluster.stop():
            status = 1
            print(f"halfmq cluster: {problem}", file=sys.stderr, flush=True)
    return status


def cluster_main(argv: list[str]) -> int:
    plan = parse_args(argv)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(run(plan))
    finally:
        loop.close()
