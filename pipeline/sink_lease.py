"""The owner of a sink attempt: a small process that lives exactly as long as the Spark driver (or until the
attempt is decided) and, while it lives, is connected to the broker as a producer of the attempt's owner group
(the proof check answers look for before rolling anything back) and of the sink group (so the broker can always
ask someone about the sink's halves while the job runs).

Spark runs a data source's driver-side code in short-lived Python workers, so no Python object lives through a
job: the writer starts this process when Spark ships it to the tasks, and it watches the driver's JVM.

    python -m halfmq.pipeline.sink_lease NAMESRV SINK_GROUP ATTEMPT DRIVER_PID
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

READY = "halfmq sink lease ready"


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def driver_pid() -> int:
    """The Spark driver's JVM: the nearest ancestor named java (Python workers are its children or the children
    of its pyspark daemon); the parent when there is none (not a Spark worker)."""
    pid = os.getpid()
    try:
        while pid > 1:
            pid = _parent(pid)
            if _comm(pid) == "java":
                return pid
    except OSError:
        pass
    return os.getppid()


def start(namesrv: str, group: str, attempt: str, timeout: float = 60.0) -> int:
    """Start the owner of ``attempt`` and return its pid once it is registered with the broker."""
    proc = subprocess.Popen([sys.executable, "-m", "halfmq.pipeline.sink_lease", namesrv, group, attempt,
                             str(driver_pid())], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    # One line, then the pipe is closed: the owner outlives this (short-lived) worker.
    line = proc.stdout.readline()
    proc.stdout.close()
    if READY not in line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the sink's owner process did not start (namesrv {namesrv})")
    return proc.pid


def end(pid: int | None, attempt: str) -> None:
    """End the owner of a decided attempt (only if that pid still is that owner)."""
    if not pid:
        return
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
        if b"halfmq.pipeline.sink_lease" in args and attempt.encode() in args:
            os.kill(pid, signal.SIGTERM)
    except (OSError, ProcessLookupError):
        pass


async def _hold(namesrv: str, group: str, attempt: str, watched: int) -> None:
    from halfmq.client import TransactionProducer

    from .sink_io import owner_group, sink_producer

    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
    try:
        fd = os.pidfd_open(watched)
    except ProcessLookupError:
        return
    loop.add_reader(fd, lambda: stop.done() or stop.set_result(None))
    member, listener = sink_producer(namesrv, group)
    owner = TransactionProducer(owner_group(attempt), listener, namesrv)
    await owner.start()
    await member.start()
    print(READY, flush=True)
    try:
        await stop
    finally:
        loop.remove_reader(fd)
        os.close(fd)
        await member.close()
        await owner.close()
        await listener.close()


def main() -> None:
    namesrv, group, attempt, watched = sys.argv[1:5]
    try:
        asyncio.run(_hold(namesrv, group, attempt, int(watched)))
    except Exception as exc:
        print(f"sink lease failed: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
