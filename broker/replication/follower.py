"""A broker group's follower: it holds what its leader holds, through its own writer, and serves reads of it.

It connects to the leader's ``haListenPort`` (``haMasterAddress``, or the address the name servers give for the
group's leader), says which record it holds last and receives the records after it, or a snapshot first
(broker/replication/leader.py says when). Each record is applied by the follower's own writer (``ApplyRedo``):
durable before the follower acknowledges it. No other write reaches its store (``MessageStore.write_refusal``:
sends, halves and decisions are refused, naming the leader), so its store is the leader's, byte for byte.

Readers of a follower (pulls, offset queries, admin reads) see a record only once the leader says every in-sync
member has it (``committed``): a failover can never take back what a consumer read here. Topic configurations and
consumer offsets the records change are reloaded into the broker's tables as they are shown. Consumer offsets
committed by consumers reading here are sent to the leader (``HALFMQ_REPL_OFFSETS``), which stores them: they
reach the group's store, and this one through it.
"""
from __future__ import annotations

import asyncio
import logging
import os

from halfmq.protocol.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand, decode_command
from halfmq.protocol.frame import FrameDecoder
from halfmq.store import NotLeaderError
from halfmq.store.redo import ApplyRedo, RedoSummary

from ..namesrv.link import signed
from . import wire

log = logging.getLogger(__name__)
RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0)  #: waits between attempts to reach the leader, the last repeated
HANDSHAKE_TIMEOUT_S = 10.0


class _LinkProtocol(asyncio.Protocol):
    def __init__(self, follower: "ReplicationFollower"):
        self.follower = follower
        self.decoder = FrameDecoder(wire.MAX_FRAME)
        self.transport = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            for frame in self.decoder.feed(data):
                self.follower.on_command(decode_command(frame))
        except Exception:
            log.exception("replication link to %s failed; reconnecting", self.follower.leader_addr)
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)


