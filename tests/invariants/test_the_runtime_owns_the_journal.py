"""Invariant 8, the runtime owns the journal: a bot module defines handlers and policy, and
the runtime (``botmesh.run`` in one process, or the Kafka worker) supplies transport,
provider and journal."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import botmesh
from botmesh import Bot, Context, ErrorEvent, Inbound, Outcome, SentEvent
from botmesh.errors import ConfigError, RateLimitedError
from botmesh.journal import MemoryKv
from botmesh.testing import ManualClock, MockProvider


async def test_botmesh_run_journals_in_memory_by_default() -> None:
    bot = Bot("bot", durability={"poll": 0})

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("hello")

    provider = MockProvider()
    async with botmesh.run(bot, provider) as app:
        assert app.journal == "memory://"
        assert await app.handle(Inbound(id="m", chat_id="c")) == Outcome.HANDLED
        assert await app.handle(Inbound(id="m", chat_id="c")) == Outcome.DUPLICATE
        ops = app.durability
        assert ops is not None
        assert [(r.id, r.state) for r in await ops.inbox.list()] == [("m", "done")]
        assert [(r.key, r.state) for r in await ops.outbox.list()] == [("m:1", "sent")]
    assert [m.text for m in provider.sent] == ["hello"]


async def test_journal_none_is_the_explicit_opt_out() -> None:
    bot = Bot("bot")
    sent: list[SentEvent] = []
    bot.on(SentEvent, sent.append)

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("a")
        await ctx.reply("a")

    provider = MockProvider()
    async with botmesh.run(bot, provider, journal=None) as app:
        assert app.durability is None and app.metrics() == {}
        assert await app.handle(Inbound(id="m", chat_id="c")) == Outcome.HANDLED
        # no journal, no dedupe: it runs again, and every send goes straight out
        assert await app.handle(Inbound(id="m", chat_id="c")) == Outcome.HANDLED
        assert [m.text for m in provider.sent] == ["a"] * 4 and len(sent) == 4
        assert [e.receipt.key for e in sent] == ["m:1", "m:2", "m:1", "m:2"]
        assert await app.enqueue("c", "now", idempotency_key="k") == "k"
        assert provider.sent[-1].text == "now"  # at once: there is no sweeper
        receipt = await app.send("c", "direct", idempotency_key="k2")
        assert (receipt.key, receipt.state) == ("k2", "sent")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("fil:///x", "unknown journal scheme 'fil://'"),
        ("file://", "file:///absolute/path"),
        ("/just/a/path", "not a URL"),
        ("memory://x", "just 'memory://'"),
    ],
)
def test_a_bad_journal_url_is_refused_by_run_itself(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match="journal") as info:
        botmesh.run(Bot("bot"), MockProvider(), journal=url)  # no start, no await
    assert info.value.field == "journal"
    assert says in str(info.value)


def test_an_unknown_file_journal_option_is_refused_by_run_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with pytest.raises(ConfigError) as info:
        botmesh.run(Bot("bot"), MockProvider(), journal=f"file://{path}?appendlog=true")
    assert info.value.field == "journal (appendlog)"
    assert "append_log" in str(info.value)  # the options it does take
    assert list(tmp_path.iterdir()) == []  # refused before anything was opened
    with pytest.raises(ConfigError) as info:
        botmesh.run(Bot("bot"), MockProvider(), journal=f"file://{path}?fsync=maybe")
    assert info.value.field == "journal (fsync)"


@pytest.mark.parametrize(
    ("option", "points_at"),
    [("backend", "journal="), ("instance_id", "instance_id=")],
)
def test_the_bot_cannot_choose_its_journal_or_instance(option: str, points_at: str) -> None:
    with pytest.raises(ConfigError) as info:
        Bot("bot", durability={option: "file:///x"})
    assert info.value.field == option
    assert "the runtime chooses this" in str(info.value)
    assert f"botmesh.run(bot, provider, {points_at}" in str(info.value)
    assert "botmesh worker" in str(info.value)


async def test_a_journal_the_caller_opened_is_used_and_left_open() -> None:
    kv = MemoryKv()
    bot = Bot("bot", durability={"poll": 0})
    async with bot.bind(MockProvider(), kv) as app:
        await app.handle(Inbound(id="m", chat_id="c"))
    assert [e.value["state"] for e in await kv.scan("")] == ["done"]  # still open: the caller's


BOT_MODULE = """
from botmesh import Bot, Context

bot = Bot("echo", durability={"poll": 0, "outbox": {"inline_max": "5s"}})


@bot.on_message
async def echo(ctx: Context) -> None:
    await ctx.reply(f"echo: {ctx.text}")
"""


def _load(path: Path) -> ModuleType:
    path.write_text(textwrap.dedent(BOT_MODULE))
    spec = importlib.util.spec_from_file_location("echo_bot_module", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_same_bot_object_runs_twice_on_one_file_journal_and_recovers(
    tmp_path: Path,
) -> None:
    module = _load(tmp_path / "echo_bot.py")  # defines the bot and nothing else
    bot = module.bot
    assert isinstance(bot, Bot)
    journal = f"file://{tmp_path}/journal?append_log=true"
    clock = ManualClock()
    errors: list[ErrorEvent] = []
    bot.on(ErrorEvent, errors.append)

    first = MockProvider()
    first.fail_next(RateLimitedError(retry_after=60.0))  # past inline_max: deferred
    async with botmesh.run(bot, first, journal=journal, instance_id="echo-0", clock=clock) as app:
        assert await app.handle(Inbound(id="m1", chat_id="c", text="hi")) == Outcome.HANDLED
    assert first.sent == [] and [e.where for e in errors] == ["handler"]  # SendDeferredError

    second = MockProvider()
    clock.advance(60)
    async with botmesh.run(bot, second, journal=journal, instance_id="echo-0", clock=clock) as app:
        ops = app.durability
        assert ops is not None
        await ops.drain()  # the deferred reply, recovered from the file
        assert await app.handle(Inbound(id="m1", chat_id="c", text="hi")) == Outcome.DUPLICATE
        rec = await ops.outbox.get("m1:1")
        assert rec is not None and (rec.state, rec.attempts) == ("sent", 2)
    assert [m.text for m in second.sent] == ["echo: hi"]
