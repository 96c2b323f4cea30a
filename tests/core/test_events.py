"""Events are typed: one class each, with typed fields (``DeadEvent.reason`` is a
``Reason``, ``AmbiguousEvent.resent``, ``ErrorEvent.where``, ``SentEvent.background``)."""

from __future__ import annotations

import pytest

from botmesh import AmbiguousEvent, Bot, Context, DeadEvent, ErrorEvent, Inbound, Outcome, SentEvent
from botmesh.errors import Reason, SendError, UnsupportedContentError
from botmesh.journal import MemoryKv, Write
from botmesh.testing import ManualClock, SimulatedCrash, crashable
from tests.kit import make_app, policy


def test_events_keep_the_reference_names() -> None:
    names = [e.name for e in (SentEvent, DeadEvent, AmbiguousEvent, ErrorEvent)]
    assert names == ["sent", "durability:dead", "durability:ambiguous", "error"]


async def test_a_handler_that_raises_is_reported_not_retried_and_acknowledged() -> None:
    bot = Bot("bot", durability=policy())
    errors: list[ErrorEvent] = []
    bot.on(ErrorEvent, errors.append)
    runs = 0

    @bot.on_message
    async def handler(ctx: Context) -> None:
        nonlocal runs
        runs += 1
        raise RuntimeError("boom")

    app = await make_app(bot=bot)
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c")) == Outcome.HANDLED
    app.clock.advance(3600)
    await app.ops.drain()
    rec = await app.ops.inbox.get("m1")
    assert rec is not None and rec.state == "done"
    assert runs == 1
    [event] = errors
    assert (event.where, event.inbound_id, str(event.error)) == ("handler", "m1", "boom")
    assert isinstance(event.error, RuntimeError)


async def test_dead_events_carry_a_reason() -> None:
    app = await make_app(outbox={"retries": 0})
    dead: list[DeadEvent] = []
    app.bot.on(DeadEvent, dead.append)
    app.provider.fail_next(UnsupportedContentError("no"))
    with pytest.raises(UnsupportedContentError):
        await app.runtime.send("c", "x", idempotency_key="a")
    app.provider.fail_next(SendError("down"))
    with pytest.raises(SendError):
        await app.runtime.send("c", "y", idempotency_key="b")
    assert [(e.kind, e.id, e.reason, e.error) for e in dead] == [
        ("outbox", "a", Reason.SEND_REFUSED, "no"),
        ("outbox", "b", Reason.RETRIES_EXHAUSTED, "down"),
    ]
    assert all(type(e.reason) is Reason for e in dead)


async def test_sent_events_say_whether_the_sweeper_delivered() -> None:
    app = await make_app()
    sent: list[SentEvent] = []
    app.bot.on(SentEvent, sent.append)
    inline = await app.runtime.send("c", "now", idempotency_key="a")
    await app.runtime.enqueue("c", "later", idempotency_key="b")
    await app.ops.drain()
    assert [(e.receipt.key, e.receipt.state, e.background) for e in sent] == [
        ("a", "sent", False),
        ("b", "sent", True),
    ]
    assert sent[0].receipt == inline


@pytest.mark.crash
@pytest.mark.parametrize("on_ambiguous", ["skip", "resend"])
async def test_ambiguous_events_say_whether_the_send_went_again(on_ambiguous: str) -> None:
    shared, clock = MemoryKv(), ManualClock()
    a = crashable(shared)
    a.crash_after(Write.OUTBOX_JOURNAL)
    first = await make_app(kv=a, clock=clock)
    with pytest.raises(SimulatedCrash):
        await first.runtime.send("c", "x", idempotency_key="k")
    bot = Bot("bot", durability=policy(outbox={"on_ambiguous": on_ambiguous}))
    events: list[AmbiguousEvent] = []
    bot.on(AmbiguousEvent, events.append)
    await make_app(kv=shared, clock=clock, bot=bot)
    assert events == [AmbiguousEvent(key="k", chat_id="c", resent=on_ambiguous == "resend")]
