"""Invariant 3, a key names a send: a recorded key is answered from the outbox; keys are
explicit (scoped per bot), else ``<inbound id>:<n>``, else random, and the parts of a text
are ``key``, ``key#2``… linked by ``previous_part``."""

from __future__ import annotations

from typing import Literal

import pytest

from botmesh import Bot, Context, Inbound, Outbound
from botmesh.errors import InvalidKeyError
from botmesh.journal import MemoryKv
from botmesh.testing import ManualClock, MockProvider
from tests.kit import make_app, policy, texts


async def test_a_recorded_key_is_answered_from_the_outbox() -> None:
    app = await make_app()
    first = await app.runtime.send("c", "invoice", idempotency_key="invoice:42")
    again = await app.runtime.send("c", "invoice", idempotency_key="invoice:42")
    assert len(app.provider.sent) == 1 and again.message_id == first.message_id
    assert again.key == first.key == "invoice:42" and again.state == "sent"
    assert app.ops.metrics()["outboxDeduped"] == 1 and app.ops.metrics()["outboxJournaled"] == 1


async def test_keys_are_explicit_else_derived_from_the_inbound_with_one_counter() -> None:
    bot = Bot("bot", durability=policy())
    keys: list[str] = []
    chats: list[str] = []

    @bot.on_message
    async def handler(ctx: Context) -> None:
        keys.append((await ctx.reply("a")).key)
        other = await ctx.send("other-chat", "b")  # another chat, same counter
        keys.append(other.key)
        chats.append(other.chat_id)
        keys.append((await ctx.reply("c", idempotency_key="mine")).key)
        keys.append(await ctx.enqueue(ctx.chat_id, "d"))
        keys.append(await ctx.enqueue("other-chat", "e"))

    app = await make_app(bot=bot)
    await app.runtime.handle(Inbound(id="in-7", chat_id="c"))
    assert keys == ["in-7:1", "in-7:2", "mine", "in-7:4", "in-7:5"]
    assert chats == ["other-chat"]
    await app.ops.drain()
    sent = [(m.chat_id, m.text) for m in app.provider.sent]
    assert sent == [("c", "a"), ("other-chat", "b"), ("c", "c"), ("c", "d"), ("other-chat", "e")]
    for key in ("in-7:1", "in-7:2", "in-7:4", "in-7:5"):
        rec = await app.ops.outbox.get(key)
        assert rec is not None and rec.inbound_id == "in-7", key
    r1 = (await app.runtime.send("c", "x")).key
    r2 = (await app.runtime.send("c", "x")).key
    assert r1 != r2 and len(r1) == 32  # random keys are not recognised as one send


async def test_the_idempotency_key_never_reaches_the_provider() -> None:
    app = await make_app()
    opts = {"idempotency_key": "k", "silent": True}
    await app.runtime.send("c", "t", idempotency_key="k", options=opts)
    await app.runtime.enqueue("c", "t", idempotency_key="k2", options=opts)
    await app.ops.drain()
    assert [m.options for m in app.provider.sent] == [{"silent": True}, {"silent": True}]
    rec = await app.ops.outbox.get("k")
    assert rec is not None and rec.payload["options"] == {"silent": True}


async def _replay_with(
    text_for_run: list[str], on_diverged: Literal["send", "skip"]
) -> tuple[MockProvider, dict[str, int], list[str]]:
    """Handle ``m`` with the first text, then replay it once per later text."""
    shared, clock, provider = MemoryKv(), ManualClock(), MockProvider()
    metrics: dict[str, int] = {}
    keys: list[str] = []
    for run, text in enumerate(text_for_run):
        bot = Bot("bot", durability=policy(outbox={"on_diverged": on_diverged}))

        @bot.on_message
        async def handler(ctx: Context, text: str = text) -> None:
            await ctx.reply(text)
            await ctx.reply("explicit " + text, idempotency_key="fixed")

        app = await make_app(provider, kv=shared, clock=clock, bot=bot, instance_id="i")
        if run == 0:
            await app.runtime.handle(Inbound(id="m", chat_id="c"))
        else:
            await app.ops.replay_inbound("m")
            await app.ops.drain()
        metrics = app.ops.metrics()
        keys = [r.key for r in await app.ops.outbox.list()]
        await app.stop()
    return provider, metrics, keys


async def test_a_diverged_replay_sends_the_new_content_under_a_new_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    provider, metrics, keys = await _replay_with(["first", "other"], "send")
    assert texts(provider) == ["first", "explicit first", "other"]
    assert metrics["outboxDiverged"] == 1  # explicit keys are never compared
    assert "other content" in caplog.text
    assert len(keys) == 3 and any(k.startswith("m:1~") for k in keys)


async def test_a_diverged_replay_under_skip_is_answered_from_the_recorded_send() -> None:
    provider, metrics, _ = await _replay_with(["first", "other", "other"], "skip")
    assert texts(provider) == ["first", "explicit first"]
    assert metrics["outboxDiverged"] == 1 and metrics["outboxDeduped"] == 2


async def test_a_replay_with_the_same_content_is_deduped_not_diverged() -> None:
    provider, metrics, _ = await _replay_with(["same", "same"], "send")
    assert texts(provider) == ["same", "explicit same"]
    assert metrics["outboxDiverged"] == 0 and metrics["outboxDeduped"] == 2


