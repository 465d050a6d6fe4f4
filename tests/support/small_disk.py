"""A small real filesystem for disk-full tests: a tmpfs of a few MB in a private mount namespace.

A holder process (``unshare -m``, then ``sleep``) owns the namespace and its tmpfs, mounted over a
directory of the test's; brokers started through :meth:`SmallDisk.wrap` (``nsenter``) see the
tmpfs there, restarts included, while everything else on the machine sees the empty directory.
The test reaches the files through ``/proc/<holder>/root`` (:meth:`host_path`), e.g. to fill the
disk with a filler file or to free it. Needs the right to mount (root or CAP_SYS_ADMIN), as the
suite has in CI; elsewhere :func:`small_disk_available` is False and the tests say why they skip.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
from functools import cache
from pathlib import Path

_CHUNK = bytes(64 * 1024)


@cache
def small_disk_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def fill(directory: Path, name: str = "filler", leave: int = 0) -> int:
    """Write ``directory/name`` until its filesystem has at most ``leave`` bytes left (none: to the
    last block, in ever smaller writes); how many bytes it wrote."""
    written = 0
    fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        chunk = len(_CHUNK)
        while chunk >= 512:
            st = os.statvfs(directory)
            room = st.f_bavail * st.f_frsize - leave
            if room <= 0:
                break
            try:
                written += os.write(fd, _CHUNK[:min(chunk, room)])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk //= 8
    finally:
        os.close(fd)
    return written


class SmallDisk:
    """A ``size_mb`` tmpfs over ``mount_dir`` in a private mount namespace, until :meth:`close`."""

    def __init__(self, mount_dir: Path, size_mb: int) -> None:
        self.mount_dir = mount_dir
        mount_dir.mkdir(parents=True, exist_ok=True)
        script = f'mount -t tmpfs -o size={size_mb}m tmpfs "$1" && echo mounted && exec sleep 100000'
        self.holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(mount_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline().decode().strip()
        if line != "mounted":
            self.close()
            raise RuntimeError(f"cannot mount a tmpfs in a private namespace: {line!r}")

    def wrap(self, args: list[str]) -> list[str]:
        """``args`` run inside the namespace (where ``mount_dir`` is the small disk)."""
        return ["nsenter", "-t", str(self.holder.pid), "-m", "--", *args]

    def host_path(self, path: Path) -> Path:
        """Where this process reaches ``path`` as the namespace sees it."""
        return Path(f"/proc/{self.holder.pid}/root") / path.resolve().relative_to("/")

    def free_bytes(self) -> int:
        st = os.statvfs(self.host_path(self.mount_dir))
        return st.f_bavail * st.f_frsize

    def fill(self, name: str = "filler", leave: int = 0) -> int:
        """Write a filler file until the disk has at most ``leave`` bytes left; its size."""
        return fill(self.host_path(self.mount_dir), name, leave)

    def free(self, name: str = "filler") -> None:
        (self.host_path(self.mount_dir) / name).unlink()

    def close(self) -> None:
        if self.holder.poll() is None:
            self.holder.send_signal(signal.SIGKILL)
            self.holder.wait(10)
        if self.holder.stdout is not None:
            self.holder.stdout.close()

    def __enter__(self) -> SmallDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

