"""The SQLite journal: a ``DurableKv`` in the ``durable`` table of one SQLite file.

``open_sqlite_kv(path)`` (URL ``sqlite:///absolute/path``) creates the table and its two
partial indexes (``due``, ``purge``) if they are missing, and puts the file in WAL mode.
Several processes on one host may open the same file at once: every commit is one
``BEGIN IMMEDIATE`` transaction whose compare-and-set checks read the committed rows, so
claims, fencing tokens and versions hold across processes. Not for a network filesystem
(SQLite's locks need a local one).

Commits made concurrently in one process share one transaction and one WAL sync (group
commit), each inside its own savepoint so that a commit that conflicts fails alone. A
database that another process holds busy is waited for and retried for up to
``busy_timeout`` (default 30 s) before the commit fails with ``JournalUnavailableError``.

``synchronous`` is ``full`` by default: a commit that returned survives a power loss.
``normal`` is faster and still survives ``kill -9`` of any process, but the last commits
may roll back at a power loss (SQLite's WAL rule).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from botmesh.state.backends.codec import decode_value, encode_value, prefix_bounds
from botmesh.state.backends.database import DatabaseKv
from botmesh.state.backends.server import options_of
from botmesh.state.errors import ConfigError, JournalUnavailableError, VersionConflictError
from botmesh.state.kv import Delete, Entry, IndexName, Op, Put

__all__ = [
    "SQLiteKv",
    "SQLiteOptions",
    "from_url",
    "open_sqlite_kv",
    "open_url",
]

log = logging.getLogger("botmesh.state.sqlite")

T = TypeVar("T")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS durable ("
    " key TEXT PRIMARY KEY NOT NULL,"
    " value TEXT NOT NULL,"
    " version INTEGER NOT NULL,"
    " due REAL,"
    " purge REAL"
    ") WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS durable_due ON durable (due, key) WHERE due IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS durable_purge ON durable (purge, key) WHERE purge IS NOT NULL",
)


@dataclass(frozen=True, slots=True)
class SQLiteOptions:
    """How the SQLite journal writes."""

    synchronous: Literal["full", "normal"] = "full"
    """``full`` (default): each commit syncs the WAL, so it survives a power loss.
    ``normal``: survives any process crash; the last commits may roll back at a power
    loss."""

    busy_timeout: float = 30.0
    """Seconds a commit waits for another process that holds the database before it fails
    with ``JournalUnavailableError``. Default 30."""

    def __post_init__(self) -> None:
        if self.synchronous not in ("full", "normal"):
            raise ConfigError(
                "sqlite.synchronous", f"must be 'full' or 'normal', got {self.synchronous!r}"
            )
        b = self.busy_timeout
        if isinstance(b, bool) or not isinstance(b, int | float) or not b > 0:
            raise ConfigError("sqlite.busy_timeout", f"must be seconds > 0, got {b!r}")


@dataclass(slots=True)
class _Pending:
    ops: list[Op]
    future: asyncio.Future[list[int]]


class SQLiteKv(DatabaseKv):
    """The SQLite journal's ``DurableKv`` (see the module docstring)."""

    #: Several processes may share it (the runtime adds a per-boot suffix to the default
    #: instance id).
    shared = True

    def __init__(self, path: str | os.PathLike[str], options: SQLiteOptions | None = None) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.options = options or SQLiteOptions()
        self._pool: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None
        self._pending: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self._closing = False

    # -- lifecycle ------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None and not self._closing:
            return
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="botmesh-sqlite")
        self._pool = pool
        self._closing = False
        try:
            await self._run(self._open_sync)
        except BaseException:
            self._pool = None
            pool.shutdown(wait=False)
            raise

    def _open_sync(self) -> None:
        folder = os.path.dirname(self.path)
        if not os.path.isdir(folder):
            raise JournalUnavailableError(
                f"the folder of the SQLite journal {self.path} does not exist; create it first"
            )
        try:
            db = sqlite3.connect(self.path, timeout=self.options.busy_timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._error("opening", exc) from exc
        try:
            self._retry_busy(lambda: self._init_schema(db))
        except BaseException:
            db.close()
            raise
        self._db = db

    def _init_schema(self, db: sqlite3.Connection) -> None:
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise JournalUnavailableError(
                f"the SQLite journal {self.path} could not switch to WAL mode (got {mode!r}); "
                "Operator action: put it on a local filesystem that supports it"
            )
        db.execute(f"PRAGMA synchronous={self.options.synchronous.upper()}")
        db.execute(f"PRAGMA busy_timeout={int(self.options.busy_timeout * 1000)}")
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                db.execute(statement)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        if self._pool is None or self._closing:
            return
        self._closing = True
        while self._writer is not None:
            await asyncio.shield(self._writer)
        pool = self._pool
        try:
            await self._run(self._close_sync)
        finally:
            self._pool = None
            pool.shutdown(wait=False)

    def _close_sync(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    # -- plumbing -------------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        if self._pool is None:
            raise self._closed()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
        except sqlite3.Error as exc:
            raise self._error("using", exc) from exc

    def _closed(self) -> JournalUnavailableError:
        return JournalUnavailableError(f"the SQLite journal {self.path} is closed; open() it again")

    def _check(self) -> None:
        if self._pool is None or self._closing:
            raise self._closed()

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise self._closed()
        return self._db

    def _error(self, what: str, exc: sqlite3.Error) -> JournalUnavailableError:
        error = JournalUnavailableError(
            f"{what} the SQLite journal {self.path} failed: {exc}. Operator action: check the "
            "file, its folder's permissions and free space"
        )
        error.__cause__ = exc
        return error

    def _retry_busy(self, fn: Callable[[], T]) -> T:
        """Run ``fn``, retrying while another process holds the database (beyond the busy
        handler's own wait), up to ``busy_timeout`` in all."""
        deadline = time.monotonic() + self.options.busy_timeout
        delay = 0.005
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                busy = exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if not busy:
                    raise
                if time.monotonic() >= deadline:
                    raise self._error("waiting (busy_timeout) for", exc) from exc
                log.debug("SQLite journal %s busy; retrying", self.path)
                time.sleep(delay)
                delay = min(delay * 2, 0.2)

    # -- reads ----------------------------------------------------------------------

    async def _get_many(self, keys: list[str]) -> dict[str, Entry]:
        return await self._run(lambda: self._retry_busy(lambda: self._get_many_sync(keys)))

    def _get_many_sync(self, keys: list[str]) -> dict[str, Entry]:
        db = self._conn()
        out: dict[str, Entry] = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            marks = ",".join("?" * len(chunk))
            rows = db.execute(
                f"SELECT key, value, version, due, purge FROM durable WHERE key IN ({marks})",
                chunk,
            ).fetchall()
            for k, v, ver, due, purge in rows:
                out[k] = Entry(k, decode_value(v), ver, due, purge)
        return out

    async def _range(self, index: IndexName, prefix: str, until: float, limit: int) -> list[str]:
        low, high = prefix_bounds(prefix)
        sql = f"SELECT key FROM durable WHERE {index} IS NOT NULL AND {index} <= ?"
        args: list[object] = [until]
        if prefix:
            sql += " AND key >= ?"
            args.append(low)
            if high is not None:
                sql += " AND key < ?"
                args.append(high)
        sql += f" ORDER BY {index}, key LIMIT ?"
        args.append(limit)

        def run() -> list[str]:
            return [r[0] for r in self._conn().execute(sql, args).fetchall()]

        return await self._run(lambda: self._retry_busy(run))

    async def _scan(self, prefix: str) -> list[Entry]:
        low, high = prefix_bounds(prefix)
        sql = "SELECT key, value, version, due, purge FROM durable WHERE key >= ?"
        args: list[object] = [low]
        if high is not None:
            sql += " AND key < ?"
            args.append(high)
        sql += " ORDER BY key"

        def run() -> list[Entry]:
            rows = self._conn().execute(sql, args).fetchall()
            return [Entry(k, decode_value(v), ver, d, p) for k, v, ver, d, p in rows]

        return await self._run(lambda: self._retry_busy(run))

    # -- writes ---------------------------------------------------------------------

    async def _commit(self, ops: Sequence[Op]) -> list[int]:
        for op in ops:
            if isinstance(op, Put):
                encode_value(op.value)  # refuse what cannot be encoded before queueing
        pending = _Pending(list(ops), asyncio.get_running_loop().create_future())
        self._pending.append(pending)
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop())
        return await pending.future

    async def _write_loop(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                live = [p for p in batch if not p.future.done()]
                if not live:
                    continue
                try:
                    outcomes = await self._run(functools.partial(self._write_batch_sync, live))
                except Exception as exc:
                    outcomes = [exc] * len(live)
                for p, outcome in zip(live, outcomes, strict=True):
                    if p.future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        p.future.set_exception(outcome)
                    else:
                        p.future.set_result(outcome)
        finally:
            self._writer = None

    def _write_batch_sync(self, batch: list[_Pending]) -> list[list[int] | BaseException]:
        db = self._conn()

        def attempt() -> list[list[int] | BaseException]:
            db.execute("BEGIN IMMEDIATE")
            try:
                outcomes: list[list[int] | BaseException] = []
                for i, p in enumerate(batch):
                    db.execute(f"SAVEPOINT c{i}")
                    try:
                        outcomes.append(_apply(db, p.ops))
                    except VersionConflictError as exc:
                        db.execute(f"ROLLBACK TO c{i}")
                        outcomes.append(exc)
                    db.execute(f"RELEASE c{i}")
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            return outcomes

        try:
            return self._retry_busy(attempt)
        except sqlite3.Error as exc:
            raise self._error(f"committing {len(batch)} write(s) to", exc) from exc


def _apply(db: sqlite3.Connection, ops: Sequence[Op]) -> list[int]:
    versions: list[int] = []
    for op in ops:
        row = db.execute("SELECT version FROM durable WHERE key = ?", (op.key,)).fetchone()
        have = row[0] if row is not None else 0
        if op.expect is not None and op.expect != have:
            raise VersionConflictError(op.key, op.expect, have)
        if isinstance(op, Delete):
            db.execute("DELETE FROM durable WHERE key = ?", (op.key,))
            versions.append(0)
            continue
        db.execute(
            "INSERT INTO durable (key, value, version, due, purge) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
            "version = excluded.version, due = excluded.due, purge = excluded.purge",
            (op.key, encode_value(op.value), have + 1, op.due, op.purge),
        )
        versions.append(have + 1)
    return versions


async def open_sqlite_kv(
    path: str | os.PathLike[str],
    *,
    synchronous: Literal["full", "normal"] = "full",
    busy_timeout: float = 30.0,
) -> SQLiteKv:
    """An ``SQLiteKv`` on ``path``, opened (table created, WAL mode on)."""
    kv = SQLiteKv(path, SQLiteOptions(synchronous, busy_timeout))
    await kv.open()
    return kv


def from_url(url: str) -> SQLiteKv:
    """An ``SQLiteKv`` (not opened yet) for ``sqlite:///absolute/path`` with optional query
    options ``?synchronous=normal&busy_timeout=10`` (seconds)."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc not in ("", "localhost") or not parts.path:
        raise ConfigError(
            "journal",
            f"{url!r} is not an SQLite journal URL; write sqlite:///absolute/path/to/bot.db",
        )
    synchronous: str = "full"
    busy_timeout = 30.0
    for name, raw in parse_qsl(parts.query, keep_blank_values=True):
        field = f"journal ({name})"
        if name == "synchronous":
            synchronous = raw.lower()
        elif name == "busy_timeout":
            try:
                busy_timeout = float(raw)
            except ValueError:
                raise ConfigError(field, f"must be seconds, got {raw!r}") from None
        else:
            raise ConfigError(
                field, "unknown option; the SQLite journal takes synchronous and busy_timeout"
            )
    given = {"synchronous": synchronous, "busy_timeout": busy_timeout}
    options = options_of(SQLiteOptions, url, given)
    return SQLiteKv(unquote(parts.path), options)


async def open_url(url: str) -> SQLiteKv:
    """The opener ``botmesh.state.backends`` calls for ``sqlite://`` URLs (see ``from_url``)."""
    kv = from_url(url)
    await kv.open()
    return kv
