"""The scheduler: the background loop sweeps on its own (woken by an enqueue or a deferral,
else every ``poll``), heartbeats the leases held, lets a pass finish at stop, and backs off
a record whose visit fails. Record times run on a manual clock; only the loop's own timer
is real (20 ms ticks), and every wait is for an event, never for a time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from botmesh import Bot, Context, ErrorEvent, Inbound, SentEvent
from botmesh.errors import JournalUnavailableError, SendDeferredError, SendError
from botmesh.journal import DurableKv, MemoryKv, Op, Put, Write
from botmesh.testing import FaultyKv, crashable
from tests.kit import GatedProvider, make_app


class WatchedKv(FaultyKv):
    """The fault kit's journal, telling waiters about every write that landed."""

    def __init__(self, inner: DurableKv) -> None:
        super().__init__(inner)
        self.landed = asyncio.Condition()

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        versions = await super().commit(ops, label=label)
        async with self.landed:
            self.landed.notify_all()
        return versions

    async def wait_for(self, label: str, count: int) -> None:
        """Until ``count`` writes labelled ``label`` landed."""
        async with self.landed:
            await self.landed.wait_for(lambda: self.labels.count(label) >= count)


async def test_the_background_sweeper_delivers_enqueued_and_deferred_sends() -> None:
    app = await make_app(poll="20ms", outbox={"inline_max": 0, "backoff": {"base": "1s"}})
    sent = asyncio.Queue[str]()
    app.bot.on(SentEvent, lambda e: sent.put_nowait(e.receipt.key))
    await app.runtime.enqueue("c", "reminder", idempotency_key="r1")
    assert await sent.get() == "r1"  # woken by the enqueue
    app.provider.fail_next(SendError("blip"))
    with pytest.raises(SendDeferredError):
        await app.runtime.send("c", "retry me", idempotency_key="r2")
    app.clock.advance(1)  # its backoff passed: the next tick delivers it
    assert await sent.get() == "r2"
    await app.stop()
    assert [m.text for m in app.provider.sent] == ["reminder", "retry me"]


async def test_the_background_heartbeat_keeps_a_slow_call_leased() -> None:
    provider = GatedProvider()
    bot = Bot(
        "bot", durability={"poll": "1h", "outbox": {"lease": "60ms"}, "inbox": {"lease": "60ms"}}
    )

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("slow")

    kv = WatchedKv(MemoryKv())
    app = await make_app(provider, kv=kv, bot=bot)
    task = asyncio.create_task(app.runtime.handle(Inbound(id="m", chat_id="c")))
    await provider.entered.wait()
    for beat in range(1, 5):  # 4 × 30 ms: twice the lease, each time half of it gone
        app.clock.advance(0.030)
        await kv.wait_for(Write.OUTBOX_HEARTBEAT, beat)
        await kv.wait_for(Write.INBOX_HEARTBEAT, beat)
        until = app.clock.now() + 0.060
        out, inbox = await app.ops.outbox.get("m:1"), await app.ops.inbox.get("m")
        assert out is not None and inbox is not None
        assert out.lease_until == inbox.lease_until == until
    provider.release.set()
    await task
    rec = await app.ops.outbox.get("m:1")
    assert rec is not None and rec.state == "sent" and rec.token == 1  # never taken over
    assert app.ops.metrics()["staleLeases"] == 0
    await app.stop()


async def test_stop_lets_a_delivery_in_progress_finish() -> None:
    provider = GatedProvider()
    kv = MemoryKv()
    app = await make_app(provider, kv=kv, poll="20ms")
    await app.runtime.enqueue("c", "bye", idempotency_key="k")
    await provider.entered.wait()  # the sweeper is in the provider call
    stopping = asyncio.create_task(app.stop())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not stopping.done()  # stop() waits: cutting the call short would make it ambiguous
    provider.release.set()
    await stopping
    entry = await kv.get(app.engine.out_prefix + "k")
    assert entry is not None and entry.value["state"] == "sent"
    assert not entry.value.get("inflight")


async def test_a_record_whose_visit_fails_is_backed_off_without_holding_up_the_rest() -> None:
    kv = crashable(MemoryKv())
    app = await make_app(kv=kv, reply="ok", inbox={"backoff": {"base": "5s", "jitter": 0}})
    errors: list[ErrorEvent] = []
    app.bot.on(ErrorEvent, errors.append)
    now = app.clock.now()
    record = {
        "t": "in",
        "id": "m",
        "state": "pending",
        "attempts": 0,
        "token": 0,
        "lease": None,
        "message": {"v": 1, "id": "m", "chat_id": "c"},
    }
    await kv.commit([Put(app.engine.in_prefix + "m", record, expect=0, due=now)])
    await app.runtime.enqueue("c", "other", idempotency_key="o")
    kv.fail(Write.INBOX_CLAIM, 2)
    assert await app.ops.sweep_once() == 1  # the send went, the inbound failed
    assert [m.text for m in app.provider.sent] == ["other"]
    assert [(type(e.error), e.where) for e in errors] == [(JournalUnavailableError, "sweeper")]
    await app.ops.sweep_once()
    assert len(errors) == 1  # backing off: not even tried
    app.clock.advance(5)
    await app.ops.sweep_once()
    assert len(errors) == 2  # tried again, failed again: the backoff doubles
    app.clock.advance(5)
    await app.ops.sweep_once()
    assert len(errors) == 2
    app.clock.advance(5)
    assert await app.ops.sweep_once() == 1
    rec = await app.ops.inbox.get("m")
    assert rec is not None and rec.state == "done" and len(errors) == 2
    assert [m.text for m in app.provider.sent] == ["other", "ok"]
