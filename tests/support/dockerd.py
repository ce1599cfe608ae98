"""A private Docker daemon for one test: everything it makes lives in one temp folder and on one bridge that it
creates, so it meets no other Docker on the machine and leaves nothing behind.

- Its own data root, exec root, pid file and socket in the folder; ``overlay2`` storage (on the tmpfs below):
  a layer or a container holds only what it changed. (``vfs`` copied the whole root file system for each one:
  docker-compose.yml's nine containers outgrew the tmpfs.)
- Its own bridge (``hmqdk<pid>`` on a /24 of 10.213.0.0/16 that no interface uses, created here and deleted at the
  end, so two test runs on one machine do not meet), and no iptables rules, NAT or ip_forward changes:
  the host reaches containers through published ports, which docker-proxy serves; an image build that needs the
  network (pip, apt) runs with ``--network host``.
- Started and stopped by its PID (SIGTERM, then SIGKILL after a timeout); ready when its log says the API
  listens. What it mounted under the folder (a network namespace) is unmounted before the folder is deleted.
- The folder is a tmpfs (at most TMPFS_SIZE): the base image, the build and the containers are several hundred
  thousand files, which dpkg and the build sync, slowly on a busy disk, and which took 100 s to delete from disk.
  Unmounting frees them at once.
"""
from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

#: The docker.io package's client: it builds with BuildKit (DOCKER_BUILDKIT=1) without the buildx plugin, which
#: was twice as fast as the legacy builder here.
CLIENT = "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else "docker"
TMPFS_SIZE = "8g"
BRIDGE_NETWORK = "10.213"  # its bridge takes the first 10.213.N.0/24 that no interface of the machine has


class DockerdFailed(RuntimeError):
    pass


def missing_tools() -> list[str]:
    """What the daemon and the base image need that is not installed (scripts/install_docker.sh installs it)."""
    return [tool for tool in ("dockerd", CLIENT, "docker-proxy", "debootstrap", "ip") if not shutil.which(tool)]


class Dockerd:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="halfmq-docker-"))  # short: unix socket paths are limited
        self._mounted = False
        self.socket = self.root / "docker.sock"
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{self.socket}", "DOCKER_BUILDKIT": "1"}
        self.proc: subprocess.Popen | None = None
        self.lines: collections.deque[str] = collections.deque(maxlen=100)
        self._listening = threading.Event()
        self.bridge = f"hmqdk{os.getpid()}"[:15]  # interface names are at most 15 characters
        self._bridge_made = False
        self._network_bridges: list[str] = []

    def start(self, timeout: float = 60.0) -> Dockerd:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs",
                                  str(self.root)], check=False, capture_output=True, text=True)
        if mounted.returncode:
            raise DockerdFailed(f"cannot mount a tmpfs on {self.root}: {mounted.stderr.strip()}")
        self._mounted = True
        self._make_bridge()
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
             "--pidfile", str(self.root / "dockerd.pid"), "-H", f"unix://{self.socket}", "--storage-driver", "overlay2",
             "--bridge", self.bridge, "--iptables=false", "--ip6tables=false", "--ip-masq=false", "--ip-forward=false"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._listening.wait(timeout):
            raise DockerdFailed(f"dockerd did not listen within {timeout} s:\n{self.log()}")
        if self.proc.poll() is not None:
            raise DockerdFailed(f"dockerd exited with status {self.proc.returncode}:\n{self.log()}")
        return self

    @staticmethod
    def free_prefix() -> str:
        """``10.213.N``: the first /24 of BRIDGE_NETWORK that no interface of the machine has."""
        in_use = subprocess.run(["ip", "-o", "-4", "addr", "show"], check=False, capture_output=True,
                                text=True).stdout
        subnet = next((n for n in range(1, 255) if f" {BRIDGE_NETWORK}.{n}." not in in_use), None)
        if subnet is None:
            raise DockerdFailed(f"every {BRIDGE_NETWORK}.N.0/24 is in use: bridges left by killed test runs? "
                                f"(ip -o addr show | grep hmq)")
        return f"{BRIDGE_NETWORK}.{subnet}"

    def create_network(self, name: str, subnet: str) -> None:
        """A user-defined bridge network (``docker network create``) on a bridge named here, which ``stop`` deletes
        should the network outlive its test: dockerd keeps a network's bridge when it stops."""
        bridge = f"hmqn{len(self._network_bridges)}{os.getpid()}"[:15]
        self._network_bridges.append(bridge)  # first: a failed create may still have made it
        self.docker("network", "create", "--subnet", subnet, "-o", f"com.docker.network.bridge.name={bridge}", name)

    def _make_bridge(self) -> None:
        prefix = self.free_prefix()
        for command in (["ip", "link", "add", self.bridge, "type", "bridge"],
                        ["ip", "addr", "add", f"{prefix}.1/24", "dev", self.bridge],
                        ["ip", "link", "set", self.bridge, "up"]):
            done = subprocess.run(command, check=False, capture_output=True, text=True)
            if done.returncode:
                raise DockerdFailed(f"{' '.join(command)}: {done.stderr.strip()}")
            self._bridge_made = True

    def _read_log(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if "API listen on" in line:
                self._listening.set()
        self._listening.set()  # it exited: start() reports that rather than wait out its timeout

    def log(self) -> str:
        return "\n".join(self.lines)

    def docker(self, *args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run the docker client against this daemon; raises DockerdFailed with its output when it fails."""
        done = subprocess.run([CLIENT, *args], check=False, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode:
            raise DockerdFailed(f"docker {' '.join(args)} exited with {done.returncode}:\n"
                                f"{done.stdout}{done.stderr}")
        return done

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the daemon by its PID, then delete its folder (images, containers, volumes) and its bridge."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            self._unmount_leftovers()
            if self._mounted:
                subprocess.run(["umount", str(self.root)], check=False, capture_output=True)
            shutil.rmtree(self.root, ignore_errors=True)
            if self._bridge_made:
                subprocess.run(["ip", "link", "delete", self.bridge], check=False, capture_output=True)
            for bridge in self._network_bridges:  # gone already unless its network was not removed
                subprocess.run(["ip", "link", "delete", bridge], check=False, capture_output=True)

    def _unmount_leftovers(self) -> None:
        """dockerd leaves its default network namespace mounted under the exec root: the tmpfs cannot be unmounted,
        nor rmtree go into it, until that is."""
        mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], check=False, capture_output=True,
                                text=True).stdout.split()
        for target in sorted((m for m in mounts if m.startswith(f"{self.root}/")), reverse=True):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
