"""``Engine``: one bot's durability engine over one journal, put together from its parts.

=============  ====================================================================
``inbox``      journal an inbound, run its handlers, mark it done (``botmesh.state.inbox``)
``outbox``     journal a send, inline or enqueued; per-chat order (``botmesh.state.outbox``)
``delivery``   provider calls, the retry decision, dead letters (``botmesh.state.delivery``)
``leases``     leases, fencing tokens, heartbeats (``botmesh.state.lease``)
``sweeper``    the pass over due records (``botmesh.state.scheduler``)
``publisher``  receipts to the runtime's sink, at least once (``botmesh.state.receipts``)
``retention``  purge of finished records (``botmesh.state.retention``)
``operations`` list, replay, retry, discard, metrics (``botmesh.state.operations``)
``leader``     the provider session's lease, ``provider_session="leader"``
(``botmesh.state.leader``)
``turns``      a chat's handlers on one replica at a time (``botmesh.state.turns``)
=============  ====================================================================

The engine never opens or closes the journal (``DurableKv``): the runtime that chose it
does. ``open()`` recovers what an earlier run of this instance left (leases reclaimed at
once, inbounds replayed, sends in flight resolved by the ambiguity policy, receipts
published again). Only ``Exception`` is ever caught: a ``BaseException`` (a simulated
crash, a cancel) always goes through, so nothing is written after it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from botmesh.state.clock import Clock, SystemClock
from botmesh.state.config import DurabilityConfig
from botmesh.state.delivery import Delivery
from botmesh.state.events import Event
from botmesh.state.inbox import Inbox
from botmesh.state.kv import DurableKv, Entry, Op, Partitioned, anywhere, unpartitioned
from botmesh.state.leader import Leadership
from botmesh.state.lease import Leases
from botmesh.state.messages import Inbound
from botmesh.state.metrics import Metrics, Timings
from botmesh.state.operations import Operations
from botmesh.state.outbox import Outbox
from botmesh.state.ports import Provider
from botmesh.state.receipts import Publisher, ReceiptSink
from botmesh.state.retention import Retention
from botmesh.state.scheduler import Scheduler, Sweeper
from botmesh.state.turns import Turns

__all__ = ["Engine", "EngineHooks"]

log = logging.getLogger("botmesh.engine")


@dataclass(frozen=True, slots=True)
class EngineHooks:
    """What the engine calls back into the bot."""

    #: Run the handlers of one inbound (handler errors are the bot's to report). It may
    #: return journal writes that must land with the inbound's ``done`` (a flow checkpoint):
    #: the inbox commits them in the same ``inbox.mark_done`` write, or not at all.
    dispatch: Callable[[Inbound], Awaitable[Sequence[Op] | None]]
    #: Deliver an event to the bot's listeners (never raises).
    emit: Callable[[Event], Awaitable[None]]
    #: A flow checkpoint (``<scope>/flow/<chat>``) whose ``due`` time came: its pending ask
    #: timed out, or an operator restarted it. Returns how many it acted on (0 or 1).
    flow_due: Callable[[Entry, float], Awaitable[int]] | None = None
    #: Once per sweeper pass: due work the bot keeps in memory (non-persistent flows).
    sweep: Callable[[float], Awaitable[int]] | None = None


class Engine:
    """The inbox, the outbox and their leases for one bot scope on one journal."""

    def __init__(
        self,
        kv: DurableKv,
        *,
        scope: str,
        config: DurabilityConfig,
        provider: Provider,
        hooks: EngineHooks,
        instance_id: str,
        receipts: ReceiptSink | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        timings: Timings | None = None,
    ) -> None:
        self.kv = kv
        #: What the engine times (handlers, provider calls), when anything does.
        self.timings = timings
        #: The context of the work on one record found by a scan (``Partitioned.near``).
        self.near = kv.near if isinstance(kv, Partitioned) else anywhere
        #: The context of work on records of several partitions (``Partitioned``).
        self.across_partitions = (
            kv.across_partitions if isinstance(kv, Partitioned) else unpartitioned
        )
        #: This engine is the only writer of the records it sees (``Partitioned``).
        self.exclusive = isinstance(kv, Partitioned)
        self.scope = scope
        self.config = config
        self.provider = provider
        self.hooks = hooks
        self.instance_id = instance_id
        self.clock: Clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.boot = uuid.uuid4().hex[:12]
        self.prefix = f"{scope}/"
        self.in_prefix = f"{scope}/in/"
        self.out_prefix = f"{scope}/out/"
        self.flow_prefix = f"{scope}/flow/"
        self.metrics = Metrics()
        self.wake = asyncio.Event()
        self.leases = Leases(self)
        #: The provider session's lease (``provider_session="leader"``), else ``None``.
        self.leader = Leadership.of(self)
        #: Chat turns across replicas (a shared, unpartitioned journal), else ``None``.
        self.turns = Turns.of(self)
        self.publisher = Publisher(self, receipts) if receipts is not None else None
        self.outbox = Outbox(self)
        self.delivery = Delivery(self)
        self.inbox = Inbox(self)
        self.retention = Retention(self)
        self.sweeper = Sweeper(self)
        self.scheduler = Scheduler(self)
        self.operations = Operations(self)
        # The runtime's entry points, bound once (no pass-through call on the hot path):
        #: Journal an inbound, run its handlers, mark it done -> ``Outcome`` (``Inbox.handle``).
        self.handle = self.inbox.handle
        #: Journal a send, inline or for the sweeper -> ``Receipt`` (``Outbox.submit``).
        self.submit = self.outbox.submit
        #: Deliver an event to the bot's listeners (never raises).
        self.emit = hooks.emit

    async def open(self) -> None:
        """Recover (the journal is open already), then start the background scheduler."""
        if self.leader is not None:
            await self.leader.tick()
        await self.recover()
        self.scheduler.start()

    async def recover(self) -> int:
        """The recovery pass over what the journal holds now (at start; on the Kafka worker
        also for each partition it is given): per-chat order rebuilt, leases of this
        instance's earlier boots reclaimed, inbounds replayed, sends in flight resolved,
        receipts published again. Returns how many records it acted on."""
        await self.outbox.rebuild_tails()
        return await self.sweeper.sweep_once(recovering=True)

    async def close(self) -> None:
        """Stop the scheduler (letting a pass finish), release the provider session, and
        record the receipts published."""
        await self.scheduler.stop()
        if self.leader is not None:
            await self.leader.release()
        if self.publisher is not None:
            try:
                await self.publisher.flush()
            except Exception as exc:  # they stay unpublished; the next start publishes them
                log.warning("receipts not recorded as published at stop: %s", exc)

    def purge_at(self, now: float) -> float | None:
        return now + self.config.retention if self.config.retention > 0 else None
