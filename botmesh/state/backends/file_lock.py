"""The file journal's lock: ``<path>.lock``, an ``flock`` held for as long as it is open.

Two modes share the one file, so that the two journals on one file refuse each other:

- exclusive (the single-process ``FileKv``): ``LOCK_EX``, with the holder's pid written
  inside. A second live process is refused with ``JournalLockedError`` naming the holder's
  pid; a second open of the same journal in this process is refused until the first one is
  closed; a lock file left by a dead process is taken over at once (the kernel released its
  flock when it died).
- shared (``SharedFileKv``, several processes): ``LOCK_SH``, held by every shared journal
  that has the file open, with ``shared`` written inside. A live exclusive holder refuses a
  shared open and any shared holder refuses an exclusive open, in this process or another.
  A shared holder never removes the file (others may hold it); the exclusive holder does.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections import Counter

from botmesh.state.errors import JournalLockedError

__all__ = ["JournalLock"]

_held_lock = threading.Lock()
#: Journal paths (resolved) this process holds open exclusively.
_held: set[str] = set()
#: Journal paths (resolved) this process holds open shared, with how many opens.
_shared: Counter[str] = Counter()

#: What a shared holder writes in the lock file (an exclusive holder writes its pid).
SHARED_MARK = "shared"


class JournalLock:
    """The lock of one journal file; ``acquire()`` once, ``release()`` once."""

    def __init__(self, journal: str, *, shared: bool = False) -> None:
        self.journal = os.path.realpath(journal)
        self.path = self.journal + ".lock"
        self.shared = shared
        self._fd: int | None = None

    def acquire(self) -> None:
        with _held_lock:
            self._refuse_in_process()
            if self.shared:
                _shared[self.journal] += 1
            else:
                _held.add(self.journal)
        try:
            self._fd = self._take()
        except BaseException:
            self._forget()
            raise

    def _refuse_in_process(self) -> None:
        pid = os.getpid()
        if self.journal in _held:
            raise JournalLockedError(
                self.journal,
                pid,
                f"the journal {self.journal} is already open in this process (pid {pid}) as "
                "a file journal; close() that journal before opening it again",
            )
        if not self.shared and _shared[self.journal]:
            raise JournalLockedError(
                self.journal,
                pid,
                f"the journal {self.journal} is open in this process (pid {pid}) as a "
                "shared-file journal; close() it before opening the file as a file journal, "
                "or open this one as shared-file:// too",
            )

    def _forget(self) -> None:
        with _held_lock:
            if self.shared:
                _shared[self.journal] -= 1
                if _shared[self.journal] <= 0:
                    del _shared[self.journal]
            else:
                _held.discard(self.journal)

    def _take(self) -> int:
        mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                holder = _read_holder(fd)
                os.close(fd)
                raise self._refusal(holder) from None
            # The holder before us may have unlinked the file between our open and our
            # flock: then we hold a lock on a file nobody else will find. Start again.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            mark = SHARED_MARK if self.shared else str(os.getpid())
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{mark}\n".encode(), 0)
            return fd

    def _refusal(self, holder: str) -> JournalLockedError:
        if holder == SHARED_MARK and not self.shared:
            return JournalLockedError(
                self.journal,
                None,
                f"the journal {self.journal} is open as a shared-file journal by other live "
                f"processes (lock file {self.path}); the file journal needs it alone. Stop "
                "them, or open this one as shared-file:// too",
            )
        pid = int(holder) if holder.isdigit() else None
        who = f"pid {pid}" if pid is not None else "a process that is starting up"
        if self.shared:
            why = (
                f"the journal {self.journal} is open as a file journal (one process alone) "
                f"by another live process ({who}, lock file {self.path}); a shared-file "
                "journal never writes a file that journal holds. Stop that process, or open "
                "every process's journal as shared-file://"
            )
        else:
            why = (
                f"the journal {self.journal} is locked by another live process "
                f"({who}, lock file {self.path}); stop that process or give this "
                "one another journal path"
            )
        return JournalLockedError(self.journal, pid, why)

    def still_held(self) -> bool:
        """Whether the lock file at the path is still the one this lock holds (someone may
        have removed it by hand, letting another journal create and lock a new one)."""
        fd = self._fd
        if fd is None:
            return False
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if not self.shared:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
            os.close(fd)
        finally:
            self._forget()


def _read_holder(fd: int) -> str:
    """What the holder wrote in the lock file: a pid, ``shared``, or ``""``."""
    try:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
