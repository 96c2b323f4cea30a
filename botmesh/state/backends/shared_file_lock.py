"""The cross-process mutex of the shared-file journal: ``<path>.mutex``.

Each instance keeps a file of its own, ``<path>.mutex.<nonce>``, holding its identity
(host, pid, the pid's start time and the random nonce). It takes the mutex by linking that
file to ``<path>.mutex`` (an exclusive create: the link fails when the name exists, and the
identity is complete the moment the name appears) and gives it back by removing the link.
Nothing is ever killed:

- A mutex whose holder is dead (its pid gone on this host, or reused by another process:
  the start time differs) is broken at once.
- A live holder refreshes the file's mtime every ``heartbeat`` (a thread, so a holder whose
  event loop is busy keeps it too); only a mutex not refreshed for ``stale`` (a stalled
  holder: SIGSTOP, a debugger, a frozen VM) is broken.

Breaking renames the file aside and removes it only if it is still the very file judged
(same inode, same mtime); a mutex that another process took in between is linked back.
Two processes racing to break one stalled mutex are thus safe. Three can still go wrong:
while a breaker moves a fresh mutex aside to check it, a third process may create its own,
and the fresh holder and the third one then both hold it for one write. The holder checks
that the mutex at the path is still its own right before it writes (``owned()``), which
narrows that window but cannot close it: keep ``stale`` well above the slowest write.

Fairness: an instance that has to wait writes its nonce into ``<path>.mutex.wait`` at
each try; one that finds a fresh mark of another instance there lets it go first (it
pauses ``COURTESY`` before its own first try). Without it the last holder, which tries
again at once, would keep the mutex from the others, which pause between tries.

Meant for a local filesystem (atomic rename, hard links); not NFS.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import socket
import threading
import time
from dataclasses import dataclass

__all__ = ["COURTESY", "FIRST_PAUSE", "MAX_PAUSE", "FileMutex", "Holder", "next_pause"]

log = logging.getLogger("botmesh.state.shared_file")

#: The first pause between two tries to take a held mutex, and the longest one (seconds).
FIRST_PAUSE = 0.0005
MAX_PAUSE = 0.005
#: How long a holder that has just given the mutex back lets others waiting for it try
#: first, before it takes it again (a bit longer than their longest pause).
COURTESY = 0.006
#: A wait mark younger than this (seconds) says another instance is waiting now.
WAIT_FRESH = 0.02


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a mutex, as written in its file."""

    host: str
    pid: int
    #: The pid's start time (clock ticks since boot, ``/proc/<pid>/stat``); 0 when unknown.
    started: int
    nonce: str

    def encode(self) -> bytes:
        return f"{self.host} {self.pid} {self.started} {self.nonce}\n".encode()

    @staticmethod
    def decode(data: bytes) -> Holder | None:
        """The holder written in ``data``; ``None`` when it is not complete yet (the file
        was just created) or not ours."""
        if not data.endswith(b"\n"):
            return None
        parts = data.decode("utf-8", "replace").split()
        if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        return Holder(parts[0], int(parts[1]), int(parts[2]), parts[3])

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def next_pause(pause: float) -> float:
    """The pause before the next try of a waiter at backoff ``pause`` (jittered)."""
    return pause * random.uniform(0.5, 1.0)


