"""The outbox: journal before the provider, keys, dedupe, divergence, retries, deferral,
enqueue, order, parts, ambiguity, bypass."""

from __future__ import annotations

import asyncio

import pytest

from botmesh import (
    Bot,
    Inbound,
    MemoryDurability,
    MockProvider,
    OutsideSessionWindowError,
    PayloadTooLargeError,
    RateLimitedError,
    RecipientUnreachableError,
    SendDeferredError,
    SendError,
    UnsupportedContentError,
)
from botmesh.testing import ManualClock, SimulatedCrash, crashable
from state.messages import Media, Outbound, SendResult
from tests.core.helpers import durable, make_bot


class WatchingProvider(MockProvider):
    """Looks at the journal during each call."""

    def __init__(self, bot_ref: list[Bot], **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.bot_ref = bot_ref
        self.seen: list[tuple[str, bool, int]] = []

    async def send(self, message: Outbound) -> SendResult:
        d = durable(self.bot_ref[0].durability)
        for r in await d.outbox.list():
            if r.payload["text"] == message.text:
                self.seen.append((r.state, r.inflight, r.token))
        return await super().send(message)


async def test_send_is_journaled_in_flight_before_the_provider_and_id_recorded() -> None:
    ref: list[Bot] = []
    bot, provider, _, d = make_bot(WatchingProvider(ref))
    ref.append(bot)
    await bot.start()
    receipt = await bot.send("c", "hello", idempotency_key="k1")
    assert provider.seen == [("pending", True, 1)]
    rec = await d.outbox.get("k1")
    assert rec is not None and (rec.state, rec.message_id, rec.inflight) == (
        "sent",
        receipt.message_id,
        False,
    )
    assert receipt.state == "sent" and receipt.key == "k1"


async def test_recorded_key_is_answered_from_the_outbox() -> None:
    bot, provider, _, d = make_bot()
    await bot.start()
    first = await bot.send("c", "invoice", idempotency_key="invoice:42")
    again = await bot.send("c", "invoice", idempotency_key="invoice:42")
    assert len(provider.sent) == 1 and again.message_id == first.message_id
    assert d.metrics()["outboxDeduped"] == 1 and d.metrics()["outboxJournaled"] == 1


async def test_keys_explicit_derived_random() -> None:
    bot, _, _, d = make_bot()
    keys: list[str] = []

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        keys.append((await ctx.reply("a")).key)
        keys.append((await bot.send(ctx.chat_id, "b")).key)  # bot.send in a handler: derived
        keys.append((await ctx.reply("c", idempotency_key="mine")).key)
        keys.append(await bot.enqueue(ctx.chat_id, "d"))

    await bot.start()
    await bot.handle(Inbound("in-7", "c"))
    r1 = (await bot.send("c", "x")).key
    r2 = (await bot.send("c", "x")).key
    assert keys == ["in-7:1", "in-7:2", "mine", "in-7:4"]
    assert r1 != r2 and len(r1) == 32  # random keys are not recognised as one send
    rec = await d.outbox.get("in-7:1")
    assert rec is not None and rec.inbound_id == "in-7"


async def test_the_idempotency_key_never_reaches_the_provider() -> None:
    bot, provider, _, d = make_bot()
    await bot.start()
    message = Outbound("c", "t", options={"idempotency_key": "k", "silent": True})
    await d.send(message, key="k")
    await d.enqueue(message, key="k2")
    await d.drain()
    assert [m.options for m in provider.sent] == [{"silent": True}, {"silent": True}]
    rec = await d.outbox.get("k")
    assert rec is not None and rec.payload["options"] == {"silent": True}


async def _replay_with(
    text_for_run: list[str], on_diverged: str
) -> tuple[MockProvider, dict[str, int], Bot]:
    shared = MemoryDurability()
    clock = ManualClock()
    provider = MockProvider()
    bot = None
    for run, text in enumerate(text_for_run):
        bot = Bot(
            provider,
            durability={
                "backend": shared,
                "instance_id": "i",
                "poll": 0,
                "outbox": {"on_diverged": on_diverged},
            },
            clock=clock,
        )

        @bot.on_message
        async def handler(ctx, text=text):  # type: ignore[no-untyped-def]
            await ctx.reply(text)
            await ctx.reply("explicit " + text, idempotency_key="fixed")

        await bot.start()
        if run == 0:
            await bot.handle(Inbound("m", "c"))
        else:
            await durable(bot.durability).replay_inbound("m")
            await durable(bot.durability).drain()
    assert bot is not None
    return provider, durable(bot.durability).metrics(), bot


async def test_divergence_send_sends_new_content_under_a_new_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    provider, metrics, bot = await _replay_with(["first", "other"], "send")
    assert [m.text for m in provider.sent] == ["first", "explicit first", "other"]
    assert metrics["outboxDiverged"] == 1  # explicit keys are never compared
    assert "other content" in caplog.text
    keys = [r.key for r in await durable(bot.durability).outbox.list()]
    assert len(keys) == 3 and any(k.startswith("m:1~") for k in keys)


async def test_divergence_skip_answers_from_the_recorded_send() -> None:
    provider, metrics, _ = await _replay_with(["first", "other", "other"], "skip")
    assert [m.text for m in provider.sent] == ["first", "explicit first"]
    assert metrics["outboxDiverged"] == 1 and metrics["outboxDeduped"] == 2


async def test_same_content_replay_is_deduped_not_diverged() -> None:
    provider, metrics, _ = await _replay_with(["same", "same"], "send")
    assert [m.text for m in provider.sent] == ["same", "explicit same"]
    assert metrics["outboxDiverged"] == 0 and metrics["outboxDeduped"] == 2


async def test_fingerprint_is_taken_before_the_before_send_hooks() -> None:
    shared = MemoryDurability()
    clock = ManualClock()
    provider = MockProvider()
    stamps = iter(range(100))
    for run in range(2):
        bot = Bot(
            provider, durability={"backend": shared, "instance_id": "i", "poll": 0}, clock=clock
        )
        bot.before("send", lambda m: Outbound(m.chat_id, f"{m.text} #{next(stamps)}"))

        @bot.on_message
        async def handler(ctx):  # type: ignore[no-untyped-def]
            await ctx.reply("hi")

        await bot.start()
        if run == 0:
            await bot.handle(Inbound("m", "c"))
        else:
            await durable(bot.durability).replay_inbound("m")
            await durable(bot.durability).drain()
    assert [m.text for m in provider.sent] == ["hi #0"]  # the hook's change is not divergence
    assert durable(bot.durability).metrics()["outboxDiverged"] == 0


async def test_retryable_errors_retry_inline_with_backoff() -> None:
    bot, provider, clock, d = make_bot(outbox={"backoff": {"base": "1s", "cap": "1m", "jitter": 0}})
    await bot.start()
    provider.fail_next(SendError("flaky"), times=3)
    t0 = clock.now()
    receipt = await bot.send("c", "x", idempotency_key="k")
    assert receipt.state == "sent" and len(provider.calls) == 4
    assert clock.now() - t0 == 1 + 2 + 4  # exponential, no jitter
    rec = await d.outbox.get("k")
    assert rec is not None and rec.attempts == 4 and rec.token == 4
    assert d.metrics()["outboxRetried"] == 3


async def test_rate_limit_waits_at_least_retry_after() -> None:
    bot, provider, clock, _ = make_bot(outbox={"backoff": {"base": "1s", "jitter": 0}})
    await bot.start()
    provider.fail_next(RateLimitedError(retry_after=9.0))
    t0 = clock.now()
    await bot.send("c", "x")
    assert clock.now() - t0 == 9.0


@pytest.mark.parametrize(
    "error",
    [
        UnsupportedContentError("no"),
        PayloadTooLargeError("big"),
        OutsideSessionWindowError("closed"),
        RecipientUnreachableError("blocked"),
        SendError("custom final", retryable=False),
    ],
)
async def test_final_errors_are_dead_lettered_at_once(error: SendError) -> None:
    bot, provider, _, d = make_bot()
    dead: list[object] = []
    bot.on("durability:dead", dead.append)
    await bot.start()
    provider.fail_next(error, times=10)
    with pytest.raises(type(error)):
        await bot.send("c", "x", idempotency_key="k")
    assert len(provider.calls) == 1
    [rec] = await d.outbox.list(state="dead")
    assert rec.key == "k" and rec.error is not None and rec.error["type"] == type(error).__name__
    assert d.metrics()["outboxDead"] == 1 and len(dead) == 1


async def test_retries_run_out_then_dead() -> None:
    bot, provider, _, d = make_bot(outbox={"retries": 2, "inline_max": "1h"})
    await bot.start()
    provider.fail_next(SendError("down"), times=10)
    with pytest.raises(SendError):
        await bot.send("c", "x", idempotency_key="k")
    assert len(provider.calls) == 3  # retries after the first attempt
    rec = await d.outbox.get("k")
    assert rec is not None and rec.state == "dead"


async def test_inline_max_defers_to_the_sweeper() -> None:
    bot, provider, clock, d = make_bot(
        outbox={"inline_max": "5s", "backoff": {"base": "2s", "jitter": 0}}
    )
    after: list[str] = []
    bot.after("send", lambda r: after.append(r.key))
    await bot.start()
    provider.fail_next(SendError("down"), times=3)
    with pytest.raises(SendDeferredError) as info:
        await bot.send("c", "x", idempotency_key="k")
    assert info.value.key == "k"
    assert len(provider.calls) == 2  # 2 s wait fits, the next 4 s would pass 5 s
    rec = await d.outbox.get("k")
    assert rec is not None and rec.state == "failed" and rec.lease_owner is None
    assert d.metrics()["outboxDeferred"] == 1
    assert await d.sweep_once() == 0  # not due yet
    clock.advance(4)
    assert await d.sweep_once() == 1  # fails a third time
    clock.advance(8)
    assert await d.sweep_once() == 1
    rec = await d.outbox.get("k")
    assert rec is not None and rec.state == "sent" and after == ["k"]


async def test_enqueue_runs_hooks_once_and_the_sweeper_delivers() -> None:
    bot, provider, _, d = make_bot()
    before: list[str] = []
    after: list[str] = []
    sent: list[str] = []

    def stamp(m: Outbound) -> Outbound:
        before.append(m.text or "")
        return Outbound(m.chat_id, (m.text or "") + "!")

    bot.before("send", stamp)
    bot.after("send", lambda r: after.append(r.key))
    bot.on("sent", lambda r: sent.append(r.key))
    await bot.start()
    key = await bot.enqueue("c", "reminder", idempotency_key="reminder:1")
    assert key == "reminder:1" and provider.sent == [] and before == ["reminder"]
    assert await bot.enqueue("c", "reminder", idempotency_key="reminder:1") == key  # no-op
    await d.drain()
    assert [m.text for m in provider.sent] == ["reminder!"]
    assert after == ["reminder:1"] and sent == ["reminder:1"]
    assert before == ["reminder", "reminder"]  # hooks ran at enqueue, never at delivery


async def test_sends_to_one_chat_keep_order_while_one_is_retried_inline() -> None:
    bot, provider, _, _ = make_bot()
    await bot.start()
    provider.fail_next(SendError("flaky"), times=2)

    async def slow_clock_sends() -> None:
        await asyncio.gather(
            bot.send("c", "first"), bot.send("c", "second"), bot.send("d", "other")
        )

    await slow_clock_sends()
    texts = [m.text for m in provider.sent if m.chat_id == "c"]
    assert texts == ["first", "second"]


async def test_text_over_the_limit_is_split_after_the_hooks_into_linked_parts() -> None:
    bot, provider, _, d = make_bot(MockProvider(text_limit=10))
    bot.before("send", lambda m: Outbound(m.chat_id, (m.text or "") + " tail-end"))
    await bot.start()
    receipt = await bot.send("c", "aaaa bbbb cccc", idempotency_key="k")
    texts = [m.text for m in provider.sent]
    assert "".join(t or "" for t in texts) == "aaaa bbbb cccc tail-end"
    assert all(len(t or "") <= 10 for t in texts)
    recs = {r.key: r for r in await d.outbox.list()}
    assert sorted(recs) == ["k", "k#2", "k#3"]
    assert (recs["k"].previous_part, recs["k#2"].previous_part, recs["k#3"].previous_part) == (
        None,
        "k",
        "k#2",
    )
    assert receipt.key == "k" and receipt.part == 1


async def test_a_part_waits_behind_an_earlier_part_and_keeps_its_budget() -> None:
    provider = MockProvider(text_limit=5)
    bot, _, clock, d = make_bot(provider, outbox={"inline_max": 0, "retries": 3})
    await bot.start()
    provider.fail_next(SendError("down"), times=2)
    with pytest.raises(SendDeferredError):
        await bot.send("c", "aaaa bbbb", idempotency_key="k")
    assert [m.text for m in provider.sent] == []
    part2 = await d.outbox.get("k#2")
    assert part2 is not None and part2.state == "pending" and part2.attempts == 0
    for _ in range(6):
        clock.advance(10)
        await d.sweep_once()
    assert [m.text for m in provider.sent] == ["aaaa ", "bbbb"]  # never overtaken
    part2 = await d.outbox.get("k#2")
    assert (
        part2 is not None and part2.state == "sent" and part2.attempts == 1
    )  # waiting not charged


async def test_a_part_dies_with_a_dead_earlier_part() -> None:
    provider = MockProvider(text_limit=5)
    bot, _, _, d = make_bot(provider)
    await bot.start()
    provider.fail_next(UnsupportedContentError("no"))
    with pytest.raises(UnsupportedContentError):
        await bot.send("c", "aaaa bbbb cccc", idempotency_key="k")
    states = {r.key: r.state for r in await d.outbox.list()}
    assert states == {"k": "dead", "k#2": "dead", "k#3": "dead"}
    assert provider.sent == [] and d.metrics()["outboxDead"] == 3


async def test_a_journaled_over_limit_record_is_split_by_the_sweeper() -> None:
    shared = MemoryDurability()
    clock = ManualClock()
    wide = Bot(
        MockProvider(text_limit=None),
        durability={"backend": shared, "instance_id": "i", "poll": 0},
        clock=clock,
    )
    await wide.start()
    await wide.enqueue("c", "aaaa bbbb cccc", idempotency_key="k")  # journaled unsplit
    narrow_provider = MockProvider(text_limit=5)
    narrow = Bot(
        narrow_provider, durability={"backend": shared, "instance_id": "j", "poll": 0}, clock=clock
    )
    await narrow.start()
    d = durable(narrow.durability)
    await d.drain()
    assert [m.text for m in narrow_provider.sent] == ["aaaa ", "bbbb ", "cccc"]
    recs = {r.key: (r.state, r.payload["text"], r.previous_part) for r in await d.outbox.list()}
    assert recs == {
        "k": ("sent", "aaaa ", None),
        "k#2": ("sent", "bbbb ", "k"),
        "k#3": ("sent", "cccc", "k#2"),
    }


@pytest.mark.parametrize("policy", ["skip", "resend"])
async def test_ambiguous_send_after_a_crash(policy: str) -> None:
    shared = MemoryDurability()
    clock = ManualClock()
    a = crashable(shared)
    a.crash_before("outbox.mark_sent")
    provider_a = MockProvider()
    bot_a = Bot(provider_a, durability={"backend": a, "instance_id": "i1", "poll": 0}, clock=clock)
    await bot_a.start()
    with pytest.raises(SimulatedCrash):
        await bot_a.send("c", "hello", idempotency_key="k")
    assert len(provider_a.sent) == 1  # the channel got it; the journal never heard back
    provider_b = MockProvider()
    bot_b = Bot(
        provider_b,
        durability={
            "backend": shared,
            "instance_id": "i1",
            "poll": 0,
            "outbox": {"on_ambiguous": policy},
        },
        clock=clock,
    )
    events: list[object] = []
    bot_b.on("durability:ambiguous", events.append)
    await bot_b.start()
    d = durable(bot_b.durability)
    rec = await d.outbox.get("k")
    assert rec is not None and rec.ambiguous
    assert d.metrics()["outboxAmbiguous"] == 1 and len(events) == 1
    if policy == "skip":
        assert rec.state == "unknown" and provider_b.sent == []  # never a duplicate
    else:
        assert rec.state == "sent" and len(provider_b.sent) == 1  # never lost


async def test_big_or_unencodable_payloads_bypass_the_outbox(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bot, provider, _, d = make_bot(outbox={"max_payload_bytes": 1000})
    await bot.start()
    await bot.send("c", "x" * 2000)
    await d.send(Outbound("c", "obj", options={"stream": object()}), key="s")
    assert len(provider.sent) == 2 and await d.outbox.list() == []
    assert d.metrics()["outboxBypassed"] == 2
    assert "bypasses the outbox" in caplog.text


async def test_binary_content_is_journaled_base64() -> None:
    bot, provider, _, d = make_bot()
    await bot.start()
    await d.enqueue(Outbound("c", None, Media(data=b"\x89PNG\x00", mime="image/png")), key="img")
    rec = await d.outbox.get("img")
    assert rec is not None and rec.payload["media"]["data"] == "iVBORwA="
    await d.drain()
    assert provider.sent[0].media == Media(data=b"\x89PNG\x00", mime="image/png")
