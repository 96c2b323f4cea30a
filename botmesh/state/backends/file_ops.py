"""The file-system calls of the file journal's write path, in one object.

Every write the journal makes goes through a ``FileOps``; tests pass a subclass that fails
a chosen call (EIO, ENOSPC, a short write) to check that the journal fails that write loudly
and stays readable. No ``LD_PRELOAD``, no monkeypatching of ``os``.
"""

from __future__ import annotations

import os

__all__ = ["FileOps"]


class FileOps:
    """Thin wrappers around ``os``; override a method to inject a fault."""

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def fsync_dir(self, path: str) -> None:
        """Make a rename or a new file in directory ``path`` durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_all(self, fd: int, data: bytes) -> None:
        """Write every byte of ``data``; a write that makes no progress is an ``OSError``."""
        view = memoryview(data)
        while view:
            n = self.write(fd, view)
            if n <= 0:
                raise OSError(f"short write: {len(view)} of {len(data)} bytes not written")
            view = view[n:]
