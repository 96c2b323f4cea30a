"""The outbox: every send is journaled under its idempotency key before the provider is
called. ``send`` (inline: journaled in flight, delivered now, retried inline up to
``outbox.inline_max``) and ``enqueue`` (journaled for the sweeper) share one path.

::

    (journal) ──> pending ──(provider ok)──> sent ──(retention)──> purged
                   │  ▲  ╲
     (retryable    │  │   ╲ (final error, retries spent, previous part dead)
      error)       ▼  │    ╲
                  failed ───> dead
    pending+inflight found after a crash ──> unknown (on_ambiguous="skip") or sent again

A text over the channel's limit is split first, into one record per part (``key``,
``key#2``…, linked by ``previous_part``); media rides on part 1. Only a part that still
cannot be journaled (over ``outbox.max_payload_bytes``, or not JSON) bypasses the outbox.
With ``outbox.keep_chat_order`` a send to a chat whose earlier send waits for a retry is
journaled behind it (``after``) and leaves that to the sweeper.

With ``provider_session="leader"`` an inline send on a standby (a replica not holding the
provider session) is journaled as an enqueued one would be, its receipt ``pending``: the
leader's sweeper delivers it. The standby's sends to a chat are chained (``after``) so the
leader delivers them in the order they were made.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from botmesh.state.common import Common
from botmesh.state.config import OutboxConfig
from botmesh.state.errors import DurabilityError, JournalUnavailableError, VersionConflictError
from botmesh.state.keys import diverged_key, part_key
from botmesh.state.kv import Put, handover
from botmesh.state.lease import Held
from botmesh.state.messages import Outbound, OutboxState, Receipt
from botmesh.state.order import ChatOrder
from botmesh.state.ports import Provider
from botmesh.state.records import SETTLED, Json, encode_outbound, receipt_of
from botmesh.state.splitter import split_text, text_length, unit_of
from botmesh.state.timing import Timing
from botmesh.state.writes import Write

__all__ = [
    "Deliveries",
    "Outbox",
    "Plan",
    "new_values",
    "part_payloads",
]

log = logging.getLogger("botmesh.outbox")


def part_payloads(payload: Json, texts: list[str | None]) -> list[Json]:
    """The journaled payload of each part: part 1 keeps the media, every part the options."""
    first = {**payload, "text": texts[0]}
    if len(texts) == 1:
        return [first]
    rest = {k: v for k, v in payload.items() if k != "media"}
    return [first, *({**rest, "text": t} for t in texts[1:])]


def new_values(
    key: str,
    payloads: list[Json],
    *,
    first_part: int,
    parts: int,
    fp: str | None,
    inbound_id: str | None,
    now: float,
    lease: Json | None,
    after: str | None,
    fallback: Json | None = None,
    at: float | None = None,
    deadline: float | None = None,
) -> list[Json]:
    """One record per part; the first one leased and in flight when ``lease`` (inline);
    ``fallback`` and a scheduled send's time (``at``) ride on the first part
    (``botmesh.state.fallback``), its ``deadline`` on every part (``botmesh.state.timing``)."""
    values: list[Json] = []
    previous: str | None = None
    for i, payload in enumerate(payloads, start=first_part):
        k = part_key(key, i)
        value: Json = {
            "key": k,
            "state": OutboxState.PENDING,
            "attempts": 0,
            "token": 0,
            "payload": payload,
            "created": now,
            "updated": now,
        }
        if lease is not None:
            value["token"] = 1
            value["lease"] = lease
            if i == first_part:
                value.update(attempts=1, inflight=True)
        if parts > 1:
            value.update(part=i, parts=parts)
        if previous is not None:
            value["previous_part"] = previous
        if i == first_part:
            if fp is not None:
                value["fp"] = fp
            if after is not None:
                value["after"] = after
            if fallback is not None:
                value["fallback"] = fallback
            if at is not None:
                value["at"] = at
        if deadline is not None:
            value["deadline"] = deadline
        if inbound_id is not None:
            value["inbound_id"] = inbound_id
        values.append(value)
        previous = k
    return values


@dataclass(slots=True)
class Plan:
    """A send cut into what goes to the provider directly and what is journaled."""

    chat_id: str
    #: Parts sent straight to the provider, unjournaled (counted in ``outboxBypassed``).
    bypass: list[Outbound] = field(default_factory=list)
    #: Parts to journal, in order, with their payloads.
    parts: list[Outbound] = field(default_factory=list)
    payloads: list[Json] = field(default_factory=list)
    #: Part number of ``parts[0]`` (2 when part 1 bypassed).
    first_part: int = 1
    total: int = 1
    #: An edit or a delete: each part's ``op`` and ``target`` (``botmesh.state.edits``).
    changes: list[Json] = field(default_factory=list)


class Deliveries(Protocol):
    """What the outbox hands its journaled and unjournaled parts to
    (``botmesh.state.delivery.Delivery``)."""

    async def deliver_inline(
        self, helds: list[Held], outs: list[Outbound], started: float
    ) -> Receipt: ...

    async def bypass(
        self, message: Outbound, key: str, inbound_id: str | None, part: int
    ) -> Receipt: ...

    async def pace(self, chat_id: str, value: Json | None = None) -> None: ...


class Outbox:
    """Journals sends; answers a recorded key from the outbox; keeps per-chat order."""

    def __init__(
        self,
        common: Common,
        *,
        config: OutboxConfig,
        fail_open: bool,
        provider: Provider,
        order: ChatOrder,
        delivery: Deliveries,
    ) -> None:
        self._common = common
        self._prefix = common.keys.outbox
        self._config = config
        self._fail_open = fail_open
        self._provider = provider
        self._order = order
        self._delivery = delivery
        self._lease = config.lease
        self._keep_order = config.keep_chat_order
        #: Texts shorter than this fit ``max_payload_bytes`` whatever they hold (6 bytes a
        #: character at most in JSON, plus the envelope).
        self._small_text = (config.max_payload_bytes - 256) // 6

    # -- the one path ------------------------------------------------------------------

    async def submit(
        self,
        message: Outbound,
        key: str,
        *,
        inline: bool,
        derived: bool = False,
        fp: str | None = None,
        inbound_id: str | None = None,
        fallback: Json | None = None,
        timing: Timing | None = None,
        changes: Plan | None = None,
    ) -> Receipt:
        """Journal a send under ``key``; the one path of ``ctx.reply`` / ``send`` (``inline``:
        delivered now) and ``enqueue`` (left to the sweeper). Returns the receipt of its
        first part: answered from the outbox when ``key`` is recorded; ``pending`` for an
        enqueued send, or an inline one that must wait behind a send of its chat that waits
        for a retry (``keep_chat_order``); else ``sent``.

        ``fallback`` (a ``Fallback.to_json()``) is journaled on the first part: what goes
        out instead when the channel refuses the send (``botmesh.state.fallback``).

        Inline, it retries up to ``outbox.inline_max`` then raises ``SendDeferredError``;
        raises the error of a final failure (the record is dead); ``FencedError`` when the
        lease was taken over. ``timing`` (``botmesh.state.timing``): a scheduled send is
        journaled for the sweeper, whatever ``inline`` says; a send past its deadline (its
        own, else ``outbox.deliver_within``) dies ``expired``. ``changes``: the plan of an
        edit or a delete of a sent send (``botmesh.state.edits``), journaled as a send is.
        """
        when = self._when(timing)
        if when[0] is not None:
            inline = False
        plan = self.plan(message) if changes is None else changes
        if not inline and not plan.bypass:  # enqueue returns at once: no chat lock
            queued = await self._journal(
                plan, key, derived, fp, inbound_id, inline=False, fallback=fallback, when=when
            )
            assert isinstance(queued, Receipt)
            return queued
        async with self._order.chat_lock(message.chat_id):
            first = await self._bypass(plan, key, inbound_id) if plan.bypass else None
            if not plan.parts:
                assert first is not None
                return first
            if inline and not (self._keep_order and self._order.tails.get(plan.chat_id)):
                await self._delivery.pace(plan.chat_id)  # its slot, before it is in flight
            now = self._common.clock.now()
            try:
                result = await self._journal(
                    plan, key, derived, fp, inbound_id, inline=inline, fallback=fallback, when=when
                )
            except JournalUnavailableError:
                if not (inline and self._fail_open):
                    raise
                log.warning("send %r not journaled; sent anyway (fail_open)", key)
                parts, start = plan.parts, plan.first_part
                return first or await self._send_unjournaled(parts, key, start, inbound_id)
            if not isinstance(result, Receipt):
                result = await self._delivery.deliver_inline(result, plan.parts, now)
            return first or result

    def _when(self, timing: Timing | None) -> tuple[float | None, float | None]:
        """A send's time and deadline (epoch seconds, or ``None``)."""
        if timing is None:
            within = self._config.deliver_within
            if within is None:
                return None, None
            return None, self._common.clock.now() + within
        return timing.resolve(self._common.clock.now(), self._config.deliver_within)

    async def _journal(
        self,
        plan: Plan,
        key: str,
        derived: bool,
        fp: str | None,
        inbound_id: str | None,
        *,
        inline: bool,
        fallback: Json | None = None,
        when: tuple[float | None, float | None] = (None, None),
    ) -> list[Held] | Receipt:
        """Journal the parts: the records journaled in flight (to deliver now), or a
        receipt: of the send already recorded under ``key``, or of the send left to the
        sweeper (``pending``: enqueued, scheduled, or waiting behind a send of its chat;
        a scheduled one waits its turn at its time: ``Delivery``)."""
        tails, common = self._order.tails, self._common
        at = when[0]
        for _ in range(4):
            now = common.clock.now()
            after = tails.get(plan.chat_id) if self._keep_order and at is None else None
            standby = inline and common.leader is not None and not common.leader.may_send(now)
            live = inline and after is None and not standby
            values, ops, due = self._records(
                plan, key, fp, inbound_id, now, live=live, after=after, fallback=fallback, when=when
            )
            try:
                versions = await common.kv.commit(
                    ops, label=Write.OUTBOX_JOURNAL if live else Write.OUTBOX_ENQUEUE
                )
            except VersionConflictError:
                answer = await self._answer_existing(key, derived, fp)
                if isinstance(answer, Receipt):
                    return answer
                key = answer
                continue
            self._count(
                values, scheduled=at is not None, chained=after is not None, standby=standby
            )
            if not live:
                common.wake.set()
                if inline and not standby:  # its chat waits for a retry: it goes after that
                    common.metrics.outbox_deferred += 1
                return receipt_of(values[0], now)
            return [
                Held(op.key, v["token"], ver, v, self._lease, due)
                for op, v, ver in zip(ops, values, versions, strict=True)
            ]
        raise DurabilityError(f"send {key!r}: the outbox record keeps changing under us")

    def _records(
        self,
        plan: Plan,
        key: str,
        fp: str | None,
        inbound_id: str | None,
        now: float,
        *,
        live: bool,
        after: str | None,
        fallback: Json | None,
        when: tuple[float | None, float | None],
    ) -> tuple[list[Json], list[Put], float]:
        """The records of a send's parts, their writes, and when they are due: a live send
        at its lease's end, a scheduled one at its time, else now."""
        at, deadline = when
        lease = self._common.leases.lease(now, self._lease) if live else None
        values = new_values(
            key,
            plan.payloads,
            first_part=plan.first_part,
            parts=plan.total,
            fp=fp,
            inbound_id=inbound_id,
            now=now,
            lease=lease,
            after=after,
            fallback=fallback,
            at=at,
            deadline=deadline,
        )
        for value, change in zip(values, plan.changes, strict=False):
            value.update(change)
        due = max(at, now) if at is not None else now + self._lease if live else now
        ops = [handover(self._prefix + v["key"], v, expect=0, due=due) for v in values]
        return values, ops, due

    def _count(self, values: list[Json], *, scheduled: bool, chained: bool, standby: bool) -> None:
        """A send journaled: counted; the new end of its chat's chain when it waits behind
        one (or a standby journaled it); a scheduled send is no chat's end."""
        metrics = self._common.metrics
        metrics.outbox_journaled += 1
        if scheduled:
            metrics.outbox_scheduled += 1
        elif chained or (standby and self._keep_order):
            self._order.tails[values[0]["payload"]["chat_id"]] = values[-1]["key"]
        if standby:  # handed to the leader
            metrics.provider_not_leader += 1

    async def _answer_existing(self, key: str, derived: bool, fp: str | None) -> Receipt | str:
        entry = await self._common.kv.get(self._prefix + key)
        if entry is None:
            return key  # discarded or purged meanwhile: journal again
        value = entry.value
        recorded = value.get("fp")
        if derived and fp is not None and recorded is not None and recorded != fp:
            self._common.metrics.outbox_diverged += 1
            log.warning(
                "replay produced other content under key %r (on_diverged=%s)",
                key,
                self._config.on_diverged,
            )
            if self._config.on_diverged == "send":
                return diverged_key(key, fp)
        self._common.metrics.outbox_deduped += 1
        receipt = receipt_of(value, self._common.clock.now())
        publisher = self._common.publisher
        if publisher is not None and receipt.state in SETTLED and publisher.replays_publish:
            # a replay asks again: its receipt goes out again (at least once); the record's
            # own ``published`` mark is the sweeper's business, not this copy's
            await publisher.publish(receipt, journaled=False)
        return receipt

    # -- planning and bypass -------------------------------------------------------------

    def plan(self, message: Outbound) -> Plan:
        """Split the text to the channel's limit, then decide what the journal can hold."""
        text = message.text
        if text is not None and message.media is None and not message.options:
            limit = self._provider.text_limit
            one = limit is None or text_length(text, unit_of(self._provider)) <= limit
            if one and len(text) < self._small_text:
                # the common case: one short text part, no media, no options
                payload = {"chat_id": message.chat_id, "text": text}
                return Plan(message.chat_id, parts=[message], payloads=[payload])
        plan = Plan(message.chat_id)
        texts: list[str | None] = (
            [message.text]
            if message.text is None
            else list(split_text(message.text, self._provider.text_limit, unit_of(self._provider)))
        )
        outs = _part_messages(message, texts)
        plan.total = len(outs)
        try:
            payloads = part_payloads(encode_outbound(message), texts)
        except (TypeError, ValueError) as exc:
            log.warning("send to %s bypasses the outbox: not JSON (%s)", message.chat_id, exc)
            plan.bypass = outs
            return plan
        fits = [self._fits(p, m) for p, m in zip(payloads, outs, strict=True)]
        if all(fits[1:]) and not fits[0]:
            plan.bypass, plan.first_part = outs[:1], 2
            outs, payloads = outs[1:], payloads[1:]
        elif not all(fits):
            plan.bypass = outs
            return plan
        plan.parts, plan.payloads = outs, payloads
        return plan

    def _fits(self, payload: Json, message: Outbound) -> bool:
        limit = self._config.max_payload_bytes
        if (
            message.media is None
            and not message.options
            and len(message.text or "") < self._small_text
        ):
            return True
        size = len(msgspec.json.encode(payload))
        if size > limit:
            log.warning(
                "a part of a send to %s bypasses the outbox: %d bytes > "
                "outbox.max_payload_bytes=%d; prefer URL or path media for large files",
                message.chat_id,
                size,
                limit,
            )
            return False
        return True

    async def _bypass(self, plan: Plan, key: str, inbound_id: str | None) -> Receipt | None:
        if not plan.bypass:
            return None
        return await self._send_unjournaled(plan.bypass, key, 1, inbound_id)

    async def _send_unjournaled(
        self, messages: list[Outbound], key: str, first_part: int, inbound_id: str | None
    ) -> Receipt:
        first: Receipt | None = None
        for i, message in enumerate(messages, start=first_part):
            receipt = await self._delivery.bypass(message, part_key(key, i), inbound_id, i)
            first = first or receipt
        assert first is not None
        return first


def _part_messages(message: Outbound, texts: list[str | None]) -> list[Outbound]:
    if len(texts) == 1:
        return [message]
    first = msgspec.structs.replace(message, text=texts[0])
    return [first, *(Outbound(message.chat_id, t, options=message.options) for t in texts[1:])]
