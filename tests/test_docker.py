"""The Docker image, built and run as the "Docker" section of docs/operations.md says, under a private dockerd.

Every ``docker`` command of that section's bash blocks runs, in order, with the changes this machine needs:

- ``docker build`` gets ``--network host`` (pip and apt reach their registries through the host's network; the
  test's daemon sets up no NAT) and ``--build-arg BASE_IMAGE=`` an image that scripts/make_base_image.sh makes
  with debootstrap (no image registry is reachable here);
- the client is docker.io's, with BuildKit (tests/support/dockerd.py says why);
- each of the README's port numbers becomes a free port, the same one everywhere it appears (in ``-p`` and in the
  HALFMQ_ variables alike, as the README tells users to change them), and ports are published on 127.0.0.1 only.
  So the broker runs with a listenPort other than 10911, which the health check must follow.

``docker inspect ... Health.Status`` must print ``healthy``: the test first waits for docker's health event. Then
a message is sent and consumed from the host with halfmq's Python client, through the published ports, before
the section's remaining commands (``docker exec ... admin``, ``docker stop``) run; the stopped broker must have
exited with status 0. The daemon, and with it every image, container and volume, is removed at the end.

test_compose_file_runs_etcd_and_broker_groups_that_fail_over runs docker-compose.yml's services (name servers, a
3-member etcd, two broker groups of two) with the image the README test built (one daemon for the module), as the
``docker run`` commands Compose would issue: Compose is not among the test's tools (Debian has only the Python
docker-compose 1.29, which ran this file against this daemon by hand: up, a leader killed and started again, down).

Takes 2-3 minutes from a cold start on the 2-core CI machine, the longer while others load it (103-182 s
measured): the base image 50-100 s (debootstrap, downloading every package), the build 30-50 s, the README's broker
healthy in 10 s, and the Compose test 25-40 s (its nine containers healthy, a failover, a member started again).
The daemon's tmpfs held at most 0.75 GB.
scripts/install_docker.sh installs docker.io and debootstrap.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import queue
import re
import shlex
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from halfmq.broker import health
from halfmq.client import Message, Producer, PullConsumer

from tests.support.broker_process import BrokerProcess
from tests.support.cluster import until
from tests.support.dockerd import CLIENT, Dockerd, missing_tools

REPO = Path(__file__).resolve().parents[1]
#: the page and the section whose commands this test runs
PAGE, SECTION = "docs/operations.md", "Docker"
BASE_IMAGE = "halfmq-test-base:bookworm"
#: The port numbers the README's docker commands use; each becomes a free port.
README_PORTS = ("9876", "10911", "5557")
HEALTH_TIMEOUT = 90


def section_commands(readme: str, heading: str) -> list[list[str]]:
    """The ``docker`` commands of the bash blocks under ``## heading`` (up to the next ``## ``), as argv lists."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    assert match, f"{PAGE} has no '## {heading}' section"
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", match.group(1), re.M | re.S):
        for line in re.sub(r"\\\n\s*", "", block).splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                assert argv[0] == "docker", f"the {heading} section's blocks hold only docker commands: {line!r}"
                commands.append(argv)
    return commands


def free_ports(count: int) -> list[str]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [str(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def for_this_machine(argv: list[str], ports: dict[str, str]) -> list[str]:
    """The README's command as this test runs it (see the module docstring)."""
    argv = [re.sub(r"\b(\d+)\b", lambda m: ports.get(m.group(1), m.group(1)), arg) for arg in argv]
    argv = [f"127.0.0.1:{arg}" if previous == "-p" else arg for previous, arg in zip([""] + argv, argv)]
    if argv[1] == "build":
        argv[2:2] = ["--network", "host", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}"]
    return argv


class HealthEvents:
    """``docker events`` for one container's health changes and death, read in a thread."""

    def __init__(self, dockerd: Dockerd, container: str):
        self.proc = subprocess.Popen(
            [CLIENT, "events", "--filter", f"container={container}", "--filter", "event=health_status",
             "--filter", "event=die", "--format", "{{.Status}}"],
            env=dockerd.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.events: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.events.put(line.strip()) for line in self.proc.stdout],
                         daemon=True).start()

    def wait_healthy(self, timeout: float) -> None:
        while True:
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"the container was not healthy within {timeout} s") from None
            if event == "health_status: healthy":
                return
            assert event != "die", "the container exited before it was healthy"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