async def test_the_fingerprint_is_taken_before_the_before_send_hooks() -> None:
    shared, clock, provider = MemoryKv(), ManualClock(), MockProvider()
    stamps = iter(range(100))
    metrics: dict[str, int] = {}
    for run in range(2):
        bot = Bot("bot", durability=policy())
        bot.before_send(lambda m: Outbound(m.chat_id, f"{m.text} #{next(stamps)}"))

        @bot.on_message
        async def handler(ctx: Context) -> None:
            await ctx.reply("hi")

        app = await make_app(provider, kv=shared, clock=clock, bot=bot, instance_id="i")
        if run == 0:
            await app.runtime.handle(Inbound(id="m", chat_id="c"))
        else:
            await app.ops.replay_inbound("m")
            await app.ops.drain()
        metrics = app.ops.metrics()
    assert texts(provider) == ["hi #0"]  # the hook's change is not divergence
    assert metrics["outboxDiverged"] == 0 and metrics["outboxDeduped"] == 1


async def test_a_text_over_the_limit_is_split_after_the_hooks_into_linked_parts() -> None:
    bot = Bot("bot", durability=policy())
    bot.before_send(lambda m: Outbound(m.chat_id, (m.text or "") + " tail-end"))
    app = await make_app(MockProvider(text_limit=10), bot=bot)
    receipt = await app.runtime.send("c", "aaaa bbbb cccc", idempotency_key="k")
    sent = texts(app.provider)
    assert "".join(t or "" for t in sent) == "aaaa bbbb cccc tail-end"
    assert all(len(t or "") <= 10 for t in sent)
    recs = {r.key: r for r in await app.ops.outbox.list()}
    assert sorted(recs) == ["k", "k#2", "k#3"]
    assert [recs[k].previous_part for k in ("k", "k#2", "k#3")] == [None, "k", "k#2"]
    assert [(recs[k].part, recs[k].parts) for k in ("k", "k#2", "k#3")] == [(1, 3), (2, 3), (3, 3)]
    assert receipt.key == "k" and receipt.part == 1


async def test_an_explicit_key_with_a_hash_is_refused_everywhere() -> None:
    """``k#2`` would collide with part 2 of a split send under ``k``."""
    bot = Bot("bot", durability=policy())
    refused: list[str] = []

    @bot.on_message
    async def handler(ctx: Context) -> None:
        with pytest.raises(InvalidKeyError):
            await ctx.reply("x", idempotency_key="k#2")
        refused.append("reply")
        with pytest.raises(InvalidKeyError):
            await ctx.send("c", "x", idempotency_key="k#2")
        refused.append("send")
        with pytest.raises(InvalidKeyError):
            await ctx.enqueue("c", "x", idempotency_key="k#2")
        refused.append("enqueue")

    app = await make_app(MockProvider(text_limit=5), bot=bot)
    await app.runtime.send("c", "aaaa bbbb", idempotency_key="k")  # parts k and k#2
    assert texts(app.provider) == ["aaaa ", "bbbb"]
    await app.runtime.handle(Inbound(id="m", chat_id="c"))
    assert refused == ["reply", "send", "enqueue"]
    with pytest.raises(InvalidKeyError, match="'#'"):
        await app.runtime.send("c", "other", idempotency_key="k#2")
    with pytest.raises(InvalidKeyError, match="'#'"):
        await app.runtime.enqueue("c", "other", idempotency_key="k#2")
    await app.ops.drain()
    # never answered from part 2 of k, never sent, never journaled
    assert texts(app.provider) == ["aaaa ", "bbbb"]
    rec = await app.ops.outbox.get("k#2")
    assert rec is not None and rec.payload["text"] == "bbbb" and rec.previous_part == "k"
    assert sorted(r.key for r in await app.ops.outbox.list()) == ["k", "k#2"]


async def test_bots_sharing_a_journal_see_only_their_scope() -> None:
    shared, clock = MemoryKv(), ManualClock()
    one = await make_app(kv=shared, clock=clock, bot=Bot("one", durability=policy()))
    two = await make_app(kv=shared, clock=clock, bot=Bot("two", durability=policy()))
    other_tenant = await make_app(
        kv=shared, clock=clock, bot=Bot("one", tenant_id="acme", durability=policy())
    )
    assert one.ops.scope == "default:default:one:default" and one.ops.scope != two.ops.scope
    assert other_tenant.ops.scope == "acme:default:one:default"
    await one.runtime.enqueue("c", "a", idempotency_key="reminder:1")
    await two.runtime.enqueue("c", "b", idempotency_key="reminder:1")  # explicit keys: per bot
    assert await two.ops.drain() == 1  # two delivers only its own
    assert await one.ops.drain() == 1
    assert texts(one.provider) == ["a"] and texts(two.provider) == ["b"]
    assert [r.payload["text"] for r in await one.ops.outbox.list()] == ["a"]
    await one.runtime.handle(Inbound(id="same-id", chat_id="c"))
    await two.runtime.handle(Inbound(id="same-id", chat_id="c"))  # not a duplicate across bots
    assert two.ops.metrics()["inboundDuplicates"] == 0
    assert len(await two.ops.inbox.list()) == 1
    await one.stop()
    assert await two.ops.inbox.list() != []  # the shared journal stays open for the others
