"""After the send: channels' status webhooks change a sent send's delivery state, a failure
after a 200 acts (its fallback once, else a dead letter with the channel's code), and
edits and deletes address a send by its key, journaled so a replay changes nothing twice.

The engine on the memory journal with the mock channel (it edits, deletes and records
typing); statuses are fed as the Kafka worker feeds ``<prefix>.statuses``
(``Runtime.delivery_status``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from botmesh import Bot, Context, DeadEvent, Fallback, FallbackEvent, Runtime
from botmesh.journal import MemoryKv, Write
from botmesh.state.errors import (
    OutsideSessionWindowError,
    Reason,
    RecordStateError,
    SendError,
    UnsupportedContentError,
)
from botmesh.state.messages import DeliveryStatus, Inbound, Outbound, SendResult
from botmesh.testing import ManualClock, MockProvider, SimulatedCrash, crashable
from tests.kit import ListSink, make_app, policy, settle

TEMPLATE = Fallback.template("order_update", "en")


class Channel(MockProvider):
    """The mock channel of a channel with status webhooks, mapping a ``failed`` status's
    code as WhatsApp's adapter does."""

    def __init__(self) -> None:
        super().__init__(delivery_statuses=True)

    def delivery_error(self, status: DeliveryStatus) -> SendError:
        if status.code == "131047":
            return OutsideSessionWindowError(f"{self.name}: {status.code} {status.error}")
        return SendError(f"{self.name}: {status.code}", retryable=False)


class SendsOnly:
    """A channel whose API can only send."""

    name = "plain"
    text_limit = None

    async def send(self, message: Outbound) -> SendResult:
        return SendResult("p-1")


@dataclass(frozen=True)
class Status:
    """A status webhook of the mock channel, as ``Runtime.delivery_status`` takes it."""

    message_id: str
    status: str
    chat: str = "c"
    code: str | None = None


def _status(message_id: str, status: str, *, chat: str = "c", code: str | None = None) -> Status:
    return Status(message_id, status, chat, code)


async def _apply(runtime: Runtime, status: Status) -> str:
    error = "Re-engagement message" if status.code == "131047" else None
    return await runtime.delivery_status(
        status.chat, status.message_id, status.status, channel="mock", code=status.code, error=error
    )


def _bot(events: list[Any]) -> Bot:
    bot = Bot("bot", durability=policy())
    bot.on(FallbackEvent, events.append)
    bot.on(DeadEvent, events.append)
    return bot


async def test_receipts_follow_sent_delivered_read_and_copies_change_nothing() -> None:
    sink = ListSink()
    app = await make_app(Channel(), receipts=sink)
    receipt = await app.runtime.send("c", "hello", idempotency_key="k")
    mid = receipt.message_id
    assert mid is not None
    assert await _apply(app.runtime, _status(mid, "sent")) == "unchanged"  # no news after the 200
    assert await _apply(app.runtime, _status(mid, "delivered")) == "delivered"
    assert (
        await _apply(app.runtime, _status(mid, "delivered")) == "unchanged"
    )  # the channel retried
    assert await _apply(app.runtime, _status(mid, "read")) == "read"
    assert await _apply(app.runtime, _status(mid, "delivered")) == "unchanged"  # overtaken
    assert [(r.key, r.state, r.delivery) for r in sink.receipts] == [
        ("k", "sent", None),
        ("k", "sent", "delivered"),
        ("k", "sent", "read"),
    ]
    [record] = await app.ops.outbox.list()
    assert record.state == "sent" and record.message_id == mid
    metrics = app.ops.metrics()
    assert (metrics["deliveryUpdates"], metrics["deliveryUnchanged"]) == (2, 3)


