"""The scheduler: the sweeper pass (``Sweeper.sweep_once``) and the timer that runs it and
the lease heartbeat (``Scheduler``).

A sweep pass looks at every record of the scope whose ``due`` time came: inbounds to
replay (a restart, an expired lease), sends to retry, to resolve after a crash or to let
go after the part or send they waited for, receipts to publish again, flows whose pending
ask timed out (or an operator restarted); then retention. A
record whose visit fails is retried after the inbox backoff, without holding up the rest.

The timer sleeps in real time and wakes early when the engine sets ``wake`` (an enqueue,
a deferral, an operator's replay); the passes read the engine's clock. ``stop()`` never
cuts a pass short (a delivery cancelled between the provider call and its record would be
ambiguous at the next start): it waits for the pass in progress, up to a grace period (the
outbox lease), and only then cancels.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable

from botmesh.state.common import Common
from botmesh.state.config import BackoffConfig, DurabilityConfig
from botmesh.state.delivery import Delivery
from botmesh.state.errors import FencedError, JournalUnavailableError
from botmesh.state.events import ErrorEvent
from botmesh.state.inbox import Inbox
from botmesh.state.kv import Entry
from botmesh.state.records import SETTLED, InboxState, OutboxState

__all__ = ["Scheduler", "Sweeper"]

log = logging.getLogger("botmesh.sweeper")

_DELIVERABLE = frozenset({OutboxState.PENDING, OutboxState.FAILED})
#: The most due records a pass takes; when it took that many and acted on some, the next
#: pass follows at once (not a ``poll`` later): a campaign's thousands of sends go without
#: pauses.
PASS_LIMIT = 500
#: Records copied out once settled: settled sends (their receipts) and dead inbounds (their
#: dead letters, with a sink that takes them).
_COPIED = frozenset({*SETTLED, InboxState.DEAD})


class Sweeper:
    """The sweeper's pass over due records."""

    def __init__(
        self,
        common: Common,
        *,
        backoff: BackoffConfig,
        inbox: Inbox,
        delivery: Delivery,
        flow_due: Callable[[Entry, float], Awaitable[int]] | None,
        sweep: Callable[[float], Awaitable[int]] | None,
        sends_at_once: int = 1,
    ) -> None:
        self._common = common
        #: How many chats' due sends a pass delivers at a time (``outbox.sweep_at_once``).
        self._sends_at_once = sends_at_once
        self._inbox = inbox
        self._delivery = delivery
        #: The bot's hooks: a due flow checkpoint; due work it keeps in memory.
        self._flow_due = flow_due
        self._sweep = sweep
        self._fail_counts: dict[str, int] = {}
        self._not_before: dict[str, float] = {}
        self._backoff = backoff.backoff()

    async def sweep_once(self, now: float | None = None, *, recovering: bool = False) -> int:
        """One pass; returns how many records it acted on. ``recovering`` (the first pass
        after start) also takes this instance's leases of earlier boots, whatever their
        expiry, and publishes every receipt left unpublished."""
        now = self._common.clock.now() if now is None else now
        if self._common.leader is not None:
            await self._common.leader.tick(now)
        until = math.inf if recovering else now
        scope = self._common.keys
        limit = 1_000_000 if recovering else PASS_LIMIT
        keys = await self._common.kv.range("due", scope.all, until, limit=limit)
        # Sends first: a replayed handler must find its earlier sends settled (sent,
        # unknown or resent), so that a later reply never overtakes them in the chat.
        sends = [k for k in keys if k.startswith(scope.outbox)]
        acted = await self._visit_sends(sends, now, recovering)
        rest = [k for k in keys if not k.startswith(scope.outbox)]
        rest.sort(key=lambda k: k.startswith(scope.inbox))
        for key in rest:
            acted += await self._visit(key, now, recovering)
        if self._sweep is not None:
            acted += await self._sweep(now)
        if acted and len(keys) >= limit:  # more may be due: the next pass right after
            self._common.wake.set()
        acted += await self._common.retention.purge(now)
        if self._common.publisher is not None:
            await self._common.publisher.flush(wait=False)
        return acted

    async def _visit_sends(self, keys: list[str], now: float, recovering: bool) -> int:
        """The due sends: each chat's in order (of their due times), up to
        ``outbox.sweep_at_once`` chats at a time, so that one send's provider call and journal
        writes do not hold up the next chat's (a campaign goes at the channel's pace, not
        one call after another). What one visit raised beyond ``Exception`` (the process
        stopping) stops the others and is raised as it is."""
        chats: dict[str, list[str]] = {}
        for key in keys:
            chats.setdefault(await self._chat_of(key), []).append(key)
        if len(chats) < 2 or self._sends_at_once < 2:
            return sum([await self._visit(k, now, recovering) for k in keys])
        turns = asyncio.Semaphore(self._sends_at_once)

        async def chat_sends(chain: list[str]) -> int:
            async with turns:
                return sum([await self._visit(k, now, recovering) for k in chain])

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(chat_sends(c)) for c in chats.values()]
        except BaseExceptionGroup as stopped:
            raise stopped.exceptions[0] from None
        return sum(t.result() for t in tasks)

    async def _chat_of(self, key: str) -> str:
        """The chat a due send goes to (its key when it cannot be read: its visit says why)."""
        try:
            with self._common.near(key):
                entry = await self._common.kv.get(key)
        except Exception:
            return key
        payload = entry.value.get("payload") if entry is not None else None
        chat = payload.get("chat_id") if isinstance(payload, dict) else None
        return str(chat) if chat is not None else key

    async def _visit(self, key: str, now: float, recovering: bool) -> int:
        if key in self._common.leases.held:
            return 0
        nb = self._not_before.get(key)
        if nb is not None and nb > now:
            return 0
        try:
            with self._common.near(key):
                entry = await self._common.kv.get(key)
                acted = 0 if entry is None else await self._route(entry, now, recovering)
        except Exception as exc:
            count = self._fail_counts.get(key, 0) + 1
            self._fail_counts[key] = count
            self._not_before[key] = now + self._backoff.delay(count, self._common.rng)
            log.warning("sweeper: %s failed (%d in a row): %s", key, count, exc)
            await self._common.emit(ErrorEvent(exc, "sweeper"))
            return 0
        if self._fail_counts:
            self._fail_counts.pop(key, None)
            self._not_before.pop(key, None)
        return acted

    async def _route(self, entry: Entry, now: float, recovering: bool) -> int:
        value = entry.value
        state = value.get("state")
        unpublished = state in _COPIED and value.get("published") is False
        if (
            unpublished
            and self._common.publisher is not None
            and (recovering or _due_by(entry, now))
        ):
            return await self._common.publisher.republish(entry)
        if entry.key.startswith(self._common.keys.flow):
            if self._flow_due is None or not _due_by(entry, now):
                return 0
            return await self._flow_due(entry, now)
        if entry.key.startswith(self._common.keys.inbox):
            if state != InboxState.PENDING or not self._due(entry, now):
                return 0
            outcome = await self._inbox.replay(entry, now)
            return int(outcome != "duplicate")
        if state in _DELIVERABLE:
            return await self._delivery.due(entry, now)
        return 0

    def _due(self, entry: Entry, now: float) -> bool:
        ls = self._common.leases.state(entry.value, now)
        if ls == "live":
            return False
        return ls == "orphan" or entry.due is None or entry.due <= now

    async def drain(self, max_passes: int = 100) -> int:
        """Sweep until a pass acts on nothing (tests, shutdown); returns the total."""
        total = 0
        for _ in range(max_passes):
            n = await self.sweep_once()
            total += n
            if n == 0:
                break
        return total


