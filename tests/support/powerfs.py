"""powerfs: a FUSE passthrough filesystem on which only fsynced data survives a simulated power cut.

This module owns the filesystem process. Run it as ``python -m tests.support.powerfs BACKING MOUNTPOINT
[--fsync-delay-ms N]`` from the repository root (``tests.support.powermount.PowerMount`` does that for tests and
benchmarks). It prints ``ready`` once the kernel has mounted it and then reads commands on stdin, one a line:

- ``cut drop SEED`` / ``cut partial SEED``: the power goes out. ``drop`` loses every unsynced write;
  ``partial`` writes each file's unsynced pages back in file-offset order up to a random cut point of its own
  drawn from SEED (the kernel's writeback in progress when the power failed) and loses the rest. Answers
  ``cut kept=K lost=L files=F``. From then on every operation fails with EIO, so a process still running can
  change nothing more; unmount then, and mount BACKING again to see the disk as it is after the power came back.
- ``stats``: answers ``stats unsynced_pages=N fsyncs=N``.
- end of input (the controller is gone): unmount (lazily if busy) and exit, so no mount outlives its owner.

The model:

- Writes go to an in-memory overlay of unsynced pages per file (4 KiB pages, byte-exact content, read-modify-
  write from the backing file for partial pages); reads see the overlay over the backing file. A file's size as
  processes see it is the larger of its backing size and its unsynced writes' end.
- ``fsync``/``fdatasync`` through any handle of a file writes that file's overlay (as of the call) to the
  backing file. ``--fsync-delay-ms`` makes each sync take that long first, like a slow network disk; writes and
  reads of other requests go on meanwhile (syncs of one file follow each other). Writes through a handle opened
  with O_SYNC/O_DSYNC are synced as they are made, whole touched pages (the kernel also follows each such write
  with an fsync request).
- Metadata operations (create, mkdir, unlink, rename, truncate/ftruncate, chmod, chown, utimens, symlink, link)
  are durable at once: kept simple on purpose, since LMDB's safety rests on the ordering of data and meta page
  writes inside data.mdb, not on directory operations. A page is written back whole or not at all (no torn
  sectors). The backing files are never fsynced themselves: the host does not lose power, only this layer does.
- No lock or flock operation is implemented, so the kernel keeps fcntl/flock locks locally for the mount and they
  work between the processes using it (LMDB's lock.mdb). ``kernel_cache`` keeps the page cache across opens
  (every change goes through this one kernel mount, so the cache is always coherent), and there is no direct_io:
  LMDB reads data.mdb through mmap and shares lock.mdb through a writable shared mmap, which need the page cache.
"""
from __future__ import annotations

import argparse
import errno
import os
import random
import subprocess
import sys
import threading
import time

PAGE = 4096
_SYNC_FLAGS = os.O_SYNC | os.O_DSYNC


