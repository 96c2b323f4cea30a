"""What ``Runtime.handle()`` returns: an ``Outcome`` the worker may acknowledge (handled,
duplicate, dead, fenced, unjournaled, replayed, deferred), or an error it must not (``BadRecord``,
``JournalUnavailableError``: see ``tests/invariants/test_fail_closed.py``)."""

from __future__ import annotations

import asyncio

import pytest

from botmesh import Bot, Context, ErrorEvent, Inbound, Outcome
from botmesh.errors import BadRecord, FencedError, Reason
from botmesh.journal import MemoryKv
from botmesh.testing import ManualClock, MockProvider, SimulatedCrash, crashable
from tests.kit import FrozenProvider, make_app, policy, texts


def test_the_outcomes() -> None:
    assert [o.value for o in Outcome] == [
        "handled",
        "duplicate",
        "dead",
        "fenced",
        "unjournaled",
        "replayed",
        "deferred",
    ]


async def test_handled_then_a_redelivery_is_a_duplicate_while_the_record_exists() -> None:
    runs: list[str] = []
    bot = Bot("bot", durability=policy(retention="1h"))

    @bot.on_message
    async def handler(ctx: Context) -> None:
        runs.append(ctx.inbound_id)
        await ctx.reply("hello")

    app = await make_app(bot=bot)
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c")) == Outcome.HANDLED
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c")) == Outcome.DUPLICATE
    assert runs == ["m1"] and app.ops.metrics()["inboundDuplicates"] == 1
    app.clock.advance(3601)
    assert await app.ops.sweep_once() == 2  # inbox and outbox records purged
    # the record is gone: a redelivery now is processed again
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c")) == Outcome.HANDLED
    assert runs == ["m1", "m1"] and len(app.provider.sent) == 2


async def test_a_done_message_from_the_same_source_is_replayed_from_another_a_duplicate() -> None:
    """An offset replay (the same record read again at the same place) runs the handlers
    again with every send answered from the outbox and its receipt published again; the
    same message read at another place (produced twice) runs nothing."""
    from tests.kit import ListSink

    runs: list[str] = []
    sink = ListSink()
    bot = Bot("bot", durability=policy())

    @bot.on_message
    async def handler(ctx: Context) -> None:
        runs.append(ctx.inbound_id)
        await ctx.reply("hello")
        await ctx.reply("again")

    app = await make_app(bot=bot, receipts=sink)
    message = Inbound(id="m1", chat_id="c")
    handle = app.runtime.handle
    assert await handle(message, source="in:0:7") == Outcome.HANDLED
    assert await handle(message, source="in:0:7") == Outcome.REPLAYED
    assert await handle(message, source="in:0:7") == Outcome.REPLAYED
    assert await handle(message, source="in:1:3") == Outcome.DUPLICATE
    assert await handle(message) == Outcome.DUPLICATE
    assert runs == ["m1"] * 3
    assert texts(app.provider) == ["hello", "again"]  # sent once
    assert sink.keys("sent") == ["m1:1", "m1:2"] * 3  # receipts published again per replay
    m = app.ops.metrics()
    assert (m["inboundReplayed"], m["inboundDuplicates"], m["outboxDeduped"]) == (2, 2, 4)
    [record] = await app.ops.inbox.list()
    assert (record.state, record.attempts) == ("done", 1)  # a replay writes nothing
    await app.stop()


async def test_the_same_id_while_it_is_in_flight_is_a_duplicate() -> None:
    gate = asyncio.Event()
    runs = 0
    bot = Bot("bot", durability=policy())

    @bot.on_message
    async def handler(ctx: Context) -> None:
        nonlocal runs
        runs += 1
        await gate.wait()

    app = await make_app(bot=bot)
    first = asyncio.create_task(app.runtime.handle(Inbound(id="m1", chat_id="c")))
    await asyncio.sleep(0)
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c")) == Outcome.DUPLICATE
    gate.set()
    assert await first == Outcome.HANDLED
    assert runs == 1 and app.ops.metrics()["inboundDuplicates"] == 1


@pytest.mark.crash
async def test_a_redelivery_of_a_dead_letter_is_dead() -> None:
    shared, clock = MemoryKv(), ManualClock()
    runs = 0
    bot = Bot("bot", durability=policy(inbox={"max_attempts": 1}))

    @bot.on_message
    async def handler(ctx: Context) -> None:
        nonlocal runs
        runs += 1
        raise SimulatedCrash("during", "handler", 0)  # the process dies in the handler

    first = await make_app(kv=crashable(shared), clock=clock, bot=bot)
    with pytest.raises(SimulatedCrash):
        await first.runtime.handle(Inbound(id="m", chat_id="c"))
    again = await make_app(kv=shared, clock=clock, bot=bot)  # its one run is charged: dead
    assert [r.id for r in await again.ops.inbox.list(state="dead")] == ["m"]
    assert await again.runtime.handle(Inbound(id="m", chat_id="c")) == Outcome.DEAD
    assert runs == 1


async def test_a_record_another_holder_took_over_is_fenced() -> None:
    shared, clock = MemoryKv(), ManualClock()
    frozen = FrozenProvider()
    bot = Bot("bot", durability=policy())
    errors: list[ErrorEvent] = []
    bot.on(ErrorEvent, errors.append)

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply(f"re {ctx.text}")

    a = await make_app(frozen, kv=shared, clock=clock, bot=bot, instance_id="a")
    b = await make_app(MockProvider(), kv=shared, clock=clock, bot=bot, instance_id="b")
    task = asyncio.create_task(a.runtime.handle(Inbound(id="m", chat_id="c", text="hi")))
    await frozen.entered.wait()
    clock.advance(61)  # A looks dead: B takes the inbound (and resolves A's send)
    await b.ops.drain()
    frozen.thaw.set()
    assert await task == Outcome.FENCED
    assert any(isinstance(e.error, FencedError) for e in errors)
    rec = await b.ops.inbox.get("m")
    assert rec is not None and rec.state == "done" and rec.token == 2
    assert texts(b.provider) == []  # A's reply was in flight: unknown, never sent twice


async def test_an_inbound_without_an_id_is_a_bad_record() -> None:
    app = await make_app(reply="never")
    with pytest.raises(BadRecord) as info:
        await app.runtime.handle(Inbound(chat_id="c", text="no id"))
    assert info.value.reason == Reason.WRONG_TYPE and "id" in str(info.value)
    assert app.provider.calls == [] and await app.ops.inbox.list() == []
