"""Invariant 6, order: a part never overtakes an earlier part, and sends to one chat keep
their order while one of them is retried, inline or (``outbox.keep_chat_order``) after a
deferral to the sweeper."""

from __future__ import annotations

import asyncio

import pytest

from botmesh import Bot, Context, Inbound, Outbound, Receipt, SendResult
from botmesh.errors import (
    RateLimitedError,
    Reason,
    SendDeferredError,
    SendError,
    UnsupportedContentError,
)
from botmesh.journal import MemoryKv, Write
from botmesh.testing import CrashableProvider, ManualClock, MockProvider, SimulatedCrash, crashable
from tests.kit import App, make_app, policy, settle, texts


async def test_sends_to_one_chat_keep_their_order_while_one_is_retried_inline() -> None:
    app = await make_app()
    app.provider.fail_next(SendError("flaky"), times=2)
    rt = app.runtime
    await asyncio.gather(rt.send("c", "first"), rt.send("c", "second"), rt.send("d", "other"))
    assert [m.text for m in app.provider.sent if m.chat_id == "c"] == ["first", "second"]
    assert sorted(m.text or "" for m in app.provider.sent) == ["first", "other", "second"]


async def test_a_part_waits_behind_an_earlier_part_and_keeps_its_budget() -> None:
    provider = MockProvider(text_limit=5)
    app = await make_app(provider, outbox={"inline_max": 0, "retries": 3})
    provider.fail_next(SendError("down"), times=2)
    with pytest.raises(SendDeferredError):
        await app.runtime.send("c", "aaaa bbbb", idempotency_key="k")
    assert texts(provider) == []
    part2 = await app.ops.outbox.get("k#2")
    assert part2 is not None and part2.state == "pending" and part2.attempts == 0
    for _ in range(6):
        app.clock.advance(10)
        await app.ops.sweep_once()
    assert texts(provider) == ["aaaa ", "bbbb"]  # never overtaken
    part1 = await app.ops.outbox.get("k")
    part2 = await app.ops.outbox.get("k#2")
    assert part1 is not None and (part1.state, part1.attempts) == ("sent", 3)
    assert part2 is not None and (part2.state, part2.attempts) == ("sent", 1)  # waiting is free


async def test_a_part_dies_with_a_dead_earlier_part() -> None:
    provider = MockProvider(text_limit=5)
    app = await make_app(provider)
    provider.fail_next(UnsupportedContentError("no"))
    with pytest.raises(UnsupportedContentError):
        await app.runtime.send("c", "aaaa bbbb cccc", idempotency_key="k")
    recs = {r.key: r for r in await app.ops.outbox.list()}
    assert {k: r.state for k, r in recs.items()} == {"k": "dead", "k#2": "dead", "k#3": "dead"}
    reasons = [(recs[k].error or {}).get("reason") for k in ("k", "k#2", "k#3")]
    assert reasons == [Reason.SEND_REFUSED, Reason.PREVIOUS_PART_DEAD, Reason.PREVIOUS_PART_DEAD]
    assert provider.sent == [] and app.ops.metrics()["outboxDead"] == 3


async def test_a_journaled_record_over_the_limit_is_split_by_the_sweeper() -> None:
    shared, clock = MemoryKv(), ManualClock()
    wide = await make_app(MockProvider(text_limit=None), kv=shared, clock=clock, instance_id="i")
    await wide.runtime.enqueue("c", "aaaa bbbb cccc", idempotency_key="k")  # journaled unsplit
    narrow = await make_app(MockProvider(text_limit=5), kv=shared, clock=clock, instance_id="j")
    await narrow.ops.drain()
    assert texts(narrow.provider) == ["aaaa ", "bbbb ", "cccc"]
    recs = {
        r.key: (r.state, r.payload["text"], r.previous_part) for r in await narrow.ops.outbox.list()
    }
    assert recs == {
        "k": ("sent", "aaaa ", None),
        "k#2": ("sent", "bbbb ", "k"),
        "k#3": ("sent", "cccc", "k#2"),
    }
    assert wide.provider.calls == []


async def test_retrying_a_dead_first_part_brings_back_the_parts_that_died_with_it() -> None:
    provider = MockProvider(text_limit=5)
    app = await make_app(provider)
    provider.fail_next(UnsupportedContentError("no"))
    with pytest.raises(UnsupportedContentError):
        await app.runtime.send("c", "aaaa bbbb cccc", idempotency_key="k")
    assert {r.state for r in await app.ops.outbox.list()} == {"dead"}
    await app.ops.retry_send("k")
    states = {r.key: (r.state, r.error) for r in await app.ops.outbox.list()}
    assert states == {"k": ("pending", None), "k#2": ("pending", None), "k#3": ("pending", None)}
    await app.ops.drain()
    assert texts(provider) == ["aaaa ", "bbbb ", "cccc"]  # the whole text, in order
    assert {r.state for r in await app.ops.outbox.list()} == {"sent"}


@pytest.mark.crash
async def test_retrying_an_unknown_first_part_brings_back_the_parts_unknown_with_it() -> None:
    shared, clock = MemoryKv(), ManualClock()
    channel = MockProvider(text_limit=5)
    a = crashable(shared)
    a.crash_before(Write.OUTBOX_MARK_SENT)  # part 1 went out, its outcome is lost
    first = await make_app(CrashableProvider(a, channel), kv=a, clock=clock)
    with pytest.raises(SimulatedCrash):
        await first.runtime.send("c", "aaaa bbbb cccc", idempotency_key="k")
    again = await make_app(channel, kv=shared, clock=clock)  # on_ambiguous="skip"
    await settle(again)
    recs = {r.key: r for r in await again.ops.outbox.list()}
    assert {k: r.state for k, r in recs.items()} == {
        "k": "unknown",
        "k#2": "unknown",
        "k#3": "unknown",
    }
    assert [(recs[k].error or {}).get("reason") for k in ("k#2", "k#3")] == [
        Reason.PREVIOUS_PART_UNKNOWN
    ] * 2
    assert texts(channel) == ["aaaa "]
    await again.ops.retry_send("k")  # the operator knows part 1 never arrived
    await again.ops.drain()
    assert texts(channel) == ["aaaa ", "aaaa ", "bbbb ", "cccc"]
    assert {r.state for r in await again.ops.outbox.list()} == {"sent"}


