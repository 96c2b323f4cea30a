"""Invariant 7, fail closed by default: an inbound that cannot be journaled is not
dispatched, and the refusal is an error the caller sees (``JournalUnavailableError``: do
not acknowledge it), never a normal return."""

from __future__ import annotations

import pytest

from botmesh import Bot, Context, ErrorEvent, Inbound, Outcome
from botmesh.errors import JournalUnavailableError
from botmesh.journal import MemoryKv, Write
from botmesh.testing import FaultyKv, crashable
from tests.kit import App, make_app, policy, texts


async def _counting_app(kv: FaultyKv, **options: object) -> tuple[App, list[str]]:
    """A runtime on ``kv`` whose handler counts its runs and replies once."""
    bot = Bot("bot", durability=policy(**options))
    runs: list[str] = []

    @bot.on_message
    async def handler(ctx: Context) -> None:
        runs.append(ctx.inbound_id)
        await ctx.reply("hi")

    return await make_app(kv=kv, bot=bot), runs


async def test_an_inbound_that_cannot_be_journaled_is_refused_not_dispatched() -> None:
    kv = crashable(MemoryKv())
    app, runs = await _counting_app(kv)
    errors: list[ErrorEvent] = []
    app.bot.on(ErrorEvent, errors.append)
    kv.fail(Write.INBOX_JOURNAL)
    with pytest.raises(JournalUnavailableError):
        await app.runtime.handle(Inbound(id="m1", chat_id="c"))
    assert runs == [] and app.provider.calls == [] and errors == []
    # the refusal left nothing behind: the redelivery is processed
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c")) == Outcome.HANDLED
    assert runs == ["m1"] and app.ops.metrics()["inboundDuplicates"] == 0


async def test_while_the_journal_is_down_nothing_runs_and_then_it_runs_once() -> None:
    kv = crashable(MemoryKv())
    app, runs = await _counting_app(kv)
    kv.down = True
    for _ in range(3):  # the worker keeps retrying while the journal is down
        with pytest.raises(JournalUnavailableError):
            await app.runtime.handle(Inbound(id="m1", chat_id="c"))
    assert runs == [] and app.provider.calls == []
    assert await app.ops.inbox.list() == [] and await app.ops.outbox.list() == []
    kv.down = False
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c")) == Outcome.HANDLED
    assert runs == ["m1"] and texts(app.provider) == ["hi"]
    rec = await app.ops.inbox.get("m1")
    assert rec is not None and (rec.state, rec.attempts) == ("done", 1)


async def test_fail_open_dispatches_without_the_journal_and_says_so() -> None:
    kv = crashable(MemoryKv())
    app, runs = await _counting_app(kv, fail_open=True)
    errors: list[ErrorEvent] = []
    app.bot.on(ErrorEvent, errors.append)
    kv.down = True
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c")) == Outcome.UNJOURNALED
    assert runs == ["m1"] and texts(app.provider) == ["hi"]
    assert [(type(e.error), e.where, e.inbound_id) for e in errors] == [
        (JournalUnavailableError, "inbox.journal", "m1")
    ]
    assert app.ops.metrics()["outboxBypassed"] == 1  # its reply went out unjournaled, counted
    kv.down = False
    assert await app.ops.inbox.list() == []


async def test_handled_but_not_marked_done_raises_and_a_retry_settles_it_without_rerunning() -> (
    None
):
    kv = crashable(MemoryKv())
    app, runs = await _counting_app(kv)
    kv.fail(Write.INBOX_MARK_DONE)
    with pytest.raises(JournalUnavailableError, match="handled but not marked done"):
        await app.runtime.handle(Inbound(id="m1", chat_id="c"))
    rec = await app.ops.inbox.get("m1")
    assert rec is not None and rec.state == "pending"
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c")) == Outcome.HANDLED
    assert runs == ["m1"] and texts(app.provider) == ["hi"]  # the handler did not run again
    rec = await app.ops.inbox.get("m1")
    assert rec is not None and rec.state == "done" and rec.attempts == 1
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c")) == Outcome.DUPLICATE


async def test_a_send_the_journal_refused_keeps_its_inbound_pending_and_a_retry_sends_it() -> None:
    """A handler whose send could not be journaled (so was not made) failed for the journal,
    not for itself: the inbound is not marked done (that would lose the reply) but raises,
    and the transport's retry runs the handler again and sends once."""
    kv = crashable(MemoryKv())
    app, runs = await _counting_app(kv)
    kv.fail(Write.OUTBOX_JOURNAL)
    with pytest.raises(JournalUnavailableError):
        await app.runtime.handle(Inbound(id="m1", chat_id="c"))
    rec = await app.ops.inbox.get("m1")
    assert rec is not None and rec.state == "pending"
    assert runs == ["m1"] and app.provider.calls == []
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c")) == Outcome.HANDLED
    assert runs == ["m1", "m1"] and texts(app.provider) == ["hi"]
    rec = await app.ops.inbox.get("m1")
    assert rec is not None and rec.state == "done"


async def test_handled_but_not_marked_done_and_never_redelivered_is_replayed_by_the_sweeper() -> (
    None
):
    kv = crashable(MemoryKv())
    app, runs = await _counting_app(kv)
    kv.fail(Write.INBOX_MARK_DONE)
    with pytest.raises(JournalUnavailableError):
        await app.runtime.handle(Inbound(id="m1", chat_id="c"))
    app.clock.advance(61)
    await app.ops.drain()  # the lease ran out: run again, its reply answered from the outbox
    rec = await app.ops.inbox.get("m1")
    assert rec is not None and rec.state == "done"
    assert runs == ["m1", "m1"] and texts(app.provider) == ["hi"]
    assert app.ops.metrics()["outboxDeduped"] == 1
    late = await app.runtime.handle(Inbound(id="m1", chat_id="c"))  # a late redelivery
    assert late == Outcome.DUPLICATE and app.ops.metrics()["staleLeases"] == 0
    assert runs == ["m1", "m1"] and texts(app.provider) == ["hi"]


async def test_a_send_that_cannot_be_journaled_is_refused_before_the_provider() -> None:
    kv = crashable(MemoryKv())
    app, _ = await _counting_app(kv)
    kv.down = True
    with pytest.raises(JournalUnavailableError):
        await app.runtime.send("c", "x", idempotency_key="k")
    with pytest.raises(JournalUnavailableError):
        await app.runtime.enqueue("c", "y", idempotency_key="k2")
    assert app.provider.calls == []
    kv.down = False
    assert await app.ops.outbox.list() == []
