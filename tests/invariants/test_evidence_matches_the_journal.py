"""Invariant 9, evidence matches the journal: every settled send has its receipt (at least
once, keyed by idempotency key), and every dead record has its dead letter."""

from __future__ import annotations

import contextlib

import pytest

from botmesh import Bot, Context, DeadEvent, Inbound
from botmesh.errors import Reason, SendError, UnsupportedContentError
from botmesh.journal import MemoryKv, Write
from botmesh.testing import CrashableProvider, ManualClock, MockProvider, SimulatedCrash, crashable
from tests.kit import App, ListSink, make_app, policy


async def _journal_states(app: App) -> dict[str, str]:
    return {r.key: r.state for r in await app.ops.outbox.list()}


async def _published(app: App) -> dict[str, bool]:
    return {r.key: r.published for r in await app.ops.outbox.list()}


@pytest.mark.crash
async def test_every_settled_send_has_its_receipt_in_its_state() -> None:
    shared, clock, sink = MemoryKv(), ManualClock(), ListSink()
    a = crashable(shared)
    channel = MockProvider(text_limit=5)
    first = await make_app(CrashableProvider(a, channel), kv=a, clock=clock, receipts=sink)
    await first.runtime.send("c", "aaaa bbbb", idempotency_key="ok")  # two parts
    channel.fail_next(UnsupportedContentError("no"))
    with pytest.raises(UnsupportedContentError):
        await first.runtime.send("c", "nope", idempotency_key="dead")
    a.crash_before(Write.OUTBOX_MARK_SENT, 3)  # in the ambiguous window of "lost"
    with pytest.raises(SimulatedCrash):
        await first.runtime.send("c", "lost", idempotency_key="lost")

    again = await make_app(channel, kv=shared, clock=clock, receipts=sink)  # recovers
    publisher = again.engine.publisher
    assert publisher is not None
    await publisher.flush()
    states = await _journal_states(again)
    assert states == {"ok": "sent", "ok#2": "sent", "dead": "dead", "lost": "unknown"}
    assert {(r.key, r.state) for r in sink.receipts} == set(states.items())
    by_key = {r.key: r for r in sink.receipts}
    assert (by_key["ok#2"].part, by_key["ok#2"].chat_id) == (2, "c")
    assert by_key["ok"].message_id == channel.calls[0].message_id
    assert await _published(again) == dict.fromkeys(states, True)


async def test_a_receipt_is_recorded_published_once_the_sink_acknowledged_it() -> None:
    sink = ListSink(hold=True)
    app = await make_app(receipts=sink)
    await app.runtime.send("c", "x", idempotency_key="k")
    assert sink.keys("sent") == ["k"]
    await app.ops.sweep_once()
    assert await _published(app) == {"k": False}  # handed over, not acknowledged
    sink.acks[0].set_result(None)
    publisher = app.engine.publisher
    assert publisher is not None
    assert await publisher.flush() == 1
    assert await _published(app) == {"k": True}


async def test_receipts_never_acknowledged_are_published_again_at_the_next_start() -> None:
    shared, clock = MemoryKv(), ManualClock()
    held = ListSink(hold=True)
    app = await make_app(kv=shared, clock=clock, receipts=held, reply="hello")
    await app.runtime.handle(Inbound(id="m", chat_id="c"))
    await app.runtime.send("c", "x", idempotency_key="k")
    await app.ops.drain()
    assert sorted(held.keys()) == ["k", "m:1"]
    assert await _published(app) == {"k": False, "m:1": False}
    # the process dies with the receipts in flight; the same instance starts again
    sink = ListSink()
    again = await make_app(kv=shared, clock=clock, receipts=sink)
    assert sorted((r.key, r.state) for r in sink.receipts) == [("k", "sent"), ("m:1", "sent")]
    publisher = again.engine.publisher
    assert publisher is not None
    await publisher.flush()
    assert await _published(again) == {"k": True, "m:1": True}


