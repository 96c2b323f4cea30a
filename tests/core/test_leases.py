"""Leases, heartbeats, fencing tokens and instance ids."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from botmesh import Bot, FencedError, Inbound, KvDurability, MemoryDurability, MockProvider
from botmesh.testing import ManualClock
from state.kv import MemoryKv
from state.messages import Outbound, SendResult
from tests.core.helpers import durable, make_bot


class GatedProvider(MockProvider):
    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def send(self, message: Outbound) -> SendResult:
        self.entered.set()
        await self.release.wait()
        return await super().send(message)


async def test_heartbeat_extends_inbox_and_outbox_leases_while_work_runs() -> None:
    provider = GatedProvider()
    bot, _, clock, d = make_bot(provider, inbox={"lease": "30s"}, outbox={"lease": "30s"})

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        await ctx.reply("slow upload")

    await bot.start()
    task = asyncio.create_task(bot.handle(Inbound("m", "c")))
    await provider.entered.wait()
    assert await d.heartbeat_once() == 0  # fresh leases are left alone
    for _ in range(5):  # 5 × 25 s: far past one lease, a heartbeat each third
        clock.advance(25)
        assert await d.heartbeat_once() == 2
    inbox = await d.inbox.get("m")
    out = await d.outbox.get("m:1")
    assert inbox is not None and out is not None
    assert inbox.lease_until == out.lease_until == clock.now() + 30
    other = Bot(
        MockProvider(),
        durability={"backend": d.backend, "instance_id": "x", "poll": 0},
        clock=clock,
    )
    await other.start()
    assert await durable(other.durability).sweep_once() == 0  # nothing to take over
    provider.release.set()
    await task
    assert d.metrics()["staleLeases"] == 0
    out = await d.outbox.get("m:1")
    assert out is not None and out.state == "sent" and out.token == 1


async def test_an_expired_lease_is_claimed_under_a_new_token() -> None:
    shared = MemoryDurability()
    clock = ManualClock()
    a = Bot(
        MockProvider(), durability={"backend": shared, "instance_id": "a", "poll": 0}, clock=clock
    )
    await a.start()
    await durable(a.durability).enqueue(Outbound("c", "x"), key="k")
    b_provider = MockProvider()
    b = Bot(b_provider, durability={"backend": shared, "instance_id": "b", "poll": 0}, clock=clock)
    await b.start()
    await durable(b.durability).drain()  # unleased and due: b delivers it
    rec = await durable(b.durability).outbox.get("k")
    assert rec is not None and rec.state == "sent" and rec.token == 1


async def test_the_token_is_checked_again_before_the_provider_call() -> None:
    """A inline-retries with a backoff; meanwhile its lease expires and B takes the send.
    A's next attempt must not call the provider."""
    shared = MemoryDurability()
    clock = ManualClock()
    a_provider = MockProvider()
    a = Bot(
        a_provider,
        durability={
            "backend": shared,
            "instance_id": "a",
            "poll": 0,
            "outbox": {
                "lease": "1s",
                "inline_max": "10m",
                "backoff": {"base": "2m", "cap": "1h", "jitter": 0},
            },
        },
        clock=clock,
    )
    await a.start()
    b_provider = MockProvider()
    b = Bot(b_provider, durability={"backend": shared, "instance_id": "b", "poll": 0}, clock=clock)
    await b.start()
    from state.errors import SendError

    a_provider.fail_next(SendError("flaky"))

    real_sleep = clock.sleep

    async def sleep_and_lose_the_lease(seconds: float) -> None:
        await real_sleep(seconds + 2)  # A froze past its lease (backoff + 1 s)
        await durable(b.durability).sweep_once()  # B claims the failed send, sends it

    clock.sleep = sleep_and_lose_the_lease  # type: ignore[method-assign]
    try:
        await a.send("c", "x", idempotency_key="k")
    except FencedError as exc:
        assert exc.key.endswith("/out/k")
    else:
        raise AssertionError("A completed a send it no longer owned")
    assert len(a_provider.calls) == 1  # only the first, failed, attempt
    assert len(b_provider.sent) == 1
    assert durable(a.durability).metrics()["staleLeases"] == 1


async def test_restart_with_the_same_instance_id_reclaims_only_earlier_boots() -> None:
    shared = MemoryDurability()
    clock = ManualClock()
    provider = GatedProvider()
    live = Bot(
        provider, durability={"backend": shared, "instance_id": "same", "poll": 0}, clock=clock
    )
    await live.start()
    task = asyncio.create_task(live.send("c", "in flight", idempotency_key="k"))
    await provider.entered.wait()
    d = durable(live.durability)
    # this instance's own first sweep never takes a send it is making itself
    assert await d.sweep_once(recovering=True) == 0
    # a new boot with the same id (the old one died) takes it at once, lease unexpired
    restarted = Bot(
        MockProvider(),
        durability={"backend": shared, "instance_id": "same", "poll": 0},
        clock=clock,
    )
    await restarted.start()
    rec = await durable(restarted.durability).outbox.get("k")
    assert rec is not None and rec.state == "unknown" and rec.token == 2
    provider.release.set()
    with contextlib.suppress(FencedError):  # the zombie's completion is refused
        await task
    assert d.metrics()["staleLeases"] == 1


async def test_another_instance_waits_for_the_lease_to_expire() -> None:
    shared = MemoryDurability()
    clock = ManualClock()
    provider = GatedProvider()
    a = Bot(provider, durability={"backend": shared, "instance_id": "a", "poll": 0}, clock=clock)
    await a.start()
    task = asyncio.create_task(a.send("c", "x", idempotency_key="k"))
    await provider.entered.wait()
    b = Bot(
        MockProvider(), durability={"backend": shared, "instance_id": "b", "poll": 0}, clock=clock
    )
    await b.start()
    assert await durable(b.durability).sweep_once() == 0
    clock.advance(59)
    assert await durable(b.durability).sweep_once() == 0
    clock.advance(2)
    assert await durable(b.durability).sweep_once() == 1
    provider.release.set()
    with contextlib.suppress(FencedError):  # the zombie's completion is refused
        await task


def test_default_instance_id() -> None:
    bot = Bot(MockProvider(), bot_id="helper", connection_id="wa-1", durability={})
    assert durable(bot.durability).instance_id == f"{socket.gethostname()}/helper/wa-1"
    shared = KvDurability(MemoryKv(), shared=True)
    one = Bot(MockProvider(), bot_id="helper", durability={"backend": shared})
    two = Bot(MockProvider(), bot_id="helper", durability={"backend": shared})
    i1, i2 = durable(one.durability).instance_id, durable(two.durability).instance_id
    assert i1.startswith(f"{socket.gethostname()}/helper/default/") and i1 != i2
    pinned = Bot(MockProvider(), durability={"backend": shared, "instance_id": "pod-0"})
    assert durable(pinned.durability).instance_id == "pod-0"
