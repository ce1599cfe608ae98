"""The owner of a driver's sink attempts: a small process that lives exactly as long as the Spark driver's JVM and,
while it lives, is connected to the broker as a producer of the owner group ``HALFMQ_SINK_OWNER_<owner id>`` (the
proof check answers look for before rolling anything back) and of the sink group (so the broker can always ask
someone about the sink's halves while the driver runs). One per driver, name server and sink group: every batch
write and micro-batch of that driver shares it.

Spark runs a data source's driver-side code in short-lived Python workers, so no Python object lives through a
job: the writer finds or starts this process when Spark ships it to the tasks, and it watches the driver's JVM.

    python -m halfmq.pipeline.sink_lease NAMESRV SINK_GROUP OWNER_ID DRIVER_PID RECORD_FILE
"""
from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

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


def _start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[19].decode()


def _is_owner(pid: int, owner: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return b"halfmq.pipeline.sink_lease" in args and owner.encode() in args


def ensure(namesrv: str, group: str) -> str:
    """The owner id of this driver's owner process for (namesrv, group), started if it is not running."""
    driver = driver_pid()
    folder = Path(tempfile.gettempdir()) / "halfmq-sink-owners"
    folder.mkdir(exist_ok=True)
    # The driver's pid and start time: a later process reusing the pid is another driver.
    name = hashlib.sha1(f"{driver}:{_start_time(driver)}:{namesrv}:{group}".encode()).hexdigest()[:20]
    record = folder / name
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # planner workers of one driver may run at once
        try:
            pid_text, owner = record.read_text().split()
            if _is_owner(int(pid_text), owner):
                return owner
        except (OSError, ValueError):
            pass
        owner = uuid.uuid4().hex
        pid = _start(namesrv, group, owner, driver, record)
        record.write_text(f"{pid} {owner}")
        return owner


def _start(namesrv: str, group: str, owner: str, driver: int, record: Path, timeout: float = 60.0) -> int:
    proc = subprocess.Popen([sys.executable, "-m", "halfmq.pipeline.sink_lease", namesrv, group, owner,
                             str(driver), str(record)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    # One line once it is registered, then the pipe is closed: the owner outlives this (short-lived) worker.
    ready, _w, _x = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    proc.stdout.close()
    if READY not in line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the sink's owner process did not register with the broker within {timeout} s "
                           f"(namesrv {namesrv})")
    return proc.pid


async def _hold(namesrv: str, group: str, owner_id: str, watched: int, record: Path) -> None:
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
    owner = TransactionProducer(owner_group(owner_id), listener, namesrv)
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
        try:  # the driver's record of this process, unless a newer owner replaced it
            if record.read_text().split()[1] == owner_id:
                record.unlink()
        except (OSError, IndexError):
            pass


def main() -> None:
    namesrv, group, owner_id, watched, record = sys.argv[1:6]
    try:
        asyncio.run(_hold(namesrv, group, owner_id, int(watched), Path(record)))
    except Exception as exc:
        print(f"sink lease failed: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