async def test_a_refused_receipt_stays_unpublished_and_a_later_sweep_publishes_it_again() -> None:
    sink = ListSink(refuse=ConnectionError("broker gone"))
    app = await make_app(receipts=sink)
    await app.runtime.send("c", "x", idempotency_key="k")
    publisher = app.engine.publisher
    assert publisher is not None
    assert await publisher.flush() == 0
    assert await _published(app) == {"k": False}
    await app.ops.sweep_once()
    assert sink.keys() == ["k"]  # not due again yet
    sink.refuse = None
    app.clock.advance(61)  # past its due (the outbox lease)
    await app.ops.sweep_once()
    assert sink.keys() == ["k", "k"]  # at least once: consumers drop copies by key
    await publisher.flush()
    assert await _published(app) == {"k": True}


async def test_a_bypassed_send_gets_its_receipt_once() -> None:
    sink = ListSink()
    app = await make_app(receipts=sink, outbox={"max_payload_bytes": 100})
    receipt = await app.runtime.send("c", "x" * 500, idempotency_key="big")
    await app.ops.drain()
    publisher = app.engine.publisher
    assert publisher is not None
    await publisher.flush()
    app.clock.advance(3600)
    await app.ops.drain()
    assert [(r.key, r.state) for r in sink.receipts] == [("big", "sent")]
    assert sink.receipts[0].message_id == receipt.message_id
    assert await app.ops.outbox.list() == [] and app.ops.metrics()["outboxBypassed"] == 1


async def test_a_sent_record_is_kept_past_retention_until_its_receipt_is_published() -> None:
    sink = ListSink(hold=True)
    app = await make_app(receipts=sink, retention="1m")
    await app.runtime.send("c", "x", idempotency_key="k")
    app.clock.advance(120)
    await app.ops.sweep_once()
    assert await _journal_states(app) == {"k": "sent"}  # its receipt is not acknowledged
    for ack in sink.acks:
        ack.set_result(None)
    publisher = app.engine.publisher
    assert publisher is not None
    await publisher.flush()
    await app.ops.sweep_once()
    assert await _journal_states(app) == {}


@pytest.mark.crash
async def test_every_dead_record_has_its_dead_letter() -> None:
    bot = Bot("bot", durability=policy(outbox={"retries": 1}, inbox={"max_attempts": 1}))
    dead: list[DeadEvent] = []
    bot.on(DeadEvent, dead.append)

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("re")

    app = await make_app(MockProvider(text_limit=5), bot=bot)
    app.provider.fail_next(UnsupportedContentError("no"))
    with contextlib.suppress(UnsupportedContentError):
        await app.runtime.send("c", "aaaa bbbb", idempotency_key="split")
    app.provider.fail_next(SendError("down"), times=2)
    with contextlib.suppress(SendError):
        await app.runtime.send("c", "x", idempotency_key="tired")
    # an inbound whose run never completed, with its one attempt charged
    crashing = crashable(app.kv)
    crashing.crash_before(Write.INBOX_MARK_DONE)
    zombie = await make_app(kv=crashing, clock=app.clock, bot=bot, instance_id="z")
    with pytest.raises(SimulatedCrash):
        await zombie.runtime.handle(Inbound(id="m", chat_id="c"))
    app.clock.advance(61)
    await app.ops.drain()

    journal = {
        ("outbox", r.key, (r.error or {}).get("reason")) for r in await app.ops.outbox.list("dead")
    }
    journal |= {
        ("inbox", r.id, (r.error or {}).get("reason")) for r in await app.ops.inbox.list("dead")
    }
    assert journal == {
        ("outbox", "split", Reason.SEND_REFUSED),
        ("outbox", "split#2", Reason.PREVIOUS_PART_DEAD),
        ("outbox", "tired", Reason.RETRIES_EXHAUSTED),
        ("inbox", "m", Reason.ATTEMPTS_EXHAUSTED),
    }
    assert sorted((e.kind, e.id, e.reason) for e in dead) == sorted(journal)  # one each
    m = app.ops.metrics()
    assert (m["outboxDead"], m["inboundDead"]) == (3, 1)
