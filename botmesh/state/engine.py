"""``Engine``: one bot's durability engine over one journal, put together from its parts.

===============  ================================================================================
``leases``       leases, fencing tokens, heartbeats (``botmesh.state.lease``)
``retention``    purge of finished records (``botmesh.state.retention``)
``order``        per-chat order of sends: chat locks, tails (``botmesh.state.order``)
``leader``       the provider session's lease, ``provider_session="leader"``
                 (``botmesh.state.leader``)
``publisher``    receipts to the runtime's sink, at least once (``botmesh.state.receipts``)
``turns``        a chat's handlers on one replica at a time (``botmesh.state.turns``)
``messages``     the message log: each part sent, logged in the commit that records it
                 sent; a chat's history (``botmesh.state.message_log``)
``pacers``       each channel's sends paced under its rate limits (``botmesh.state.pacing``)
``delivery``     provider calls, the retry decision, dead letters (``botmesh.state.delivery``)
``outbox``       journal a send, inline or enqueued (``botmesh.state.outbox``)
``inbox``        journal an inbound, run its handlers, mark it done (``botmesh.state.inbox``)
``checkpoints``  flow checkpoints, alone or riding on an inbound's done (``checkpoints.py``)
``sweeper``      the pass over due records (``botmesh.state.scheduler``)
``scheduler``    the timer of the sweeper and of the heartbeats (``botmesh.state.scheduler``)
``erasure``      a chat's records deleted, with a receipt (``botmesh.state.erasure``)
``operations``   list, replay, retry, discard, erase, metrics (``botmesh.state.operations``)
===============  ================================================================================

Each part gets the collaborators it uses, never the engine; this is the one place that
wires them, in the order of the table (a part comes after the parts it calls). What they
all use is passed as one value, with what is each part's own besides: the first parts
(leases, leader, publisher) take the ``Basis`` (``botmesh.state.basis``: the journal, the
keys, the clock, ...); the parts after them take a ``Common`` (``botmesh.state.common``:
the basis with the leases, the leader, the publisher, the retention rule and the bot's
listeners). The erasure takes the basis and its parts one by one: the events module names
its receipt, so it may not import ``Common``, which names the events' ``emit``.

The engine never opens or closes the journal (``DurableKv``): the runtime that chose it
does. ``open()`` recovers what an earlier run of this instance left (leases reclaimed at
once, inbounds replayed, sends in flight resolved by the ambiguity policy, receipts
published again). Only ``Exception`` is ever caught: a ``BaseException`` (a simulated
crash, a cancel) always goes through, so nothing is written after it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from botmesh.state.basis import Basis
from botmesh.state.checkpoints import Checkpoints
from botmesh.state.clock import Clock
from botmesh.state.common import Common
from botmesh.state.config import DurabilityConfig, RateLimits
from botmesh.state.counters import Timings
from botmesh.state.delivery import Delivery
from botmesh.state.edits import Change, plan_change
from botmesh.state.erasure import Erasure, ErasureReceipt
from botmesh.state.events import Emit, ErasedEvent
from botmesh.state.inbox import Dispatch, Inbox
from botmesh.state.keys import fingerprint
from botmesh.state.kv import DurableKv, Entry
from botmesh.state.leader import Leadership
from botmesh.state.lease import Leases
from botmesh.state.message_log import JournalMessageLog
from botmesh.state.messages import Receipt
from botmesh.state.operations import Operations
from botmesh.state.order import ChatOrder
from botmesh.state.outbox import Outbox
from botmesh.state.pacing import Pacer, declared_limits, group_test
from botmesh.state.ports import Provider
from botmesh.state.receipts import Publisher, ReceiptSink
from botmesh.state.records import receipt_of
from botmesh.state.retention import Retention
from botmesh.state.scheduler import Scheduler, Sweeper
from botmesh.state.statuses import Statuses
from botmesh.state.turns import Turns

__all__ = ["Engine", "EngineHooks", "RuntimeOptions", "checked_options"]

log = logging.getLogger("botmesh.engine")


class RuntimeOptions(TypedDict, total=False):
    """The keyword options of a bot bound to a provider and a journal, spelled once:
    ``botmesh.run``, ``Bot.bind``, ``Runtime`` and the worker's ``BotDefinition.bind`` take
    them as ``**options`` (checked by name: ``checked_options``), and the engine gets them."""

    #: This runtime's name among the bot's (the leases' owner); default: the host, the bot
    #: and its connection (and a random suffix on a journal other hosts share).
    instance_id: str | None
    #: Where each settled send's receipt goes (the worker's Kafka sink); default: nowhere.
    receipts: ReceiptSink | None
    #: The engine's time (tests); default: the system's.
    clock: Clock | None
    #: The engine's randomness, the backoff's jitter (tests).
    rng: random.Random | None
    #: Histograms of handler and provider times (the worker's Prometheus ones).
    timings: Timings | None
    #: The other channels a send's ``Fallback`` may go out through, by name.
    fallbacks: Mapping[str, Provider] | None
    #: Rate limits over the bot's ``outbox.rate_limits``, where not ``"default"`` (the
    #: worker's ``BOTMESH_RATE_LIMIT``, ``BOTMESH_CHAT_RATE_LIMIT``,
    #: ``BOTMESH_GROUP_RATE_LIMIT``).
    rate_limits: RateLimits | None


def checked_options(given: Mapping[str, object]) -> RuntimeOptions:
    """``given`` as ``RuntimeOptions``; a ``TypeError`` naming any other keyword (a typo
    would otherwise be dropped without a word)."""
    known = RuntimeOptions.__optional_keys__
    unknown = sorted(k for k in given if k not in known)
    if unknown:
        raise TypeError(
            f"unknown option {', '.join(map(repr, unknown))}: a bound bot takes "
            f"{', '.join(sorted(known))}"
        )
    return cast(RuntimeOptions, dict(given))


@dataclass(frozen=True, slots=True)
class EngineHooks:
    """What the engine calls back into the bot."""

    #: Run the handlers of one inbound (handler errors are the bot's to report). It may
    #: return journal writes that must land with the inbound's ``done`` (a flow checkpoint):
    #: the inbox commits them in the same ``inbox.mark_done`` write, or not at all.
    dispatch: Dispatch
    #: Deliver an event to the bot's listeners (never raises).
    emit: Emit
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
        fallbacks: Mapping[str, Provider] | None = None,
        rate_limits: RateLimits | None = None,
    ) -> None:
        self.kv = kv
        #: The rate limits of the bot's channel: the runtime's over the bot's.
        self.rate_limits = (
            config.outbox.rate_limits
            if rate_limits is None
            else rate_limits.over(config.outbox.rate_limits)
        )
        #: The channels a send's fallback may name (``botmesh.state.fallback``), by name.
        self.fallbacks = dict(fallbacks or {})
        self.scope = scope
        self.config = config
        self.provider = provider
        self.hooks = hooks
        self.instance_id = instance_id
        #: What the engine is built on: the journal, the scope's keys, this instance, its
        #: time, randomness, counters and wake-up call.
        self.basis = basis = Basis.of(
            kv, scope=scope, instance_id=instance_id, clock=clock, rng=rng, timings=timings
        )
        self.clock = basis.clock
        self.keys = keys = basis.keys
        self.in_prefix = keys.inbox
        self.out_prefix = keys.outbox
        self._wire(receipts)
        # The runtime's entry points, bound once (no pass-through call on the hot path):
        #: Journal an inbound, run its handlers, mark it done -> ``Outcome`` (``Inbox.handle``).
        self.handle = self.inbox.handle
        #: Journal a send, inline or for the sweeper -> ``Receipt`` (``Outbox.submit``).
        self.submit = self.outbox.submit
        #: Deliver an event to the bot's listeners (never raises).
        self.emit = hooks.emit

    # -- the wiring: each part from the collaborators it uses ------------------------------

    def _wire(self, receipts: ReceiptSink | None) -> None:
        """Every part, in the order of the table (a part after the parts it calls)."""
        kv, keys, config, basis = self.kv, self.keys, self.config, self.basis
        self.leases = Leases(basis)
        self.retention = Retention(
            kv, prefix=keys.all, retention=config.retention, logged=keys.log, named=keys.mid
        )
        self.order = ChatOrder(kv, prefix=keys.outbox, config=config.outbox)
        #: The provider session's lease (``provider_session="leader"``), else ``None``.
        self.leader = self._new_leader()
        self.publisher = None if receipts is None else Publisher(basis, receipts)
        #: What the parts from here on share: the basis, the parts above, the listeners.
        self.common = Common.on(
            basis,
            leases=self.leases,
            leader=self.leader,
            publisher=self.publisher,
            retention=self.retention,
            emit=self.hooks.emit,
        )
        #: Chat turns across replicas (a shared, unpartitioned journal), else ``None``.
        self.turns = self._new_turns()
        self.messages = self._new_messages()
        #: Each channel's pacing, by fallback channel name (``None``: the bot's channel).
        self.pacers = self._new_pacers()
        self.delivery = self._new_delivery()
        self.outbox = self._new_outbox()
        #: Channels' status webhooks applied to the sends they name.
        self.statuses = Statuses(
            self.common, delivery=self.delivery, provider=self.provider, fallbacks=self.fallbacks
        )
        self.inbox = self._new_inbox()
        self.checkpoints = Checkpoints(kv, prefix=keys.flow, purge_at=self.retention.purge_at)
        self.sweeper = self._new_sweeper()
        self.scheduler = Scheduler(self.common, config=config, sweeper=self.sweeper)
        self.operations = self._new_operations()

    def _new_leader(self) -> Leadership | None:
        if not Leadership.wanted(self.config, exclusive=self.basis.exclusive):
            return None
        return Leadership(
            self.basis,
            lease=self.config.leader.lease,
            provider=self.provider,
            rebuild_tails=self.order.rebuild_tails,
        )

    def _new_turns(self) -> Turns | None:
        if not Turns.wanted(self.config.inbox, self.kv, exclusive=self.basis.exclusive):
            return None
        return Turns(self.common, config=self.config.inbox, poll=self.config.poll)

    def _new_messages(self) -> JournalMessageLog:
        """The message log: what was sent, per chat (``history``)."""
        return JournalMessageLog(
            self.kv,
            keys=self.keys,
            channel=self.provider.name,
            retention=self.config.message_log_retention,
            enabled=self.config.message_log.enabled,
            texts=self.config.message_log.texts,
        )

    def _new_pacers(self) -> dict[str | None, Pacer]:
        """The bot's channel under its limits (the channel's declared ones, the settings
        over them); each fallback channel under the ones it declares."""
        channels: dict[str | None, Provider] = {None: self.provider}
        channels.update(self.fallbacks)
        return {
            name: Pacer(
                self.rate_limits.limits(declared_limits(provider))
                if name is None
                else declared_limits(provider),
                clock=self.basis.clock,
                metrics=self.basis.metrics,
                is_group=group_test(provider),
            )
            for name, provider in channels.items()
        }

    def set_pace_share(self, fraction: float) -> None:
        """This engine's part of each channel's rate, in (0, 1] (the Kafka worker's: the
        part of the inbound partitions it owns); chat limits are not shared."""
        for pacer in self.pacers.values():
            pacer.share = fraction

    def _new_delivery(self) -> Delivery:
        return Delivery(
            self.common,
            config=self.config.outbox,
            poll=self.config.poll,
            provider=self.provider,
            order=self.order,
            fallbacks=self.fallbacks,
            message_log=self.messages,
            pacers=self.pacers,
        )

    def _new_outbox(self) -> Outbox:
        return Outbox(
            self.common,
            config=self.config.outbox,
            fail_open=self.config.fail_open,
            provider=self.provider,
            order=self.order,
            delivery=self.delivery,
        )

    def _new_inbox(self) -> Inbox:
        return Inbox(
            self.common,
            config=self.config.inbox,
            fail_open=self.config.fail_open,
            provider=self.provider,
            turns=self.turns,
            dispatch=self.hooks.dispatch,
        )

    def _new_sweeper(self) -> Sweeper:
        return Sweeper(
            self.common,
            backoff=self.config.inbox.backoff,
            inbox=self.inbox,
            delivery=self.delivery,
            flow_due=self.hooks.flow_due,
            sweep=self.hooks.sweep,
            sends_at_once=self.config.outbox.sweep_at_once,
        )

    def _new_erasure(self) -> Erasure:
        emit = self.hooks.emit

        async def erased(receipt: ErasureReceipt) -> None:
            await emit(ErasedEvent(receipt.chat_id, receipt))

        return Erasure(
            self.basis,
            order=self.order,
            leases=self.leases,
            publisher=self.publisher,
            erased=erased,
        )

    def _new_operations(self) -> Operations:
        return Operations(
            self.common,
            delivery=self.delivery,
            sweeper=self.sweeper,
            checkpoints=self.checkpoints,
            erasure=self._new_erasure(),  # the operator's alone: no other part calls it
            recover=self.recover,  # a callback: the recovery pass is the engine's own
        )

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
        await self.order.rebuild_tails()
        return await self.sweeper.sweep_once(recovering=True)

    async def change(
        self,
        key: str,
        op: Change,
        own_key: str,
        *,
        text: str | None = None,
        options: Mapping[str, Any] | None = None,
        derived: bool = False,
        inbound_id: str | None = None,
        inline: bool = True,
    ) -> Receipt:
        """Edit (``text``) or delete the send ``key``, journaled under ``own_key``
        (``botmesh.state.edits``): answered from the journal when ``own_key`` is recorded
        already (a replayed handler), so the channel is called once."""
        existing = await self.kv.get(self.out_prefix + own_key)
        if existing is not None:
            self.basis.metrics.outbox_deduped += 1
            return receipt_of(existing.value, self.clock.now())
        message, plan = await plan_change(
            self.common, self.provider, key, op, text=text, options=options
        )
        receipt = await self.outbox.submit(
            message,
            own_key,
            inline=inline,
            derived=derived,
            fp=fingerprint(message) if derived else None,
            inbound_id=inbound_id,
            changes=plan,
        )
        self.basis.metrics.outbox_edits += 1
        return receipt

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
