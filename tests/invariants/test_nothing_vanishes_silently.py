"""Invariant 5, nothing vanishes silently: every record ends ``done``/``sent``, ``dead``
(with its error), ``unknown``, discarded by an operator, or bypassed (counted and logged)."""

from __future__ import annotations

import contextlib

import pytest

from botmesh import Bot, Context, DeadEvent, Inbound, Media, Outbound, SendResult
from botmesh.errors import (
    OutsideSessionWindowError,
    PayloadTooLargeError,
    Reason,
    RecipientUnreachableError,
    RecordStateError,
    SendDeferredError,
    SendError,
    UnsupportedContentError,
)
from botmesh.journal import MemoryKv, Put
from botmesh.testing import ManualClock, MockProvider, SimulatedCrash, crashable
from tests.kit import make_app, policy, texts


@pytest.mark.crash
async def test_a_message_that_crashes_every_run_is_dead_after_max_attempts() -> None:
    shared, clock = MemoryKv(), ManualClock()
    runs = 0

    def poison_bot() -> Bot:
        bot = Bot("bot", durability=policy(inbox={"max_attempts": 3}))

        @bot.on_message
        async def handler(ctx: Context) -> None:
            nonlocal runs
            runs += 1
            raise SimulatedCrash("during", "handler", 0)  # the process dies in the handler

        return bot

    for _ in range(3):
        with contextlib.suppress(SimulatedCrash):  # the first dies in handle, the next at start
            app = await make_app(kv=crashable(shared), clock=clock, bot=poison_bot())
            await app.runtime.handle(Inbound(id="poison", chat_id="c"))
    assert runs == 3
    bot = poison_bot()
    dead: list[DeadEvent] = []
    bot.on(DeadEvent, dead.append)
    app = await make_app(kv=shared, clock=clock, bot=bot)  # three runs charged: dead-lettered
    assert runs == 3
    [rec] = await app.ops.inbox.list(state="dead")
    assert rec.id == "poison" and rec.error is not None and "3 runs" in rec.error["message"]
    assert rec.error["reason"] == Reason.ATTEMPTS_EXHAUSTED
    assert app.ops.metrics()["inboundDead"] == 1
    assert [(e.kind, e.id, e.reason) for e in dead] == [
        ("inbox", "poison", Reason.ATTEMPTS_EXHAUSTED)
    ]
    assert await app.runtime.handle(Inbound(id="poison", chat_id="c")) == "dead"
    assert runs == 3


async def test_failures_before_the_handlers_back_off_then_dead() -> None:
    app = await make_app(inbox={"max_attempts": 3, "backoff": {"base": "10s", "jitter": 0}})
    clock, key = app.clock, app.engine.in_prefix + "bad"
    dead: list[DeadEvent] = []
    app.bot.on(DeadEvent, dead.append)
    # a journaled record whose message cannot be rebuilt (written by something else)
    bad = {
        "t": "in",
        "id": "bad",
        "state": "pending",
        "attempts": 0,
        "token": 0,
        "lease": None,
        "message": {"kind": "carrier-pigeon"},
        "error": None,
    }
    await app.kv.commit([Put(key, bad, expect=0, due=clock.now())])

    async def attempts_and_due() -> tuple[int, float | None]:
        entry = await app.kv.get(key)
        assert entry is not None and entry.value["state"] == "pending"
        return entry.value["attempts"], entry.due

    await app.ops.sweep_once()
    assert await attempts_and_due() == (1, clock.now() + 10)  # inbox backoff, attempt 1
    await app.ops.sweep_once()
    assert await attempts_and_due() == (1, clock.now() + 10)  # not due yet: not tried
    clock.advance(10)
    await app.ops.sweep_once()
    assert await attempts_and_due() == (2, clock.now() + 20)  # doubled
    clock.advance(20)
    await app.ops.sweep_once()
    rec = await app.ops.inbox.get("bad")
    assert rec is not None and rec.state == "dead" and rec.attempts == 3
    assert rec.error is not None and rec.error["type"] == "ValidationError"
    assert app.ops.metrics()["inboundDead"] == 1
    assert [(e.kind, e.id, e.reason) for e in dead] == [("inbox", "bad", Reason.ATTEMPTS_EXHAUSTED)]


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
    app = await make_app()
    dead: list[DeadEvent] = []
    app.bot.on(DeadEvent, dead.append)
    app.provider.fail_next(error, times=10)
    with pytest.raises(type(error)):
        await app.runtime.send("c", "x", idempotency_key="k")
    assert len(app.provider.calls) == 1
    [rec] = await app.ops.outbox.list(state="dead")
    assert rec.key == "k" and rec.error is not None
    assert rec.error["type"] == type(error).__name__ and rec.error["message"] == str(error)
    assert app.ops.metrics()["outboxDead"] == 1
    assert dead == [DeadEvent("outbox", "k", Reason.SEND_REFUSED, str(error))]


