"""The replication link's messages: RemotingCommands on ``haListenPort``, one builder and one reader each.

The link reuses the remoting frame (bounded by the same decoder, signed as registrations with name servers are,
TLS as on the other ports) with halfmq's own request codes (protocol/codes.py ``REPLICATION_CODES``):

- HALFMQ_REPL_FOLLOW, follower → leader, answered: who it is and the last record it holds; the answer says where
  the stream starts (``from``) or that a snapshot comes first (``snapshot``), with the leader's epoch.
- HALFMQ_REPL_RECORDS, leader → follower, oneway: records ``[[epoch, seq, payload], ...]`` (store/redo.py) and
  ``commit``, the last sequence every in-sync member has: followers show readers nothing past it.
- HALFMQ_REPL_SNAPSHOT, leader → follower, oneway: a piece of a snapshot at ``offset``; the last one names the
  (epoch, seq) the snapshot holds.
- HALFMQ_REPL_ACK, follower → leader, oneway: ``seq``, the last record durable at the follower, or ``snapshot``,
  the snapshot bytes written.
- HALFMQ_REPL_OFFSETS, follower → leader, oneway: consumer offsets committed at the follower.
- HALFMQ_REPL_PROMOTE, leader → follower, oneway: lead from now on, at ``epoch``, holding every record up to
  ``seq`` (a switchover).
"""
from __future__ import annotations

import msgpack

from halfmq.protocol.codes import FLAG_ONEWAY, RequestCode
from halfmq.protocol.command import RemotingCommand

C = RequestCode
#: the replication link's largest frame: a record of one write group (a 4 MiB batch half and its indexes)
MAX_FRAME = 64 << 20
RECORDS_BATCH_BYTES = 1 << 20   #: records sent in one frame, at most (one record may be larger)
SNAPSHOT_PIECE = 1 << 20        #: bytes of a snapshot per frame
SNAPSHOT_WINDOW = 4             #: snapshot pieces sent and not yet acknowledged


def follow(cluster: str, broker_name: str, broker_id: int, addr: str, ha_addr: str, epoch: int,
           seq: int) -> RemotingCommand:
    return RemotingCommand(C.HALFMQ_REPL_FOLLOW, ext_fields={
        "clusterName": cluster, "brokerName": broker_name, "brokerId": str(broker_id), "brokerAddr": addr,
        "haAddr": ha_addr, "epoch": str(epoch), "seq": str(seq)})


def records(batch: list, commit: int) -> RemotingCommand:
    return RemotingCommand(C.HALFMQ_REPL_RECORDS, flag=FLAG_ONEWAY, ext_fields={"commit": str(commit)},
                           body=msgpack.packb(batch) if batch else b"")


def read_records(cmd: RemotingCommand) -> tuple[list, int]:
    batch = msgpack.unpackb(cmd.body, use_list=False) if cmd.body else ()
    return batch, int(cmd.ext_fields["commit"])


def snapshot_piece(offset: int, piece: bytes, last: tuple[int, int] | None) -> RemotingCommand:
    ext = {"offset": str(offset)}
    if last is not None:
        ext["epoch"], ext["seq"] = str(last[0]), str(last[1])
    return RemotingCommand(C.HALFMQ_REPL_SNAPSHOT, flag=FLAG_ONEWAY, ext_fields=ext, body=piece)


def ack(seq: int | None = None, snapshot: int | None = None) -> RemotingCommand:
    ext = {"seq": str(seq)} if seq is not None else {"snapshot": str(snapshot)}
    return RemotingCommand(C.HALFMQ_REPL_ACK, flag=FLAG_ONEWAY, ext_fields=ext)


def offsets(table: dict) -> RemotingCommand:
    return RemotingCommand(C.HALFMQ_REPL_OFFSETS, flag=FLAG_ONEWAY,
                           body=msgpack.packb([[g, t, q, o] for (g, t, q), o in table.items()]))


def read_offsets(cmd: RemotingCommand) -> dict:
    return {(str(g), str(t), int(q)): int(o) for g, t, q, o in msgpack.unpackb(cmd.body)}


def promote(epoch: int, seq: int) -> RemotingCommand:
    return RemotingCommand(C.HALFMQ_REPL_PROMOTE, flag=FLAG_ONEWAY, ext_fields={"epoch": str(epoch), "seq": str(seq)})
