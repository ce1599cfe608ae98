"""The broker's side of a name-server connection: one TCP connection per name server, requests matched to answers
by opaque. It is small on purpose: the broker only registers and asks for routes; clients have their own
(``client/remoting.py``), and the broker package does not import the client package."""
from __future__ import annotations

import asyncio
import itertools

from halfmq.protocol.command import RemotingCommand, decode_command
from halfmq.protocol.frame import FrameDecoder

from halfmq.protocol.signing import signature
from ..config import ConfigError

_MAX_ANSWER = 64 << 20  #: a route or cluster answer; a peer that announces more is not a name server


def parse_namesrv_addrs(text: str, key: str = "namesrvAddr") -> list[tuple[str, int]]:
    """``HOST:PORT;HOST:PORT`` (namesrvAddr, or another key's addresses) → [(host, port)].

    Raises:
        ConfigError: an entry is not HOST:PORT, naming the key.
    """
    addrs = []
    for item in (a.strip() for a in text.split(";")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{key}: {item!r} is not HOST:PORT (addresses are separated by ';')")
        addrs.append((host.strip("[]"), int(port)))
    return addrs


def signed(cmd: RemotingCommand, config) -> RemotingCommand:
    """``cmd`` signed with the broker's namesrvAccessKey when it is set: name servers with aclEnable take signed
    requests only (registrations and route lookups alike)."""
    if config.namesrvAccessKey:
        cmd.ext_fields["AccessKey"] = config.namesrvAccessKey
        cmd.ext_fields["Signature"] = signature(config.namesrvSecretKey, cmd.ext_fields, cmd.body)
    return cmd


class NamesrvLink:
    def __init__(self, addr: str):
        self.addr = addr
        (self.host, self.port), = parse_namesrv_addrs(addr)
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._opaque = itertools.count(1)
        self._connecting: asyncio.Lock = asyncio.Lock()

    async def _connect(self, timeout: float) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is None or self._writer.is_closing():
                reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), timeout)
                self._writer = writer
                self._reader_task = asyncio.get_running_loop().create_task(self._read(reader, writer))
            return self._writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(_MAX_ANSWER)
        try:
            while data := await reader.read(1 << 16):
                for frame in decoder.feed(data):
                    cmd = decode_command(frame)
                    future = self._pending.pop(cmd.opaque, None)
                    if future is not None and not future.done():
                        future.set_result(cmd)
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError(f"name server {self.addr} closed the connection"))
            self._pending.clear()

    async def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """The answer to ``cmd``.

        Raises:
            OSError, ConnectionError, asyncio.TimeoutError: the name server is unreachable or did not answer.
        """
        writer = await self._connect(timeout)
        cmd.opaque = next(self._opaque)
        future = asyncio.get_running_loop().create_future()
        self._pending[cmd.opaque] = future
        writer.write(cmd.encode())
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(cmd.opaque, None)

    async def close(self) -> None:
        writer, task = self._writer, self._reader_task
        self._writer = None
        if writer is not None:
            writer.close()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
