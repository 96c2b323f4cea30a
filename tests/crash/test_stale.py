"""Zombies: a worker frozen in a provider call loses its leases to another worker; when it
wakes up its completions are refused and counted (``staleLeases``), on every backend."""

from __future__ import annotations

import asyncio

import pytest

from botmesh import Bot, Context, ErrorEvent, Inbound
from botmesh.errors import FencedError
from botmesh.testing import ManualClock, MockProvider
from tests.backends import BackendHandle
from tests.kit import FrozenProvider, make_app, policy

pytestmark = pytest.mark.crash


def _bot(policy_name: str) -> Bot:
    bot = Bot("z", durability=policy(outbox={"on_ambiguous": policy_name}))

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply(f"answer to {ctx.text}")

    return bot


@pytest.mark.parametrize("policy_name", ["skip", "resend"])
async def test_stale_completion_is_refused_and_counted(
    backend: BackendHandle, policy_name: str
) -> None:
    clock = ManualClock()
    frozen, healthy = FrozenProvider(), MockProvider("healthy")
    assert backend.kv is not None
    a = await make_app(
        frozen, kv=backend.kv, clock=clock, bot=_bot(policy_name), instance_id="worker-a"
    )
    b = await make_app(
        healthy, kv=backend.kv, clock=clock, bot=_bot(policy_name), instance_id="worker-b"
    )
    errors: list[BaseException] = []
    a.bot.on(ErrorEvent, lambda e: errors.append(e.error))
    task = asyncio.create_task(a.runtime.handle(Inbound(id="m1", chat_id="chat", text="hello")))
    await frozen.entered.wait()

    clock.advance(61.0)  # both leases (60 s) expired: worker A looks dead
    assert await b.ops.sweep_once() >= 2
    out = await b.ops.outbox.get("m1:1")
    assert out is not None and out.token == 2 and out.ambiguous
    assert out.state == ("unknown" if policy_name == "skip" else "sent")
    inbox = await b.ops.inbox.get("m1")
    assert inbox is not None and inbox.state == "done" and inbox.lease_owner is None

    frozen.thaw.set()  # A wakes up and tries to complete what it no longer owns
    assert await task == "fenced"
    assert a.ops.metrics()["staleLeases"] == 2  # the send and the inbound
    assert any(isinstance(e, FencedError) for e in errors)
    after = await b.ops.outbox.get("m1:1")
    assert after is not None and (after.state, after.token) == (out.state, out.token)
    assert after.message_id == out.message_id  # A's provider id was not written
    inbox_after = await b.ops.inbox.get("m1")
    assert inbox_after is not None and inbox_after.version == inbox.version
    await a.stop()
    await b.stop()
