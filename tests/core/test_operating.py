"""Operating it: events, lists, replay, retry, discard, metrics, retention, scope."""

from __future__ import annotations

import pytest

from botmesh import (
    Bot,
    DeadEvent,
    Inbound,
    MemoryDurability,
    MockProvider,
    RecordStateError,
    SendError,
    UnsupportedContentError,
)
from botmesh.testing import ManualClock
from state.metrics import METRIC_NAMES
from tests.core.helpers import durable, make_bot


async def test_metrics_have_the_thirteen_reference_names() -> None:
    _, _, _, d = make_bot()
    assert list(d.metrics()) == list(METRIC_NAMES)
    assert len(METRIC_NAMES) == 13 and set(d.metrics().values()) == {0}
    assert set(METRIC_NAMES) == {
        "inboundJournaled",
        "inboundDuplicates",
        "inboundReplayed",
        "inboundDead",
        "outboxJournaled",
        "outboxDeduped",
        "outboxRetried",
        "outboxDeferred",
        "outboxDead",
        "outboxAmbiguous",
        "outboxBypassed",
        "staleLeases",
        "outboxDiverged",
    }


async def test_dead_letters_listed_retried_and_discarded() -> None:
    bot, provider, _, d = make_bot()
    dead: list[DeadEvent] = []
    bot.on("durability:dead", dead.append)
    await bot.start()
    provider.fail_next(UnsupportedContentError("nope"))
    with pytest.raises(UnsupportedContentError):
        await bot.send("c", "x", idempotency_key="k")
    assert dead == [DeadEvent("outbox", "k", "nope")]
    assert [r.key for r in await d.outbox.list(state="dead")] == ["k"]
    await d.retry_send("k")
    rec = await d.outbox.get("k")
    assert rec is not None and (rec.state, rec.attempts, rec.error) == ("pending", 0, None)
    await d.drain()
    rec = await d.outbox.get("k")
    assert rec is not None and rec.state == "sent" and len(provider.sent) == 1
    with pytest.raises(RecordStateError) as info:
        await d.retry_send("k")  # sent: nothing to retry
    assert info.value.state == "sent"
    await d.outbox.discard("k")
    assert await d.outbox.get("k") is None
    await bot.send("c", "x", idempotency_key="k")  # a discarded key sends again
    assert len(provider.sent) == 2
    with pytest.raises(RecordStateError):
        await d.outbox.discard("nope")
    with pytest.raises(RecordStateError):
        await d.retry_send("nope")


async def test_retry_send_takes_failed_and_unknown() -> None:
    bot, provider, _, d = make_bot(outbox={"inline_max": 0})
    await bot.start()
    provider.fail_next(SendError("down"))
    with pytest.raises(Exception, match="deferred"):
        await bot.send("c", "x", idempotency_key="f")
    await d.retry_send("f")  # failed -> pending now, not at its backoff time
    await d.sweep_once()
    rec = await d.outbox.get("f")
    assert rec is not None and rec.state == "sent"


async def test_replay_inbound_processes_a_dead_or_done_message_again() -> None:
    bot, provider, _, d = make_bot()
    runs = 0

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        nonlocal runs
        runs += 1
        await ctx.reply("hello")

    await bot.start()
    await bot.handle(Inbound("m", "c"))
    await d.replay_inbound("m")
    rec = await d.inbox.get("m")
    assert rec is not None and (rec.state, rec.attempts) == ("pending", 0)
    await d.drain()
    assert runs == 2 and len(provider.sent) == 1  # its reply answered from the outbox
    assert d.metrics()["inboundReplayed"] == 1 and d.metrics()["outboxDeduped"] == 1
    assert [r.id for r in await d.inbox.list(state="done")] == ["m"]
    assert await d.inbox.list(state="dead") == []
    with pytest.raises(RecordStateError):
        await d.replay_inbound("missing")


@pytest.mark.parametrize(("retention", "kept"), [("1d", False), (0, True)])
async def test_retention_purges_done_and_sent(retention: object, kept: bool) -> None:
    bot, provider, clock, d = make_bot(retention=retention)

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        await ctx.reply("hello")

    await bot.start()
    await bot.handle(Inbound("m", "c"))
    provider.fail_next(UnsupportedContentError("no"))
    with pytest.raises(UnsupportedContentError):
        await bot.send("c", "x", idempotency_key="dead-one")
    clock.advance(86400 - 1)
    assert await d.sweep_once() == 0
    clock.advance(2)
    await d.sweep_once()
    remaining = {r.key for r in await d.outbox.list()} | {r.id for r in await d.inbox.list()}
    assert remaining == ({"m", "m:1", "dead-one"} if kept else {"dead-one"})  # dead stays


async def test_bots_sharing_a_backend_see_only_their_scope() -> None:
    shared = MemoryDurability()
    clock = ManualClock()
    p1, p2 = MockProvider(), MockProvider()
    one = Bot(p1, bot_id="one", durability={"backend": shared, "poll": 0}, clock=clock)
    two = Bot(p2, bot_id="two", durability={"backend": shared, "poll": 0}, clock=clock)
    other_tenant = Bot(
        MockProvider(),
        bot_id="one",
        tenant_id="acme",
        durability={"backend": shared, "poll": 0},
        clock=clock,
    )
    for b in (one, two, other_tenant):
        await b.start()
    d1, d2 = durable(one.durability), durable(two.durability)
    assert d1.scope == "default:default:one:default" and d1.scope != d2.scope
    assert durable(other_tenant.durability).scope == "acme:default:one:default"
    await one.enqueue("c", "a", idempotency_key="reminder:1")
    await two.enqueue("c", "b", idempotency_key="reminder:1")  # explicit keys are per bot
    assert await d2.drain() == 1  # two delivers only its own
    assert await d1.drain() == 1
    assert [m.text for m in p1.sent] == ["a"] and [m.text for m in p2.sent] == ["b"]
    assert [r.payload["text"] for r in await d1.outbox.list()] == ["a"]
    await one.handle(Inbound("same-id", "c"))
    await two.handle(Inbound("same-id", "c"))  # not a duplicate across bots
    assert d2.metrics()["inboundDuplicates"] == 0
    assert len(await d2.inbox.list()) == 1
    await one.stop()
    assert await d2.inbox.list() != []  # the shared backend stays open for the others
