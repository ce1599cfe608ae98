"""One broker process owns a store folder: an exclusive lock on ``<root>/lmdb/owner.lock`` holding its pid.

The lock (flock) is held by the broker and inherited by its writer process, so a second broker on the same folder
refuses to start, naming the folder and the process that holds it, until both are gone.
"""
from __future__ import annotations

import fcntl
import os
import time

from .errors import StoreLockedError

#: A broker killed outright leaves its writer process to be killed by the kernel an instant later: a new broker
#: waits at most this long for that writer to let go of the lock.
ORPHAN_WAIT_S = 5.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StoreOwner:
    def __init__(self, folder: str):
        self.path = os.path.join(folder, "owner.lock")
        self.fd: int | None = None

    def acquire(self) -> int:
        """Take the lock and record this process; returns the lock's fd (for the writer to inherit).

        Raises:
            StoreLockedError: another live broker holds the store.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + ORPHAN_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = self._holder(fd)
                if holder is None or _alive(holder) or time.monotonic() >= deadline:
                    os.close(fd)
                    who = f"process {holder}" if holder is not None else "another process"
                    raise StoreLockedError(
                        f"the store at {os.path.dirname(self.path)} is in use by {who} (another halfmq broker); "
                        "stop it first or give this broker its own storePathRootDir") from None
                time.sleep(0.05)  # its broker is dead: the writer it left is being killed by the kernel
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return fd

    @staticmethod
    def _holder(fd: int) -> int | None:
        try:
            return int(os.pread(fd, 32, 0).decode().strip())
        except (ValueError, UnicodeDecodeError, OSError):
            return None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