def _start_time(pid: int) -> int:
    """The start time of ``pid`` in clock ticks since boot (Linux), 0 when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of stat(5); the 20th after the command name
    except (IndexError, ValueError):
        return 0


def _alive(holder: Holder) -> bool:
    """Whether the holder's process still runs. Only a holder on this host can be judged;
    one on another host counts as alive (its mutex is broken only when stale)."""
    if holder.host != socket.gethostname():
        return True
    try:
        os.kill(holder.pid, 0)  # a probe: signal 0 is never delivered
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    if holder.started:
        started = _start_time(holder.pid)
        if started and started != holder.started:
            return False  # the pid now names another process
    return True


class FileMutex:
    """The mutex ``<journal>.mutex`` of one journal instance (see the module docstring)."""

    def __init__(self, journal: str, *, stale: float, heartbeat: float) -> None:
        self.path = journal + ".mutex"
        self.wait_path = self.path + ".wait"
        self.stale = stale
        self.heartbeat = heartbeat
        pid = os.getpid()
        self.me = Holder(socket.gethostname(), pid, _start_time(pid), secrets.token_hex(8))
        #: This instance's own file, linked to ``path`` while it holds the mutex.
        self.own_path = f"{self.path}.{self.me.nonce}"
        self._own_fd: int | None = None
        self._ino: int | None = None
        self._held = False
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        #: Mutexes this instance broke (dead holders, stalled holders): for logs and tests.
        self.broken: list[str] = []

    @property
    def held(self) -> bool:
        return self._held

    def start(self) -> None:
        """Create this instance's own file (removing those of dead processes) and start
        the heartbeat thread (it refreshes the mutex only while it is held)."""
        if self._own_fd is None:
            self._remove_dead_files()
            fd = os.open(self.own_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, self.me.encode())
                self._ino = os.fstat(fd).st_ino
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(self.own_path)
                raise
            self._own_fd = fd
        if self._beat is None:
            self._stop.clear()
            self._beat = threading.Thread(
                target=self._heartbeat, name="botmesh-shared-file-heartbeat", daemon=True
            )
            self._beat.start()

    def stop(self) -> None:
        """Stop the heartbeat thread and remove the own file (after ``release()``)."""
        beat, self._beat = self._beat, None
        if beat is not None:
            self._stop.set()
            beat.join()
        with self._guard:
            fd, self._own_fd = self._own_fd, None
        if fd is not None:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.own_path)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with self._guard:
                if self._held and self._own_fd is not None:
                    try:
                        os.utime(self._own_fd)  # our inode, wherever a breaker moved it
                    except OSError as exc:
                        log.warning("shared-file mutex %s: heartbeat failed: %s", self.path, exc)

    def _remove_dead_files(self) -> None:
        """Remove the own files that processes killed on this host left behind."""
        folder, stem = os.path.split(self.path)
        try:
            names = os.listdir(folder or ".")
        except OSError:
            return
        for name in names:
            nonce = name[len(stem) + 1 :] if name.startswith(stem + ".") else ""
            if len(nonce) != 16 or not all(c in "0123456789abcdef" for c in nonce):
                continue
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    holder = Holder.decode(f.read(512))
            except OSError:
                continue
            if holder is not None and not _alive(holder):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    # -- taking and giving back ---------------------------------------------------------

    def try_acquire(self) -> bool:
        """Take the mutex if it is free (or abandoned: then break it first); never waits."""
        assert not self._held, "the mutex is already held by this instance"
        assert self._own_fd is not None, "start() the mutex first"
        os.utime(self._own_fd)  # fresh before the name appears: never judged stale at once
        try:
            os.link(self.own_path, self.path)
        except FileExistsError:
            self._break_if_abandoned()
            return False
        with self._guard:
            self._held = True
        return True

    def acquire(self, timeout: float) -> None:
        """Take the mutex, waiting (in this thread) up to ``timeout`` seconds; raise
        ``TimeoutError`` naming the holder when it stays held by a live process."""
        deadline = time.monotonic() + timeout
        if self.others_waiting():
            time.sleep(COURTESY)
        pause = FIRST_PAUSE
        while not self.try_acquire():
            self.mark_waiting()
            if time.monotonic() >= deadline:
                raise TimeoutError(self.holder_text())
            time.sleep(next_pause(pause))
            pause = min(pause * 2, MAX_PAUSE)

    def mark_waiting(self) -> None:
        """Say that this instance waits for the mutex (see "Fairness")."""
        try:
            fd = os.open(
                self.wait_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
            )
        except OSError:
            return  # only a hint
        try:
            os.write(fd, self.me.nonce.encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    def others_waiting(self) -> bool:
        """Whether another instance marked itself waiting just now."""
        try:
            fd = os.open(self.wait_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            age = time.time() - os.fstat(fd).st_mtime
            mark = os.read(fd, 64)
        except OSError:
            return False
        finally:
            os.close(fd)
        return age < WAIT_FRESH and mark != self.me.nonce.encode()

    def owned(self) -> bool:
        """Whether the file at the path is still the mutex this instance created (it was
        not broken by another process while this one stalled)."""
        if not self._held or self._ino is None:
            return False
        try:
            return os.stat(self.path).st_ino == self._ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Give the mutex back (remove the file, if it is still ours)."""
        with self._guard:
            held, self._held = self._held, False
        if not held:
            return
        try:
            if os.stat(self.path).st_ino == self._ino:
                os.unlink(self.path)
            else:
                log.warning(
                    "shared-file mutex %s was taken over by another process while this one "
                    "held it (it stalled longer than the stale limit, %.3gs)",
                    self.path,
                    self.stale,
                )
        except FileNotFoundError:
            pass

    # -- abandoned mutexes --------------------------------------------------------------

    def read_holder(self) -> tuple[os.stat_result, Holder | None] | None:
        """The mutex file's status and holder; ``None`` when there is no mutex."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            data = os.read(fd, 512)
        finally:
            os.close(fd)
        return st, Holder.decode(data)

    def holder_text(self) -> str:
        found = self.read_holder()
        if found is None:
            return "nobody (it was just given back)"
        st, holder = found
        who = holder.describe() if holder is not None else "a process that is starting up"
        return f"{who}, refreshed {max(time.time() - st.st_mtime, 0.0):.3g}s ago"

    def _break_if_abandoned(self) -> None:
        found = self.read_holder()
        if found is None:
            return
        st, holder = found
        age = time.time() - st.st_mtime
        dead = holder is not None and not _alive(holder)
        if holder is not None and dead:
            why = f"its holder ({holder.describe()}) is dead"
        elif age > self.stale:
            who = holder.describe() if holder is not None else "an unknown process"
            why = (
                f"its holder ({who}) stalled: not refreshed for {age:.3g}s, more than the "
                f"stale limit of {self.stale:.3g}s"
            )
        else:
            return
        if self._break(st, why) and holder is not None and dead:
            with contextlib.suppress(OSError):  # the own file the dead holder left
                os.unlink(f"{self.path}.{holder.nonce}")

    def _break(self, judged: os.stat_result, why: str) -> bool:
        """Remove the mutex judged abandoned; True when this call removed it."""
        aside = f"{self.path}.{self.me.nonce}.broken"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False  # given back or broken by someone else meanwhile
        try:
            st = os.stat(aside)
            if (st.st_ino, st.st_dev, st.st_mtime_ns) == (
                judged.st_ino,
                judged.st_dev,
                judged.st_mtime_ns,
            ):
                self.broken.append(why)
                log.warning("shared-file mutex %s broken: %s", self.path, why)
                return True
            # Not the file judged: another process took the mutex (or its holder beat)
            # between our look and our rename. Put it back, unless a third took it since.
            try:
                os.link(aside, self.path)
            except FileExistsError:
                log.error(
                    "shared-file mutex %s: while breaking an abandoned mutex, a fresh one was "
                    "moved aside and a third process took the mutex before it could be put "
                    "back; one write may be lost. Operator action: keep stale_lock well above "
                    "the slowest write",
                    self.path,
                )
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(aside)
