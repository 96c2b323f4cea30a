"""The PostgreSQL journal: a ``DurableKv`` in one table, ``{table_prefix}durable``.

``open_postgres_kv("postgresql://user:password@host/db")`` (URL ``postgresql://…``, with
``?table_prefix=bot_`` among the query options) creates the table and its two partial
indexes, ``…_due`` and ``…_purge``, idempotently at start (under an advisory lock, so
replicas starting together do not race). Every compare-and-set is one statement (an
``UPDATE … WHERE version = $n``, an ``INSERT … ON CONFLICT DO NOTHING``); a commit of
several operations runs them in one transaction, and a conflict rolls it back whole. So
any number of processes on any number of hosts share the journal safely.

The driver is asyncpg: binary protocol, prepared statements cached per connection, no
libpq; measured faster than psycopg 3 for this access pattern (many small statements),
and kept up by its maintainers with every PostgreSQL and Python release.

Connections: with a URL (``dsn``) the journal creates its own pool and closes it on
``close()``; a connection the server drops while idle (a restart, a failover,
``idle_session_timeout``) is reported with ``logger.error`` and replaced on the next query,
and a read that meets a dropped connection is retried once on a new one. A pool you pass
(``pool=``) is yours: it is never closed here. A commit whose connection breaks in the
middle of the statement fails with ``JournalUnavailableError`` (its outcome is unknown to
us; the engine treats it as a journal write that failed).

Passwords never appear in logs, errors or ``repr``: ``redact(url)`` replaces them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import SplitResult, urlunsplit

import asyncpg

from botmesh.state.backends.codec import decode_value, encode_value, prefix_bounds
from botmesh.state.backends.server import ServerKv, ServerUrl
from botmesh.state.errors import ConfigError, JournalUnavailableError, VersionConflictError
from botmesh.state.kv import Delete, Entry, IndexName, Op, Put

__all__ = [
    "PostgresKv",
    "PostgresOptions",
    "check_url",
    "from_url",
    "open_postgres_kv",
    "open_url",
]

log = logging.getLogger("botmesh.state.postgres")

T = TypeVar("T")
Conn = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NOT_SENT = (asyncpg.exceptions.InterfaceError,)
_LOST = (
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
    ConnectionError,
    OSError,
)


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    """Where and how the PostgreSQL journal keeps its table."""

    table_prefix: str = "botmesh_"
    """Prefix of the table name (``{table_prefix}durable``): letters, digits and ``_``.
    Default ``botmesh_``."""

    min_connections: int = 1
    """Connections the journal's own pool keeps open. Default 1."""

    max_connections: int = 10
    """Most connections the journal's own pool opens (concurrent commits). Default 10."""

    connect_timeout: float = 10.0
    """Seconds to wait for a new connection. Default 10."""

    def __post_init__(self) -> None:
        if not isinstance(self.table_prefix, str) or not _IDENT.match(self.table_prefix + "x"):
            raise ConfigError(
                "postgres.table_prefix",
                f"must be letters, digits and '_' (not starting with a digit), got "
                f"{self.table_prefix!r}",
            )
        if len(self.table) > 57:
            raise ConfigError("postgres.table_prefix", "too long (PostgreSQL names: 63 bytes)")
        for name in ("min_connections", "max_connections"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"postgres.{name}", f"must be a whole number >= 1, got {value!r}")
        if self.min_connections > self.max_connections:
            raise ConfigError("postgres.min_connections", "must not exceed max_connections")
        t = self.connect_timeout
        if isinstance(t, bool) or not isinstance(t, int | float) or not t > 0:
            raise ConfigError("postgres.connect_timeout", f"must be seconds > 0, got {t!r}")

    @property
    def table(self) -> str:
        return f"{self.table_prefix}durable"