class _File:
    """One backing file (by inode) while it is open or has unsynced pages: its fd, size and overlay."""

    def __init__(self, path: str, fd: int):
        self.path = path  # backing path, for a deterministic order at the cut; follows renames
        self.fd = fd
        self.refs = 0
        self.size = os.fstat(fd).st_size  # as processes see it: backing size or the unsynced writes' end
        self.pages: dict[int, bytes] = {}  # page number → PAGE bytes not yet synced
        # Slow syncs of one file run one after the other, as a disk's cache flushes do: two overlapping ones could
        # otherwise finish out of order and write an older snapshot of a page over a newer one.
        self.sync_lock = threading.Lock()

    def backing_page(self, number: int) -> bytes:
        data = os.pread(self.fd, PAGE, number * PAGE)
        return data + bytes(PAGE - len(data))

    def read(self, size: int, offset: int) -> bytes:
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        data = os.pread(self.fd, end - offset, offset)
        if len(data) < end - offset:  # past the backing file's end: unsynced extension or a hole
            data += bytes(end - offset - len(data))
        if not self.pages:
            return data
        out = bytearray(data)
        for number in range(offset // PAGE, (end - 1) // PAGE + 1):
            page = self.pages.get(number)
            if page is not None:
                start = number * PAGE
                lo, hi = max(offset, start), min(end, start + PAGE)
                out[lo - offset:hi - offset] = page[lo - start:hi - start]
        return bytes(out)

    def write(self, data: bytes, offset: int) -> list[int]:
        """Put ``data`` into the overlay; returns the page numbers it touched."""
        end = offset + len(data)
        touched = []
        for number in range(offset // PAGE, (end - 1) // PAGE + 1):
            start = number * PAGE
            lo, hi = max(offset, start), min(end, start + PAGE)
            if hi - lo == PAGE:
                page = data[lo - offset:hi - offset]
            else:
                base = self.pages.get(number)
                if base is None:
                    base = self.backing_page(number)
                page = base[:lo - start] + data[lo - offset:hi - offset] + base[hi - start:]
            self.pages[number] = page
            touched.append(number)
        self.size = max(self.size, end)
        return touched

    def write_back(self, pages: dict[int, bytes], limit: int) -> None:
        """Write ``pages`` to the backing file in offset order, none of it past ``limit`` (the file's size)."""
        for number in sorted(pages):
            start = number * PAGE
            if start < limit:
                os.pwrite(self.fd, pages[number][:min(PAGE, limit - start)], start)

    def forget(self, pages: dict[int, bytes]) -> None:
        """Drop the overlay pages that are still exactly those of ``pages`` (they are synced now)."""
        for number, data in pages.items():
            if self.pages.get(number) is data:
                del self.pages[number]

    def truncate(self, length: int) -> None:
        os.ftruncate(self.fd, length)  # metadata: durable at once
        for number in [n for n in self.pages if n * PAGE >= length]:
            del self.pages[number]
        tail = self.pages.get(length // PAGE)
        if tail is not None:  # bytes past the new end read as zeros if the file grows again
            keep = length % PAGE
            self.pages[length // PAGE] = tail[:keep] + bytes(PAGE - keep)
        self.size = length


def _operations_base():
    # Imported here, not at the top: the controller side (tests) imports nothing that loads libfuse.
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")  # libfuse3 even where libfuse2 is installed too
    import mfusepy
    return mfusepy


class PowerFS:
    """The filesystem operations (mfusepy's Operations protocol) over ``backing``."""

    use_ns = True

    def __init__(self, backing: str, fsync_delay_s: float = 0.0, on_ready=None):
        self.backing = os.path.realpath(backing)
        self.fsync_delay_s = fsync_delay_s
        self.on_ready = on_ready
        # One request at a time, so a cut never sees a half-applied write. (Not named "lock": mfusepy would take an
        # attribute of that name for the lock operation and stop the kernel from keeping locks itself.)
        self._mutex = threading.Lock()
        self.files: dict[tuple[int, int], _File] = {}  # (st_dev, st_ino) → file
        self.handles: dict[int, tuple[_File, int]] = {}  # fh → (file, open flags)
        self.next_fh = 1
        self.cut_done = False
        self.fsyncs = 0

    # --- helpers ---
    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _live(self) -> None:
        if self.cut_done:
            raise OSError(errno.EIO, "powerfs: the power is out")

    def _known(self, real: str) -> _File | None:
        try:
            st = os.lstat(real)
        except FileNotFoundError:
            return None
        return self.files.get((st.st_dev, st.st_ino))

    def _open_handle(self, real: str, flags: int) -> int:
        fd = os.open(real, os.O_RDWR if os.access(real, os.W_OK) else os.O_RDONLY)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        file = self.files.get(key)
        if file is None:
            file = self.files[key] = _File(real, fd)
        else:
            os.close(fd)
        file.refs += 1
        fh, self.next_fh = self.next_fh, self.next_fh + 1
        self.handles[fh] = (file, flags)
        if flags & os.O_TRUNC:
            file.truncate(0)
        return fh

    def _sync(self, file: _File, numbers=None) -> None:
        """Make ``file``'s unsynced pages (or just ``numbers``) durable, after the configured delay."""
        if not self.fsync_delay_s:
            with self._mutex:
                self._live()
                self.fsyncs += 1
                pages = self._unsynced(file, numbers)
                file.write_back(pages, file.size)
                file.forget(pages)
            return
        # The slow disk: the sync takes this long, and other requests are served meanwhile. What it makes durable
        # is the file's pages as of the call (later writes stay unsynced); a cut during the wait loses them.
        with file.sync_lock:
            with self._mutex:
                self._live()
                self.fsyncs += 1
                pages = self._unsynced(file, numbers)
                limit = file.size
            time.sleep(self.fsync_delay_s)
            with self._mutex:
                self._live()
                file.write_back(pages, min(limit, file.size))
                file.forget(pages)

    @staticmethod
    def _unsynced(file: _File, numbers) -> dict[int, bytes]:
        if numbers is None:
            return dict(file.pages)
        return {n: file.pages[n] for n in numbers if n in file.pages}

    # --- the power cut ---
    def cut(self, model: str, seed: int) -> str:
        if model not in ("drop", "partial"):
            raise ValueError(f"unknown model {model!r}")
        rng = random.Random(seed)
        kept = lost = 0
        with self._mutex:
            self.cut_done = True
            for file in sorted(self.files.values(), key=lambda f: f.path):
                numbers = sorted(file.pages)
                keep = rng.randint(0, len(numbers)) if model == "partial" and numbers else 0
                file.write_back({n: file.pages[n] for n in numbers[:keep]}, file.size)
                kept += keep
                lost += len(numbers) - keep
                file.pages.clear()
            files = len(self.files)
        return f"cut kept={kept} lost={lost} files={files}"

    def stats(self) -> str:
        with self._mutex:
            unsynced = sum(len(f.pages) for f in self.files.values())
            return f"stats unsynced_pages={unsynced} fsyncs={self.fsyncs}"

    # --- FUSE operations ---
    def init(self, path):
        if self.on_ready is not None:
            self.on_ready()

    def getattr(self, path, fh=None):
        with self._mutex:
            self._live()
            real = self._real(path)
            st = os.lstat(real)
            attrs = {key: getattr(st, key) for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                                       "st_ino", "st_blocks", "st_blksize")}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            file = self.files.get((st.st_dev, st.st_ino))
            if file is not None:
                attrs["st_size"] = file.size
            return attrs

    def readdir(self, path, fh):
        self._live()
        return [".", ".."] + os.listdir(self._real(path))

    def readlink(self, path):
        self._live()
        return os.readlink(self._real(path))

    def statfs(self, path):
        self._live()
        sv = os.statvfs(self._real(path))
        return {key: getattr(sv, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                  "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def mkdir(self, path, mode):
        self._live()
        os.mkdir(self._real(path), mode)

    def rmdir(self, path):
        self._live()
        os.rmdir(self._real(path))

    def unlink(self, path):
        with self._mutex:
            self._live()
            real = self._real(path)
            st = os.lstat(real)
            os.unlink(real)
            file = self.files.get((st.st_dev, st.st_ino))
            if file is not None and file.refs == 0 and st.st_nlink <= 1:  # gone for good: its pages too
                os.close(self.files.pop((st.st_dev, st.st_ino)).fd)

    def rename(self, old, new):
        with self._mutex:
            self._live()
            try:
                st = os.lstat(self._real(new))
            except FileNotFoundError:
                st = None
            os.rename(self._real(old), self._real(new))
            replaced = self.files.get((st.st_dev, st.st_ino)) if st is not None else None
            if replaced is not None and replaced.refs == 0 and st.st_nlink <= 1:  # its unsynced pages go with it
                os.close(self.files.pop((st.st_dev, st.st_ino)).fd)
            moved = self._known(self._real(new))
            if moved is not None:
                moved.path = self._real(new)

    def symlink(self, target, source):
        self._live()
        os.symlink(source, self._real(target))

    def link(self, target, source):
        self._live()
        os.link(self._real(source), self._real(target))

    def chmod(self, path, mode):
        self._live()
        os.chmod(self._real(path), mode)

    def chown(self, path, uid, gid):
        self._live()
        os.chown(self._real(path), uid, gid)

    def utimens(self, path, times=None):
        self._live()
        os.utime(self._real(path), ns=times)

    def truncate(self, path, length, fh=None):
        with self._mutex:
            self._live()
            file = self.handles[fh][0] if fh is not None else self._known(self._real(path))
            if file is None:
                os.truncate(self._real(path), length)
            else:
                file.truncate(length)

    def create(self, path, mode, flags):
        with self._mutex:
            self._live()
            real = self._real(path)
            os.close(os.open(real, os.O_CREAT | os.O_WRONLY | (flags & os.O_EXCL), mode))
            return self._open_handle(real, flags)

    def open(self, path, flags):
        with self._mutex:
            self._live()
            return self._open_handle(self._real(path), flags)

    def read(self, path, size, offset, fh):
        with self._mutex:
            self._live()
            return self.handles[fh][0].read(size, offset)

    def write(self, path, data, offset, fh):
        with self._mutex:
            self._live()
            file, flags = self.handles[fh]
            touched = file.write(data, offset)
        if flags & _SYNC_FLAGS:
            self._sync(file, touched)
        return len(data)

    def fsync(self, path, datasync, fh):
        self._sync(self.handles[fh][0])

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        # Always allowed, also after the cut: closing changes nothing on the disk.
        with self._mutex:
            file, _flags = self.handles.pop(fh)
            file.refs -= 1
            if file.refs == 0 and (not file.pages or self.cut_done):
                for key, known in list(self.files.items()):
                    if known is file:
                        del self.files[key]
                os.close(file.fd)

    def destroy(self, path):
        with self._mutex:
            for file in self.files.values():
                os.close(file.fd)
            self.files.clear()


def _unmount(mountpoint: str) -> None:
    """Unmount; lazily when still busy (the controller vanished and left processes behind)."""
    if subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True).returncode != 0:
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True)


def _control(fs: PowerFS, mountpoint: str) -> None:
    """Commands from stdin (see the module docstring); end of input unmounts."""
    for line in sys.stdin:
        words = line.split()
        try:
            if words[:1] == ["cut"] and len(words) == 3:
                answer = fs.cut(words[1], int(words[2]))
            elif words == ["stats"]:
                answer = fs.stats()
            else:
                answer = f"error unknown command {line.strip()!r}"
        except Exception as exc:  # answer it: the controller waits for a line
            answer = f"error {exc!r}"
        print(answer, flush=True)
    _unmount(mountpoint)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    parser.add_argument("--fsync-delay-ms", type=float, default=0.0)
    parser.add_argument("--debug", action="store_true", help="libfuse's request trace on stderr")
    args = parser.parse_args(argv)
    mfusepy = _operations_base()

    class Operations(PowerFS, mfusepy.Operations):
        pass

    def ready():
        print("ready", flush=True)
        threading.Thread(target=_control, args=(fs, args.mountpoint), daemon=True).start()

    fs = Operations(args.backing, args.fsync_delay_ms / 1000, on_ready=ready)
    # Several kernel requests at once (threads), so a slow fsync does not hold reads up.
    mfusepy.FUSE(fs, args.mountpoint, foreground=True, nothreads=False, debug=args.debug, fsname="powerfs",
                 kernel_cache=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
