"""Invariant 1, journal before acting: an inbound is durably recorded before any handler
runs, and a send is durably recorded (pending, leased) before the provider is called."""

from __future__ import annotations

import pytest

from botmesh import Bot, Context, Inbound, Outcome
from botmesh.journal import MemoryKv, Write
from botmesh.state.messages import Media, Outbound, SendResult
from botmesh.testing import ManualClock, MockProvider, SimulatedCrash, crashable
from tests.kit import App, make_app, policy, texts


async def test_an_inbound_is_journaled_before_any_handler_and_done_after() -> None:
    bot = Bot("bot", durability=policy())
    apps: list[App] = []
    seen: list[tuple[str, str | None]] = []

    @bot.on_message
    async def handler(ctx: Context) -> None:
        rec = await apps[0].ops.inbox.get(ctx.inbound_id)
        assert rec is not None
        seen.append((rec.state, rec.lease_owner))

    app = await make_app(bot=bot)
    apps.append(app)
    assert await app.runtime.handle(Inbound(id="m1", chat_id="c", text="hi")) == Outcome.HANDLED
    assert seen == [("pending", "i1")]
    rec = await app.ops.inbox.get("m1")
    assert rec is not None and rec.state == "done" and rec.lease_owner is None
    assert rec.inbound() == Inbound(id="m1", chat_id="c", text="hi")
    assert app.ops.metrics()["inboundJournaled"] == 1


async def test_an_inbound_is_done_only_once_its_sends_settled() -> None:
    bot = Bot("bot", durability=policy())
    apps: list[App] = []
    states: list[str] = []

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("one")
        rec = await apps[0].ops.inbox.get("m1")
        assert rec is not None
        states.append(rec.state)  # still pending while the handler runs

    app = await make_app(bot=bot)
    apps.append(app)
    await app.runtime.handle(Inbound(id="m1", chat_id="c"))
    assert states == ["pending"]
    assert texts(app.provider) == ["one"]


class WatchingProvider(MockProvider):
    """Looks at the journal during each call."""

    def __init__(self) -> None:
        super().__init__()
        self.apps: list[App] = []
        self.seen: list[tuple[str, bool, int, str | None]] = []

    async def send(self, message: Outbound) -> SendResult:
        for r in await self.apps[0].ops.outbox.list():
            if r.payload["text"] == message.text:
                self.seen.append((r.state, r.inflight, r.token, r.lease_owner))
        return await super().send(message)


async def test_a_send_is_journaled_in_flight_before_the_provider_and_its_id_recorded() -> None:
    provider = WatchingProvider()
    app = await make_app(provider)
    provider.apps.append(app)
    receipt = await app.runtime.send("c", "hello", idempotency_key="k1")
    assert provider.seen == [("pending", True, 1, "i1")]
    rec = await app.ops.outbox.get("k1")
    assert rec is not None
    assert (rec.state, rec.message_id, rec.inflight) == ("sent", receipt.message_id, False)
    assert receipt.state == "sent" and receipt.key == "k1"


@pytest.mark.crash
async def test_no_handler_runs_when_the_process_dies_before_the_inbound_is_journaled() -> None:
    shared = MemoryKv()
    a = crashable(shared)
    a.crash_before(Write.INBOX_JOURNAL)
    runs: list[str] = []
    bot = Bot("bot", durability=policy())

    @bot.on_message
    async def handler(ctx: Context) -> None:
        runs.append(ctx.inbound_id)

    app = await make_app(kv=a, bot=bot)
    with pytest.raises(SimulatedCrash):
        await app.runtime.handle(Inbound(id="m1", chat_id="c"))
    assert runs == [] and await shared.scan("") == []


@pytest.mark.crash
async def test_no_provider_call_when_the_process_dies_before_the_send_is_journaled() -> None:
    shared = MemoryKv()
    a = crashable(shared)
    a.crash_before(Write.OUTBOX_JOURNAL)
    app = await make_app(kv=a)
    with pytest.raises(SimulatedCrash):
        await app.runtime.send("c", "hello", idempotency_key="k")
    assert app.provider.calls == []


@pytest.mark.crash
async def test_an_inbound_left_unfinished_is_replayed_at_the_next_start() -> None:
    shared = MemoryKv()
    clock = ManualClock()
    a = crashable(shared)
    a.crash_after(Write.INBOX_JOURNAL)  # journaled, then the process died
    first = await make_app(kv=a, clock=clock, reply="never")
    with pytest.raises(SimulatedCrash):
        await first.runtime.handle(Inbound(id="m1", chat_id="c", text="hi"))
    assert first.provider.calls == []

    bot = Bot("bot", durability=policy())

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply(f"re: {ctx.text}")

    # same instance id: reclaimed at once, without waiting for the lease to expire
    again = await make_app(kv=shared, clock=clock, bot=bot)
    assert texts(again.provider) == ["re: hi"]
    rec = await again.ops.inbox.get("m1")
    assert rec is not None and (rec.state, rec.attempts, rec.token) == ("done", 2, 2)
    assert again.ops.metrics()["inboundReplayed"] == 1
    await again.stop()


async def test_binary_content_is_journaled_base64() -> None:
    app = await make_app()
    png = Media(data=b"\x89PNG\x00", mime="image/png")
    await app.runtime.enqueue("c", None, media=png, idempotency_key="img")
    rec = await app.ops.outbox.get("img")
    assert rec is not None and rec.payload["media"]["data"] == "iVBORwA="
    await app.ops.drain()
    assert app.provider.sent[0].media == png
