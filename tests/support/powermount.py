"""PowerMount: the controlling side of a powerfs mount (tests/support/powerfs.py) for tests and benchmarks.

It starts the filesystem process over a backing folder, waits until the kernel has mounted it, cuts its power
through the process's stdin, and unmounts it. Unmounting first tries a plain unmount (every process that used the
mount must be gone by then) and falls back to a lazy one, so a failing test never leaves a mount behind; the
filesystem process also unmounts by itself when its stdin closes (its controller died).
"""
from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class PowerMountError(RuntimeError):
    pass


class PowerMount:
    def __init__(self, backing, mountpoint, fsync_delay_ms: float = 0.0):
        self.backing = str(backing)
        self.mountpoint = str(mountpoint)
        self.fsync_delay_ms = fsync_delay_ms
        self.proc: subprocess.Popen | None = None
        self._buffer = b""

    def start(self, timeout: float = 30.0) -> "PowerMount":
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        # stderr is inherited: the filesystem's complaints land in the test's captured output.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.powerfs", self.backing, self.mountpoint,
             f"--fsync-delay-ms={self.fsync_delay_ms}"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            line = self._line(timeout)
        except PowerMountError:
            self.unmount()
            raise
        if line != "ready" or not os.path.ismount(self.mountpoint):
            self.unmount()
            raise PowerMountError(f"powerfs did not mount {self.mountpoint}: {line!r}")
        return self

    def __enter__(self) -> "PowerMount":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.unmount()

    def _line(self, timeout: float) -> str:
        """The filesystem process's next answer line (it answers every command with exactly one)."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise PowerMountError(f"powerfs gave no answer within {timeout} s")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise PowerMountError(f"powerfs exited (status {self.proc.wait()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def command(self, text: str, timeout: float = 30.0) -> str:
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()
        answer = self._line(timeout)
        if answer.startswith("error"):
            raise PowerMountError(f"powerfs refused {text!r}: {answer}")
        return answer

    def cut(self, model: str, seed: int) -> str:
        """The power goes out now (``drop`` or ``partial``, see powerfs); returns the filesystem's summary."""
        return self.command(f"cut {model} {seed}")

    def stats(self) -> str:
        return self.command("stats")

    def unmount(self, timeout: float = 30.0) -> None:
        """Unmount and wait for the filesystem process; lazily if something still uses the mount."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        lazy = False
        if os.path.ismount(self.mountpoint):
            if subprocess.run(["fusermount3", "-u", self.mountpoint], capture_output=True).returncode != 0:
                lazy = True
                subprocess.run(["fusermount3", "-u", "-z", self.mountpoint], capture_output=True)
        try:
            proc.stdin.close()  # end of input: the filesystem process unmounts (if still needed) and exits
        except BrokenPipeError:
            pass
        try:
            # After a lazy unmount the process would serve until the last user closes its files: do not wait.
            proc.wait(2 if lazy else timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child, by its pid
            proc.wait()
        proc.stdout.close()
        if os.path.ismount(self.mountpoint):
            raise PowerMountError(f"{self.mountpoint} is still mounted")


class PowerDisk:
    """A temp folder holding a backing directory and one mount point, mounted with powerfs one power cycle at a
    time: ``power_on()`` mounts (returns the mount point), ``cut(model, seed)`` cuts the power, ``power_off()``
    unmounts. ``close()`` (or leaving the ``with`` block) unmounts whatever is mounted and deletes the folder, but
    never while a mount is still there (rmtree through a live mount would delete through it)."""

    def __init__(self, fsync_delay_ms: float = 0.0, prefix: str = "halfmq-powerfs-"):
        self.fsync_delay_ms = fsync_delay_ms
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self.backing = self.root / "backing"
        self.mountpoint = self.root / "mnt"
        self.mount: PowerMount | None = None

    def __enter__(self) -> "PowerDisk":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def power_on(self) -> Path:
        assert self.mount is None, "already mounted"
        self.mount = PowerMount(self.backing, self.mountpoint, self.fsync_delay_ms).start()
        return self.mountpoint

    def cut(self, model: str, seed: int) -> str:
        return self.mount.cut(model, seed)

    def power_off(self) -> None:
        mount, self.mount = self.mount, None
        if mount is not None:
            mount.unmount()

    def close(self) -> None:
        try:
            self.power_off()
        finally:
            if not os.path.ismount(self.mountpoint):
                shutil.rmtree(self.root, ignore_errors=True)