class ReplicationFollower:
    """The follower's side of the replication link, and the store's gate while it follows."""

    def __init__(self, ctx, leader_addr: str | None, find_leader=None, on_promote=None, broker_id: int = 0,
                 ha_addr: str = ""):
        self.ctx = ctx
        self.store = ctx.store
        self.config = ctx.config
        self.leader_addr = leader_addr        #: HOST:PORT of the leader's replication port, when known
        self.find_leader = find_leader        #: async () -> HOST:PORT or None (the name servers' view)
        self.on_promote = on_promote          #: async (epoch, seq) -> None: the broker takes the leadership
        self.broker_id = broker_id            #: the id this follower is shown under
        self.ha_addr = ha_addr                #: its own replication address (where it serves once it leads)
        self.committed = self.store.position[1]  #: the leader's committed sequence: readers see up to here
        self.leader_epoch = 0
        self.connected = False
        self.snapshotting = False
        self.snapshots = 0                    #: snapshots of the leader's store installed (catch-ups)
        self._proto: _LinkProtocol | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._opaque = 0
        self._task: asyncio.Task | None = None
        self._ack_seq = 0
        self._ack_scheduled = False
        self._submitted = 0                   #: the last record handed to the writer
        self._durable = asyncio.Event()       #: set when records became durable here
        self._snapshot_file = None
        self._snapshot_path = os.path.join(self.store.path, "snapshot.incoming")
        self._stopping = False

    # --- lifecycle ---
    def start(self) -> None:
        self.store.set_gate(self)
        self.store.write_refusal = self.write_refusal
        self.ctx.offsets.forward = self.forward_offsets
        self._task = asyncio.get_running_loop().create_task(self._run(), name="replication-follower")

    async def stop(self) -> None:
        """Stop following. Records durable here and held for the leader's word are published first: this store
        holds them, whatever role the member takes next (the member puts that role's gate in place)."""
        self._stopping = True
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._close_snapshot()
        self.committed = 1 << 62
        self.store.link.release()
        if self.ctx.offsets.forward == self.forward_offsets:
            self.ctx.offsets.forward = None

    def write_refusal(self) -> Exception:
        leader = self.leader_addr or "its leader (not known yet)"
        return NotLeaderError(f"broker {self.config.brokerName}/{self.broker_id} is a follower: writes go to "
                              f"the group's leader, {leader}")

    # --- the link ---
    async def _run(self) -> None:
        attempt = 0
        while not self._stopping:
            try:
                # The leader it was told of first (a switchover, the role file); after a failure, the one the name
                # servers know now (a leader that handed over since).
                if self.find_leader is not None and not self.config.haMasterAddress and (
                        attempt or not self.leader_addr):
                    self.leader_addr = await self.find_leader() or self.leader_addr
                if self.leader_addr:
                    await self._follow(self.leader_addr)
                    attempt = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cannot follow leader %s: %s", self.leader_addr or "(unknown)", exc)
            finally:
                self.connected = False
                self._close_snapshot()
            if self._stopping:
                return
            await asyncio.sleep(RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)])
            attempt += 1

    async def _follow(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        loop = asyncio.get_running_loop()
        tls = None
        if self.config.tlsEnable:
            import ssl
            tls = ssl.create_default_context()
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE  # members authenticate by signature, as with name servers
        _transport, proto = await asyncio.wait_for(
            loop.create_connection(lambda: _LinkProtocol(self), host.strip("[]"), int(port), ssl=tls),
            HANDSHAKE_TIMEOUT_S)
        self._proto = proto
        try:
            await self._settle()
            epoch, seq = self.store.position
            cfg = self.config
            answer = await self._request(wire.follow(cfg.brokerClusterName, cfg.brokerName, self.broker_id,
                                                     self.ctx.broker_addr, self.ha_addr, epoch, seq))
            if answer.code != ResponseCode.SUCCESS:
                raise ConnectionError(f"the leader refused: {answer.remark}")
            self.leader_epoch = int(answer.ext_fields["epoch"])
            if self.leader_epoch < epoch:
                raise ConnectionError(f"the leader's epoch {self.leader_epoch} is older than this store's {epoch}")
            self.connected = True
            log.info("following %s (epoch %d) from record %s", addr, self.leader_epoch,
                     "a snapshot" if "snapshot" in answer.ext_fields else answer.ext_fields["from"])
            if "snapshot" not in answer.ext_fields:
                self._confirmed()
            self._set_committed(int(answer.ext_fields["commit"]))
            self._send_offsets()
            await proto.closed
            if not self._stopping:
                log.warning("the replication link to %s closed", addr)
        finally:
            if proto.transport is not None:
                proto.transport.close()
            self._proto = None

    async def _settle(self) -> None:
        """Records handed to the writer over an earlier link are durable before this one says where it is: else
        the leader would send them again, or a record it lacks would be missing from what it is told."""
        deadline = asyncio.get_running_loop().time() + HANDSHAKE_TIMEOUT_S
        while self._ack_seq < self._submitted and asyncio.get_running_loop().time() < deadline:
            self._durable.clear()
            try:
                await asyncio.wait_for(self._durable.wait(), HANDSHAKE_TIMEOUT_S)
            except asyncio.TimeoutError:
                break

    async def _request(self, cmd: RemotingCommand) -> RemotingCommand:
        self._opaque += 1
        cmd.opaque = self._opaque
        future = asyncio.get_running_loop().create_future()
        self._pending[cmd.opaque] = future
        self._send(cmd)
        try:
            return await asyncio.wait_for(future, HANDSHAKE_TIMEOUT_S)
        finally:
            self._pending.pop(cmd.opaque, None)

    def _send(self, cmd: RemotingCommand) -> None:
        proto = self._proto
        if proto is not None and proto.transport is not None and not proto.transport.is_closing():
            proto.transport.write(signed(cmd, self.config).encode())

    def on_command(self, cmd: RemotingCommand) -> None:
        if cmd.flag & FLAG_RESPONSE:
            future = self._pending.pop(cmd.opaque, None)
            if future is not None and not future.done():
                future.set_result(cmd)
        elif cmd.code == RequestCode.HALFMQ_REPL_RECORDS:
            batch, commit = wire.read_records(cmd)
            for epoch, seq, payload in batch:
                self.store.submit(ApplyRedo(epoch, seq, payload)).add_done_callback(self._applied)
                self._submitted = seq
            self._set_committed(commit)
        elif cmd.code == RequestCode.HALFMQ_REPL_SNAPSHOT:
            self._snapshot_piece(cmd)
        elif cmd.code == RequestCode.HALFMQ_REPL_PROMOTE:
            ext = cmd.ext_fields
            asyncio.get_running_loop().create_task(self.on_promote(int(ext["epoch"]), int(ext["seq"])))

    # --- the store's gate ---
    def shipped(self, record) -> None:
        """A follower's writer records nothing (it never leads while it follows)."""

    def durable(self, seq: int) -> None:
        """Applied records are durable here: acknowledge the last (once per loop iteration)."""
        self._ack_seq = max(self._ack_seq, seq)
        self._durable.set()
        if not self._ack_scheduled:
            self._ack_scheduled = True
            asyncio.get_running_loop().call_soon(self._send_ack)

    def _send_ack(self) -> None:
        self._ack_scheduled = False
        self._send(wire.ack(seq=self._ack_seq))

    def _set_committed(self, commit: int) -> None:
        if commit > self.committed:
            self.committed = commit
            self.store.link.release()

    def _applied(self, completion) -> None:
        """A record is shown to readers: the broker's tables take what it changed."""
        try:
            summary: RedoSummary = completion.result()
        except Exception as exc:
            log.error("a replicated record could not be applied (%s); resyncing", exc)
            if self._proto is not None and self._proto.transport is not None:
                self._proto.transport.close()
            return
        ctx = self.ctx
        for topic, tid in summary.deleted_topics.items():
            self.store.forget_topic(topic, tid)
            ctx.offsets.forget_topic(topic)
        if summary.topics:
            ctx.topics.reload(summary.topics)
        if summary.offsets:
            ctx.offsets.replicated(summary.offsets)
        if summary.minimums:
            self.store.advance_minimums(summary.minimums)

    # --- snapshots ---
    def _snapshot_piece(self, cmd: RemotingCommand) -> None:
        offset = int(cmd.ext_fields["offset"])
        if offset == 0:
            self._close_snapshot()
            self.snapshotting = True
            self._snapshot_file = open(self._snapshot_path, "wb")
            log.info("receiving a snapshot from %s", self.leader_addr)
        if self._snapshot_file is None or self._snapshot_file.tell() != offset:
            raise ConnectionError(f"snapshot piece at {offset} out of order")
        self._snapshot_file.write(cmd.body)
        end = offset + len(cmd.body)
        if "seq" not in cmd.ext_fields:
            self._send(wire.ack(snapshot=end))
            return
        self._snapshot_file.flush()
        os.fsync(self._snapshot_file.fileno())
        self._snapshot_file.close()
        self._snapshot_file = None
        asyncio.get_running_loop().create_task(self._install(end, int(cmd.ext_fields["seq"])))

    async def _install(self, size: int, seq: int) -> None:
        try:
            await self.store.replace(self._snapshot_path)
        except Exception:
            log.exception("installing the leader's snapshot failed")
            if self._proto is not None and self._proto.transport is not None:
                self._proto.transport.close()
            return
        finally:
            self.snapshotting = False
        self.committed = min(self.committed, seq)
        ctx = self.ctx
        ctx.topics.reload(set(ctx.topics.topics) | set(self.store.topics()))
        ctx.offsets.reload()
        self.snapshots += 1
        log.info("installed the leader's snapshot at record %d", seq)
        self._confirmed()
        self._send(wire.ack(snapshot=size))

    def _confirmed(self) -> None:
        """The leader has seen this store: its records are a prefix of the leader's, or its snapshot replaced them.
        Readers see it from now on."""
        self.store.reads_held = None

    def _close_snapshot(self) -> None:
        if self._snapshot_file is not None:
            self._snapshot_file.close()
            self._snapshot_file = None
        self.snapshotting = False

    # --- offsets committed here ---
    def forward_offsets(self, table: dict) -> bool:
        """Consumer offsets committed at this follower go to the leader; False while it is not reachable (the
        offsets manager keeps them for the next try)."""
        if not self.connected:
            return False
        self._send(wire.offsets(table))
        return True

    def _send_offsets(self) -> None:
        asyncio.get_running_loop().create_task(self.ctx.offsets.flush())

    # --- status ---
    def status(self) -> dict:
        epoch, seq = self.store.position
        return {"role": "follower", "epoch": epoch, "seq": seq, "committed": self.committed,
                "leader": self.leader_addr or "", "connected": self.connected, "snapshot": self.snapshotting,
                "snapshotsInstalled": self.snapshots}
