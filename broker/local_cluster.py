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
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import ipaddress
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError, load_config, parse_flags

NAMESRV_READY = re.compile(rb"halfmq namesrv ready: (\S+)")
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
    check_broker_args(parser, broker_args)
    return Plan(args.namesrvs, args.brokers, Path(args.dir).resolve(), args.host, ns_ports, broker_ports,
                args.cluster_name, broker_args, args.start_timeout, args.stop_timeout, args.replicas)


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

    def __init__(self, name: str, args: list[str], log_path: Path, ready: re.Pattern):
        self.name, self.args, self.log_path, self.ready_pattern = name, args, log_path, ready
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
                limit=1 << 20)
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
        if self.proc.returncode is None:
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
        if status != 0:
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

    @property
    def members(self) -> list[Member]:
        return [*self.namesrvs, *self.brokers]

    async def start(self) -> str:
        """Start every member; returns the ready line. Raises MemberFailed (the members started stay up for
        ``stop``)."""
        plan = self.plan
        self._logs.mkdir(parents=True, exist_ok=True)
        ready = await _all_ready([m.start(plan.start_timeout) for m in self.namesrvs])
        self.namesrv_addr = ";".join(match.group(1).decode() for match in ready)
        # A group of replicas refuses writes while fewer than two members have them (a leader that lost its store
        # cannot take writes alone); a flag after -- may say otherwise, as it comes later.
        group_args = ["--minInSyncReplicas=2"] if plan.replicas > 1 else []
        for k, (port, grpc_port, metrics_port, dashboard_port, ha_port) in enumerate(plan.broker_ports):
            group, broker_id = divmod(k, plan.replicas)
            name = f"broker-{group}" if broker_id == 0 else f"broker-{group}-follower-{broker_id}"
            # The plan's flags come after the user's: the cluster's keys win over a -c file's or a repeated flag.
            self.brokers.append(Member(name, [
                *self._cli, "broker", *group_args, *plan.broker_args, f"--storePathRootDir={plan.root / name}",
                f"--brokerName=broker-{group}", f"--brokerId={broker_id}", f"--brokerClusterName={plan.cluster_name}",
                f"--namesrvAddr={self.namesrv_addr}", f"--bindAddress={plan.host}", f"--listenPort={port}",
                f"--grpcListenPort={grpc_port}", f"--metricsPromExporterPort={metrics_port}",
                f"--dashboardPort={dashboard_port}", f"--haListenPort={ha_port}"],
                self._logs / f"{name}.log", BROKER_READY))
        ready = await _all_ready([b.start(plan.start_timeout) for b in self.brokers])
        brokers = " ".join(f"{b.name} {m.group(1).decode()} grpc {m.group(3).decode()} metrics {m.group(2).decode()} "
                           f"dashboard {m.group(4).decode()}" for b, m in zip(self.brokers, ready, strict=True))
        return f"halfmq cluster ready: namesrvAddr {self.namesrv_addr} {brokers}"

    async def first_exit(self) -> Member:
        """The first member to exit (any exit is a failure while the cluster runs)."""
        waits = {asyncio.ensure_future(m.proc.wait()): m for m in self.members}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return waits[next(iter(done))]

    async def stop(self) -> list[str]:
        """Brokers first (each unregisters from the name servers that are still up), then name servers; returns
        what went wrong."""
        timeout = self.plan.stop_timeout
        problems = await asyncio.gather(*(b.stop(timeout) for b in self.brokers))
        problems += await asyncio.gather(*(n.stop(timeout) for n in self.namesrvs))
        return [p for p in problems if p]


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
    print(f"halfmq cluster: starting {plan.namesrvs} name server(s) and {plan.brokers} broker(s){replicas} in "
          f"{plan.root} (their output: {plan.root / 'logs'})", flush=True)
    try:
        starting = loop.create_task(cluster.start())
        await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            print(starting.result(), flush=True)  # raises MemberFailed
            died = loop.create_task(cluster.first_exit())
            await asyncio.wait([died, stopping], return_when=asyncio.FIRST_COMPLETED)
            if died.done():
                member = died.result()
                member.reported, status = True, 1
                print(f"halfmq cluster: {member.name} exited with status {await member.exited()}; stopping the "
                      f"others{member.last_output()}", file=sys.stderr, flush=True)
            else:
                died.cancel()
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
    from .cli import new_event_loop  # the one place the loop is chosen (uvloop: no child-watcher threads)
    plan = parse_args(argv)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(run(plan))
    finally:
        loop.close()
