"""Zombies: a worker frozen in a provider call loses its leases to another worker; when it
wakes up its completions are refused and counted (``staleLeases``), on every backend."""

from __future__ import annotations

import asyncio

import pytest

from botmesh import Bot, FencedError, Inbound
from botmesh.testing import ManualClock, MockProvider
from state.messages import Outbound, SendResult
from tests.backends import BackendHandle

pytestmark = pytest.mark.crash


class FrozenProvider(MockProvider):
    """Blocks its first send until ``thaw`` is set (the process froze mid-call)."""

    def __init__(self) -> None:
        super().__init__("frozen")
        self.entered = asyncio.Event()
        self.thaw = asyncio.Event()

    async def send(self, message: Outbound) -> SendResult:
        if not self.entered.is_set():
            self.entered.set()
            await self.thaw.wait()
        return await super().send(message)


def _bot(kv: object, provider: MockProvider, instance: str, policy: str, clock: ManualClock) -> Bot:
    bot = Bot(
        provider,
        bot_id="z",
        durability={
            "backend": kv,
            "instance_id": instance,
            "poll": 0,
            "outbox": {"on_ambiguous": policy},
        },
        clock=clock,
    )

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        await ctx.reply(f"answer to {ctx.text}")

    return bot


@pytest.mark.parametrize("policy", ["skip", "resend"])
async def test_stale_completion_is_refused_and_counted(backend: BackendHandle, policy: str) -> None:
    clock = ManualClock()
    frozen, healthy = FrozenProvider(), MockProvider("healthy")
    a = _bot(backend.kv, frozen, "worker-a", policy, clock)
    b = _bot(backend.kv, healthy, "worker-b", policy, clock)
    errors: list[BaseException] = []
    a.on("error", errors.append)
    await a.start()
    await b.start()
    task = asyncio.create_task(a.handle(Inbound("m1", "chat", "hello")))
    await frozen.entered.wait()

    clock.advance(61.0)  # both leases (60 s) expired: worker A looks dead
    assert b.durability is not None and a.durability is not None
    assert await b.durability.sweep_once() >= 2
    out = await b.durability.outbox.get("m1:1")
    assert out is not None and out.token == 2 and out.ambiguous
    assert out.state == ("unknown" if policy == "skip" else "sent")
    inbox = await b.durability.inbox.get("m1")
    assert inbox is not None and inbox.state == "done" and inbox.lease_owner is None

    frozen.thaw.set()  # A wakes up and tries to complete what it no longer owns
    await task
    assert a.durability.metrics()["staleLeases"] == 2  # the send and the inbound
    assert any(isinstance(e, FencedError) for e in errors)
    after = await b.durability.outbox.get("m1:1")
    assert after is not None and (after.state, after.token) == (out.state, out.token)
    assert after.message_id == out.message_id  # A's provider id was not written
    inbox_after = await b.durability.inbox.get("m1")
    assert inbox_after is not None and inbox_after.version == inbox.version
    await a.stop()
    await b.stop()