# -- per-chat order across a deferral (outbox.keep_chat_order) -----------------------------


def _later_sends_bot(keep: bool, receipts: list[Receipt], keys: list[str]) -> Bot:
    """A bot whose handler sends three times to its chat and once to another chat."""
    bot = Bot(
        "bot",
        durability=policy(outbox={"inline_max": "15s", "keep_chat_order": keep}),
    )

    @bot.on_message
    async def handler(ctx: Context) -> None:
        receipts.append(await ctx.reply("second"))
        receipts.append(await ctx.send(ctx.chat_id, "third"))
        keys.append(await ctx.enqueue(ctx.chat_id, "fourth"))
        receipts.append(await ctx.send("d", "elsewhere"))

    return bot


async def _defer_first(app: App) -> None:
    """A rate-limited send to chat ``c`` that outlasts ``inline_max``: deferred."""
    app.provider.fail_next(RateLimitedError(retry_after=30.0))
    with pytest.raises(SendDeferredError):
        await app.runtime.send("c", "first", idempotency_key="k1")


async def test_later_sends_to_a_chat_wait_behind_a_deferred_send() -> None:
    receipts: list[Receipt] = []
    keys: list[str] = []
    app = await make_app(bot=_later_sends_bot(True, receipts, keys))
    await _defer_first(app)
    await app.runtime.handle(Inbound(id="m2", chat_id="c"))
    assert [(r.key, r.state) for r in receipts] == [
        ("m2:1", "pending"),  # journaled behind "first"
        ("m2:2", "pending"),
        ("m2:4", "sent"),  # another chat is not held
    ]
    assert keys == ["m2:3"]
    assert texts(app.provider) == ["elsewhere"]
    await app.ops.drain()
    assert texts(app.provider) == ["elsewhere"]  # nothing overtakes "first" before it is due
    app.clock.advance(30)
    await app.ops.drain()
    assert texts(app.provider) == ["elsewhere", "first", "second", "third", "fourth"]
    recs = {r.key: r for r in await app.ops.outbox.list()}
    assert {k: (r.state, r.attempts) for k, r in recs.items() if k != "m2:4"} == {
        "k1": ("sent", 2),
        "m2:1": ("sent", 1),  # waiting is not charged as an attempt
        "m2:2": ("sent", 1),
        "m2:3": ("sent", 1),
    }
    assert app.ops.metrics()["outboxDeferred"] == 3  # "first", then "second" and "third"
    # the chat is free again: a new send goes out at once
    assert (await app.runtime.send("c", "fifth")).state == "sent"


async def test_without_keep_chat_order_a_later_send_overtakes_a_deferred_one() -> None:
    receipts: list[Receipt] = []
    keys: list[str] = []
    app = await make_app(bot=_later_sends_bot(False, receipts, keys))
    await _defer_first(app)
    await app.runtime.handle(Inbound(id="m2", chat_id="c"))
    assert [r.state for r in receipts] == ["sent", "sent", "sent"]
    await app.ops.drain()  # the enqueued send is due at once
    assert texts(app.provider) == ["second", "third", "elsewhere", "fourth"]
    app.clock.advance(30)
    await app.ops.drain()
    assert texts(app.provider) == ["second", "third", "elsewhere", "fourth", "first"]


class FailsOnce(MockProvider):
    """Refuses the first attempt of the texts in ``flaky`` (retryable)."""

    def __init__(self, *flaky: str) -> None:
        super().__init__()
        self.flaky = set(flaky)

    async def send(self, message: Outbound) -> SendResult:
        if message.text in self.flaky:
            self.flaky.discard(message.text)
            self.fail_next(SendError("blip"))
        return await super().send(message)


async def test_the_queue_behind_a_deferred_send_survives_a_restart() -> None:
    shared, clock = MemoryKv(), ManualClock()
    receipts: list[Receipt] = []
    keys: list[str] = []
    provider = FailsOnce("third")  # it also fails once, in the background, after the restart
    bot = _later_sends_bot(True, receipts, keys)
    app = await make_app(provider, kv=shared, clock=clock, bot=bot)
    await _defer_first(app)
    await app.runtime.handle(Inbound(id="m2", chat_id="c"))
    await app.stop()

    again = await make_app(provider, kv=shared, clock=clock, bot=bot)  # the same instance
    queued = await again.runtime.send("c", "fifth", idempotency_key="k5")
    assert queued.state == "pending"  # still behind the deferred send, after the restart
    rec = await again.ops.outbox.get("k5")
    assert rec is not None and rec.after == "m2:3"  # behind the last send queued before
    assert await again.runtime.enqueue("c", "sixth", idempotency_key="k6") == "k6"
    await again.ops.drain()
    assert texts(provider) == ["elsewhere"]
    await settle(again, passes=40, step=1)
    assert texts(provider) == ["elsewhere", "first", "second", "third", "fourth", "fifth", "sixth"]
    rec = await again.ops.outbox.get("k5")
    assert rec is not None and (rec.state, rec.attempts) == ("sent", 1)
