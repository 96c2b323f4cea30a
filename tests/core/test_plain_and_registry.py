"""The plain path without durability, ``durability={}``, and backends by URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from botmesh import Bot, ConfigError, Inbound, KvDurability, MemoryDurability, MockProvider
from state.backends import open_backend, register_backend, schemes
from state.kv import MemoryKv
from tests.core.helpers import durable


async def test_without_durability_nothing_is_journaled() -> None:
    provider = MockProvider()
    bot = Bot(provider)
    sent: list[object] = []
    bot.on("sent", sent.append)

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        await ctx.reply("a")
        await ctx.reply("a")

    await bot.start()
    await bot.handle(Inbound("m", "c"))
    await bot.handle(Inbound("m", "c"))  # no journal, no dedupe: it runs again
    assert bot.durability is None
    assert [m.text for m in provider.sent] == ["a"] * 4 and len(sent) == 4
    assert await bot.enqueue("c", "now", idempotency_key="k") == "k"
    assert provider.sent[-1].text == "now"
    await bot.stop()


async def test_empty_mapping_is_memory_durability() -> None:
    bot = Bot(MockProvider(), durability={})
    d = durable(bot.durability)
    assert isinstance(d.backend, MemoryDurability)
    await bot.start()
    await bot.handle(Inbound("m", "c"))
    assert [r.state for r in await d.inbox.list()] == ["done"]
    await bot.stop()


async def test_backends_by_url(tmp_path: Path) -> None:
    assert {"memory", "file"} <= set(schemes())
    kv = await open_backend("memory://")
    assert isinstance(kv, MemoryKv)
    fkv = await open_backend(f"file://{tmp_path}/j?append_log=1")
    await fkv.close()
    bot = Bot(MockProvider(), durability={"backend": f"file://{tmp_path}/bot", "poll": 0})
    await bot.start()
    await bot.handle(Inbound("m", "c"))
    await bot.stop()
    again = Bot(MockProvider(), durability={"backend": f"file://{tmp_path}/bot", "poll": 0})
    await again.start()
    assert [r.id for r in await durable(again.durability).inbox.list()] == ["m"]
    await again.stop()


async def test_bad_urls_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown journal scheme 'nosuch://'"):
        await open_backend("nosuch://x")
    with pytest.raises(ConfigError, match="not a URL"):
        await open_backend("/just/a/path")
    register_backend(
        "fancy", "botmesh_fancy_backend_missing:open", install="pip install 'botmesh[fancy]'"
    )
    with pytest.raises(ConfigError, match=r"pip install 'botmesh\[fancy\]'"):
        await open_backend("fancy://host")
    with pytest.raises(ConfigError) as info:
        await open_backend(f"file://{tmp_path}/j?appendlog=1")
    assert "backend" in info.value.field and "appendlog" in info.value.field


async def test_any_durable_kv_or_kv_durability_is_a_backend() -> None:
    kv = MemoryKv()
    bot = Bot(MockProvider(), durability={"backend": kv})
    assert durable(bot.durability).backend.kv is kv
    kd = KvDurability(kv)
    assert durable(Bot(MockProvider(), durability={"backend": kd}).durability).backend is kd
