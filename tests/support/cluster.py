"""A local cluster of real processes on loopback: standalone name servers (``halfmq namesrv``) and brokers that
register with all of them (BrokerProcess, each with its own store). Tests kill, stop and restart members by the
handles this module keeps; nothing else is touched."""
from __future__ import annotations

import asyncio
import collections
import re
import signal
import sys

from .broker_process import BrokerProcess

NAMESRV_READY = re.compile(rb"halfmq namesrv ready: (\S+)")


class NamesrvProcess:
    def __init__(self, *flags: str):
        self.args = [sys.executable, "-m", "halfmq.broker.cli", "namesrv", "--bindAddress=127.0.0.1",
                     "--listenPort=0", *flags]
        self.proc: asyncio.subprocess.Process | None = None
        self.addr = ""
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self._drain: asyncio.Task | None = None

    async def start(self, timeout: float = 30.0) -> "NamesrvProcess":
        self.proc = await asyncio.create_subprocess_exec(*self.args, stdout=asyncio.subprocess.PIPE,
                                                         stderr=asyncio.subprocess.STDOUT)

        async def ready() -> None:
            while line := await self.proc.stdout.readline():
                self.lines.append(line.decode(errors="replace").rstrip())
                if match := NAMESRV_READY.search(line):
                    self.addr = match.group(1).decode()
                    return
            raise RuntimeError(f"the name server exited before it was ready:\n{self.output()}")
        try:
            await asyncio.wait_for(ready(), timeout)
        except BaseException:
            await self.kill()
            raise
        self._drain = asyncio.get_running_loop().create_task(self._drain_output())
        return self

    async def _drain_output(self) -> None:
        while line := await self.proc.stdout.readline():
            self.lines.append(line.decode(errors="replace").rstrip())

    def output(self, last: int = 60) -> str:
        return "\n".join(list(self.lines)[-last:])

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
        if self.proc is not None:
            await self.proc.wait()
        if self._drain is not None:
            await asyncio.gather(self._drain, return_exceptions=True)

    async def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        await self.kill()


class LocalCluster:
    """``namesrvs`` name servers and ``brokers`` brokers named broker-0, broker-1, ... in cluster ``name``."""

    def __init__(self, root, namesrvs: int = 2, brokers: int = 3, name: str = "TestCluster",
                 broker_flags: tuple[str, ...] = (), namesrv_flags: tuple[str, ...] = ()):
        self.root, self.name = root, name
        self.namesrvs = [NamesrvProcess(*namesrv_flags) for _ in range(namesrvs)]
        self.broker_count = brokers
        self.broker_flags = broker_flags
        self.brokers: list[BrokerProcess] = []

    @property
    def namesrv_addr(self) -> str:
        return ";".join(n.addr for n in self.namesrvs)

    def broker_process(self, index: int, *extra: str) -> BrokerProcess:
        return BrokerProcess(self.root / f"broker-{index}", f"--brokerName=broker-{index}",
                             f"--brokerClusterName={self.name}", f"--namesrvAddr={self.namesrv_addr}",
                             *self.broker_flags, *extra)

    async def start(self) -> "LocalCluster":
        try:
            await asyncio.gather(*(n.start() for n in self.namesrvs))
            self.brokers = [self.broker_process(i) for i in range(self.broker_count)]
            await asyncio.gather(*(b.start() for b in self.brokers))
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        await asyncio.gather(*(b.stop() for b in self.brokers if b.proc is not None), return_exceptions=True)
        await asyncio.gather(*(n.stop() for n in self.namesrvs), return_exceptions=True)


async def until(check, timeout: float, what: str, interval: float = 0.05):
    """Polls the awaitable-returning ``check`` until it returns a true value (returned), or fails naming ``what``:
    routes change in other processes, which send no event this process could wait on."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = None
    while loop.time() < deadline:
        try:
            last = await check()
        except Exception as exc:  # noqa: BLE001 - e.g. a name server not answering yet; retried until the deadline
            last = exc
        if last and not isinstance(last, Exception):
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


class BrokerGroup:
    """Name servers and one broker group: a leader (member 0) and followers (member i has brokerId i), each a
    process with its own store under ``root/member-i``. Tests kill, pause and restart members by these handles."""

    def __init__(self, root, size: int = 3, namesrvs: int = 1, name: str = "g", cluster: str = "GroupCluster",
                 broker_flags: tuple[str, ...] = ()):
        self.root, self.name, self.cluster = root, name, cluster
        self.namesrvs = [NamesrvProcess() for _ in range(namesrvs)]
        self.size = size
        self.broker_flags = broker_flags
        self.members: list[BrokerProcess | None] = [None] * size

    @property
    def namesrv_addr(self) -> str:
        return ";".join(n.addr for n in self.namesrvs)

    def store_dir(self, index: int):
        return self.root / f"member-{index}"

    def member_process(self, index: int, *extra: str) -> BrokerProcess:
        return BrokerProcess(self.store_dir(index), f"--brokerName={self.name}", f"--brokerId={index}",
                             f"--brokerClusterName={self.cluster}", f"--namesrvAddr={self.namesrv_addr}",
                             "--registerNameServerPeriod=500", *self.broker_flags, *extra)

    async def start_member(self, index: int, *extra: str) -> BrokerProcess:
        member = self.members[index] = self.member_process(index, *extra)
        return await member.start()

    async def start(self) -> "BrokerGroup":
        try:
            await asyncio.gather(*(n.start() for n in self.namesrvs))
            for index in range(self.size):  # the leader first: followers find it through the name servers
                await self.start_member(index)
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        await asyncio.gather(*(m.stop() for m in self.members if m is not None and m.proc is not None),
                             return_exceptions=True)
        await asyncio.gather(*(n.stop() for n in self.namesrvs), return_exceptions=True)
