"""Erasure of a chat in process (``app.durability.erase_chat``), on every journal backend:
the chat's inbounds, sends, flow checkpoint, turn and message log are deleted, the other
chats are untouched, a send in flight finishes (and is recorded) first, pending sends are
discarded and named, dead ones listed, and erasing again is harmless."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from botmesh import Bot, Context, Conversation, Inbound
from botmesh.errors import (
    RecordStateError,
    SendDeferredError,
    SendError,
    UnsupportedContentError,
)
from botmesh.journal import MemoryKv, Write
from botmesh.state.events import ErasedEvent
from botmesh.state.inbox import Outcome
from botmesh.state.keys import ScopeKeys
from botmesh.state.kv import DurableKv, Entry, Put
from botmesh.state.lease import Held
from botmesh.testing import MockProvider, SimulatedCrash, crashable
from tests.backends import BackendHandle
from tests.kit import App, GatedProvider, ListSink, make_app, policy, settle

A = "chat-a"
#: Another chat whose id starts with A's: nothing of it may go with A.
B = "chat-a/b"
SECRET = "my card number is 4111"


def chat_bot() -> Bot:
    """Replies to every message; ``/ask`` starts a persistent flow that waits for an answer."""
    bot = Bot("erase-bot", durability=policy(outbox={"inline_max": 0}))

    @bot.flow("survey", persistent=True)
    async def survey(conv: Conversation) -> Any:
        return await conv.ask("your favourite colour?")

    @bot.on_message
    async def handler(ctx: Context) -> None:
        if ctx.text == "/ask":
            await ctx.start_flow(survey)
        else:
            await ctx.reply(f"you said {ctx.text}")

    return bot


async def fill(app: App, chat: str) -> None:
    """A chat with every kind of record: inbounds, a sent reply, a flow checkpoint, a
    pending send, a failed send, a dead send, and message log entries."""
    await app.runtime.handle(Inbound(id=f"{chat}:m1", chat_id=chat, text=SECRET))
    await app.runtime.handle(Inbound(id=f"{chat}:m2", chat_id=chat, text="/ask"))
    app.provider.fail_next(UnsupportedContentError("no"))
    with pytest.raises(UnsupportedContentError):  # final: dead
        await app.runtime.send(chat, SECRET, idempotency_key=f"{chat}-dead")
    app.provider.fail_next(SendError("down"))
    with pytest.raises(SendDeferredError):  # failed, left for a retry
        await app.runtime.send(chat, SECRET, idempotency_key=f"{chat}-failed")
    await app.runtime.enqueue(chat, SECRET, idempotency_key=f"{chat}-pending")
    log = ScopeKeys.of(app.ops.scope).log_of(chat)
    await app.kv.commit(
        [Put(f"{log}{n:017d}/k/0001", {"chat_id": chat, "text": SECRET}, None) for n in (1, 2)]
    )


async def records(kv: DurableKv, scope: str) -> dict[str, Entry]:
    return {e.key: e for e in await kv.scan(ScopeKeys.of(scope).all)}


def of_chat(entries: dict[str, Entry], scope: str, chat: str) -> list[str]:
    """The keys of ``chat``'s records, read from their values (as an auditor would)."""
    keys = ScopeKeys.of(scope)
    out = []
    for k, e in entries.items():
        v = e.value
        if (
            (v.get("message") or {}).get("chat_id") == chat
            or (v.get("payload") or {}).get("chat_id") == chat
            or k in (keys.flow + chat, keys.turn + chat)
            or k.startswith(keys.log_of(chat))
        ):
            out.append(k)
    return out


def names_of(entries: dict[str, Entry], scope: str, chat: str) -> set[str]:
    """The keys naming ``chat``'s sends under their message ids (botmesh.state.statuses)."""
    keys = ScopeKeys.of(scope)
    sends = {e.value.get("key") for k, e in entries.items() if k in of_chat(entries, scope, chat)}
    return {k for k, e in entries.items() if k.startswith(keys.mid) and e.value["key"] in sends}


async def started(backend: BackendHandle, provider: Any = None) -> App:
    """The chat bot on a channel with status webhooks (its sends named under their
    message ids: the erasure deletes those names too)."""
    assert backend.kv is not None
    channel = provider if provider is not None else MockProvider(delivery_statuses=True)
    return await make_app(channel, kv=backend.kv, bot=chat_bot())