class PostgresKv(ServerKv):
    """The PostgreSQL journal's ``DurableKv`` (see the module docstring)."""

    server, url_name, connection, up = "PostgreSQL", "dsn", "pool", "the server"

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        options: PostgresOptions | None = None,
    ) -> None:
        super().__init__(dsn, pool)
        self._pool: asyncpg.Pool | None = pool
        self.options = options or PostgresOptions()
        t = f'"{self.options.table}"'
        self._sql = _Statements(t, self.options.table)
        self._opened = False
        self._closing = False

    def __repr__(self) -> str:
        return f"PostgresKv({self._at()}, table={self.options.table!r})"

    # -- lifecycle ------------------------------------------------------------------

    async def open(self) -> None:
        if self._opened and not self._closing:
            return
        self._closing = False
        if self._own:
            assert self._url is not None
            try:
                self._pool = await asyncpg.create_pool(
                    self._url,
                    min_size=self.options.min_connections,
                    max_size=self.options.max_connections,
                    timeout=self.options.connect_timeout,
                    max_inactive_connection_lifetime=0,  # only the server drops them
                    init=self._watch,
                )
            except (*_LOST, asyncpg.PostgresError, TimeoutError) as exc:
                raise self._error("connecting to", exc) from None
        await self._call(self._create_schema, read=True)
        self._opened = True

    async def _watch(self, conn: Conn) -> None:
        conn.add_termination_listener(self._terminated)

    def _terminated(self, conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy) -> None:
        if not self._closing:
            log.error(
                "PostgreSQL journal %s: the server closed a connection (restart, failover or "
                "idle timeout); it is replaced on the next query",
                self.where,
            )

    async def _create_schema(self, conn: Conn) -> None:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self.options.table)
            for statement in self._sql.schema:
                await conn.execute(statement)

    async def close(self) -> None:
        if not self._opened or self._closing:
            return
        self._closing = True
        self._opened = False
        if self._own and self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    # -- plumbing -------------------------------------------------------------------

    def _check(self) -> asyncpg.Pool:
        if not self._opened or self._closing or self._pool is None:
            raise JournalUnavailableError(f"the journal {self.where} is closed; open() it again")
        return self._pool

    async def _call(self, fn: Callable[[Conn], Awaitable[T]], *, read: bool) -> T:
        """Run ``fn`` on a pooled connection. A connection found dropped is replaced and the
        call retried once: always for a read, for a write only when nothing was sent."""
        pool = self._pool
        if pool is None:
            raise JournalUnavailableError(f"the journal {self.where} is closed; open() it again")
        for attempt in (1, 2):
            try:
                async with pool.acquire(timeout=self.options.connect_timeout) as conn:
                    return await fn(conn)
            except VersionConflictError:
                raise
            except _LOST as exc:
                retry = attempt == 1 and (read or isinstance(exc, _NOT_SENT))
                if not retry:
                    raise self._error("using", exc) from None
                log.error(
                    "PostgreSQL journal %s: a connection was dropped (%s); retrying on a new one",
                    self.where,
                    type(exc).__name__,
                )
            except (asyncpg.PostgresError, TimeoutError) as exc:
                raise self._error("using", exc) from None
        raise AssertionError("unreachable")

    # -- reads ----------------------------------------------------------------------

    async def _get_many(self, keys: list[str]) -> dict[str, Entry]:
        async def run(conn: Conn) -> list[Any]:
            return await conn.fetch(self._sql.get_many, keys)

        rows = await self._call(run, read=True)
        return {r[0]: Entry(r[0], decode_value(r[1]), r[2], r[3], r[4]) for r in rows}

    async def _range(self, index: IndexName, prefix: str, until: float, limit: int) -> list[str]:
        low, high = prefix_bounds(prefix)
        sql = self._sql.range[(index, high is not None)]
        args: list[object] = [until, low, limit] + ([high] if high is not None else [])

        async def run(conn: Conn) -> list[Any]:
            return await conn.fetch(sql, *args)

        return [r[0] for r in await self._call(run, read=True)]

    async def _scan(self, prefix: str) -> list[Entry]:
        low, high = prefix_bounds(prefix)
        sql = self._sql.scan[high is not None]
        args: list[object] = [low, *([high] if high is not None else [])]

        async def run(conn: Conn) -> list[Any]:
            return await conn.fetch(sql, *args)

        rows = await self._call(run, read=True)
        return [Entry(r[0], decode_value(r[1]), r[2], r[3], r[4]) for r in rows]

    # -- writes ---------------------------------------------------------------------

    async def _commit(self, ops: Sequence[Op]) -> list[int]:
        staged = [(op, encode_value(op.value) if isinstance(op, Put) else None) for op in ops]

        async def run(conn: Conn) -> list[int]:
            if len(staged) == 1:
                return [await self._apply(conn, *staged[0])]
            async with conn.transaction():
                return [await self._apply(conn, op, text) for op, text in staged]

        return await self._call(run, read=False)

    async def _apply(self, conn: Conn, op: Op, text: str | None) -> int:
        sql = self._sql
        if isinstance(op, Put):
            assert text is not None
            if op.expect is None:
                version = await conn.fetchval(sql.upsert, op.key, text, op.due, op.purge)
            elif op.expect == 0:
                version = await conn.fetchval(sql.insert, op.key, text, op.due, op.purge)
            else:
                version = await conn.fetchval(sql.update, op.key, text, op.due, op.purge, op.expect)
            if version is None:
                await self._conflict(conn, op)
            return int(version)
        assert isinstance(op, Delete)
        if op.expect is None:
            await conn.execute(sql.delete_any, op.key)
            return 0
        if op.expect == 0:
            if await conn.fetchval(sql.version, op.key) is not None:
                await self._conflict(conn, op)
            return 0
        if await conn.fetchval(sql.delete, op.key, op.expect) is None:
            await self._conflict(conn, op)
        return 0

    async def _conflict(self, conn: Conn, op: Op) -> None:
        actual = await conn.fetchval(self._sql.version, op.key)
        raise VersionConflictError(op.key, op.expect, int(actual) if actual is not None else 0)


