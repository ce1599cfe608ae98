"""The sync helper process: ``fdatasync`` on the store's data file whenever the broker asks.

Run as ``python sync_helper.py DATA_FILE``. Every byte read on stdin is one request; after the sync that covers
it, one byte goes back on stdout: ``.`` synced, ``!`` the sync failed. Requests that queue up during a sync are
all answered by the next one. EOF on stdin ends the process.

A process rather than a thread: a thread must win the GIL back from the busy event loop after every sync,
which delayed each acknowledgement by up to a switch interval and cost a dozen futex calls per sync.
Only the standard library is imported, so the process starts in milliseconds.
"""
import os
import sys


def main() -> int:
    fd = os.open(sys.argv[1], os.O_RDWR)
    while True:
        try:
            requests = os.read(0, 65536)
        except InterruptedError:
            continue
        if not requests:
            return 0
        try:
            os.fdatasync(fd)
            answer = b"." * len(requests)
        except OSError as exc:
            print(f"halfmq sync helper: fdatasync failed: {exc}", file=sys.stderr, flush=True)
            answer = b"!" * len(requests)
        view = memoryview(answer)
        while view:
            view = view[os.write(1, view):]


if __name__ == "__main__":
    sys.exit(main())