async def test_erase_deletes_the_chats_records_and_nothing_else(backend: BackendHandle) -> None:
    app = await started(backend)
    erased: list[ErasedEvent] = []
    app.bot.on(ErasedEvent, erased.append)
    scope = app.ops.scope
    await fill(app, A)
    await fill(app, B)
    before = await records(app.kv, scope)
    mine, theirs = of_chat(before, scope, A), of_chat(before, scope, B)
    keys = ScopeKeys.of(scope)
    assert keys.flow + A in mine and any(k.startswith(keys.log_of(A)) for k in mine)

    receipt = await app.ops.erase_chat(A, note="ticket 42")

    after = await records(app.kv, scope)
    assert of_chat(after, scope, A) == []
    assert {k: after[k].version for k in theirs} == {k: before[k].version for k in theirs}
    named = names_of(before, scope, A)
    assert len(named) == 2 and names_of(after, scope, B) == names_of(before, scope, B) != set()
    assert set(after) == set(before) - set(mine) - named  # the names go too, uncounted
    assert receipt.chat_id == A and receipt.note == "ticket 42" and not receipt.dry_run
    assert receipt.instance == "i1" and receipt.scope == scope
    d = receipt.deleted
    logged = sum(k.startswith(keys.log_of(A)) for k in mine)  # ours, and the sends' own
    assert (d.inbox, d.outbox, d.flow, d.log) == (2, 5, 1, logged)  # 2 replies, 3 sends
    assert logged >= 2
    assert d.total == len(mine)
    assert sorted(receipt.discarded) == [f"{A}-failed", f"{A}-pending"]
    assert [(x.kind, x.id, x.reason, x.where) for x in receipt.dead] == [
        ("outbox", f"{A}-dead", "send-refused", "journal")
    ]
    assert SECRET not in msgspec.json.encode(receipt).decode()
    assert [e.receipt for e in erased] == [receipt] and erased[0].name == "durability:erased"

    # the discarded sends never go out; the other chat's do
    already = len(app.provider.sent)
    await app.ops.retry_send(f"{B}-failed")
    app.clock.advance(3600)
    await app.ops.drain()
    later = app.provider.sent[already:]
    assert {m.chat_id for m in later} == {B} and len(later) == 2  # B's failed and pending
    await app.stop()


async def test_erasing_again_is_harmless_and_the_chat_starts_afresh(
    backend: BackendHandle,
) -> None:
    app = await started(backend)
    await fill(app, A)
    first = await app.ops.erase_chat(A)
    again = await app.ops.erase_chat(A)
    assert first.deleted.total > 0
    assert again.deleted.total == 0 and again.discarded == [] and again.dead == []
    # a message of the chat after the erasure is a new conversation: no flow waits for it
    already = len(app.provider.sent)
    outcome = await app.runtime.handle(Inbound(id=f"{A}:m3", chat_id=A, text="blue"))
    assert outcome == Outcome.HANDLED
    assert [m.text for m in app.provider.sent[already:]] == ["you said blue"]
    await app.stop()


async def test_a_dry_run_deletes_nothing(backend: BackendHandle) -> None:
    app = await started(backend)
    await fill(app, A)
    before = await records(app.kv, app.ops.scope)
    plan = await app.ops.erase_chat(A, dry_run=True)
    assert plan.dry_run and plan.deleted.total == len(of_chat(before, app.ops.scope, A))
    assert await records(app.kv, app.ops.scope) == before
    done = await app.ops.erase_chat(A)
    assert done.deleted == plan.deleted and done.discarded == plan.discarded
    await app.stop()


async def test_an_inline_send_in_flight_finishes_first(backend: BackendHandle) -> None:
    provider = GatedProvider()
    app = await started(backend, provider)
    sending = asyncio.create_task(app.runtime.send(A, "last words", idempotency_key="flying"))
    await provider.entered.wait()  # the provider call is under way
    erasing = asyncio.create_task(app.ops.erase_chat(A))
    for _ in range(20):  # the erasure waits for the chat's lock, held by the send
        await asyncio.sleep(0)
    assert not erasing.done()
    assert (await app.ops.outbox.get("flying")) is not None
    provider.release.set()
    receipt = await sending
    assert receipt.state == "sent"  # recorded before the erasure deleted it
    erased = await erasing
    assert erased.deleted.outbox == 1 and erased.discarded == []
    assert await app.ops.outbox.get("flying") is None
    assert [m.text for m in provider.sent] == ["last words"]
    await app.stop()