async def send_and_consume(namesrv: str) -> None:
    async with Producer("docker-test-producer", namesrv) as producer, \
            PullConsumer("docker-test-consumer", namesrv) as consumer:
        result = await producer.send(Message("DockerTopic", b"through the published ports"))
        pulled = await consumer.pull(result.queue, 0)
        assert [m.body for m in pulled.messages] == [b"through the published ports"]


@pytest.mark.parametrize("cmdline, argv", [
    (["tini", "--", "halfmq", "broker", "-c", "/etc/halfmq/broker.conf"], ["-c", "/etc/halfmq/broker.conf"]),
    (["/opt/halfmq/.venv/bin/python3", "/opt/halfmq/.venv/bin/halfmq", "broker", "--listenPort=1"],
     ["--listenPort=1"]),
    (["python", "-m", "halfmq.broker.cli", "broker"], []),
    (["halfmq", "admin", "brokerStatus"], None),
    (["python", "-m", "halfmq.broker.health"], None),
])
def test_health_check_recognises_a_broker_command_line(cmdline, argv):
    assert health.broker_argv(cmdline) == argv


async def test_health_check_reads_the_running_brokers_own_configuration(tmp_path, monkeypatch):
    """The image's health check follows the port the broker was given (here by a flag), reads the broker's
    environment rather than its own, and finds a stopped broker unhealthy, naming the address it tried."""
    port = int(free_ports(1)[0])
    monkeypatch.setenv("HALFMQ_maxMessageSize", "1048576")
    broker = await BrokerProcess(tmp_path / "store", f"--listenPort={port}").start()
    monkeypatch.delenv("HALFMQ_maxMessageSize")
    try:
        process = Path(f"/proc/{broker.proc.pid}")
        cmdline = [arg.decode() for arg in (process / "cmdline").read_bytes().split(b"\0") if arg]
        config = health.broker_config(process, health.broker_argv(cmdline))
        assert (config.listenPort, config.maxMessageSize) == (port, 1048576)
        assert health.check(config) == f"127.0.0.1:{port}"
    finally:
        await broker.stop()
    with pytest.raises(health.NotHealthy, match=re.escape(f"does not answer on 127.0.0.1:{port} (listenPort)")):
        health.check(config)


def diagnosis(dockerd: Dockerd, container: str) -> str:
    """The container's health check results and the broker's last output, for a failure message."""
    checks = dockerd.docker("inspect", "--format", "{{json .State.Health}}", container, check=False)
    logs = dockerd.docker("logs", "--tail", "40", container, check=False)
    return f"health: {checks.stdout}{checks.stderr}\nbroker output:\n{logs.stdout}{logs.stderr}"


def option(commands: list[list[str]], command: str, name: str) -> str:
    """The value of option ``name`` in the section's ``docker command``."""
    argv = next(argv for argv in commands if argv[1] == command)
    return argv[argv.index(name) + 1]


@pytest.fixture(scope="module")
def dockerd():
    """One private daemon with the base image for this module's tests: the image the README test builds is the one
    the Compose test runs (built once: a build takes 20-40 s)."""
    missing = missing_tools()
    assert not missing, f"missing {missing}: run scripts/install_docker.sh (scripts/test.sh does)"
    daemon = Dockerd()
    try:
        daemon.start()
        started = time.monotonic()
        made = subprocess.run(["bash", "scripts/make_base_image.sh", BASE_IMAGE], check=False, cwd=REPO,
                              env={**daemon.env, "TMPDIR": str(daemon.root)}, capture_output=True, text=True,
                              timeout=600)
        assert made.returncode == 0, f"make_base_image.sh failed:\n{made.stdout}{made.stderr}"
        print(f"base image made in {time.monotonic() - started:.0f} s")
        yield daemon
    finally:
        daemon.stop()  # every image, container, volume and network goes with it