async def test_retries_run_out_then_dead() -> None:
    app = await make_app(outbox={"retries": 2, "inline_max": "1h"})
    dead: list[DeadEvent] = []
    app.bot.on(DeadEvent, dead.append)
    app.provider.fail_next(SendError("down"), times=10)
    with pytest.raises(SendError):
        await app.runtime.send("c", "x", idempotency_key="k")
    assert len(app.provider.calls) == 3  # retries after the first attempt
    rec = await app.ops.outbox.get("k")
    assert rec is not None and rec.state == "dead" and rec.attempts == 3
    assert dead == [DeadEvent("outbox", "k", Reason.RETRIES_EXHAUSTED, "down")]


async def test_a_send_past_inline_max_is_deferred_to_the_sweeper_not_lost() -> None:
    app = await make_app(outbox={"inline_max": "5s", "backoff": {"base": "2s", "jitter": 0}})
    after: list[str] = []
    app.bot.after_send(lambda r: after.append(r.key))
    app.provider.fail_next(SendError("down"), times=3)
    with pytest.raises(SendDeferredError) as info:
        await app.runtime.send("c", "x", idempotency_key="k")
    assert info.value.key == "k"
    assert len(app.provider.calls) == 2  # the 2 s wait fits, the next 4 s would pass 5 s
    rec = await app.ops.outbox.get("k")
    assert rec is not None and rec.state == "failed" and rec.lease_owner is None
    assert app.ops.metrics()["outboxDeferred"] == 1
    assert await app.ops.sweep_once() == 0  # not due yet
    app.clock.advance(4)
    assert await app.ops.sweep_once() == 1  # fails a third time
    app.clock.advance(8)
    assert await app.ops.sweep_once() == 1
    rec = await app.ops.outbox.get("k")
    assert rec is not None and rec.state == "sent" and after == ["k"]


async def test_dead_letters_are_listed_retried_and_discarded() -> None:
    app = await make_app()
    dead: list[DeadEvent] = []
    app.bot.on(DeadEvent, dead.append)
    app.provider.fail_next(UnsupportedContentError("nope"))
    with pytest.raises(UnsupportedContentError):
        await app.runtime.send("c", "x", idempotency_key="k")
    assert dead == [DeadEvent("outbox", "k", Reason.SEND_REFUSED, "nope")]
    assert [r.key for r in await app.ops.outbox.list(state="dead")] == ["k"]
    await app.ops.retry_send("k")
    rec = await app.ops.outbox.get("k")
    assert rec is not None and (rec.state, rec.attempts, rec.error) == ("pending", 0, None)
    await app.ops.drain()
    rec = await app.ops.outbox.get("k")
    assert rec is not None and rec.state == "sent" and len(app.provider.sent) == 1
    with pytest.raises(RecordStateError) as info:
        await app.ops.retry_send("k")  # sent: nothing to retry
    assert info.value.state == "sent"
    await app.ops.outbox.discard("k")
    assert await app.ops.outbox.get("k") is None
    await app.runtime.send("c", "x", idempotency_key="k")  # a discarded key sends again
    assert len(app.provider.sent) == 2
    with pytest.raises(RecordStateError):
        await app.ops.outbox.discard("nope")
    with pytest.raises(RecordStateError):
        await app.ops.retry_send("nope")


