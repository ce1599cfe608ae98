"""The power-cut filesystem (tests/support/powerfs.py) itself, through a real FUSE mount: what it keeps across a
cut is exactly what was synced (drop), or that plus a prefix in file-offset order of the rest (partial); after a
cut nothing more reaches the disk; locks, mmap and LMDB work on it. The power-loss test of the broker rests on
these properties, so each is proven here on its own."""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.support.powerfs import PAGE
from tests.support.powermount import PowerDisk


@pytest.fixture
def disk():
    with PowerDisk() as disk:
        yield disk


def page(char: str, n: int = 1) -> bytes:
    return char.encode() * (PAGE * n)


def write_file(path, data: bytes, offset: int = 0, sync: bool = False, flags: int = 0) -> None:
    fd = os.open(path, os.O_CREAT | os.O_RDWR | flags, 0o644)
    try:
        os.pwrite(fd, data, offset)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def test_synced_data_survives_a_drop_cut_and_unsynced_data_does_not(disk):
    mnt = disk.power_on()
    write_file(mnt / "f", page("a", 2) + b"tail", sync=True)
    # Unsynced: an overwrite inside a synced page, a new page and a longer file.
    write_file(mnt / "f", b"BBBB", offset=100)
    write_file(mnt / "f", page("c"), offset=3 * PAGE)
    expected_live = bytearray(page("a", 2) + b"tail" + bytes(PAGE - 4) + page("c"))
    expected_live[100:104] = b"BBBB"
    assert (mnt / "f").read_bytes() == expected_live  # the overlay is seen over the backing file
    assert disk.cut("drop", 1) == "cut kept=0 lost=2 files=1"
    disk.power_off()
    mnt = disk.power_on()
    assert (mnt / "f").read_bytes() == page("a", 2) + b"tail"


def test_fsync_through_another_handle_syncs_the_file(disk):
    mnt = disk.power_on()
    write_file(mnt / "f", page("x"))
    fd = os.open(mnt / "f", os.O_RDONLY)  # LMDB's sync helper opens its own handle and fdatasyncs that
    os.fdatasync(fd)
    os.close(fd)
    write_file(mnt / "f", b"lost", offset=0)
    disk.cut("drop", 1)
    disk.power_off()
    assert (disk.power_on() / "f").read_bytes() == page("x")


def test_writes_through_an_o_dsync_handle_are_durable_at_once(disk):
    mnt = disk.power_on()
    write_file(mnt / "f", page("m"), flags=os.O_DSYNC)  # LMDB writes meta pages this way unless told not to
    write_file(mnt / "f", page("u"), offset=PAGE)
    disk.cut("drop", 1)
    disk.power_off()
    assert (disk.power_on() / "f").read_bytes() == page("m")


@pytest.mark.parametrize("seed", range(8))
def test_partial_cut_keeps_a_prefix_in_offset_order(disk, seed):
    mnt = disk.power_on()
    pages = 16
    write_file(mnt / "f", page("o", pages), sync=True)
    fd = os.open(mnt / "f", os.O_RDWR)
    for number in reversed(range(pages)):  # written last page first: the write-back order is the offset's
        os.pwrite(fd, page("n"), number * PAGE)
    os.close(fd)
    summary = disk.cut("partial", seed)
    disk.power_off()
    data = (disk.power_on() / "f").read_bytes()
    kept = [data[i * PAGE:(i + 1) * PAGE] == page("n") for i in range(pages)]
    assert all(kept[i] or data[i * PAGE:(i + 1) * PAGE] == page("o") for i in range(pages)), "torn page"
    k = sum(kept)
    assert kept == [True] * k + [False] * (pages - k), f"seed {seed}: not an offset-order prefix: {kept}"
    assert summary == f"cut kept={k} lost={pages - k} files=1"


