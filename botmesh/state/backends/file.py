"""The file journal: a ``DurableKv`` in one file on one host, needing no server.

``open_file_kv(path)`` (URL ``file:///path``) keeps every entry in memory and the
journal on disk in up to three files beside each other:

- ``<path>``: the snapshot (format in ``botmesh.state.backends.file_format``). In snapshot mode
  (the default) every commit rewrites it atomically: a temp file, ``fsync`` when asked,
  a rename over the old one, ``fsync`` of the directory.
- ``<path>.log``: with ``append_log=True`` each commit appends one checksummed line here
  instead, and the snapshot is rewritten (and the log emptied) every ``compact_every``
  entries or ``compact_bytes`` bytes; ``close()`` folds the log into the snapshot. A
  leftover log is always replayed on open, in either mode.
- ``<path>.lock``: held (``flock``, with our pid inside) while the journal is open.

Commits made concurrently in one process share one write and one ``fsync`` (group
commit); each still succeeds or fails on its own. A commit returns only once its write
reached the file (and the disk, with ``fsync``); a write that failed (EIO, ENOSPC, a short
write) fails its commits with ``JournalWriteError``, is rolled back from the file and is
not applied in memory. A journal that cannot be read back is refused on open with
``JournalCorruptError`` and left exactly as it was.

One failure window stays: when an ``fsync`` fails the kernel may already have written or
dropped the data, so the commit fails *and* the instance refuses every later write until it
is reopened (the PostgreSQL answer to "fsyncgate"); after a power loss such a commit may
or may not be there.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from botmesh.state.backends.file_format import (
    decode_snapshot,
    encode_entry,
    encode_log_line,
    encode_snapshot,
    read_log,
)
from botmesh.state.backends.file_lock import JournalLock
from botmesh.state.backends.file_ops import FileOps
from botmesh.state.errors import (
    ConfigError,
    JournalUnavailableError,
    JournalWriteError,
    VersionConflictError,
)
from botmesh.state.kv import Entry, IndexName, Op, apply_ops, copy_entry, range_of

__all__ = [
    "FILE_URL_OPTIONS",
    "FileKv",
    "FileOptions",
    "file_url_option",
    "from_url",
    "open_file_kv",
    "open_url",
]

log = logging.getLogger("botmesh.state.file")

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FileOptions:
    """How the file journal writes."""

    append_log: bool = False
    """Append each commit to ``<path>.log`` instead of rewriting the snapshot. Default
    ``False`` (snapshot mode: every commit rewrites the whole file)."""

    fsync: bool | None = None
    """Flush each write to the disk before the commit returns (the log line, or the new
    snapshot before it replaces the old one). Default (``None``): on with ``append_log``,
    off in snapshot mode (the rename is atomic but may sit in the OS cache at a power
    loss). Compactions and folds into the snapshot always fsync before the log is cut."""

    compact_every: int = 1000
    """Append-log mode: rewrite the snapshot and empty the log after this many log
    entries. Default 1000."""

    compact_bytes: int = 4 * MiB
    """Append-log mode: … or once the log reaches this many bytes. Default 4 MiB."""

    def __post_init__(self) -> None:
        for name in ("compact_every", "compact_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"file.{name}", f"must be a whole number >= 1, got {value!r}")
        for name in ("append_log", "fsync"):
            value = getattr(self, name)
            if not (isinstance(value, bool) or (name == "fsync" and value is None)):
                raise ConfigError(f"file.{name}", f"must be True or False, got {value!r}")

    @property
    def fsync_writes(self) -> bool:
        return self.append_log if self.fsync is None else self.fsync


@dataclass(slots=True)
class _Pending:
    ops: list[Op]
    label: str
    #: The versions of a commit (or the result of ``read``).
    future: asyncio.Future[Any]
    #: A read served in the batch instead of a commit (the shared journal reads under
    #: its mutex, in the same batch as the commits made at the same time).
    read: Callable[[], object] | None = None


@dataclass(slots=True)
class _Accepted:
    pending: _Pending
    versions: list[int]
    puts: list[tuple[str, Entry, str]]
    deletes: list[str]


class _RenamedUnsynced(Exception):
    """The new snapshot replaced the old one but the directory fsync failed."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause)
        self.cause = cause