class _Statements:
    """The SQL of one table, built once."""

    def __init__(self, t: str, name: str) -> None:
        cols = "key, value, version, due, purge"
        self.schema = (
            f"CREATE TABLE IF NOT EXISTS {t} ("
            ' key text COLLATE "C" PRIMARY KEY,'
            " value text NOT NULL,"
            " version bigint NOT NULL,"
            " due double precision,"
            " purge double precision)",
            f'CREATE INDEX IF NOT EXISTS "{name}_due" ON {t} (due, key) WHERE due IS NOT NULL',
            f'CREATE INDEX IF NOT EXISTS "{name}_purge" ON {t} (purge, key) '
            "WHERE purge IS NOT NULL",
        )
        self.get_many = f"SELECT {cols} FROM {t} WHERE key = ANY($1::text[])"
        self.version = f"SELECT version FROM {t} WHERE key = $1"
        self.insert = (
            f"INSERT INTO {t} ({cols}) VALUES ($1, $2, 1, $3, $4) "
            "ON CONFLICT (key) DO NOTHING RETURNING version"
        )
        self.upsert = (
            f"INSERT INTO {t} AS d ({cols}) VALUES ($1, $2, 1, $3, $4) ON CONFLICT (key) DO "
            "UPDATE SET value = EXCLUDED.value, version = d.version + 1, due = EXCLUDED.due, "
            "purge = EXCLUDED.purge RETURNING version"
        )
        self.update = (
            f"UPDATE {t} SET value = $2, version = version + 1, due = $3, purge = $4 "
            "WHERE key = $1 AND version = $5 RETURNING version"
        )
        self.delete = f"DELETE FROM {t} WHERE key = $1 AND version = $2 RETURNING 0"
        self.delete_any = f"DELETE FROM {t} WHERE key = $1"
        self.range: dict[tuple[str, bool], str] = {}
        for index in ("due", "purge"):
            base = f"SELECT key FROM {t} WHERE {index} IS NOT NULL AND {index} <= $1 AND key >= $2"
            order = f" ORDER BY {index}, key LIMIT $3"
            self.range[(index, False)] = base + order
            self.range[(index, True)] = base + " AND key < $4" + order
        scan = f"SELECT {cols} FROM {t} WHERE key >= $1"
        self.scan = {False: scan + " ORDER BY key", True: scan + " AND key < $2 ORDER BY key"}


def _seconds(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"must be seconds, got {raw!r}") from None


def _whole(raw: str) -> int:
    if not raw.isdigit():
        raise ValueError(f"must be a whole number, got {raw!r}")
    return int(raw)


def _journal(parts: SplitResult, options: PostgresOptions) -> PostgresKv:
    return PostgresKv(urlunsplit(parts._replace(scheme="postgresql")), options=options)


_URL = ServerUrl(
    schemes=("postgresql", "postgres"),
    server="PostgreSQL",
    example="postgresql://user:password@host:5432/database?table_prefix=botmesh_",
    readers={
        "table_prefix": str,
        "min_connections": _whole,
        "max_connections": _whole,
        "connect_timeout": _seconds,
    },
    options=PostgresOptions,
    journal=_journal,
)
#: What ``botmesh.state.backends`` calls for a ``postgresql://`` URL: refuse a bad one
#: (``ConfigError``, password redacted), make its ``PostgresKv`` (not opened), open it.
check_url, from_url, open_url = _URL.check, _URL.kv, _URL.open


async def open_postgres_kv(
    dsn: str | None = None,
    *,
    pool: asyncpg.Pool | None = None,
    table_prefix: str = "botmesh_",
    max_connections: int = 10,
) -> PostgresKv:
    """A ``PostgresKv`` on a server (``dsn``) or on a pool you own, opened (table created)."""
    options = PostgresOptions(table_prefix, max_connections=max_connections)
    kv = PostgresKv(dsn, pool=pool, options=options)
    await kv.open()
    return kv