def kept_sizes(seed: int) -> list[int]:
    """Eight new files of 16 unsynced pages each, a partial cut: each file's size after it (its kept prefix)."""
    with PowerDisk() as disk:
        mnt = disk.power_on()
        for name in range(8):
            write_file(mnt / f"f{name}", page("n", 16))
        disk.cut("partial", seed)
        disk.power_off()
        mnt = disk.power_on()
        return [os.path.getsize(mnt / f"f{name}") // PAGE for name in range(8)]


def test_partial_cut_points_come_from_the_seed():
    first = kept_sizes(11)
    assert len(set(first)) > 2, first  # each file gets its own cut point
    assert kept_sizes(11) == first  # the same seed cuts the same way
    assert kept_sizes(12) != first


def test_after_the_cut_every_operation_fails_and_nothing_reaches_the_disk(disk):
    mnt = disk.power_on()
    write_file(mnt / "f", b"synced", sync=True)
    fd = os.open(mnt / "f", os.O_RDWR)
    disk.cut("drop", 1)
    for attempt in (lambda: os.pwrite(fd, b"later", 0), lambda: os.fsync(fd), lambda: os.open(mnt / "g", os.O_CREAT),
                    lambda: os.mkdir(mnt / "d")):
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.EIO
    os.close(fd)
    disk.power_off()
    mnt = disk.power_on()
    assert sorted(os.listdir(mnt)) == ["f"] and (mnt / "f").read_bytes() == b"synced"


def test_metadata_operations_are_durable_at_once(disk):
    mnt = disk.power_on()
    os.mkdir(mnt / "d")
    write_file(mnt / "d" / "a", b"")
    os.rename(mnt / "d" / "a", mnt / "d" / "b")
    write_file(mnt / "d" / "t", b"0123456789", sync=True)
    os.truncate(mnt / "d" / "t", 4)
    disk.cut("drop", 1)
    disk.power_off()
    mnt = disk.power_on()
    assert sorted(os.listdir(mnt / "d")) == ["b", "t"] and (mnt / "d" / "t").read_bytes() == b"0123"


def test_mmap_reads_see_unsynced_writes(disk):
    mnt = disk.power_on()
    write_file(mnt / "f", page("a", 2), sync=True)
    fd = os.open(mnt / "f", os.O_RDWR)
    view = mmap.mmap(fd, 2 * PAGE, prot=mmap.PROT_READ)  # as LMDB reads data.mdb
    os.pwrite(fd, b"new", PAGE + 10)
    assert view[PAGE + 8:PAGE + 15] == b"aanewaa"
    view.close()
    os.close(fd)


def test_locks_are_kept_by_the_kernel_between_processes(disk):
    mnt = disk.power_on()
    write_file(mnt / "lock", b"\0" * 64)
    fd = os.open(mnt / "lock", os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 8, 0)
    other = os.open(mnt / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    with pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    probe = textwrap.dedent(f"""
        import fcntl, os
        fd = os.open({str(mnt / 'lock')!r}, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 8, 0)
            print("acquired")
        except BlockingIOError:
            print("refused")
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 8, 8)  # another range is free
        print("other range")
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert out.stdout.splitlines() == ["refused", "other range"], out.stderr
    os.close(other)
    os.close(fd)


LMDB_WRITER = textwrap.dedent("""
    import sys, lmdb
    env = lmdb.open(sys.argv[1], map_size=1 << 24, sync=True, metasync=True, lock=True)
    for i in range(200):
        with env.begin(write=True) as txn:
            txn.put(b"%08d" % i, b"v" * 3000)
    print("committed", flush=True)
    sys.stdin.read()  # keep the env open until told
""")
LMDB_READER = textwrap.dedent("""
    import sys, lmdb
    env = lmdb.open(sys.argv[1], map_size=1 << 24, lock=True)
    with env.begin() as txn:
        keys = [k for k, _ in txn.cursor()]
    print(len(keys), keys == [b"%08d" % i for i in range(len(keys))])
""")


def test_lmdb_from_two_processes_and_synced_commits_survive_a_partial_cut(disk):
    """LMDB with full syncs (data fdatasynced, meta written O_DSYNC) on the layer, shared by a writer process and
    this one (lock.mdb is a shared writable mmap, locked with fcntl): every commit survives a cut. The store is
    read back in a subprocess: a damaged LMDB can crash its reader."""
    mnt = disk.power_on()
    import lmdb
    path = str(mnt / "env")
    writer = subprocess.Popen([sys.executable, "-c", LMDB_WRITER, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "committed"
        env = lmdb.open(path, map_size=1 << 24, lock=True)
        with env.begin() as txn:  # the writer's commits, read through this process's own mmap
            assert txn.stat()["entries"] == 200
        disk.cut("partial", 3)
        env.close()
    finally:
        writer.stdin.close()
        writer.wait(30)
    disk.power_off()
    reader = subprocess.run([sys.executable, "-c", LMDB_READER, str(disk.power_on() / "env")],
                            capture_output=True, text=True, timeout=60)
    assert reader.stdout.split() == ["200", "True"], (reader.returncode, reader.stdout, reader.stderr[-2000:])


def test_fsync_delay_slows_each_sync(tmp_path):
    with PowerDisk(fsync_delay_ms=50) as disk:
        mnt = disk.power_on()
        fd = os.open(mnt / "f", os.O_CREAT | os.O_RDWR, 0o644)
        os.pwrite(fd, b"x", 0)
        start = time.perf_counter()
        os.fdatasync(fd)
        assert time.perf_counter() - start >= 0.05
        os.close(fd)
