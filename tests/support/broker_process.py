"""A broker started as users start it (``python -m halfmq.broker.cli broker ...``) in a session of its own.

Its process group then holds the broker and every helper process it starts (a sync helper, a writer process),
so a simulated power cut can end all of them at once with ``os.killpg`` on the group id this module started —
and nothing else. The broker's output is drained continuously (a full pipe would stall its logging) and its last
lines are kept for failure messages.
"""
from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import sys

READY = re.compile(rb"halfmq ready: broker (\S+) namesrv (\S+)")
READY_GRPC = re.compile(rb" grpc (\S+)")  #: on the ready line: "-" when gRPC is off


class BrokerDidNotStart(RuntimeError):
    pass


class BrokerProcess:
    def __init__(self, store_dir, *flags: str):
        self.args = [sys.executable, "-m", "halfmq.broker.cli", "broker", "--bindAddress=127.0.0.1",
                     "--listenPort=0", "--namesrvListenPort=0", "--metricsPromExporterPort=-1", "--grpcListenPort=-1", "--dashboardPort=-1",
                     "--haListenPort=0",
                     f"--storePathRootDir={store_dir}", *flags]
        self.proc: asyncio.subprocess.Process | None = None
        self.pgid: int | None = None
        self.broker_addr = self.namesrv = ""
        self.grpc_addr = ""  #: HOST:PORT of its gRPC endpoint, with --grpcListenPort=0 (or another port)
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self._drain: asyncio.Task | None = None

    async def start(self, timeout: float = 60.0) -> "BrokerProcess":
        """Start and wait for the ready line; raises BrokerDidNotStart with its output if it exits first."""
        self.proc = await asyncio.create_subprocess_exec(*self.args, stdout=asyncio.subprocess.PIPE,
                                                         stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        self.pgid = self.proc.pid  # a new session: its leader's pid is the group id
        try:
            await asyncio.wait_for(self._until_ready(), timeout)
        except asyncio.TimeoutError:
            await self.kill_group()
            raise BrokerDidNotStart(f"no ready line within {timeout} s:\n{self.output()}") from None
        self._drain = asyncio.get_running_loop().create_task(self._drain_output())
        return self

    async def _until_ready(self) -> None:
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                status = await self.proc.wait()
                await self.kill_group()  # whatever it started dies with it
                raise BrokerDidNotStart(f"the broker exited with status {status} before it was ready:\n"
                                        f"{self.output()}")
            self.lines.append(line.decode(errors="replace").rstrip())
            match = READY.search(line)
            if match:
                self.broker_addr, self.namesrv = match.group(1).decode(), match.group(2).decode()
                grpc = READY_GRPC.search(line)
                self.grpc_addr = grpc.group(1).decode() if grpc and grpc.group(1) != b"-" else ""
                return

    async def _drain_output(self) -> None:
        while line := await self.proc.stdout.readline():
            self.lines.append(line.decode(errors="replace").rstrip())

    def output(self, last: int = 60) -> str:
        return "\n".join(list(self.lines)[-last:])

    async def kill_group(self) -> None:
        """SIGKILL the broker's whole process group (the power is out) and wait until every member is gone."""
        if self.pgid is None:
            return
        # The group id cannot name anyone else while the broker is unreaped or a member lives: only then kill.
        if self.proc.returncode is None or _group_members(self.pgid):
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        await self.proc.wait()
        await wait_group_gone(self.pgid)
        if self._drain is not None:
            try:  # EOF once every holder of the output pipe is gone; one that left the group could keep it open
                await asyncio.wait_for(self._drain, 10)
            except asyncio.TimeoutError:
                pass

    async def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a graceful shutdown); the group is killed if it does not finish within ``timeout``."""
        if self.proc is None or self.proc.returncode is not None:
            await self.kill_group()
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        await self.kill_group()  # helpers that outlived it, if any


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a group, from /proc."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(name))
    return members


async def wait_group_gone(pgid: int, timeout: float = 30.0) -> None:
    """Wait (on pidfds, not a sleep loop) until no live process of the group is left: only then are its files
    on a mount closed, so the mount can be unmounted."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while members := _group_members(pgid):
        for pid in members:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            exited = loop.create_future()
            loop.add_reader(fd, lambda f=exited: f.done() or f.set_result(None))
            try:
                await asyncio.wait_for(exited, max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise RuntimeError(f"process {pid} of group {pgid} is still alive {timeout} s after SIGKILL") \
                    from None
            finally:
                loop.remove_reader(fd)
                os.close(fd)
