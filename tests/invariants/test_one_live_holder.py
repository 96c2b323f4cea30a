"""Invariant 2, one live holder: every claim takes a fencing token, and a completion
carrying an older token is rejected and counted (``staleLeases``)."""

from __future__ import annotations

import asyncio

import pytest

from botmesh import Bot, Context, Inbound, Outcome
from botmesh.errors import FencedError, SendError
from botmesh.journal import MemoryKv
from botmesh.testing import ManualClock, MockProvider
from tests.kit import GatedProvider, make_app, policy


async def test_the_heartbeat_extends_inbox_and_outbox_leases_while_work_runs() -> None:
    provider = GatedProvider()
    bot = Bot("bot", durability=policy(inbox={"lease": "30s"}, outbox={"lease": "30s"}))

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("slow upload")

    app = await make_app(provider, bot=bot)
    clock, leases = app.clock, app.engine.leases
    task = asyncio.create_task(app.runtime.handle(Inbound(id="m", chat_id="c")))
    await provider.entered.wait()
    assert await leases.heartbeat_once(clock.now()) == 0  # fresh leases are left alone
    for _ in range(5):  # 5 × 25 s: far past one lease, a heartbeat each third
        clock.advance(25)
        assert await leases.heartbeat_once(clock.now()) == 2
    inbox = await app.ops.inbox.get("m")
    out = await app.ops.outbox.get("m:1")
    assert inbox is not None and out is not None
    assert inbox.lease_until == out.lease_until == clock.now() + 30
    other = await make_app(MockProvider(), kv=app.kv, clock=clock, instance_id="x")
    assert await other.ops.sweep_once() == 0  # nothing to take over
    provider.release.set()
    assert await task == Outcome.HANDLED
    assert app.ops.metrics()["staleLeases"] == 0
    out = await app.ops.outbox.get("m:1")
    assert out is not None and out.state == "sent" and out.token == 1


async def test_a_free_record_is_claimed_by_any_instance_under_the_next_token() -> None:
    shared, clock = MemoryKv(), ManualClock()
    a = await make_app(kv=shared, clock=clock, instance_id="a")
    await a.runtime.enqueue("c", "x", idempotency_key="k")
    b = await make_app(kv=shared, clock=clock, instance_id="b")
    await b.ops.drain()  # unleased and due: b delivers it
    rec = await b.ops.outbox.get("k")
    assert rec is not None and rec.state == "sent" and rec.token == 1
    assert rec.lease_owner is None and [m.text for m in b.provider.sent] == ["x"]
    assert a.provider.calls == []


async def test_the_token_is_checked_again_before_the_next_provider_call() -> None:
    """A retries inline after a backoff; meanwhile its lease expires and B takes the send.
    A's next attempt must not call the provider."""
    shared, clock = MemoryKv(), ManualClock()
    a = await make_app(
        kv=shared,
        clock=clock,
        instance_id="a",
        outbox={"lease": "1s", "inline_max": "10m", "backoff": {"base": "2m", "cap": "1h"}},
    )
    b = await make_app(kv=shared, clock=clock, instance_id="b")
    a.provider.fail_next(SendError("flaky"))
    real_sleep = clock.sleep

    async def sleep_and_lose_the_lease(seconds: float) -> None:
        await real_sleep(seconds + 2)  # A froze past its lease (backoff + 1 s)
        await b.ops.sweep_once()  # B claims the failed send, sends it

    clock.sleep = sleep_and_lose_the_lease  # type: ignore[method-assign]
    with pytest.raises(FencedError) as info:
        await a.runtime.send("c", "x", idempotency_key="k")
    assert info.value.key.endswith("/out/k")
    assert len(a.provider.calls) == 1  # only the first, failed, attempt
    assert len(b.provider.sent) == 1
    assert a.ops.metrics()["staleLeases"] == 1
    rec = await b.ops.outbox.get("k")
    assert rec is not None and rec.state == "sent" and rec.token == 2


async def test_a_restart_with_the_same_instance_id_reclaims_only_earlier_boots() -> None:
    shared, clock = MemoryKv(), ManualClock()
    provider = GatedProvider()
    live = await make_app(provider, kv=shared, clock=clock, instance_id="same")
    task = asyncio.create_task(live.runtime.send("c", "in flight", idempotency_key="k"))
    await provider.entered.wait()
    # this instance's own recovery pass never takes a send it is making itself
    assert await live.engine.sweeper.sweep_once(recovering=True) == 0
    # a new boot with the same id (the old one died) takes it at once, lease unexpired
    restarted = await make_app(kv=shared, clock=clock, instance_id="same")
    rec = await restarted.ops.outbox.get("k")
    assert rec is not None and rec.state == "unknown" and rec.token == 2
    provider.release.set()
    with pytest.raises(FencedError):  # the zombie's completion is refused
        await task
    assert live.ops.metrics()["staleLeases"] == 1
    rec = await restarted.ops.outbox.get("k")
    assert rec is not None and rec.state == "unknown" and rec.message_id is None


async def test_another_instance_waits_for_the_lease_to_expire() -> None:
    shared, clock = MemoryKv(), ManualClock()
    provider = GatedProvider()
    a = await make_app(provider, kv=shared, clock=clock, instance_id="a")
    task = asyncio.create_task(a.runtime.send("c", "x", idempotency_key="k"))
    await provider.entered.wait()
    b = await make_app(kv=shared, clock=clock, instance_id="b")
    assert await b.ops.sweep_once() == 0
    clock.advance(59)
    assert await b.ops.sweep_once() == 0
    clock.advance(2)
    assert await b.ops.sweep_once() == 1
    provider.release.set()
    with pytest.raises(FencedError):  # the zombie's completion is refused
        await task
    assert a.ops.metrics()["staleLeases"] == 1