async def test_what_cannot_be_journaled_bypasses_the_outbox_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = await make_app(outbox={"max_payload_bytes": 1000})  # no channel text limit
    await app.runtime.send("c", "x" * 2000)  # cannot be split: bypasses whole
    await app.runtime.send("c", "obj", options={"stream": object()})  # not JSON
    assert texts(app.provider) == ["x" * 2000, "obj"]
    assert await app.ops.outbox.list() == []
    assert app.ops.metrics()["outboxBypassed"] == 2
    assert "bypasses the outbox" in caplog.text and "max_payload_bytes=1000" in caplog.text


class FailsEveryOtherCall(MockProvider):
    """Refuses calls 1, 3, 5… (retryable): the first attempt of each send in turn."""

    async def send(self, message: Outbound) -> SendResult:
        if len(self.calls) % 2 == 0:
            self.fail_next(SendError("blip"))
        return await super().send(message)


async def test_a_text_over_max_payload_is_split_first_and_each_part_retried() -> None:
    provider = FailsEveryOtherCall(text_limit=400)
    app = await make_app(provider, outbox={"max_payload_bytes": 1000})
    text = "word " * 300  # 1500 characters: over max_payload_bytes, 4 parts of the channel
    receipt = await app.runtime.send("c", text, idempotency_key="k")
    assert receipt.key == "k" and receipt.state == "sent"
    assert "".join(t or "" for t in texts(provider)) == text
    recs = {r.key: r for r in await app.ops.outbox.list()}
    assert sorted(recs) == ["k", "k#2", "k#3", "k#4"]
    assert {(r.state, r.attempts) for r in recs.values()} == {("sent", 2)}  # each retried
    assert len(provider.calls) == 8
    m = app.ops.metrics()
    assert (m["outboxBypassed"], m["outboxRetried"], m["outboxJournaled"]) == (0, 4, 1)


async def test_media_rides_on_part_1_only() -> None:
    app = await make_app(MockProvider(text_limit=5))
    photo = Media(url="https://example.org/p.png", mime="image/png")
    await app.runtime.send("c", "aaaa bbbb cccc", media=photo, idempotency_key="k")
    assert [(m.text, m.media) for m in app.provider.sent] == [
        ("aaaa ", photo),
        ("bbbb ", None),
        ("cccc", None),
    ]
    recs = {r.key: r for r in await app.ops.outbox.list()}
    assert recs["k"].payload["media"]["url"] == photo.url
    assert recs["k#2"].payload.get("media") is None and recs["k#3"].payload.get("media") is None


async def test_a_part_1_too_big_to_journal_bypasses_and_the_other_parts_are_journaled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = await make_app(MockProvider(text_limit=5), outbox={"max_payload_bytes": 1000})
    big = Media(data=b"\x00" * 2000, mime="image/png")  # inline bytes: about 2.7 kB of JSON
    receipt = await app.runtime.send("c", "aaaa bbbb cccc", media=big, idempotency_key="k")
    assert receipt.key == "k" and receipt.part == 1 and receipt.state == "sent"
    assert [(m.text, m.media) for m in app.provider.sent] == [
        ("aaaa ", big),
        ("bbbb ", None),
        ("cccc", None),
    ]
    recs = {r.key: r for r in await app.ops.outbox.list()}
    assert sorted(recs) == ["k#2", "k#3"]  # part 1 bypassed, parts 2 and 3 journaled
    assert {r.state for r in recs.values()} == {"sent"}
    assert recs["k#3"].previous_part == "k#2"
    assert app.ops.metrics()["outboxBypassed"] == 1
    assert "bypasses the outbox" in caplog.text
