"""The background sweeper (scheduling) drives the same transitions on its own."""

from __future__ import annotations

import asyncio

from botmesh import Bot, Inbound, MockProvider, SendError
from state.messages import Outbound, SendResult
from tests.core.helpers import durable


async def test_background_sweeper_delivers_enqueued_and_deferred_sends() -> None:
    provider = MockProvider()
    bot = Bot(
        provider,
        durability={"poll": "20ms", "outbox": {"inline_max": 0, "backoff": {"base": "10ms"}}},
    )
    sent = asyncio.Queue[str]()
    bot.on("sent", lambda r: sent.put_nowait(r.key))
    await bot.start()
    await bot.enqueue("c", "reminder", idempotency_key="r1")
    assert await asyncio.wait_for(sent.get(), 30) == "r1"  # woken by the enqueue
    provider.fail_next(SendError("blip"))
    try:
        await bot.send("c", "retry me", idempotency_key="r2")
    except Exception as exc:
        assert type(exc).__name__ == "SendDeferredError"
    assert await asyncio.wait_for(sent.get(), 30) == "r2"
    await bot.stop()
    assert [m.text for m in provider.sent] == ["reminder", "retry me"]


class SlowProvider(MockProvider):
    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def send(self, message: Outbound) -> SendResult:
        await self.go.wait()
        return await super().send(message)


async def test_background_heartbeat_keeps_a_slow_call_leased() -> None:
    provider = SlowProvider()
    bot = Bot(
        provider, durability={"poll": "1s", "outbox": {"lease": "60ms"}, "inbox": {"lease": "60ms"}}
    )

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        await ctx.reply("slow")

    await bot.start()
    d = durable(bot.durability)
    task = asyncio.create_task(bot.handle(Inbound("m", "c")))
    # wait until the heartbeat has extended the send's lease several times
    for _ in range(3000):
        rec = await d.outbox.get("m:1")
        if rec is not None and rec.version >= 4:
            break
        await asyncio.sleep(0.01)
    rec = await d.outbox.get("m:1")
    assert rec is not None and rec.version >= 4 and rec.token == 1  # extended, never taken
    provider.go.set()
    await task
    rec = await d.outbox.get("m:1")
    assert rec is not None and rec.state == "sent" and d.metrics()["staleLeases"] == 0
    await bot.stop()


class EnteringProvider(MockProvider):
    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()

    async def send(self, message: Outbound) -> SendResult:
        self.entered.set()
        await asyncio.sleep(0.05)  # the call is in progress when stop() comes
        return await super().send(message)


async def test_stop_lets_a_delivery_in_progress_finish() -> None:
    provider = EnteringProvider()
    bot = Bot(provider, durability={"poll": "20ms"})
    await bot.start()
    d = durable(bot.durability)
    await bot.enqueue("c", "bye", idempotency_key="k")
    await provider.entered.wait()
    await bot.stop()  # must not cut the call short: that would make it ambiguous
    kv = d.backend.kv
    await kv.open()  # stop() closed it; the memory journal keeps its data
    entry = await kv.get(d.out_prefix + "k")
    assert entry is not None and entry.value["state"] == "sent" and not entry.value["inflight"]
