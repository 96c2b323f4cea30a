"""The file journal's lock: ``<path>.lock``, an ``flock`` held for as long as it is open,
with the holder's pid written inside.

A second live process is refused with ``JournalLockedError`` naming the holder's pid; a
second open of the same journal in this process is refused until the first one is closed;
a lock file left by a dead process is taken over at once (the kernel released its flock
when it died).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading

from botmesh.state.errors import JournalLockedError

__all__ = ["JournalLock"]

_held_lock = threading.Lock()
#: Journal paths (resolved) this process holds open.
_held: set[str] = set()


class JournalLock:
    """The lock of one journal file; ``acquire()`` once, ``release()`` once."""

    def __init__(self, journal: str) -> None:
        self.journal = os.path.realpath(journal)
        self.path = self.journal + ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        with _held_lock:
            if self.journal in _held:
                raise JournalLockedError(
                    self.journal,
                    os.getpid(),
                    f"the journal {self.journal} is already open in this process "
                    f"(pid {os.getpid()}); close() that journal before opening it again",
                )
            _held.add(self.journal)
        try:
            self._fd = self._take()
        except BaseException:
            with _held_lock:
                _held.discard(self.journal)
            raise

    def _take(self) -> int:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                pid = _read_pid(fd)
                os.close(fd)
                holder = f"pid {pid}" if pid is not None else "a process that is starting up"
                raise JournalLockedError(
                    self.journal,
                    pid,
                    f"the journal {self.journal} is locked by another live process "
                    f"({holder}, lock file {self.path}); stop that process or give this "
                    "one another journal path",
                ) from None
            # The holder before us may have unlinked the file between our open and our
            # flock: then we hold a lock on a file nobody else will find. Start again.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            os.close(fd)
        finally:
            with _held_lock:
                _held.discard(self.journal)


def _read_pid(fd: int) -> int | None:
    try:
        raw = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None
