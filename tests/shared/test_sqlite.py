"""The SQLite journal's own promises: its table, WAL mode, and a busy database waited for."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from botmesh.state.backends import check_url, open_backend
from botmesh.state.backends.sqlite import SQLiteKv, open_sqlite_kv
from botmesh.state.errors import ConfigError, JournalUnavailableError
from botmesh.state.kv import Put


async def test_the_durable_table_and_its_indexes_in_wal_mode(tmp_path: Path) -> None:
    kv = await open_backend(f"sqlite://{tmp_path}/bot.db")
    assert isinstance(kv, SQLiteKv) and kv.shared
    await kv.commit([Put("s/a", {"x": 1}, expect=0, due=1.0)])
    await kv.close()
    db = sqlite3.connect(tmp_path / "bot.db")
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
        assert {"durable", "durable_due", "durable_purge"} <= names
        assert db.execute("SELECT key, version, due FROM durable").fetchall() == [("s/a", 1, 1.0)]
    finally:
        db.close()


def _hold_write_lock(path: Path, locked: threading.Event, release: threading.Event) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    locked.set()
    release.wait(30)
    db.execute("COMMIT")
    db.close()


async def test_a_busy_database_is_waited_for_not_failed(tmp_path: Path) -> None:
    path = tmp_path / "bot.db"
    kv = await open_sqlite_kv(path)
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, locked, release))
    holder.start()
    try:
        assert locked.wait(30)
        commit = kv.commit([Put("s/a", {}, expect=0)])
        # the commit is blocked behind the other writer until it lets go
        threading.Timer(0.3, release.set).start()
        assert await commit == [1]
    finally:
        release.set()
        holder.join()
        await kv.close()


async def test_a_database_busy_beyond_busy_timeout_fails_the_commit(tmp_path: Path) -> None:
    path = tmp_path / "bot.db"
    kv = await open_sqlite_kv(path, busy_timeout=0.2)
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, locked, release))
    holder.start()
    try:
        assert locked.wait(30)
        with pytest.raises(JournalUnavailableError, match="busy_timeout") as info:
            await kv.commit([Put("s/a", {}, expect=0)])
        assert str(path) in str(info.value)
    finally:
        release.set()
        holder.join()
    assert await kv.commit([Put("s/a", {}, expect=0)]) == [1]  # nothing half-applied
    await kv.close()


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("sqlite://relative/bot.db", "sqlite:///absolute/path"),
        ("sqlite:///tmp/x.db?synchronous=sometimes", "'full' or 'normal'"),
        ("sqlite:///tmp/x.db?busy_timeout=soon", "must be seconds"),
        ("sqlite:///tmp/x.db?fsync=1", "takes synchronous and busy_timeout"),
    ],
)
def test_bad_sqlite_urls_are_refused_naming_the_fix(url: str, words: str) -> None:
    with pytest.raises(ConfigError, match="journal") as info:
        check_url(url)
    assert words in str(info.value)


def test_good_sqlite_urls_pass() -> None:
    check_url("sqlite:///var/lib/bot/bot.db?synchronous=normal&busy_timeout=5")


async def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(JournalUnavailableError, match="does not exist"):
        await open_sqlite_kv(tmp_path / "nope" / "bot.db")