async def test_a_status_the_journal_does_not_hold_is_counted_and_dropped() -> None:
    app = await make_app(Channel())
    receipt = await app.runtime.send("c", "hello", idempotency_key="k")
    assert receipt.message_id is not None
    assert await _apply(app.runtime, _status("someone-else", "read")) == "unmatched"
    # the chat as the channel writes it need not be the send's: the message id decides
    other = _status(receipt.message_id, "delivered", chat="whatsapp:c")
    assert await _apply(app.runtime, other) == "delivered"
    # past retention the send is purged, and so is its name under the message id
    app.clock.advance(8 * 86400)
    assert await app.engine.retention.purge(app.clock.now()) == 1  # the record; its name too
    assert await app.kv.get(app.engine.keys.mid_of(receipt.message_id)) is None
    late = _status(receipt.message_id, "read")
    assert await _apply(app.runtime, late) == "unmatched"
    assert app.ops.metrics()["deliveryUnmatched"] == 2


async def test_a_failure_after_the_200_without_a_fallback_is_dead_with_the_code() -> None:
    events: list[Any] = []
    sink = ListSink()
    app = await make_app(Channel(), receipts=sink, bot=_bot(events))
    receipt = await app.runtime.send("c", "hello", idempotency_key="k")
    assert receipt.message_id is not None
    failed = _status(receipt.message_id, "failed", code="131026")
    assert await _apply(app.runtime, failed) == "failed"
    [record] = await app.ops.outbox.list()
    assert record.state == "dead"
    assert record.error is not None and record.error["reason"] == Reason.UNDELIVERED
    assert "131026" in record.error["message"]
    [dead] = [e for e in events if isinstance(e, DeadEvent)]
    assert dead.reason == Reason.UNDELIVERED and dead.id == "k"
    last = sink.receipts[-1]
    assert (last.state, last.delivery, last.delivery_code) == ("dead", "failed", "131026")
    # a second copy, and a late "read", change nothing
    assert await _apply(app.runtime, failed) == "unchanged"
    assert await _apply(app.runtime, _status(receipt.message_id, "read")) == "unchanged"
    assert app.ops.metrics()["deliveryFailed"] == 1


async def test_a_failure_the_fallback_names_sends_the_fallback_once() -> None:
    events: list[Any] = []
    sink = ListSink()
    channel = Channel()
    app = await make_app(channel, receipts=sink, bot=_bot(events))
    receipt = await app.runtime.send("c", "hello", idempotency_key="k", fallback=TEMPLATE)
    assert receipt.message_id is not None
    failed = _status(receipt.message_id, "failed", code="131047")
    assert await _apply(app.runtime, failed) == "failed"
    await settle(app)
    assert await _apply(app.runtime, failed) == "unchanged"  # late, and again
    await settle(app)
    assert [m.options for m in channel.sent] == [{}, TEMPLATE.options]
    assert [type(e).__name__ for e in events] == ["FallbackEvent"]
    records = {r.key: r for r in await app.ops.outbox.list()}
    assert records["k"].state == "sent" and records["k~fallback"].state == "sent"
    keys = [(r.key, r.delivery, r.fallback_key) for r in sink.receipts]
    assert ("k", "failed", "k~fallback") in keys and ("k~fallback", None, "k~fallback") in keys


@pytest.mark.parametrize("crash", ["before", "after"])
async def test_a_crash_around_the_switch_sends_the_fallback_once(crash: str) -> None:
    shared, clock, channel = MemoryKv(), ManualClock(), Channel()
    dying = crashable(shared)
    first = await make_app(channel, kv=dying, clock=clock)
    receipt = await first.runtime.send("c", "hello", idempotency_key="k", fallback=TEMPLATE)
    assert receipt.message_id is not None
    failed = _status(receipt.message_id, "failed", code="131047")
    getattr(dying, f"crash_{crash}")(Write.OUTBOX_DELIVERY)
    with pytest.raises(SimulatedCrash):
        await _apply(first.runtime, failed)
    # the status is read again after the restart (its offset was not committed)
    again = await make_app(channel, kv=shared, clock=clock)
    expected = "unchanged" if crash == "after" else "failed"
    assert await _apply(again.runtime, failed) == expected
    await settle(again)
    assert await _apply(again.runtime, failed) == "unchanged"
    await settle(again)
    assert [m.options for m in channel.sent] == [{}, TEMPLATE.options]