_MISSING = Entry("", {}, 0)


class FileKv:
    """The file journal's ``DurableKv`` (see the module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        options: FileOptions | None = None,
        *,
        file_ops: FileOps | None = None,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.log_path = self.path + ".log"
        self._tmp_path = self.path + ".tmp"
        self._dir = os.path.dirname(self.path)
        self.options = options or FileOptions()
        self._ops = file_ops or FileOps()
        self._fsync = self.options.fsync_writes
        self._entries: dict[str, Entry] = {}
        self._frags: dict[str, str] = {}
        self._seq = 0
        self._log_fd: int | None = None
        self._log_size = 0
        self._log_entries = 0
        self._pending: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self._lock: JournalLock | None = None
        self._opened = False
        self._closing = False
        self._broken: str | None = None

    # -- lifecycle ------------------------------------------------------------------

    async def open(self) -> None:
        if self._opened:
            return
        await asyncio.to_thread(self._open_sync)
        self._opened = True
        self._closing = False
        self._broken = None

    def _open_sync(self) -> None:
        if not os.path.isdir(self._dir):
            raise JournalUnavailableError(
                f"the folder of the journal {self.path} does not exist; create it first"
            )
        lock = JournalLock(self.path)
        try:
            lock.acquire()
        except OSError as exc:
            raise self._open_error(exc) from exc
        try:
            self._load()
        except BaseException as exc:
            self._close_log_fd()
            lock.release()
            if isinstance(exc, OSError):
                raise self._open_error(exc) from exc
            raise
        self._lock = lock

    def _open_error(self, exc: OSError) -> JournalUnavailableError:
        return JournalUnavailableError(
            f"opening the file journal {self.path} failed: {exc}. Operator action: check "
            "the path, its permissions and the disk"
        )

    def _load(self) -> None:
        seq, entries = 0, dict[str, Entry]()
        data = _read(self.path)
        if data is not None:
            seq, entries = decode_snapshot(data, self.path)
        log_data = _read(self.log_path)
        replay = read_log(log_data, self.log_path, seq) if log_data is not None else None
        # Nothing above wrote a byte; from here on the journal is known good.
        with contextlib.suppress(FileNotFoundError):
            self._ops.unlink(self._tmp_path)
        if replay is not None:
            for commit in replay.commits:
                for key in commit.deletes:
                    entries.pop(key, None)
                for entry in commit.puts:
                    entries[entry.key] = entry
                seq = commit.seq
        self._entries = entries
        self._frags = {k: encode_entry(e) for k, e in entries.items()}
        self._seq = seq
        if replay is not None and replay.torn_bytes:
            log.warning(
                "file journal %s: cut a torn last line (line %s, %d bytes at offset %d), "
                "left by a crash during a write; %d commits replayed",
                self.log_path,
                replay.torn_line,
                replay.torn_bytes,
                replay.good_size,
                len(replay.commits),
            )
        if self.options.append_log:
            good = replay.good_size if replay is not None else 0
            fd = self._ops.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            self._log_fd = fd
            try:
                if replay is not None and replay.torn_bytes:
                    self._ops.ftruncate(fd, good)
                    self._ops.fsync(fd)
                elif replay is None and self._fsync:
                    self._ops.fsync_dir(self._dir)
            except OSError as exc:
                raise self._write_error("cutting the torn last line of the log", exc) from exc
            self._log_size = good
            self._log_entries = _count_lines(log_data, good) if log_data is not None else 0
            if self._needs_compaction():
                self._compact_sync(encode_snapshot(self._seq, list(self._frags.values())))
        elif log_data is not None:
            try:
                self._fold_sync(write_snapshot=bool(replay and replay.commits))
            except OSError as exc:
                raise self._write_error("folding the leftover log into the snapshot", exc) from exc

    async def close(self) -> None:
        if not self._opened or self._closing:
            return
        self._closing = True
        while self._writer is not None:
            await asyncio.shield(self._writer)
        try:
            if self._log_fd is not None:
                snapshot = encode_snapshot(self._seq, list(self._frags.values()))
                await asyncio.to_thread(self._close_sync, snapshot)
        finally:
            self._close_log_fd()
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            self._opened = False

    def _close_sync(self, snapshot: bytes) -> None:
        if self._broken is not None:
            return  # leave the files as they are; the next open replays them
        try:
            self._fold_sync(write_snapshot=self._log_size > 0, snapshot=snapshot)
        except OSError as exc:
            raise self._write_error("folding the log into the snapshot on close", exc) from exc

    def _fold_sync(self, *, write_snapshot: bool, snapshot: bytes | None = None) -> None:
        """Write the snapshot (always fsynced), then remove the log."""
        if write_snapshot:
            data = snapshot or encode_snapshot(self._seq, list(self._frags.values()))
            try:
                self._write_snapshot_sync(data, fsync=True)
            except _RenamedUnsynced as exc:
                raise exc.cause from None
        self._close_log_fd()
        try:
            self._ops.unlink(self.log_path)
        except FileNotFoundError:
            return
        self._ops.fsync_dir(self._dir)

    def _close_log_fd(self) -> None:
        fd, self._log_fd = self._log_fd, None
        if fd is not None:
            try:
                self._ops.close(fd)
            except OSError:
                log.warning("file journal %s: closing the log failed", self.log_path)

    # -- reads ----------------------------------------------------------------------

    def _check(self) -> None:
        if not self._opened or self._closing:
            raise JournalUnavailableError(
                f"the file journal {self.path} is closed; open() it again"
            )

    async def get(self, key: str) -> Entry | None:
        self._check()
        e = self._entries.get(key)
        return copy_entry(e) if e is not None else None

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        self._check()
        return {k: copy_entry(e) for k in keys if (e := self._entries.get(k)) is not None}

    async def range(
        self, index: IndexName, prefix: str, until: float, limit: int = 100
    ) -> list[str]:
        self._check()
        return range_of(self._entries, index, prefix, until, limit)

    async def scan(self, prefix: str) -> list[Entry]:
        self._check()
        return [copy_entry(self._entries[k]) for k in sorted(self._entries) if k.startswith(prefix)]

    # -- writes ---------------------------------------------------------------------

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        self._check()
        if self._broken is not None:
            raise JournalWriteError(self._broken)
        pending = _Pending(list(ops), label, asyncio.get_running_loop().create_future())
        if not pending.ops:
            return []
        self._enqueue(pending)
        versions: list[int] = await pending.future
        return versions

    def _enqueue(self, pending: _Pending) -> None:
        self._pending.append(pending)
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop())

    async def _write_loop(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                live = [p for p in batch if not p.future.done()]
                try:
                    await self._write_batch(live)
                except Exception as exc:  # a bug must not leave commits waiting forever
                    log.exception("file journal %s: a batch of writes failed", self.path)
                    for p in live:
                        _settle(p, exc)
        finally:
            self._writer = None

    def _stage(self, batch: list[_Pending]) -> list[_Accepted]:
        """Check each commit of the batch in order against the state the earlier ones
        leave; a commit that conflicts (or cannot be encoded) fails alone."""
        touched = {op.key for p in batch for op in p.ops}
        scratch = {k: self._entries[k] for k in touched if k in self._entries}
        accepted: list[_Accepted] = []
        for p in batch:
            keys = list(dict.fromkeys(op.key for op in p.ops))
            saved = {k: scratch.get(k, _MISSING) for k in keys}
            try:
                versions = apply_ops(scratch, p.ops)
                puts: list[tuple[str, Entry, str]] = []
                deletes: list[str] = []
                for k in keys:
                    e = scratch.get(k)
                    if e is None:
                        deletes.append(k)
                    else:
                        puts.append((k, e, encode_entry(e)))
            except (VersionConflictError, TypeError) as exc:
                for k, e in saved.items():
                    if e is _MISSING:
                        scratch.pop(k, None)
                    else:
                        scratch[k] = e
                _settle(p, exc)
                continue
            accepted.append(_Accepted(p, versions, puts, deletes))
        return accepted

    async def _write_batch(self, batch: list[_Pending]) -> None:
        accepted = self._stage(batch)
        if not accepted:
            return
        first = self._seq + 1
        try:
            if self.options.append_log:
                lines = b"".join(
                    encode_log_line(
                        first + i, a.pending.label, [f for _, _, f in a.puts], a.deletes
                    )
                    for i, a in enumerate(accepted)
                )
                await asyncio.to_thread(self._append_sync, lines)
                self._log_size += len(lines)
                self._log_entries += len(accepted)
            else:
                changed = {k for a in accepted for k in (*(k for k, _, _ in a.puts), *a.deletes)}
                frags = [f for k, f in self._frags.items() if k not in changed]
                final: dict[str, str] = {}
                for a in accepted:
                    for k in a.deletes:
                        final.pop(k, None)
                    for k, _, f in a.puts:
                        final[k] = f
                frags.extend(final.values())
                data = encode_snapshot(first + len(accepted) - 1, frags)
                await asyncio.to_thread(self._write_snapshot_sync, data, fsync=self._fsync)
        except (OSError, _RenamedUnsynced) as exc:
            cause = exc.cause if isinstance(exc, _RenamedUnsynced) else exc
            error = self._write_error(f"committing {len(accepted)} write(s)", cause)
            for a in accepted:
                _settle(a.pending, error)
            return
        for a in accepted:
            for k in a.deletes:
                self._entries.pop(k, None)
                self._frags.pop(k, None)
            for k, e, f in a.puts:
                self._entries[k] = e
                self._frags[k] = f
        self._seq = first + len(accepted) - 1
        for a in accepted:
            _settle(a.pending, a.versions)
        if self.options.append_log and self._needs_compaction():
            snapshot = encode_snapshot(self._seq, list(self._frags.values()))
            await asyncio.to_thread(self._compact_sync, snapshot)

    def _append_sync(self, lines: bytes) -> None:
        fd = self._log_fd
        assert fd is not None
        try:
            self._ops.write_all(fd, lines)
        except OSError:
            self._rollback_log(fd)
            raise
        if self._fsync:
            try:
                self._ops.fsync(fd)
            except OSError:
                self._rollback_log(fd)
                self._broken = (
                    f"an fsync of the journal log {self.log_path} failed, so what reached "
                    "the disk is unknown; this instance takes no more writes. Operator "
                    "action: check the disk, then reopen the journal"
                )
                raise

    def _rollback_log(self, fd: int) -> None:
        try:
            self._ops.ftruncate(fd, self._log_size)
        except OSError:
            self._broken = (
                f"a failed write to the journal log {self.log_path} could not be cut off "
                "again; this instance takes no more writes. Operator action: check the "
                "disk, then reopen the journal (the torn line is cut on open)"
            )

    def _write_snapshot_sync(self, data: bytes, *, fsync: bool) -> None:
        """Replace the snapshot atomically; nothing changes unless it returns or raises
        ``_RenamedUnsynced`` (the new file is in place, its directory entry not synced)."""
        tmp = self._tmp_path
        fd = self._ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            try:
                self._ops.write_all(fd, data)
                if fsync:
                    self._ops.fsync(fd)
            finally:
                self._ops.close(fd)
            self._ops.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                self._ops.unlink(tmp)
            raise
        if fsync:
            try:
                self._ops.fsync_dir(self._dir)
            except OSError as exc:
                self._broken = (
                    f"the new snapshot {self.path} is in place but the fsync of its folder "
                    "failed, so it may not survive a power loss; this instance takes no more "
                    "writes. Operator action: check the disk, then reopen the journal"
                )
                raise _RenamedUnsynced(exc) from exc

    def _needs_compaction(self) -> bool:
        return (
            self._log_entries >= self.options.compact_every
            or self._log_size >= self.options.compact_bytes
        )

    def _compact_sync(self, snapshot: bytes) -> None:
        """Fold the log into a new snapshot (fsynced), then empty the log. A failure here
        loses nothing (every commit is in the log) and is retried at the next commit."""
        fd = self._log_fd
        assert fd is not None
        before = self._broken
        try:
            self._write_snapshot_sync(snapshot, fsync=True)
        except (OSError, _RenamedUnsynced) as exc:
            self._broken = before  # not ambiguous here: the log still holds every commit
            log.warning("file journal %s: compaction failed (%s); will retry", self.path, exc)
            return
        try:
            self._ops.ftruncate(fd, 0)
            if self._fsync:
                self._ops.fsync(fd)
        except OSError as exc:
            # The snapshot holds every commit; a log that was not emptied replays harmlessly.
            log.warning("file journal %s: emptying the log failed (%s)", self.log_path, exc)
            return
        self._log_size = 0
        self._log_entries = 0

    def _write_error(self, what: str, exc: OSError) -> JournalWriteError:
        """The error a failed write raises; ``__cause__`` is the ``OSError`` (its errno)."""
        reason = exc.strerror or str(exc)
        code = errno.errorcode.get(exc.errno, "") if exc.errno is not None else "short write"
        error = JournalWriteError(
            f"{what} to the file journal {self.path} failed: {reason} ({code}); "
            "nothing of it was applied and the journal is still readable. Operator action: "
            "check the disk (free space, I/O errors)"
            + (f". {self._broken}" if self._broken else "")
        )
        error.__cause__ = exc
        return error


def _settle(pending: _Pending, outcome: list[int] | BaseException) -> None:
    if pending.future.done():
        return
    if isinstance(outcome, BaseException):
        pending.future.set_exception(outcome)
    else:
        pending.future.set_result(outcome)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _count_lines(data: bytes, size: int) -> int:
    return data.count(b"\n", 0, size)


async def open_file_kv(
    path: str | os.PathLike[str],
    *,
    append_log: bool = False,
    fsync: bool | None = None,
    compact_every: int = 1000,
    compact_bytes: int = 4 * MiB,
    file_ops: FileOps | None = None,
) -> FileKv:
    """A ``FileKv`` on ``path``, opened (locked, read back, leftover log replayed)."""
    kv = FileKv(
        path,
        FileOptions(append_log, fsync, compact_every, compact_bytes),
        file_ops=file_ops,
    )
    await kv.open()
    return kv


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def from_url(url: str, *, file_ops: FileOps | None = None) -> FileKv:
    """A ``FileKv`` (not opened yet) for ``file:///absolute/path`` with optional query
    options: ``?append_log=true&fsync=false&compact_every=1000&compact_bytes=4194304``."""
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
        raise ConfigError(
            "journal",
            f"{url!r} is not a file journal URL; write file:///absolute/path/to/journal",
        )
    kwargs: dict[str, bool | int | None] = {}
    for name, raw in parse_qsl(parts.query, keep_blank_values=True):
        if not file_url_option(name, raw, kwargs):
            raise ConfigError(
                f"journal ({name})",
                "unknown option; the file journal takes append_log, fsync, compact_every "
                "and compact_bytes",
            )
    options = FileOptions(**kwargs)  # type: ignore[arg-type]  # each value checked above
    return FileKv(unquote(parts.path), options, file_ops=file_ops)


#: The URL options of ``FileOptions`` (the shared-file journal takes them too).
FILE_URL_OPTIONS = ("append_log", "fsync", "compact_every", "compact_bytes")


def file_url_option(name: str, raw: str, into: dict[str, bool | int | None]) -> bool:
    """Read the URL option ``name=raw`` of ``FileOptions`` into ``into``; False when
    ``name`` is not one of them. A bad value raises ``ConfigError`` naming the option."""
    field = f"journal ({name})"
    if name in ("append_log", "fsync"):
        if raw.lower() not in _TRUE | _FALSE:
            raise ConfigError(field, f"must be true or false (or 1 or 0), got {raw!r}")
        into[name] = raw.lower() in _TRUE
    elif name in ("compact_every", "compact_bytes"):
        if not raw.isdigit():
            raise ConfigError(field, f"must be a whole number, got {raw!r}")
        into[name] = int(raw)
    else:
        return False
    return True


async def open_url(url: str) -> FileKv:
    """The opener ``botmesh.state.backends`` calls for ``file://`` URLs (see ``from_url``)."""
    kv = from_url(url)
    await kv.open()
    return kv
