"""Shared pieces of the file-journal tests."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from botmesh.state.backends.file_ops import FileOps
from botmesh.state.kv import DurableKv

CHILD = Path(__file__).with_name("_child.py")
ROOT = Path(__file__).resolve().parents[2]


async def state_of(kv: DurableKv) -> dict[str, tuple[Any, ...]]:
    """Every entry, comparable: key -> (value, version, due, purge)."""
    return {e.key: (e.value, e.version, e.due, e.purge) for e in await kv.scan("")}


class CountingOps(FileOps):
    """Counts the calls of the write path."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def write(self, fd: int, data: memoryview) -> int:
        self._count("write")
        return super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self._count("fsync")
        super().fsync(fd)

    def fsync_dir(self, path: str) -> None:
        self._count("fsync_dir")
        super().fsync_dir(path)

    def replace(self, src: str, dst: str) -> None:
        self._count("replace")
        super().replace(src, dst)


class NoSyncOps(FileOps):
    """No fsync at all: for the fuzzer, where only the bytes matter, not the disk."""

    def fsync(self, fd: int) -> None:
        pass

    def fsync_dir(self, path: str) -> None:
        pass


class FaultyOps(FileOps):
    """Fails the ``nth`` (1-based) call of ``call`` with ``err``, once; ``short`` makes
    that write return half of its bytes first and fail on the next call."""

    def __init__(self, call: str, nth: int = 1, err: int = errno.EIO, short: bool = False):
        self.call = call
        self.nth = nth
        self.err = err
        self.short = short
        self.seen = 0
        self.fired = False
        self._short_pending = False

    def _maybe_fail(self, call: str) -> None:
        if call != self.call or self.fired:
            return
        self.seen += 1
        if self.seen == self.nth:
            self.fired = True
            raise OSError(self.err, os.strerror(self.err))

    def write(self, fd: int, data: memoryview) -> int:
        if self.call == "write" and self.short and not self.fired:
            self.seen += 1
            if self._short_pending:
                self.fired = True
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            if self.seen == self.nth and len(data) > 1:
                self._short_pending = True
                return super().write(fd, data[: len(data) // 2])
            return super().write(fd, data)
        self._maybe_fail("write")
        return super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self._maybe_fail("fsync")
        super().fsync(fd)

    def fsync_dir(self, path: str) -> None:
        self._maybe_fail("fsync_dir")
        super().fsync_dir(path)

    def replace(self, src: str, dst: str) -> None:
        self._maybe_fail("replace")
        super().replace(src, dst)

    def ftruncate(self, fd: int, size: int) -> None:
        self._maybe_fail("ftruncate")
        super().ftruncate(fd, size)
