"""KvDurability on every backend of ``tests/backends.py``: the engine's behaviour must not
depend on the journal it runs on (a new backend joins with one registry line)."""

from __future__ import annotations

import pytest

from botmesh import Bot, Inbound, MockProvider, SendDeferredError, SendError
from botmesh.testing import ManualClock
from tests.backends import BackendHandle
from tests.core.helpers import durable


def _bot(
    kv: object, clock: ManualClock, provider: MockProvider | None = None, **outbox: object
) -> Bot:
    bot = Bot(
        provider or MockProvider(text_limit=8),
        durability={
            "backend": kv,
            "instance_id": "conf",
            "poll": 0,
            "retention": "1d",
            "outbox": {"backoff": {"jitter": 0}, **outbox},
        },
        clock=clock,
    )

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        await ctx.reply(f"re {ctx.text} and more")
        await bot.enqueue(ctx.chat_id, "later")

    return bot


async def test_journal_dedupe_and_restart(backend: BackendHandle) -> None:
    clock = ManualClock()
    provider = MockProvider(text_limit=8)
    bot = _bot(backend.kv, clock, provider)
    await bot.start()
    await bot.handle(Inbound("m1", "c", "hi"))
    await durable(bot.durability).drain()
    sent = [m.text for m in provider.sent]
    assert sent == ["re hi ", "and more", "later"]
    kv = await backend.reopen()  # a restart on the same data
    again = _bot(kv, clock, provider)
    await again.start()
    d = durable(again.durability)
    await again.handle(Inbound("m1", "c", "hi"))  # redelivered after the restart
    assert [m.text for m in provider.sent] == sent
    assert d.metrics()["inboundDuplicates"] == 1
    states = {r.key: r.state for r in await d.outbox.list()}
    assert states == {"m1:1": "sent", "m1:1#2": "sent", "m1:2": "sent"}
    clock.advance(86401)
    assert await d.sweep_once() == 4  # retention: 1 inbox + 3 outbox records
    assert await d.outbox.list() == [] and await d.inbox.list() == []


async def test_deferred_send_survives_a_restart(backend: BackendHandle) -> None:
    clock = ManualClock()
    provider = MockProvider()
    provider.fail_next(SendError("down"), times=2)
    bot = _bot(backend.kv, clock, provider, inline_max=0)
    await bot.start()
    with pytest.raises(SendDeferredError):
        await bot.send("c", "important", idempotency_key="k")
    kv = await backend.reopen()
    again = _bot(kv, clock, provider)
    await again.start()
    d = durable(again.durability)
    for _ in range(3):
        clock.advance(10)
        await d.sweep_once()
    rec = await d.outbox.get("k")
    assert rec is not None and (rec.state, rec.attempts) == ("sent", 3)
    assert [m.text for m in provider.sent] == ["important"]


async def test_unfinished_inbound_replayed_after_restart(backend: BackendHandle) -> None:
    from botmesh.testing import SimulatedCrash, crashable

    clock = ManualClock()
    provider = MockProvider(text_limit=100)
    a = crashable(backend.kv)  # type: ignore[arg-type]
    a.crash_before("inbox.mark_done")
    bot = _bot(a, clock, provider)
    await bot.start()
    with pytest.raises(SimulatedCrash):
        await bot.handle(Inbound("m1", "c", "hi"))
    kv = await backend.reopen()
    again = _bot(kv, clock, provider)
    await again.start()
    d = durable(again.durability)
    await d.drain()
    assert [m.text for m in provider.sent] == ["re hi and more", "later"]
    rec = await d.inbox.get("m1")
    assert rec is not None and (rec.state, rec.attempts) == ("done", 2)
    assert d.metrics()["outboxDeduped"] == 2  # both sends answered from the outbox
