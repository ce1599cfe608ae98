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

test_compose_file_runs_a_cluster_of_two_name_servers_and_two_brokers runs docker-compose.yml's services with the
image the README test built (one daemon for the module), as the ``docker run`` commands Compose would issue: Compose
is not installed here (Debian has only the Python docker-compose 1.29; it ran this file against this daemon by hand).

Takes 1.5 minutes from a cold start on the 2-core CI machine, 3 when others load it: the base image 55-100 s
(debootstrap, downloading every package), the build 20-40 s, start-up to healthy 12 s, the rest a few seconds.
scripts/install_docker.sh installs docker.io and debootstrap.
"""
from __future__ import annotations

import asyncio
import collections
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
COMPOSE_KEYS = {"image", "build", "entrypoint", "healthcheck", "ports", "networks", "depends_on", "environment",
                "volumes"}


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


async def cluster_list(dockerd: Dockerd, container: str, namesrv: str, broker_id: str = "0") -> dict[str, str]:
    """brokerName → the address of its member ``broker_id`` (0: the leader), as ``halfmq admin clusterList`` run in
    ``container`` prints them."""
    done = await asyncio.to_thread(dockerd.docker, "exec", container, "halfmq", "admin", "-n", namesrv,
                                   "clusterList", "--json")
    return {row["brokerName"]: row["addr"] for row in json.loads(done.stdout) if str(row["brokerId"]) == broker_id}


@pytest.mark.skipif(os.geteuid() != 0, reason="dockerd and debootstrap need root")
async def test_compose_file_runs_a_cluster_of_two_name_servers_and_two_brokers(dockerd):
    """docker-compose.yml's services, run from the image as ``docker run`` commands (Compose is not installed
    here): every container becomes healthy, each name server lists both brokers, sends from the host through the
    published name-server ports land on both brokers and are stored, and a stopped broker leaves the routes."""
    image = ensure_image(dockerd, section_commands((REPO / PAGE).read_text(), SECTION))
    compose = compose_file({"HALFMQ_NET": dockerd.free_prefix()})
    published = [port.split(":")[1] for service in compose["services"].values() for port in service.get("ports", [])]
    ports = dict(zip(published, free_ports(len(published))))
    runs = compose_runs(compose, ports)
    assert {service["image"] for service in compose["services"].values()} == {image}
    [network] = compose["networks"].values()
    members = {(service["environment"]["HALFMQ_brokerName"], service["environment"].get("HALFMQ_brokerId", "0")):
               f"{service['environment']['HALFMQ_brokerIP1']}:10911"
               for service in compose["services"].values() if "environment" in service}
    brokers = {name: addr for (name, broker_id), addr in members.items() if broker_id == "0"}
    followers = {name: addr for (name, broker_id), addr in members.items() if broker_id == "1"}
    namesrvs = [name for name, service in compose["services"].items() if "environment" not in service]
    assert len(brokers) == 2 and len(followers) == 2 and len(namesrvs) == 2, (members, namesrvs)
    events = {name: HealthEvents(dockerd, name) for name, _ in runs}
    try:
        dockerd.create_network(network["name"], network["ipam"]["config"][0]["subnet"])
        for name, argv in runs:
            dockerd.docker(*argv)
        for name, watch in events.items():
            try:
                watch.wait_healthy(HEALTH_TIMEOUT)
            except AssertionError as exc:
                raise AssertionError(f"{name}: {exc}\n{diagnosis(dockerd, name)}") from None
        for namesrv in namesrvs:
            async def lists_both(namesrv=namesrv) -> bool:
                return (await cluster_list(dockerd, "broker-0", f"{namesrv}:9876") == brokers
                        and await cluster_list(dockerd, "broker-0", f"{namesrv}:9876", "1") == followers)
            # a broker registers as it starts; one that started before a name server listened, 30 s later
            await until(lists_both, 60, f"{namesrv} lists both brokers", interval=1)
        async def groups_in_sync() -> bool:
            # Each leader's metrics (replicationStatus is an admin request: with ACL off, served to loopback only)
            def in_sync(addr: str) -> bool:
                host = addr.rsplit(":", 1)[0]
                with urllib.request.urlopen(f"http://{host}:5557/metrics", timeout=5) as answer:
                    return "halfmq_replication_in_sync_members 2.0" in answer.read().decode()
            return all(await asyncio.gather(*(asyncio.to_thread(in_sync, a) for a in brokers.values())))
        await until(groups_in_sync, 90, "each broker's follower in sync", interval=1)
        landed = collections.Counter()
        async with Producer("compose-test-producer", ";".join(f"127.0.0.1:{port}" for port in ports.values())) \
                as producer:
            for i in range(40):
                landed[(await producer.send(Message("ComposeTopic", b"%d" % i))).queue.broker_name] += 1
        assert set(landed) == set(brokers), landed
        status = json.loads(dockerd.docker("exec", "broker-1", "halfmq", "admin", "-n", ";".join(
            f"{n}:9876" for n in namesrvs), "topicStatus", "-t", "ComposeTopic", "--json").stdout)
        stored = collections.Counter()
        for row in status:
            stored[row["brokerName"]] += row["maxOffset"] - row["minOffset"]
        assert stored == landed
        dockerd.docker("stop", "broker-1")
        assert dockerd.docker("inspect", "--format", "{{.State.ExitCode}}", "broker-1").stdout.strip() == "0"
        assert await cluster_list(dockerd, "broker-0", f"{namesrvs[0]}:9876") == \
            {"broker-0": brokers["broker-0"]}, "a stopped broker unregisters as it stops"
    finally:
        for watch in events.values():
            watch.close()
        dockerd.docker("rm", "--force", "--volumes", *events, check=False)
        dockerd.docker("network", "rm", network["name"], check=False)
        dockerd.docker("volume", "rm", "--force", *compose.get("volumes", {}), check=False)