async def test_a_sweeper_delivery_in_flight_finishes_first(backend: BackendHandle) -> None:
    provider = GatedProvider()
    app = await started(backend, provider)
    await app.runtime.enqueue(A, "queued", idempotency_key="q1")
    sweeping = asyncio.create_task(app.ops.sweep_once())
    await provider.entered.wait()
    erasing = asyncio.create_task(app.ops.erase_chat(A))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not erasing.done()
    provider.release.set()
    await sweeping
    erased = await erasing
    assert erased.deleted.outbox == 1 and erased.discarded == []  # it went out
    assert [m.text for m in provider.sent] == ["queued"]
    assert await app.ops.outbox.get("q1") is None
    await app.stop()


async def test_a_record_held_past_the_wait_is_refused_not_deleted() -> None:
    app = await make_app(bot=chat_bot())
    await app.runtime.enqueue(A, "x", idempotency_key="held")
    entry = await app.kv.get(ScopeKeys.of(app.ops.scope).outbox + "held")
    assert entry is not None
    app.engine.leases.held[entry.key] = Held(entry.key, 0, entry.version, entry.value, 60, 0)
    with pytest.raises(RecordStateError) as refused:
        await app.ops.erase_chat(A, wait=0.05)
    assert refused.value.state == "in flight" and "held" in str(refused.value)
    assert await app.ops.outbox.get("held") is not None
    del app.engine.leases.held[entry.key]
    assert (await app.ops.erase_chat(A)).discarded == ["held"]
    await app.stop()


@pytest.mark.crash
async def test_a_crash_at_the_erasure_deletes_all_or_nothing_and_erasing_again_finishes() -> None:
    for when in ("before", "after"):
        inner = MemoryKv()
        kv = crashable(inner)
        app = await make_app(kv=kv, bot=chat_bot())
        await fill(app, A)
        scope = app.ops.scope
        mine = of_chat(await records(inner, scope), scope, A)
        getattr(kv, f"crash_{when}")(Write.CHAT_ERASE)
        with pytest.raises(SimulatedCrash):
            await app.ops.erase_chat(A)
        left = of_chat(await records(inner, scope), scope, A)
        assert left == (mine if when == "before" else [])
        restarted = await make_app(kv=inner, bot=chat_bot(), clock=app.clock)
        receipt = await restarted.ops.erase_chat(A)
        assert receipt.deleted.total == len(left)
        assert of_chat(await records(inner, scope), scope, A) == []
        await restarted.stop()


@pytest.mark.crash
async def test_a_dead_inbound_is_listed_and_the_receipts_go_out_before_the_erasure() -> None:
    inner = MemoryKv()
    kv = crashable(inner)
    kv.crash_after(Write.INBOX_JOURNAL)  # its one attempt charged, then the process died
    first = await make_app(kv=kv, bot=chat_bot(), inbox={"max_attempts": 1})
    with pytest.raises(SimulatedCrash):
        await first.runtime.handle(Inbound(id="d1", chat_id=A, text=SECRET))
    sink = ListSink()
    bot = Bot("erase-bot", durability=policy(inbox={"max_attempts": 1}))
    app = await make_app(kv=inner, bot=bot, clock=first.clock, receipts=sink)
    await settle(app)
    dead = await app.ops.inbox.get("d1")
    assert dead is not None and dead.state == "dead"
    await app.runtime.send(A, "sent before", idempotency_key="s1")
    receipt = await app.ops.erase_chat(A)
    assert [(d.kind, d.id, d.reason) for d in receipt.dead] == [
        ("inbox", "d1", "attempts-exhausted")
    ]
    assert receipt.deleted.inbox == 1 and receipt.deleted.outbox == 1
    assert "s1" in sink.keys("sent")  # its receipt went out; the erasure does not recall it
    assert await app.ops.inbox.get("d1") is None
    await app.stop()
