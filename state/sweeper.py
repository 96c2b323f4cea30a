"""Scheduling, apart from the state transitions: a task that calls
``ScopedDurability.heartbeat_once`` and ``sweep_once`` on a timer.

It sleeps in real time (``asyncio``) and wakes early when the engine sets ``wake`` (an
enqueue, a deferral, an operator's replay); the transitions read the injected clock.
``stop()`` never cuts a pass short (a delivery cancelled between the provider call and its
record would be ambiguous at the next start): it waits for the pass in progress, up to a
grace period (the outbox lease), and only then cancels.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from state.durability import ScopedDurability

__all__ = ["Sweeper"]

log = logging.getLogger("botmesh.sweeper")


class Sweeper:
    """Runs every ``poll`` seconds, and heartbeats every third of the shortest lease."""

    def __init__(self, durability: ScopedDurability) -> None:
        self.durability = durability
        cfg = durability.config
        self.poll = cfg.poll
        self.tick = min(cfg.poll, cfg.inbox.lease / 3, cfg.outbox.lease / 3)
        self.grace = cfg.outbox.lease
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        if self._task is None and self.poll > 0:
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._run(), name="botmesh-sweeper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self.durability.wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), self.grace)
        except TimeoutError:
            log.warning("sweeper pass still running after %ss; cancelling it", self.grace)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        d = self.durability
        last = 0.0
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(d.wake.wait(), self.tick)
            if self._stopping:
                return
            woken = d.wake.is_set()
            d.wake.clear()
            try:
                await d.heartbeat_once()
                mono = time.monotonic()
                if woken or mono - last >= self.poll:
                    last = mono
                    await d.sweep_once()
            except Exception:
                log.exception("sweeper pass failed; next pass in %ss", self.tick)
