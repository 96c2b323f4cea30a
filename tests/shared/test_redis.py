"""The Redis journal's own promises, on a real server: keys under the prefix with one hash
tag per scope, sorted-set indexes, a warning when persistence is off, a client you pass
left open, and no password in any message."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from botmesh.state.backends import check_url, open_backend
from botmesh.state.backends.redis import RedisKv, open_redis_kv
from botmesh.state.errors import ConfigError, JournalUnavailableError
from botmesh.state.kv import Put
from tests import servers

pytestmark = pytest.mark.redis


@pytest.fixture
def url() -> str:
    return servers.redis_url()


async def test_keys_carry_one_hash_tag_per_scope(url: str) -> None:
    kv = await open_backend(f"{url}?prefix=layout")
    assert isinstance(kv, RedisKv) and kv.shared
    await kv.commit([Put("bot:1/in/m1", {}, expect=0, due=5.0), Put("bot:1/out/k", {}, expect=0)])
    await kv.commit([Put("bot:2/out/k", {}, expect=0, purge=9.0)])
    await kv.close()
    client = aioredis.Redis.from_url(url)
    try:
        keys = sorted(
            k.decode() if isinstance(k, bytes) else k for k in await client.keys("layout:*")
        )
        assert keys == [
            "layout:{durable:bot:1}:due",
            "layout:{durable:bot:1}:e",
            "layout:{durable:bot:2}:e",
            "layout:{durable:bot:2}:purge",
        ]
        slots = {k: key_slot(k.encode()) for k in keys}
        assert slots["layout:{durable:bot:1}:due"] == slots["layout:{durable:bot:1}:e"]
        assert slots["layout:{durable:bot:2}:e"] == slots["layout:{durable:bot:2}:purge"]
        assert await client.type("layout:{durable:bot:1}:due") == b"zset"
        assert await client.zscore("layout:{durable:bot:1}:due", "bot:1/in/m1") == 5.0
    finally:
        await client.aclose()


async def test_a_server_without_the_append_only_file_is_warned_about(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.config_set("appendonly", "no")
        with caplog.at_level(logging.WARNING, logger="botmesh.state.redis"):
            kv = await open_redis_kv(client=client, prefix="warn")
        assert any("appendonly no" in r.getMessage() for r in caplog.records)
        caplog.clear()
        await client.config_set("appendonly", "yes")
        await client.config_set("appendfsync", "always")
        with caplog.at_level(logging.WARNING, logger="botmesh.state.redis"):
            quiet = await open_redis_kv(client=client, prefix="warn")
        assert caplog.records == []
        await kv.close()
        await quiet.close()
        assert await client.ping()  # a client you pass is yours: still open
    finally:
        await client.config_set("appendonly", "yes")
        await client.config_set("appendfsync", "everysec")
        await client.aclose()


async def test_an_unreachable_server_is_named_without_its_password() -> None:
    bad = f"redis://:{servers.REDIS_PASSWORD}@127.0.0.1:1/0"
    with pytest.raises(JournalUnavailableError) as info:
        await open_backend(bad)
    text = str(info.value)
    assert "127.0.0.1:1" in text and "***" in text
    assert servers.REDIS_PASSWORD not in text


async def test_a_wrong_password_is_refused_without_echoing_it(url: str) -> None:
    bad = url.replace(servers.REDIS_PASSWORD, "not-the-password-77")
    with pytest.raises(JournalUnavailableError) as info:
        await open_backend(bad)
    assert "not-the-password-77" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis://:hunter2@h:6379/0?prefix=a{b}", "without braces"),
        ("redis://:hunter2@h:6379/0?cluster=maybe", "true or false"),
        ("redis:///0", "redis://:password@host"),
    ],
)
def test_bad_redis_urls_are_refused_without_the_password(url: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_url(url)
    assert words in str(info.value)
    assert "hunter2" not in str(info.value)
