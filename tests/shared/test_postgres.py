"""The PostgreSQL journal's own promises, on a real server: one table created idempotently
with real indexes, a dropped idle connection reported and replaced, a pool you pass left
open, and no password in any message."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import asyncpg
import pytest

from botmesh.state.backends import check_url, open_backend
from botmesh.state.backends.postgres import PostgresKv, open_postgres_kv
from botmesh.state.errors import ConfigError, JournalUnavailableError
from botmesh.state.kv import Put
from tests import servers

pytestmark = pytest.mark.postgres


async def _until(condition: Callable[[], bool]) -> None:
    """Wait (a hang guard of 30 s, not a timing) until the client saw the server's goodbye."""
    async with asyncio.timeout(30):
        while not condition():  # noqa: ASYNC110 - a log record has no event to await
            await asyncio.sleep(0.01)


@pytest.fixture
def url() -> str:
    return servers.postgres_url()


async def test_one_table_with_real_indexes_created_idempotently(url: str) -> None:
    kvs = await asyncio.gather(*(open_backend(f"{url}?table_prefix=idem_") for _ in range(4)))
    assert all(isinstance(kv, PostgresKv) and kv.shared for kv in kvs)
    await kvs[0].commit([Put("s/a", {"x": 1}, expect=0, due=2.0, purge=3.0)])
    for kv in kvs:
        await kv.close()
    conn = await asyncpg.connect(url)
    try:
        tables = await conn.fetch("SELECT tablename FROM pg_tables WHERE tablename LIKE 'idem_%'")
        assert [r[0] for r in tables] == ["idem_durable"]
        indexes = {
            r[0]: r[1]
            for r in await conn.fetch(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'idem_durable'"
            )
        }
        assert "(due, key) WHERE (due IS NOT NULL)" in indexes["idem_durable_due"]
        assert "(purge, key) WHERE (purge IS NOT NULL)" in indexes["idem_durable_purge"]
        plan = await conn.fetchval(
            "EXPLAIN SELECT key FROM idem_durable WHERE due IS NOT NULL AND due <= 5 "
            "ORDER BY due, key LIMIT 10"
        )
        assert plan is not None
        await conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                "EXPLAIN SELECT key FROM idem_durable WHERE due IS NOT NULL AND due <= 5 "
                "ORDER BY due, key LIMIT 10"
            )
        )
        assert "idem_durable_due" in plan  # the due index serves the sweeper's query
    finally:
        await conn.close()


async def test_an_idle_connection_dropped_by_the_server_is_reported_and_replaced(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # its own application name (asyncpg passes the URL's other parameters as server
    # settings): only its connections are dropped, not those of tests running beside it
    name = f"botmesh-drop-{uuid.uuid4().hex[:8]}"
    separator = "&" if "?" in url else "?"
    kv = await open_postgres_kv(
        f"{url}{separator}application_name={name}", table_prefix="drop_", max_connections=2
    )
    await kv.commit([Put("s/a", {"n": 1}, expect=0)])
    admin = await asyncpg.connect(url)
    try:
        with caplog.at_level(logging.ERROR, logger="botmesh.state.postgres"):
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND application_name = $1 AND state = 'idle'",
                name,
            )
            assert killed >= 1
            await _until(lambda: any("closed a connection" in r.message for r in caplog.records))
            # the next send's journal write goes through, on a new connection
            assert await kv.commit([Put("s/a", {"n": 2}, expect=1)]) == [2]
        entry = await kv.get("s/a")
        assert entry is not None and entry.value == {"n": 2}
        assert all(servers.PG_PASSWORD not in r.getMessage() for r in caplog.records)
    finally:
        await admin.close()
        await kv.close()


async def test_a_pool_you_pass_is_yours(url: str) -> None:
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        kv = await open_postgres_kv(pool=pool, table_prefix="mine_")
        await kv.commit([Put("s/a", {}, expect=0)])
        await kv.close()
        assert not pool._closed  # type: ignore[attr-defined]  # asyncpg has no public flag
        assert await pool.fetchval("SELECT count(*) FROM mine_durable") == 1
        assert "a pool you own" in repr(kv)
    finally:
        await pool.close()


async def test_an_unreachable_server_is_named_without_its_password() -> None:
    bad = f"postgresql://botmesh:{servers.PG_PASSWORD}@127.0.0.1:1/postgres?connect_timeout=2"
    with pytest.raises(JournalUnavailableError) as info:
        await open_backend(bad)
    text = str(info.value)
    assert "127.0.0.1:1" in text and "***" in text
    assert servers.PG_PASSWORD not in text
    assert servers.PG_PASSWORD not in repr(info.value.args)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("postgresql://u:hunter2@h/db?table_prefix=bad-name", "letters, digits"),
        ("postgresql://u:hunter2@h/db?max_connections=lots", "whole number"),
        ("postgresql:///nohost", "postgresql://user:password@host"),
    ],
)
def test_bad_postgres_urls_are_refused_without_the_password(url: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_url(url)
    assert words in str(info.value)
    assert "hunter2" not in str(info.value)
