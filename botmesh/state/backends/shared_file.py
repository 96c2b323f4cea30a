"""The shared-file journal: the file journal, opened by several processes on one host.

``open_shared_file_kv(path)`` (URL ``shared-file:///path``) keeps the file journal's files
and format (``botmesh.state.backends.file_format``: the snapshot ``<path>``, the append
log ``<path>.log``) and adds one file:

- ``<path>.mutex``: a cross-process mutex (``botmesh.state.backends.shared_file_lock``;
  beside it each open instance keeps ``<path>.mutex.<nonce>``, the file it links there to
  take it, and waiters mark ``<path>.mutex.wait``).
  Every operation, read or write, runs under it against the current file: the instance
  rereads the journal only when it changed since this instance last saw it (another
  process wrote: the snapshot's identity and header, the log's identity and size), so a
  read sees every commit another process made before it, and a compare-and-set is checked
  against the committed version. Claims are exclusive and fencing tokens hold across
  processes. Operations made at the same time in one process share one hold of the mutex
  and one write (group commit).

A mutex left by a dead process is broken at once; a live holder refreshes it (a heartbeat
thread, every ``heartbeat``, a third of ``stale_lock`` by default), so only a holder
stalled for ``stale_lock`` (30 s by default: SIGSTOP, a debugger) is treated as abandoned.
Nothing is ever killed. An operation that cannot take the mutex within ``lock_timeout``
(twice ``stale_lock`` by default) fails with ``JournalUnavailableError`` naming the holder.

By default every write rereads (when it changed) and rewrites the whole snapshot; with
``append_log=True`` each write appends one line to ``<path>.log`` (compacted every
``compact_every`` entries or ``compact_bytes``), and a process reads only the lines the
others appended since it last looked. A torn last line (a writer killed mid-append) is
cut by the next holder; a bad line with more after it is refused (``APPEND_LOG_CORRUPT``,
with file, line and offset) and the files are left as they are. Unlike the file journal,
``close()`` leaves the log to the other processes (it is replayed by whoever opens the
journal next).

Never open one file with both journals: the single-process file journal (``file://``)
and this one take the journal's ``<path>.lock`` exclusively and shared, so each refuses a
file the other holds, whichever opened first.

For a few processes on one host (or a filesystem with atomic rename and hard links); not
NFS. Keep ``stale_lock`` well above the slowest write: if three processes
race to break an already stalled mutex, two can briefly hold it and one write may be lost
(see ``shared_file_lock``). Where that matters, use a database journal.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from botmesh.state.backends.file import (
    FILE_URL_OPTIONS,
    FileKv,
    FileOptions,
    MiB,
    _Pending,
    file_url_option,
)
from botmesh.state.backends.file_format import encode_entry, read_log
from botmesh.state.backends.file_lock import JournalLock
from botmesh.state.backends.file_ops import FileOps
from botmesh.state.backends.shared_file_lock import (
    COURTESY,
    FIRST_PAUSE,
    MAX_PAUSE,
    FileMutex,
    next_pause,
)
from botmesh.state.durations import Duration, parse_duration
from botmesh.state.errors import (
    ConfigError,
    DurabilityError,
    JournalLockedError,
    JournalUnavailableError,
    VersionConflictError,
)
from botmesh.state.kv import Entry, IndexName, copy_entry, range_of

__all__ = [
    "SharedFileKv",
    "SharedFileOptions",
    "from_url",
    "open_shared_file_kv",
    "open_url",
]

log = logging.getLogger("botmesh.state.shared_file")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SharedFileOptions(FileOptions):
    """How the shared-file journal writes (the ``FileOptions``) and shares its file."""

    stale_lock: float = 30.0
    """Seconds after which a mutex its live holder stopped refreshing (a stalled process)
    is broken. Default 30. Keep it well above the slowest write."""

    heartbeat: float | None = None
    """Seconds between two refreshes of a held mutex. Default (``None``): a third of
    ``stale_lock``. Must be below ``stale_lock``."""

    lock_timeout: float | None = None
    """Seconds an operation waits for a mutex that a live process holds before it fails
    with ``JournalUnavailableError``. Default (``None``): twice ``stale_lock``."""

    def __post_init__(self) -> None:
        FileOptions.__post_init__(self)
        for name in ("stale_lock", "heartbeat", "lock_timeout"):
            value = getattr(self, name)
            if value is None and name != "stale_lock":
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigError(f"shared_file.{name}", f"must be seconds > 0, got {value!r}")
        if self.heartbeat is not None and self.heartbeat >= self.stale_lock:
            raise ConfigError(
                "shared_file.heartbeat",
                f"must be below stale_lock ({self.stale_lock:g}s), got {self.heartbeat:g}s; "
                "a holder that refreshes less often than that would be robbed while it works "
                "(leave it unset: a third of stale_lock)",
            )

    @property
    def beat(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.stale_lock / 3

    @property
    def wait(self) -> float:
        return self.lock_timeout if self.lock_timeout is not None else 2 * self.stale_lock


#: What identifies the journal's files as last seen: the snapshot's inode, size, mtime and
#: header line (its seq and CRC), and the log's inode and size (``None``: missing).
_Signature = tuple[tuple[int, int, int, bytes] | None, tuple[int, int] | None]


class _MutexLost(JournalUnavailableError):
    """The mutex was broken while this instance held it (it stalled past the stale limit)."""


class SharedFileKv(FileKv):
    """The shared-file journal's ``DurableKv`` (see the module docstring)."""

    #: Several processes may share it (the runtime adds a per-boot suffix to the default
    #: instance id, and takes chat turns).
    shared = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        options: SharedFileOptions | None = None,
        *,
        file_ops: FileOps | None = None,
    ) -> None:
        opts = options or SharedFileOptions()
        super().__init__(path, opts, file_ops=file_ops)
        self.shared_options = opts
        self._mutex = FileMutex(
            os.path.realpath(self.path), stale=opts.stale_lock, heartbeat=opts.beat
        )
        self._shared_lock: JournalLock | None = None
        #: The files as this instance last saw them (``None``: reread at the next hold).
        self._seen: _Signature | None = None

    @property
    def mutex_breaks(self) -> list[str]:
        """Why each mutex this instance broke was abandoned (dead or stalled holder)."""
        return list(self._mutex.broken)

    # -- lifecycle ------------------------------------------------------------------

    async def open(self) -> None:
        if self._opened:
            return
        lock = await asyncio.to_thread(self._take_shared_lock)
        try:
            self._mutex.start()
            await self._take_mutex()
            try:
                await asyncio.to_thread(self._load_sync)
            finally:
                self._mutex.release()
        except BaseException as exc:
            self._close_log_fd()
            self._mutex.stop()
            lock.release()
            if isinstance(exc, OSError):
                raise self._open_error(exc) from exc
            raise
        self._shared_lock = lock
        self._opened = True
        self._closing = False
        self._broken = None

    def _take_shared_lock(self) -> JournalLock:
        if not os.path.isdir(self._dir):
            raise JournalUnavailableError(
                f"the folder of the journal {self.path} does not exist; create it first"
            )
        lock = JournalLock(self.path, shared=True)
        try:
            lock.acquire()
        except OSError as exc:
            raise self._open_error(exc) from exc
        return lock

    async def close(self) -> None:
        """Let the operations already called finish, then release the files; later calls
        are refused. The log stays for the other processes (no fold)."""
        if not self._opened or self._closing:
            return
        self._closing = True
        while self._writer is not None:
            await asyncio.shield(self._writer)
        self._close_log_fd()
        self._mutex.release()
        self._mutex.stop()
        if self._shared_lock is not None:
            self._shared_lock.release()
            self._shared_lock = None
        self._seen = None
        self._opened = False

    # -- reads: served under the mutex, in the writer's batches -----------------------

    async def _read(self, read: Callable[[], T]) -> T:
        self._check()
        pending = _Pending([], "", asyncio.get_running_loop().create_future(), read)
        self._enqueue(pending)
        result: T = await pending.future
        return result

    async def get(self, key: str) -> Entry | None:
        def read() -> Entry | None:
            e = self._entries.get(key)
            return copy_entry(e) if e is not None else None

        return await self._read(read)

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        keys = list(keys)
        return await self._read(
            lambda: {k: copy_entry(e) for k in keys if (e := self._entries.get(k)) is not None}
        )

    async def range(
        self, index: IndexName, prefix: str, until: float, limit: int = 100
    ) -> list[str]:
        return await self._read(lambda: range_of(self._entries, index, prefix, until, limit))

    async def scan(self, prefix: str) -> list[Entry]:
        return await self._read(
            lambda: [
                copy_entry(self._entries[k]) for k in sorted(self._entries) if k.startswith(prefix)
            ]
        )

    # -- one hold of the mutex per batch ------------------------------------------------

    async def _take_mutex(self) -> None:
        """Take the mutex, waiting (without blocking the event loop) up to ``lock_timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shared_options.wait
        if self._mutex.others_waiting():
            await asyncio.sleep(COURTESY)  # let them go first (fairness)
        pause = FIRST_PAUSE
        while not self._mutex.try_acquire():
            self._mutex.mark_waiting()
            if loop.time() >= deadline:
                raise JournalUnavailableError(
                    f"the shared-file journal {self.path} waited "
                    f"{self.shared_options.wait:g}s for its mutex {self._mutex.path}, held "
                    f"by {self._mutex.holder_text()}. Operator action: find out why that "
                    "process holds it so long (a stalled holder is broken after stale_lock)"
                )
            await asyncio.sleep(next_pause(pause))
            pause = min(pause * 2, MAX_PAUSE)

    async def _write_batch(self, batch: list[_Pending]) -> None:
        commits = [p for p in batch if p.read is None]
        reads = [p for p in batch if p.read is not None]
        try:
            await self._take_mutex()
        except JournalUnavailableError as exc:
            for p in batch:
                _fail(p, exc)
            return
        try:
            try:
                await self._refresh()
            except (DurabilityError, OSError) as exc:
                self._seen = None
                error = exc if isinstance(exc, DurabilityError) else self._read_error(exc)
                for p in batch:
                    _fail(p, error)
                return
            seq = self._seq
            if commits:
                try:
                    await super()._write_batch(commits)
                except _MutexLost as exc:
                    for p in commits:
                        _fail(p, exc)
                if any(_failed_write(p) for p in commits):
                    self._seen = None  # what reached the files is not what we hold
            for p in reads:
                assert p.read is not None
                try:
                    _settle_value(p, p.read())
                except Exception as exc:
                    _fail(p, exc)
            if self._seen is not None and self._seq != seq:  # we wrote: note the files
                self._seen = self._signature()
        finally:
            self._mutex.release()

    def _read_error(self, exc: OSError) -> JournalUnavailableError:
        error = JournalUnavailableError(
            f"reading the shared-file journal {self.path} failed: {exc}. Operator action: "
            "check the path, its permissions and the disk"
        )
        error.__cause__ = exc
        return error

    # -- keeping up with the other processes (under the mutex) -------------------------

    def _signature(self) -> _Signature:
        snapshot: tuple[int, int, int, bytes] | None = None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
        else:
            try:
                st = os.fstat(fd)
                head = os.pread(fd, 512, 0)
            finally:
                os.close(fd)
            newline = head.find(b"\n")
            snapshot = (st.st_ino, st.st_size, st.st_mtime_ns, head[: newline + 1] or head)
        try:
            lst = os.stat(self.log_path)
        except FileNotFoundError:
            return snapshot, None
        return snapshot, (lst.st_ino, lst.st_size)

    def _load_sync(self) -> None:
        """Read the journal from scratch (the open, or files another process replaced)."""
        self._close_log_fd()
        self._seen = None
        self._load()
        self._seen = self._signature()

    async def _refresh(self) -> None:
        """Bring the state in memory up to the files, rereading only what changed. The
        check is a few metadata calls, made here; a reread goes to a thread."""
        if not self._up_to_date():
            await asyncio.to_thread(self._refresh_sync)

    def _up_to_date(self) -> bool:
        """Whether the files are as this instance last saw them (lock file checked too)."""
        if self._shared_lock is not None and not self._shared_lock.still_held():
            raise JournalLockedError(
                self.path,
                None,
                f"the lock file {self._shared_lock.path} of the shared-file journal "
                f"{self.path} was removed or replaced while it was open, so a file journal "
                "may hold the file now; this instance refuses every operation. Operator "
                "action: stop the processes of this journal, then open them again",
            )
        fd = self._log_fd
        if fd is not None and os.fstat(fd).st_nlink == 0:
            return False  # the log was removed (folded) by another process
        return self._seen is not None and self._signature() == self._seen

    def _refresh_sync(self) -> None:
        fd = self._log_fd
        if fd is not None and os.fstat(fd).st_nlink == 0:
            self._load_sync()  # the log was removed (folded) by another process
            return
        now = self._signature()
        seen = self._seen
        if now == seen:
            return
        if (
            seen is not None
            and fd is not None
            and now[0] == seen[0]
            and now[1] is not None
            and seen[1] is not None
            and now[1][0] == seen[1][0] == os.fstat(fd).st_ino
            and now[1][1] > seen[1][1] == self._log_size
        ):
            self._replay_tail(fd)
        else:
            self._load_sync()
            return
        self._seen = self._signature()

    def _replay_tail(self, fd: int) -> None:
        """Apply the log lines other processes appended since this instance last looked."""
        start = self._log_size
        with open(self.log_path, "rb") as f:
            f.seek(start)
            data = f.read()
        replay = read_log(
            data, self.log_path, self._seq, base_offset=start, base_line=self._log_entries
        )
        for commit in replay.commits:
            for key in commit.deletes:
                self._entries.pop(key, None)
                self._frags.pop(key, None)
            for entry in commit.puts:
                self._entries[entry.key] = entry
                self._frags[entry.key] = encode_entry(entry)
            self._seq = commit.seq
        self._log_entries += data.count(b"\n", 0, replay.good_size - start)
        self._log_size = replay.good_size
        if replay.torn_bytes:
            log.warning(
                "shared-file journal %s: cut a torn last line (line %s, %d bytes at offset "
                "%d), left by a process that died during a write",
                self.log_path,
                replay.torn_line,
                replay.torn_bytes,
                replay.good_size,
            )
            self._ops.ftruncate(fd, replay.good_size)
            self._ops.fsync(fd)

    # -- writes: only while the mutex is still ours ----------------------------------

    def _owned(self) -> None:
        if not self._mutex.owned():
            raise _MutexLost(
                f"the mutex {self._mutex.path} of the shared-file journal {self.path} was "
                "broken by another process while this one held it (it stalled longer than "
                f"stale_lock, {self.shared_options.stale_lock:g}s); nothing of this write "
                "was applied. Operator action: raise stale_lock above the longest stall"
            )

    def _append_sync(self, lines: bytes) -> None:
        self._owned()
        super()._append_sync(lines)

    def _write_snapshot_sync(self, data: bytes, *, fsync: bool) -> None:
        self._owned()
        super()._write_snapshot_sync(data, fsync=fsync)


def _fail(pending: _Pending, exc: BaseException) -> None:
    if not pending.future.done():
        pending.future.set_exception(exc)


def _settle_value(pending: _Pending, value: object) -> None:
    if not pending.future.done():
        pending.future.set_result(value)


def _failed_write(pending: _Pending) -> bool:
    """Whether a commit failed in its write (not by a conflict or a bad value)."""
    future = pending.future
    if not future.done() or future.cancelled():
        return False
    exc = future.exception()
    return exc is not None and not isinstance(exc, VersionConflictError | TypeError)


async def open_shared_file_kv(
    path: str | os.PathLike[str],
    *,
    append_log: bool = False,
    fsync: bool | None = None,
    compact_every: int = 1000,
    compact_bytes: int = 4 * MiB,
    stale_lock: Duration = "30s",
    heartbeat: Duration | None = None,
    lock_timeout: Duration | None = None,
    file_ops: FileOps | None = None,
) -> SharedFileKv:
    """A ``SharedFileKv`` on ``path``, opened (read back under the mutex)."""
    kv = SharedFileKv(
        path,
        SharedFileOptions(
            append_log,
            fsync,
            compact_every,
            compact_bytes,
            parse_duration(stale_lock, "shared_file.stale_lock"),
            parse_duration(heartbeat, "shared_file.heartbeat") if heartbeat is not None else None,
            parse_duration(lock_timeout, "shared_file.lock_timeout")
            if lock_timeout is not None
            else None,
        ),
        file_ops=file_ops,
    )
    await kv.open()
    return kv


_DURATIONS = ("stale_lock", "heartbeat", "lock_timeout")


def from_url(url: str, *, file_ops: FileOps | None = None) -> SharedFileKv:
    """A ``SharedFileKv`` (not opened yet) for ``shared-file:///absolute/path`` with optional
    query options: the file journal's (``append_log``, ``fsync``, ``compact_every``,
    ``compact_bytes``) and ``stale_lock``, ``heartbeat``, ``lock_timeout`` (durations:
    ``30s``, ``500ms``…)."""
    parts = urlsplit(url)
    if parts.scheme != "shared-file" or parts.netloc not in ("", "localhost") or not parts.path:
        raise ConfigError(
            "journal",
            f"{url!r} is not a shared-file journal URL; write "
            "shared-file:///absolute/path/to/journal",
        )
    kwargs: dict[str, Any] = {}
    for name, raw in parse_qsl(parts.query, keep_blank_values=True):
        if name in _DURATIONS:
            kwargs[name] = parse_duration(raw, f"journal ({name})")
        elif not file_url_option(name, raw, kwargs):
            raise ConfigError(
                f"journal ({name})",
                "unknown option; the shared-file journal takes "
                + ", ".join((*FILE_URL_OPTIONS, *_DURATIONS)),
            )
    try:
        options = SharedFileOptions(**kwargs)
    except ConfigError as exc:
        raise ConfigError("journal", f"{url!r}: {exc}") from None
    return SharedFileKv(unquote(parts.path), options, file_ops=file_ops)


async def open_url(url: str) -> SharedFileKv:
    """The opener ``botmesh.state.backends`` calls for ``shared-file://`` URLs."""
    kv = from_url(url)
    await kv.open()
    return kv
