"""The engine on every journal backend of ``tests/backends.py``: its behaviour must not
depend on the journal it runs on (a new backend joins with one registry line)."""

from __future__ import annotations

import pytest

from botmesh import Bot, Context, Inbound, Outcome
from botmesh.errors import SendDeferredError, SendError
from botmesh.journal import DurableKv, Write
from botmesh.testing import ManualClock, MockProvider, SimulatedCrash, crashable
from tests.backends import BackendHandle
from tests.kit import App, make_app, policy, texts


async def _app(kv: DurableKv, clock: ManualClock, provider: MockProvider, **outbox: object) -> App:
    bot = Bot("conf", durability=policy(retention="1d", outbox=outbox))

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply(f"re {ctx.text} and more")
        await ctx.enqueue(ctx.chat_id, "later")

    return await make_app(provider, kv=kv, clock=clock, bot=bot, instance_id="conf")


async def test_journal_dedupe_and_restart(backend: BackendHandle) -> None:
    assert backend.kv is not None
    clock, provider = ManualClock(), MockProvider(text_limit=8)
    app = await _app(backend.kv, clock, provider)
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c", text="hi")) == Outcome.HANDLED
    await app.ops.drain()
    sent = texts(provider)
    assert sent == ["re hi ", "and more", "later"]
    kv = await backend.reopen()  # a restart on the same data
    again = await _app(kv, clock, provider)
    redelivered = await again.runtime.handle(Inbound(id="m1", chat_id="c", text="hi"))
    assert redelivered == Outcome.DUPLICATE and texts(provider) == sent
    assert again.ops.metrics()["inboundDuplicates"] == 1
    states = {r.key: r.state for r in await again.ops.outbox.list()}
    assert states == {"m1:1": "sent", "m1:1#2": "sent", "m1:2": "sent"}
    clock.advance(86401)
    # retention: 1 inbox + 3 outbox records, and the chat's turn on a shared journal
    turn = int(again.engine.turns is not None)
    assert await again.ops.sweep_once() == 4 + turn
    assert await again.ops.outbox.list() == [] and await again.ops.inbox.list() == []


async def test_a_deferred_send_survives_a_restart(backend: BackendHandle) -> None:
    assert backend.kv is not None
    clock, provider = ManualClock(), MockProvider()
    provider.fail_next(SendError("down"), times=2)
    app = await _app(backend.kv, clock, provider, inline_max=0)
    with pytest.raises(SendDeferredError):
        await app.runtime.send("c", "important", idempotency_key="k")
    kv = await backend.reopen()
    again = await _app(kv, clock, provider)
    for _ in range(3):
        clock.advance(10)
        await again.ops.sweep_once()
    rec = await again.ops.outbox.get("k")
    assert rec is not None and (rec.state, rec.attempts) == ("sent", 3)
    assert texts(provider) == ["important"]


@pytest.mark.crash
async def test_an_unfinished_inbound_is_replayed_after_a_restart(backend: BackendHandle) -> None:
    assert backend.kv is not None
    clock, provider = ManualClock(), MockProvider(text_limit=100)
    a = crashable(backend.kv)
    a.crash_before(Write.INBOX_MARK_DONE)
    app = await _app(a, clock, provider)
    with pytest.raises(SimulatedCrash):
        await app.runtime.handle(Inbound(id="m1", chat_id="c", text="hi"))
    kv = await backend.reopen()
    again = await _app(kv, clock, provider)
    await again.ops.drain()
    assert texts(provider) == ["re hi and more", "later"]
    rec = await again.ops.inbox.get("m1")
    assert rec is not None and (rec.state, rec.attempts) == ("done", 2)
    assert again.ops.metrics()["outboxDeduped"] == 2  # both sends answered from the outbox
