"""Entry point of the store's writer process (writer.py): ``python -m halfmq.store.writer_process PATH MAP_SIZE
MAX_MAP_SIZE SYNC_EACH FLUSH_INTERVAL_MS BROKER_PID FD``, FD being its end of the socket to the broker."""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys

from halfmq.store.writer import serve


def _die_with_parent() -> None:
    """The writer must not outlive its broker: an orphan would keep writing behind a new broker's back."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the broker's EOF still stops it


def main(argv: list[str]) -> int:
    path, map_size, max_map_size, sync_each, interval_ms, broker_pid, fd = argv
    _die_with_parent()
    # A stop signal to the whole process group (Ctrl-C, systemd's default stop, kill -- -PGID, timeout) reaches the
    # writer too: it leaves stopping to its broker, which closes it after the last group (and it dies with the
    # broker if the broker is killed).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s halfmq writer: %(message)s")
    sock = socket.socket(fileno=int(fd))
    # The broker died before the death signal was armed: the writer was re-parented. (A broker that is PID 1 itself,
    # in a container without an init, is a parent like any other.)
    if os.getppid() != int(broker_pid):
        return 1
    return serve(path, int(map_size), int(max_map_size), sync_each == "1", int(interval_ms) / 1000, sock)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
