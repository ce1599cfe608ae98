"""The writer keeps the data file written ahead of LMDB's pages, so a commit's sync overwrites blocks instead of
growing the file (store/writer.py, Prewriter): the zeros synced before a commit writes over them, and not after a
commit large enough to pay for its own growth."""
from __future__ import annotations

import errno
import os

import lmdb

from halfmq.protocol.message import MessageRecord
from halfmq.store import MessageStore, StoreConfig, message_request
from halfmq.store import writer as writer_module
from halfmq.store.ops import PutMessages
from halfmq.store.writer import PREWRITE_SKIP_ABOVE, PREWRITE_STEP, Prewriter


def _put(store, body: bytes):
    rec = MessageRecord(topic="T", body=body, queue_id=0, born_host="127.0.0.1:1")
    return store.submit(PutMessages([message_request(rec)]))


def _used_bytes(store) -> int:
    """Where the newest commit's pages end."""
    return (store.env.info()["last_pgno"] + 1) * store.env.stat()["psize"]


async def test_commits_write_inside_the_file_already_written_and_the_store_reopens(tmp_path):
    store = MessageStore(StoreConfig(root=str(tmp_path), map_size=64 << 20))
    await store.open()
    data_file = os.path.join(store.path, "data.mdb")
    body = os.urandom(20 << 10)  # overflow pages: every commit takes pages past the last one
    # The writer takes a group only after it wrote ahead for the one before: after the second answer, the first
    # commit's step is on file.
    await _put(store, body)
    await _put(store, body)
    grew = 0
    for _ in range(6):
        before_size, before_used = os.stat(data_file).st_size, _used_bytes(store)
        await _put(store, body)
        used = _used_bytes(store)
        grew += used > before_used
        assert used <= before_size, "a commit grew the data file: its sync had to write the inode and allocate"
    assert grew == 6
    assert os.stat(data_file).st_size - _used_bytes(store) >= PREWRITE_STEP - 6 * len(body) - (64 << 10)
    await store.close()
    # A data file longer than its pages opens as any other: everything is there, and writing goes on.
    store = MessageStore(StoreConfig(root=str(tmp_path), map_size=64 << 20))
    await store.open()
    try:
        assert store.max_offset("T", 0) == 8
        assert (await _put(store, b"after"))[0].queue_offset == 8
    finally:
        await store.close()


def _env(tmp_path, map_size: int) -> lmdb.Environment:
    env = lmdb.open(str(tmp_path), map_size=map_size)
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    return env


def test_writing_ahead_stops_at_the_map(tmp_path):
    env = _env(tmp_path, 1 << 20)
    prewriter = Prewriter(env)
    try:
        for _ in range(3):
            prewriter.after_commit()
        assert os.stat(tmp_path / "data.mdb").st_size == 1 << 20  # LMDB cannot use pages past its map yet
    finally:
        prewriter.close()
        env.close()


def test_a_full_disk_stops_writing_ahead_and_commits_go_on(tmp_path, monkeypatch, caplog):
    env = _env(tmp_path, 64 << 20)
    prewriter = Prewriter(env)
    size = os.stat(tmp_path / "data.mdb").st_size

    def no_space(*_args):  # a full disk, without filling one
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer_module.os, "pwrite", no_space)
    try:
        prewriter.after_commit()
        prewriter.after_commit()
        assert prewriter.failed and os.stat(tmp_path / "data.mdb").st_size == size
        assert "writing ahead in the data file failed" in caplog.text
        monkeypatch.undo()
        with env.begin(write=True) as txn:
            txn.put(b"k2", os.urandom(100_000))
        prewriter.after_commit()  # stays off for the writer's life: the file is as long as LMDB made it
        assert os.stat(tmp_path / "data.mdb").st_size == (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        with env.begin() as txn:
            assert len(txn.get(b"k2")) == 100_000
    finally:
        prewriter.close()
        env.close()


def _file_and_used(env, path) -> tuple[int, int]:
    return os.stat(path).st_size, (env.info()["last_pgno"] + 1) * env.stat()["psize"]


def test_the_zeros_written_ahead_are_synced_before_a_commit_writes_over_them(tmp_path, monkeypatch):
    env = _env(tmp_path, 64 << 20)
    prewriter = Prewriter(env)
    synced = []  # the data file's size at each fdatasync of the prewriter's descriptor
    real_fdatasync = os.fdatasync

    def spy(fd):
        if fd == prewriter.fd:
            synced.append(os.fstat(fd).st_size)
        real_fdatasync(fd)

    monkeypatch.setattr(writer_module.os, "fdatasync", spy)
    try:
        _size, used = _file_and_used(env, tmp_path / "data.mdb")
        prewriter.after_commit()
        # Left dirty, the zeros were written out by the next commit's own sync, inside its acknowledgement.
        assert synced and synced[-1] >= used + PREWRITE_STEP
    finally:
        prewriter.close()
        env.close()


def test_no_writing_ahead_after_a_commit_that_grew_the_file_by_more_than_the_bound(tmp_path):
    env = _env(tmp_path, 64 << 20)
    data_file = tmp_path / "data.mdb"
    prewriter = Prewriter(env)
    try:
        with env.begin(write=True) as txn:  # a Spark sink's batch half, say
            txn.put(b"large", os.urandom(PREWRITE_SKIP_ABOVE + (64 << 10)))
        prewriter.after_commit()
        size, used = _file_and_used(env, data_file)
        assert size == used, "zeros written ahead of a large commit: each of its bytes is written twice"
        with env.begin(write=True) as txn:
            txn.put(b"small", b"x")
        prewriter.after_commit()  # small commits are written ahead of again
        size, used = _file_and_used(env, data_file)
        assert size >= used + PREWRITE_STEP
    finally:
        prewriter.close()
        env.close()