# -- edits and deletes ----------------------------------------------------------------------


def _editing_bot() -> Bot:
    bot = Bot("bot", durability=policy())

    @bot.on_message
    async def answer(ctx: Context) -> None:
        if ctx.text == "go":
            await ctx.reply("working…", idempotency_key="status")
            await ctx.typing()
        else:
            await ctx.edit("status", f"done: {ctx.text}")

    return bot


async def test_an_edit_replayed_after_a_crash_calls_the_channel_once() -> None:
    shared, clock, channel = MemoryKv(), ManualClock(), MockProvider()
    first = await make_app(channel, kv=shared, clock=clock, bot=_editing_bot())
    await first.runtime.handle(Inbound(id="m1", chat_id="c", text="go"))
    assert channel.typings == ["c"]
    dying = crashable(shared)
    dying.crash_before(Write.INBOX_MARK_DONE)  # the edit went out; the inbound is not done
    second = await make_app(channel, kv=dying, clock=clock, bot=_editing_bot())
    with pytest.raises(SimulatedCrash):
        await second.runtime.handle(Inbound(id="m2", chat_id="c", text="42"))
    again = await make_app(channel, kv=shared, clock=clock, bot=_editing_bot())
    await settle(again)  # the recovery replays m2: its edit is answered from the journal
    await again.runtime.handle(Inbound(id="m2", chat_id="c", text="42"))
    [mid] = [c.message_id for c in channel.calls]
    assert mid is not None
    assert channel.edits == [(mid, "done: 42")] and channel.texts[mid] == "done: 42"
    edit = {r.key: r for r in await again.ops.outbox.list()}["m2:1"]
    assert edit.state == "sent" and edit.message_id == mid
    assert again.ops.metrics()["outboxEdits"] == 0  # this process made none


async def test_an_edit_of_a_split_text_addresses_its_parts_and_deletes_the_rest() -> None:
    channel = MockProvider(text_limit=10)
    app = await make_app(channel)
    await app.runtime.send("c", "aaaa bbbb cccc dddd eeee", idempotency_key="long")
    mids = [c.message_id for c in channel.calls]
    assert len(mids) == 3
    await app.runtime.edit("long", "xxxx yyyy", idempotency_key="e1")
    assert channel.edits == [(mids[0], "xxxx yyyy")]
    assert channel.deletes == mids[1:]
    with pytest.raises(ValueError, match="needs 4 messages"):
        await app.runtime.edit("long", "a" * 40)
    await app.runtime.delete("long", idempotency_key="d1")
    assert channel.deletes == [*mids[1:], *mids]
    await app.runtime.delete("long", idempotency_key="d1")  # the same key: answered
    assert len(channel.deletes) == 5
    assert app.ops.metrics()["outboxEdits"] == 2


async def test_an_edit_is_refused_for_a_key_never_sent_in_flight_or_on_a_channel_that_cannot() -> (
    None
):
    app = await make_app(MockProvider())
    with pytest.raises(RecordStateError, match="no send was journaled"):
        await app.runtime.edit("nope", "x")
    await app.runtime.enqueue("c", "later", idempotency_key="q", delay=60)
    with pytest.raises(RecordStateError, match="not gone out yet"):
        await app.runtime.delete("q")
    plain = await make_app(SendsOnly())
    await plain.runtime.send("c", "hi", idempotency_key="k")
    with pytest.raises(UnsupportedContentError, match="cannot edit"):
        await plain.runtime.edit("k", "x")
    assert await plain.runtime.typing("c") is False
    assert (await plain.ops.outbox.list())[0].key == "k"  # nothing journaled for the edit


async def test_without_a_journal_an_edit_is_refused() -> None:
    bot = Bot("bot")
    runtime = bot.bind(MockProvider(), None)
    await runtime.start()
    try:
        with pytest.raises(Exception, match="journal"):
            await runtime.edit("k", "x")
    finally:
        await runtime.stop()