def _due_by(entry: Entry, now: float) -> bool:
    return entry.due is None or entry.due <= now


class Scheduler:
    """Runs a sweep every ``poll`` seconds (or when woken), and heartbeats every third of
    the shortest lease."""

    def __init__(
        self,
        common: Common,
        *,
        config: DurabilityConfig,
        sweeper: Sweeper,
    ) -> None:
        self._common = common
        self._sweeper = sweeper
        self.poll = config.poll
        self.tick = min(config.poll, config.inbox.lease / 3, config.outbox.lease / 3)
        if common.leader is not None:
            self.tick = min(self.tick, config.leader.lease / 6)
        self.grace = config.outbox.lease
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        if self._task is None and self.poll > 0:
            self._stopping = False
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name="botmesh-sweeper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self._common.wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), self.grace)
        except TimeoutError:
            log.warning("sweeper pass still running after %ss; cancelling it", self.grace)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        last = 0.0
        unavailable = False
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._common.wake.wait(), self.tick)
            if self._stopping:
                return
            woken = self._common.wake.is_set()
            self._common.wake.clear()
            try:
                if self._common.leader is not None:
                    await self._common.leader.tick()
                await self._common.leases.heartbeat_once(self._common.clock.now())
                mono = time.monotonic()
                if woken or mono - last >= self.poll:
                    last = mono
                    await self._sweeper.sweep_once()
                elif self._common.publisher is not None:
                    await self._common.publisher.flush(wait=False)
                unavailable = False
            except FencedError as exc:  # a partition taken away meanwhile: its new owner's
                log.info("sweeper pass stopped: %s", exc)
            except JournalUnavailableError as exc:  # a moment: a rebalance, the broker
                # said once per outage, without a traceback (it is tried again every tick)
                level = logging.DEBUG if unavailable else logging.WARNING
                unavailable = True
                log.log(level, "sweeper pass stopped, the journal is unavailable: %s", exc)
            except Exception:
                log.exception("sweeper pass failed; next pass in %ss", self.tick)
