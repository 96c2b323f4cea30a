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
from typing import TYPE_CHECKING

from botmesh.state.events import ErrorEvent
from botmesh.state.kv import Entry
from botmesh.state.records import SETTLED, InboxState, OutboxState

if TYPE_CHECKING:
    from botmesh.state.engine import Engine

__all__ = ["Scheduler", "Sweeper"]

log = logging.getLogger("botmesh.sweeper")

_DELIVERABLE = frozenset({OutboxState.PENDING, OutboxState.FAILED})
#: Records copied out once settled: settled sends (their receipts) and dead inbounds (their
#: dead letters, with a sink that takes them).
_COPIED = frozenset({*SETTLED, InboxState.DEAD})


class Sweeper:
    """The sweeper's pass over due records."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine
        self._fail_counts: dict[str, int] = {}
        self._not_before: dict[str, float] = {}
        self._backoff = engine.config.inbox.backoff.backoff()

    async def sweep_once(self, now: float | None = None, *, recovering: bool = False) -> int:
        """One pass; returns how many records it acted on. ``recovering`` (the first pass
        after start) also takes this instance's leases of earlier boots, whatever their
        expiry, and publishes every receipt left unpublished."""
        e = self._e
        now = e.clock.now() if now is None else now
        if e.leader is not None:
            await e.leader.tick(now)
        until = math.inf if recovering else now
        keys = await e.kv.range("due", e.prefix, until, limit=1_000_000 if recovering else 500)
        # Sends first: a replayed handler must find its earlier sends settled (sent,
        # unknown or resent), so that a later reply never overtakes them in the chat.
        keys.sort(key=lambda k: k.startswith(e.in_prefix))
        acted = 0
        for key in keys:
            acted += await self._visit(key, now, recovering)
        if e.hooks.sweep is not None:
            acted += await e.hooks.sweep(now)
        acted += await e.retention.purge(now)
        if e.publisher is not None:
            await e.publisher.flush(wait=False)
        return acted

    async def _visit(self, key: str, now: float, recovering: bool) -> int:
        e = self._e
        if key in e.leases.held:
            return 0
        nb = self._not_before.get(key)
        if nb is not None and nb > now:
            return 0
        try:
            with e.near(key):
                entry = await e.kv.get(key)
                acted = 0 if entry is None else await self._route(entry, now, recovering)
        except Exception as exc:
            count = self._fail_counts.get(key, 0) + 1
            self._fail_counts[key] = count
            self._not_before[key] = now + self._backoff.delay(count, e.rng)
            log.warning("sweeper: %s failed (%d in a row): %s", key, count, exc)
            await e.emit(ErrorEvent(exc, "sweeper"))
            return 0
        if self._fail_counts:
            self._fail_counts.pop(key, None)
            self._not_before.pop(key, None)
        return acted

    async def _route(self, entry: Entry, now: float, recovering: bool) -> int:
        e = self._e
        value = entry.value
        state = value.get("state")
        unpublished = state in _COPIED and value.get("published") is False
        if unpublished and e.publisher is not None and (recovering or _due_by(entry, now)):
            return await e.publisher.republish(entry)
        if entry.key.startswith(e.flow_prefix):
            if e.hooks.flow_due is None or not _due_by(entry, now):
                return 0
            return await e.hooks.flow_due(entry, now)
        if entry.key.startswith(e.in_prefix):
            if state != InboxState.PENDING or not self._due(entry, now):
                return 0
            outcome = await e.inbox.replay(entry, now)
            return int(outcome != "duplicate")
        if state in _DELIVERABLE:
            return await e.delivery.due(entry, now)
        return 0

    def _due(self, entry: Entry, now: float) -> bool:
        ls = self._e.leases.state(entry.value, now)
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

    def __init__(self, engine: Engine) -> None:
        self._e = engine
        cfg = engine.config
        self.poll = cfg.poll
        self.tick = min(cfg.poll, cfg.inbox.lease / 3, cfg.outbox.lease / 3)
        if engine.leader is not None:
            self.tick = min(self.tick, cfg.leader.lease / 6)
        self.grace = cfg.outbox.lease
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
        self._e.wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), self.grace)
        except TimeoutError:
            log.warning("sweeper pass still running after %ss; cancelling it", self.grace)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        e = self._e
        last = 0.0
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(e.wake.wait(), self.tick)
            if self._stopping:
                return
            woken = e.wake.is_set()
            e.wake.clear()
            try:
                if e.leader is not None:
                    await e.leader.tick()
                await e.leases.heartbeat_once(e.clock.now())
                mono = time.monotonic()
                if woken or mono - last >= self.poll:
                    last = mono
                    await e.sweeper.sweep_once()
                elif e.publisher is not None:
                    await e.publisher.flush(wait=False)
            except Exception:
                log.exception("sweeper pass failed; next pass in %ss", self.tick)
