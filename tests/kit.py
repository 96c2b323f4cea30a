"""Shared pieces of the engine tests: a runtime on a manual clock, and providers that hold,
freeze, fail or count their calls. The fault kit (a journal that crashes or fails) is
``botmesh.testing.crashable`` — one kit for the crash matrix and the unit tests alike.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import botmesh
from botmesh import Bot, Context
from botmesh.journal import DurableKv, MemoryKv, Operations
from botmesh.state.engine import Engine
from botmesh.state.messages import Outbound, SendResult
from botmesh.state.receipts import ReceiptSink
from botmesh.testing import ManualClock, MockProvider

__all__ = [
    "App",
    "FrozenProvider",
    "GatedProvider",
    "ListSink",
    "make_app",
    "policy",
    "settle",
    "texts",
]


def policy(**options: Any) -> dict[str, Any]:
    """Durability options for tests: no background sweeper, no jitter (unless given)."""
    options.setdefault("poll", 0)
    inbox = dict(options.pop("inbox", {}))
    inbox.setdefault("backoff", {"jitter": 0})
    outbox = dict(options.pop("outbox", {}))
    outbox.setdefault("backoff", {"jitter": 0})
    return {**options, "inbox": inbox, "outbox": outbox}


@dataclass
class App:
    """A started runtime and what tests reach for."""

    runtime: botmesh.Runtime
    bot: Bot
    provider: Any
    clock: ManualClock
    kv: DurableKv

    @property
    def ops(self) -> Operations:
        ops = self.runtime.durability
        assert ops is not None
        return ops

    @property
    def engine(self) -> Engine:
        engine = self.runtime._core.engine
        assert engine is not None
        return engine

    async def stop(self) -> None:
        await self.runtime.stop()


def texts(provider: MockProvider) -> list[str | None]:
    """The texts a provider accepted, in call order."""
    return [m.text for m in provider.sent]


async def settle(app: App, *, passes: int = 6, step: float = 61.0) -> None:
    """Let time pass (``step`` seconds, past a default lease) and drain, ``passes`` times."""
    for _ in range(passes):
        app.clock.advance(step)
        await app.ops.drain()


async def make_app(
    provider: Any = None,
    *,
    kv: DurableKv | None = None,
    clock: ManualClock | None = None,
    bot: Bot | None = None,
    bot_id: str = "bot",
    instance_id: str | None = "i1",
    receipts: ReceiptSink | None = None,
    reply: str | None = None,
    **options: Any,
) -> App:
    """A started runtime on a manual clock; ``reply`` registers a handler that replies it."""
    clock = clock or ManualClock()
    provider = provider if provider is not None else MockProvider()
    kv = kv if kv is not None else MemoryKv()
    if bot is None:
        bot = Bot(bot_id, durability=policy(**options))
    if reply is not None:
        text = reply

        @bot.on_message
        async def answer(ctx: Context) -> None:
            await ctx.reply(text)

    runtime = bot.bind(
        provider,
        kv,
        instance_id=instance_id,
        receipts=receipts,
        clock=clock,
        rng=random.Random(7),
    )
    await runtime.start()
    return App(runtime, bot, provider, clock, kv)


class GatedProvider(MockProvider):
    """Holds every send until ``release`` is set; ``entered`` tells a send is waiting."""

    def __init__(self, name: str = "gated", **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        #: Sends waiting for ``release`` now.
        self.calling = 0

    async def send(self, message: Outbound) -> SendResult:
        self.entered.set()
        self.calling += 1
        try:
            await self.release.wait()
        finally:
            self.calling -= 1
        return await super().send(message)


class FrozenProvider(MockProvider):
    """Blocks its first send until ``thaw`` is set (the process froze mid-call)."""

    def __init__(self, name: str = "frozen", **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.entered = asyncio.Event()
        self.thaw = asyncio.Event()

    async def send(self, message: Outbound) -> SendResult:
        if not self.entered.is_set():
            self.entered.set()
            await self.thaw.wait()
        return await super().send(message)


class ListSink:
    """A receipts sink that keeps every receipt and acknowledges it at once (or never,
    with ``hold=True``, or with an error, with ``refuse``)."""

    def __init__(self, *, hold: bool = False, refuse: BaseException | None = None) -> None:
        self.receipts: list[botmesh.Receipt] = []
        self.hold = hold
        self.refuse = refuse
        self.acks: list[asyncio.Future[None]] = []

    async def publish(self, receipt: botmesh.Receipt) -> asyncio.Future[None]:
        self.receipts.append(receipt)
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.refuse is not None:
            ack.set_exception(self.refuse)
        elif not self.hold:
            ack.set_result(None)
        self.acks.append(ack)
        return ack

    def keys(self, state: str | None = None) -> list[str]:
        return [r.key for r in self.receipts if state is None or r.state == state]
