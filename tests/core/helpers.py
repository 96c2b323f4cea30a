"""Helpers of the core tests: a bot factory on a manual clock, a journal that can fail."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from botmesh import Bot
from botmesh.testing import ManualClock, MockProvider
from state.durability import ScopedDurability
from state.errors import JournalUnavailableError
from state.kv import DurableKv, Entry, IndexName, MemoryKv, Op


class FlakyKv:
    """A ``DurableKv`` whose commits fail on demand (``JournalUnavailableError``)."""

    def __init__(self, inner: DurableKv | None = None) -> None:
        self.inner = inner or MemoryKv()
        self.down = False
        self.fail_labels: dict[str, int] = {}
        self.labels: list[str] = []

    def fail(self, label: str, times: int = 1) -> None:
        self.fail_labels[label] = times

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def get(self, key: str) -> Entry | None:
        return await self.inner.get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        return await self.inner.get_many(keys)

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        left = self.fail_labels.get(label, 0)
        if self.down or left:
            if left:
                self.fail_labels[label] = left - 1
            raise JournalUnavailableError(f"journal down (test) at {label}")
        self.labels.append(label)
        return await self.inner.commit(ops, label=label)

    async def range(
        self, index: IndexName, prefix: str, until: float, limit: int = 100
    ) -> list[str]:
        return await self.inner.range(index, prefix, until, limit)

    async def scan(self, prefix: str) -> list[Entry]:
        return await self.inner.scan(prefix)


def durable(d: ScopedDurability | None) -> ScopedDurability:
    assert d is not None
    return d


def make_bot(
    provider: Any = None,
    *,
    clock: ManualClock | None = None,
    bot_id: str = "bot",
    **options: Any,
) -> tuple[Bot, Any, ManualClock, ScopedDurability]:
    """A durable bot on a manual clock, no background sweeper, no jitter."""
    clock = clock or ManualClock()
    provider = provider if provider is not None else MockProvider()
    options.setdefault("poll", 0)
    inbox = dict(options.pop("inbox", {}))
    inbox.setdefault("backoff", {"jitter": 0})
    outbox = dict(options.pop("outbox", {}))
    outbox.setdefault("backoff", {"jitter": 0})
    bot = Bot(
        provider,
        bot_id=bot_id,
        durability={**options, "inbox": inbox, "outbox": outbox},
        clock=clock,
    )
    return bot, provider, clock, durable(bot.durability)