@pytest.mark.skipif(os.geteuid() != 0, reason="dockerd and debootstrap need root")
def test_readme_docker_section_builds_runs_and_serves_on_another_port(dockerd):
    readme_commands = section_commands((REPO / PAGE).read_text(), SECTION)
    ports = dict(zip(README_PORTS, free_ports(len(README_PORTS))))
    container = option(readme_commands, "run", "--name")
    events = None
    try:
        events = HealthEvents(dockerd, container)
        outputs, exchanged = [], False
        for argv in readme_commands:
            argv = for_this_machine(argv, ports)
            if argv[1] == "inspect":
                started = time.monotonic()
                try:
                    events.wait_healthy(HEALTH_TIMEOUT)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\n{diagnosis(dockerd, container)}") from None
                print(f"healthy after {time.monotonic() - started:.1f} s more")
            if argv[1] in ("exec", "stop") and not exchanged:
                asyncio.run(send_and_consume(f"127.0.0.1:{ports['9876']}"))
                exchanged = True
            started = time.monotonic()
            done = subprocess.run([CLIENT, *argv[1:]], check=False, cwd=REPO, env=dockerd.env, capture_output=True,
                                  text=True, timeout=900)
            print(f"{shlex.join(argv)}: {time.monotonic() - started:.1f} s")
            assert done.returncode == 0, (f"{shlex.join(argv)} exited with {done.returncode}:\n"
                                          f"{done.stdout[-3000:]}{done.stderr[-3000:]}\n"
                                          f"{diagnosis(dockerd, container)}")
            outputs.append((argv, done.stdout))
        assert exchanged, "the section never reached a command after start-up (exec or stop)"
        health = next(out for argv, out in outputs if argv[1] == "inspect")
        assert health.strip() == "healthy"
        checks = dockerd.docker("inspect", "--format", "{{range .State.Health.Log}}{{.Output}}{{end}}", container)
        assert f"healthy: the broker answers on 127.0.0.1:{ports['10911']}" in checks.stdout, checks.stdout
        assert any("DockerTopic" in out for argv, out in outputs if argv[1] == "exec"), \
            "no admin command of the section listed the topic the client used"
        status = dockerd.docker("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container).stdout
        assert status.split() == ["exited", "0"], f"docker stop: the broker ended as {status!r}"
    finally:
        if events is not None:
            events.close()
        for argv in (["rm", "--force", "--volumes", container], ["volume", "prune", "--force"]):
            dockerd.docker(*argv, check=False)


#: What the Compose test translates into ``docker run`` options; a service using anything else fails it, so the file
#: cannot grow a setting the test would silently skip.
COMPOSE_KEYS = {"image", "build", "entrypoint", "user", "healthcheck", "ports", "networks", "depends_on",
                "environment", "volumes"}
#: etcd's key naming a broker group's leader (broker/replication/election.py): ``{"id", "addr", "epoch"}``
LEADER_KEY = "/halfmq/{cluster}/{group}/leader"


def compose_file(variables: dict[str, str]) -> dict:
    """docker-compose.yml with its ``${VAR:-default}`` references replaced as Compose does."""
    def value(match: re.Match) -> str:
        if match.group(1) in variables:
            return variables[match.group(1)]
        assert match.group(2) is not None, f"docker-compose.yml uses ${{{match.group(1)}}} without a default"
        return match.group(2)
    return yaml.safe_load(re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", value, (REPO / "docker-compose.yml").read_text()))


def compose_runs(compose: dict, ports: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(service, ``docker run`` arguments) for each service, dependencies first: the containers ``docker compose
    up`` makes, named after their services (which is also how Compose's network aliases name them), published
    host ports replaced by ``ports``."""
    services, order = compose["services"], []

    def visit(name: str) -> None:
        for dependency in services[name].get("depends_on", []):
            visit(dependency)
        if name not in order:
            order.append(name)
    for name in services:
        visit(name)
    runs = []
    for name in order:
        service = services[name]
        assert set(service) <= COMPOSE_KEYS, f"service {name} uses {set(service) - COMPOSE_KEYS}: translate it here"
        argv = ["run", "-d", "--name", name]
        networks = service["networks"]
        [(network, settings)] = networks.items() if isinstance(networks, dict) else [(networks[0], None)]
        argv += ["--network", compose["networks"][network]["name"]]
        if settings:
            argv += ["--ip", settings["ipv4_address"]]
        if "user" in service:
            argv += ["--user", service["user"]]
        for key, val in service.get("environment", {}).items():
            argv += ["-e", f"{key}={val}"]
        for volume in service.get("volumes", []):
            argv += ["-v", volume]
        for port in service.get("ports", []):
            host, published, target = port.split(":")
            argv += ["-p", f"{host}:{ports[published]}:{target}"]
        if check := service.get("healthcheck"):
            kind, *command = check["test"]
            assert kind == "CMD", f"service {name}: only exec-form health checks are translated"
            argv += ["--health-cmd", shlex.join(command), "--health-interval", check["interval"],
                     "--health-timeout", check["timeout"], "--health-retries", str(check["retries"])]
        command = []
        if "entrypoint" in service:
            entrypoint, *command = service["entrypoint"]  # docker run takes the rest as the command
            argv += ["--entrypoint", entrypoint]
        runs.append((name, [*argv, service["image"], *command]))
    return runs


def ensure_image(dockerd: Dockerd, readme_commands: list[list[str]]) -> str:
    """The image the README test built, or built here as it does when that test did not run first."""
    image = option(readme_commands, "build", "-t")
    if dockerd.docker("image", "inspect", image, check=False).returncode:
        argv = for_this_machine(next(argv for argv in readme_commands if argv[1] == "build"), {})
        built = subprocess.run([CLIENT, *argv[1:]], check=False, cwd=REPO, env=dockerd.env, capture_output=True,
                               text=True, timeout=900)
        assert built.returncode == 0, f"{shlex.join(argv)}:\n{built.stdout[-3000:]}{built.stderr[-3000:]}"
    return image


@dataclasses.dataclass(frozen=True)
class GroupMember:
    """A broker service of docker-compose.yml: its container and who it is in its group."""
    container: str
    group: str
    broker_id: str  #: the id it has in etcd's election, and in routes while it follows
    ip: str

    @property
    def addr(self) -> str:
        return f"{self.ip}:10911"

    def metrics(self) -> dict[str, float]:
        """Its unlabelled ``halfmq_replication_*`` gauges (replicationStatus is an admin request: with ACL off,
        served to loopback clients only, so the test reads what each member publishes)."""
        with urllib.request.urlopen(f"http://{self.ip}:5557/metrics", timeout=5) as answer:
            text = answer.read().decode()
        return {name: float(value) for name, value in re.findall(r"^(halfmq_replication_\w+) (\S+)$", text, re.M)}


def group_members(compose: dict) -> dict[str, list[GroupMember]]:
    """brokerName → its members, as the broker services' variables say."""
    groups: dict[str, list[GroupMember]] = collections.defaultdict(list)
    for name, service in compose["services"].items():
        env = service.get("environment", {})
        if "HALFMQ_brokerName" in env:
            groups[env["HALFMQ_brokerName"]].append(
                GroupMember(name, env["HALFMQ_brokerName"], env["HALFMQ_brokerId"], env["HALFMQ_brokerIP1"]))
    return dict(groups)


async def cluster_list(dockerd: Dockerd, container: str, namesrv: str) -> dict[tuple[str, str], str]:
    """(brokerName, brokerId) → address (brokerId 0: the group's leader), as ``halfmq admin clusterList`` run in
    ``container`` prints them."""
    done = await asyncio.to_thread(dockerd.docker, "exec", container, "halfmq", "admin", "-n", namesrv,
                                   "clusterList", "--json")
    return {(row["brokerName"], str(row["brokerId"])): row["addr"] for row in json.loads(done.stdout)}


async def etcd_leader(dockerd: Dockerd, etcd: str, cluster: str, group: str) -> str | None:
    """The id of the member etcd names as ``group``'s leader (None while it names none), read with etcdctl in the
    ``etcd`` container."""
    done = await asyncio.to_thread(dockerd.docker, "exec", etcd, "etcdctl", "get", "--print-value-only",
                                   LEADER_KEY.format(cluster=cluster, group=group))
    return str(json.loads(done.stdout)["id"]) if done.stdout.strip() else None


async def send(namesrv: str, count: int) -> collections.Counter:
    """Sends ``count`` messages through the name servers; brokerName → how many each group acknowledged."""
    landed = collections.Counter()
    async with Producer("compose-test-producer", namesrv) as producer:
        for i in range(count):
            landed[(await producer.send(Message("ComposeTopic", b"%d" % i))).queue.broker_name] += 1
    return landed


@pytest.mark.skipif(os.geteuid() != 0, reason="dockerd and debootstrap need root")
async def test_compose_file_runs_etcd_and_broker_groups_that_fail_over(dockerd):
    """docker-compose.yml's services, run from the image as ``docker run`` commands (see the module docstring):
    every container becomes healthy; etcd's three members form one cluster; each broker group's leader is
    the member etcd names, in sync with its follower, and both name servers route to the two (the leader as brokerId
    0); sends from the host through the published name-server ports land on both groups and are stored.

    Then one group's leader is killed (docker kill): etcd names its follower, which the name servers route as
    brokerId 0, and sends through them go on, to the other group only (minInSyncReplicas 2: a group takes writes
    while both members have them); once the killed member is started again it follows, and the group takes sends
    again. Last, the other group's leader is stopped (docker stop): it exits 0 and its follower leads at once."""
    image = ensure_image(dockerd, section_commands((REPO / PAGE).read_text(), SECTION))
    compose = compose_file({"HALFMQ_NET": dockerd.free_prefix()})
    services = compose["services"]
    published = [port.split(":")[1] for service in services.values() for port in service.get("ports", [])]
    ports = dict(zip(published, free_ports(len(published))))
    namesrv_addr = ";".join(f"127.0.0.1:{port}" for port in ports.values())
    runs = compose_runs(compose, ports)
    assert {service["image"] for service in services.values()} == {image}
    [network] = compose["networks"].values()
    groups = group_members(compose)
    [cluster] = {service["environment"]["HALFMQ_brokerClusterName"] for service in services.values()
                 if "HALFMQ_brokerName" in service.get("environment", {})}
    etcds = [name for name, service in services.items() if "ETCD_NAME" in service.get("environment", {})]
    namesrvs = [name for name, service in services.items() if "namesrv" in service.get("entrypoint", [])]
    assert len(etcds) == 3 and len(namesrvs) == 2 and sorted(len(m) for m in groups.values()) == [2, 2], \
        (etcds, namesrvs, groups)
    assert all(service["environment"]["HALFMQ_haEtcdEndpoints"] == ",".join(f"{e}:2379" for e in etcds)
               for members in groups.values() for service in (services[m.container] for m in members))
    events = {name: HealthEvents(dockerd, name) for name, _ in runs}

    async def elected(group: str) -> tuple[GroupMember, GroupMember] | None:
        """(leader, follower) once etcd names the group's leader, which leads by its metrics, with its follower
        in sync; else None."""
        leader_id = await etcd_leader(dockerd, etcds[0], cluster, group)
        [leader] = [m for m in groups[group] if m.broker_id == leader_id] or [None]
        if leader is None:
            return None
        [follower] = [m for m in groups[group] if m is not leader]
        led, followed = await asyncio.gather(asyncio.to_thread(leader.metrics), asyncio.to_thread(follower.metrics))
        if (led.get("halfmq_replication_leader"), led.get("halfmq_replication_in_sync_members"),
                followed.get("halfmq_replication_leader")) == (1.0, 2.0, 0.0):
            return leader, follower
        return None

    listed: dict[str, dict[tuple[str, str], str]] = {}  #: what each name server routed when last asked

    async def routed(routes: dict[tuple[str, str], str]) -> bool:
        """Both name servers route exactly ``routes``."""
        for namesrv in namesrvs:
            listed[namesrv] = await cluster_list(dockerd, namesrvs[0], f"{namesrv}:9876")
        return all(answer == routes for answer in listed.values())

    def routes_of(roles: dict[str, tuple[GroupMember, GroupMember]]) -> dict[tuple[str, str], str]:
        return {key: addr for group, (leader, follower) in roles.items()
                for key, addr in (((group, "0"), leader.addr), ((group, follower.broker_id), follower.addr))}

    try:
        dockerd.create_network(network["name"], network["ipam"]["config"][0]["subnet"])
        for name, argv in runs:
            dockerd.docker(*argv)
        for name, watch in events.items():
            try:
                watch.wait_healthy(HEALTH_TIMEOUT)
            except AssertionError as exc:
                raise AssertionError(f"{name}: {exc}\n{diagnosis(dockerd, name)}") from None
        members = json.loads(dockerd.docker("exec", etcds[0], "etcdctl", "member", "list", "-w", "json").stdout)
        assert sorted((m["name"], m["peerURLs"], m["clientURLs"]) for m in members["members"]) == \
            [(e, [f"http://{e}:2380"], [f"http://{e}:2379"]) for e in etcds]
        checked = dockerd.docker("exec", etcds[0], "etcdctl", "endpoint", "health", "--cluster")
        assert checked.stderr.count("is healthy") == 3, checked.stderr  # etcdctl reports health on stderr

        roles = {}
        for group in groups:
            roles[group] = await until(lambda group=group: elected(group), 90, f"{group} has a leader on etcd",
                                       interval=1)
        # a broker registers as it starts, and again at once as it takes the lead
        await until(lambda: routed(routes_of(roles)), 60, "both name servers route to each leader", interval=1)
        landed = await send(namesrv_addr, 40)
        assert set(landed) == set(groups), landed
        status = json.loads(dockerd.docker("exec", namesrvs[0], "halfmq", "admin", "-n", ";".join(
            f"{n}:9876" for n in namesrvs), "topicStatus", "-t", "ComposeTopic", "--json").stdout)
        stored = collections.Counter()
        for row in status:
            stored[row["brokerName"]] += row["maxOffset"] - row["minOffset"]
        assert stored == landed

        failed, other = sorted(groups)[1], sorted(groups)[0]
        killed, survivor = roles[failed]
        dockerd.docker("kill", killed.container)
        killed_at = time.monotonic()
        async def took_over() -> bool:
            return await etcd_leader(dockerd, etcds[0], cluster, failed) == survivor.broker_id
        await until(took_over, 30, f"etcd names {survivor.container} {failed}'s leader", interval=0.2)
        print(f"{survivor.container} elected {time.monotonic() - killed_at:.1f} s after the kill")
        await until(lambda: routed({**routes_of({other: roles[other]}), (failed, "0"): survivor.addr}), 30,
                    f"the name servers route {failed} to {survivor.container} alone", interval=0.5)
        assert await send(namesrv_addr, 10) == {other: 10}, "a group of one member takes no writes"
        dockerd.docker("start", killed.container)
        roles[failed] = (survivor, killed)
        await until(lambda: elected(failed), 90, f"{killed.container} follows {survivor.container}", interval=1)
        await until(lambda: routed(routes_of(roles)), 60, f"both name servers route {failed}'s members", interval=1)
        assert failed in await send(namesrv_addr, 40), f"{failed} takes sends again once both members are back"

        leader, follower = roles[other]
        dockerd.docker("stop", leader.container)
        assert dockerd.docker("inspect", "--format", "{{.State.ExitCode}}", leader.container).stdout.strip() == "0"
        # a stopped leader resigns its lease: the follower leads and registers without waiting for it to expire
        await until(lambda: routed({**routes_of({failed: roles[failed]}), (other, "0"): follower.addr}), 5,
                    f"{follower.container} leads {other} once {leader.container} stopped", interval=0.2)
    except AssertionError as exc:
        brokers = [m.container for members in groups.values() for m in members]
        raise AssertionError(f"{exc}\nroutes listed last: {listed}\n" + "\n".join(
            f"--- {name}\n{diagnosis(dockerd, name)}" for name in brokers)) from None
    finally:
        for watch in events.values():
            watch.close()
        dockerd.docker("rm", "--force", "--volumes", *events, check=False)
        dockerd.docker("network", "rm", network["name"], check=False)
        dockerd.docker("volume", "rm", "--force", *compose.get("volumes", {}), check=False)
